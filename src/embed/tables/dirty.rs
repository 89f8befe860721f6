//! The rows changed since the last checkpoint, per local shard (for incremental
//! checkpoints, `embed --checkpoint-full-every N`, `docs/embed.md`): a bitset over each
//! shard's local rows, set for every row the table optimizer was applied to (the
//! owners' summed rows of each step, the replicas' rows with a non-zero all-reduced
//! gradient) and for every hash-table slot that took a new entry, and cleared when a
//! checkpoint commits. A row in the set may be unchanged
//! (an update that left its bits as they were); a changed row is always in it.

use super::store::Store;

/// Per local shard of a [`Store`] (same order as `store.local`): one bit per local row.
#[derive(Clone, Debug, Default)]
pub struct DirtyRows {
    bits: Vec<Vec<u64>>,
}

impl DirtyRows {
    /// Empty sets sized for `store`'s local shards.
    pub fn new(store: &Store) -> Self {
        DirtyRows {
            bits: store
                .local
                .iter()
                .map(|ls| vec![0u64; (ls.rows as usize).div_ceil(64)])
                .collect(),
        }
    }

    /// Mark local row `r` of local shard `li`.
    #[inline]
    pub fn mark(&mut self, li: usize, r: usize) {
        self.bits[li][r / 64] |= 1u64 << (r % 64);
    }

    /// After a step's backward on rank `me`: `rows[j]` are the local rows the optimizer
    /// updated in the `j`-th slot this rank owns (`store.owned[me][j]`).
    pub fn mark_owned(&mut self, store: &Store, me: usize, rows: &[Vec<u32>]) {
        for (&s, rs) in store.owned[me].iter().zip(rows) {
            let Some(li) = store.slot_local[s] else {
                continue;
            };
            for &r in rs {
                self.mark(li, r as usize);
            }
        }
    }

    /// After the replicated tables' update: `reduced` is the all-reduced gradient as
    /// `local_apply_replicated` reads it (table after table, `vocab x dim` each); a row
    /// with a non-zero gradient was updated.
    pub fn mark_replicated(&mut self, store: &Store, reduced: &[f32]) {
        let mut rest = reduced;
        for t in 0..store.spec.tables.len() {
            let Some(li) = store.replica[t] else { continue };
            let ts = &store.spec.tables[t];
            let (dense, tail) = rest.split_at(ts.vocab as usize * ts.dim);
            rest = tail;
            for (r, g) in dense.chunks(ts.dim.max(1)).enumerate() {
                if g.iter().any(|&x| x != 0.0) {
                    self.mark(li, r);
                }
            }
        }
    }

    /// Before a checkpoint: mark the hash tables' slots that took a new entry (and a
    /// freshly initialised row) since the last one ([`super::hashtab::HashShard::take_renewed`]);
    /// a key admitted late has a row the optimizer never touched.
    pub fn absorb_renewed(&mut self, store: &mut Store) {
        for t in 0..store.hash.len() {
            let Some(shard) = store.hash[t].as_mut() else {
                continue;
            };
            let renewed = shard.take_renewed();
            let Ok(li) = store.hash_local(t) else {
                continue;
            };
            for s in renewed {
                self.mark(li, s as usize);
            }
        }
    }

    /// The marked local rows of local shard `li`, ascending.
    pub fn rows(&self, li: usize) -> Vec<u64> {
        let mut out = Vec::new();
        for (w, &word) in self.bits[li].iter().enumerate() {
            let mut x = word;
            while x != 0 {
                out.push(w as u64 * 64 + u64::from(x.trailing_zeros()));
                x &= x - 1;
            }
        }
        out
    }

    /// Marked rows over every local shard.
    pub fn count(&self) -> u64 {
        self.bits
            .iter()
            .flatten()
            .map(|w| u64::from(w.count_ones()))
            .sum()
    }

    /// Forget every mark (a checkpoint committed, or one was restored).
    pub fn clear(&mut self) {
        self.bits.iter_mut().for_each(|b| b.fill(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_list_in_order_and_clear() {
        let mut d = DirtyRows {
            bits: vec![vec![0; 3], vec![0; 1]],
        };
        for r in [130, 0, 63, 64, 0, 129] {
            d.mark(0, r);
        }
        d.mark(1, 5);
        assert_eq!(d.rows(0), vec![0, 63, 64, 129, 130]);
        assert_eq!(d.rows(1), vec![5]);
        assert_eq!(d.count(), 6);
        d.clear();
        assert_eq!(d.count(), 0);
        assert!(d.rows(0).is_empty());
    }
}
