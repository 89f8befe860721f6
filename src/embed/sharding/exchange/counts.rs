//! What one exchange moved, counted for the per-interval report.

/// What one exchange moved, for the per-interval report.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ExchangeCounts {
    /// Ids in the local batches (of tables that are not replicated).
    pub occurrences: u64,
    /// Ids sent to owners by the lookup (a column-wise table sends an id to each of
    /// its shards); the backward sends the same ids once more.
    pub sent: u64,
    /// Rows this rank served (pooled: rows it pooled) or updated as an owner.
    pub owner_rows: u64,
    /// Seconds this rank spent applying the optimizer to its rows, but for the pooled
    /// slots updated within the pooled backward (counted in the backward).
    pub update_seconds: f64,
}

impl std::ops::AddAssign for ExchangeCounts {
    fn add_assign(&mut self, o: Self) {
        self.occurrences += o.occurrences;
        self.sent += o.sent;
        self.owner_rows += o.owner_rows;
        self.update_seconds += o.update_seconds;
    }
}
