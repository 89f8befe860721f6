//! A rank's memory estimate, shared by both workloads: named parts in bytes, their
//! total and one-line description, and the fixed allowance every estimate counts
//! ([`BASE_BYTES`]). Each workload fills in its own parts (`als::shard::memory`,
//! `embed::memory`) and refuses a run that does not fit through
//! [`crate::node::check_fits`]. Pure arithmetic.

use crate::metrics::human_bytes;

/// The parts of the estimate, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemEstimate {
    pub parts: Vec<(&'static str, u64)>,
}

/// Program text, MPI and HDF5 buffers, thread stacks and small arrays.
pub const BASE_BYTES: u64 = 64 << 20;

impl MemEstimate {
    pub fn total(&self) -> u64 {
        self.parts
            .iter()
            .fold(0u64, |acc, p| acc.saturating_add(p.1))
    }

    /// `4.2 GB (tables 1.5 GB, CSR 1.6 GB, ...)`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .filter(|p| p.1 > 0)
            .map(|(k, v)| format!("{k} {}", human_bytes(*v)))
            .collect();
        format!("{} ({})", human_bytes(self.total()), parts.join(", "))
    }
}
