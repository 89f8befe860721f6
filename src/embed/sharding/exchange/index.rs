//! The dedup index of an exchange: the position of each id in a first-seen list, a
//! dense array for small tables and an open-addressing map for large ones.

/// A map from ids (below `u32::MAX`, which marks an empty slot) to positions: open
/// addressing with linear probing in a power-of-two table at most half full.
#[derive(Debug)]
pub(in crate::embed::sharding) struct OpenMap {
    keys: Vec<u32>,
    vals: Vec<u32>,
    shift: u32,
    len: usize,
}

impl OpenMap {
    fn with_capacity(n: usize) -> OpenMap {
        let cap = (2 * n.max(8)).next_power_of_two();
        OpenMap {
            keys: vec![u32::MAX; cap],
            vals: vec![0; cap],
            shift: 64 - cap.trailing_zeros(),
            len: 0,
        }
    }

    #[inline(always)]
    fn slot(&self, id: u32) -> usize {
        ((id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline]
    fn get_or_insert(&mut self, id: u32, next: u32) -> u32 {
        debug_assert!(id != u32::MAX);
        let mask = self.keys.len() - 1;
        let mut h = self.slot(id);
        loop {
            let k = self.keys[h];
            if k == id {
                return self.vals[h];
            }
            if k == u32::MAX {
                self.keys[h] = id;
                self.vals[h] = next;
                self.len += 1;
                if 2 * self.len > self.keys.len() {
                    self.grow();
                }
                return next;
            }
            h = (h + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let old = std::mem::replace(self, OpenMap::with_capacity(self.keys.len()));
        for (&k, &v) in old.keys.iter().zip(&old.vals) {
            if k != u32::MAX {
                self.get_or_insert(k, v);
            }
        }
    }

    fn clear(&mut self) {
        self.keys.fill(u32::MAX);
        self.len = 0;
    }
}

/// How many ids ahead a dedup pass asks the cache for its index entry.
const INDEX_PREFETCH_AHEAD: usize = 16;

/// Position of each id in a first-seen list: a dense array for tables (or shards)
/// of up to 2^25 rows, an open-addressing map beyond.
#[derive(Debug)]
pub(in crate::embed::sharding) enum Index {
    Dense(Vec<u32>),
    Sparse(OpenMap),
}

impl Index {
    const DENSE_MAX: u64 = 1 << 25;

    /// An index for up to `inserts` ids out of `rows`: dense when that costs at most
    /// a few times the inserts (filling it is O(rows)), hashed otherwise.
    pub(in crate::embed::sharding) fn new(rows: u64, inserts: usize) -> Index {
        if rows <= Self::DENSE_MAX && rows <= 8 * inserts.max(4096) as u64 {
            Index::Dense(vec![u32::MAX; rows as usize])
        } else {
            Index::Sparse(OpenMap::with_capacity(inserts))
        }
    }

    /// The position of `id`, or `next` (recorded) when it is new.
    #[inline]
    pub(in crate::embed::sharding) fn get_or_insert(&mut self, id: u32, next: u32) -> u32 {
        match self {
            Index::Dense(v) => {
                let slot = &mut v[id as usize];
                if *slot == u32::MAX {
                    *slot = next;
                }
                *slot
            }
            Index::Sparse(m) => m.get_or_insert(id, next),
        }
    }

    /// Ask the cache for the entry of `id` (a later insert then finds it near): the
    /// ids of a batch are mostly spread over large tables, and each would otherwise
    /// wait for memory in turn.
    #[inline(always)]
    pub(in crate::embed::sharding) fn prefetch(&self, id: u32) {
        let p: *const u32 = match self {
            Index::Dense(v) => match v.get(id as usize) {
                Some(slot) => slot,
                None => return,
            },
            Index::Sparse(m) => &m.keys[m.slot(id)],
        };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch reads nothing (and `p` points into a live buffer); SSE
        // is part of every x86_64 CPU.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
        };
        let _ = p;
    }

    /// [`Index::prefetch`] of the id [`INDEX_PREFETCH_AHEAD`] past position `k` of
    /// `ids` (none past the end), for a pass that inserts `ids` in order.
    #[inline(always)]
    pub(in crate::embed::sharding) fn prefetch_ahead(&self, ids: &[u32], k: usize) {
        if let Some(&ahead) = ids.get(k + INDEX_PREFETCH_AHEAD) {
            self.prefetch(ahead);
        }
    }

    /// Forget `ids` (which must be all the ids inserted).
    pub(in crate::embed::sharding) fn clear(&mut self, ids: &[u32]) {
        match self {
            Index::Dense(v) => ids.iter().for_each(|&id| v[id as usize] = u32::MAX),
            Index::Sparse(m) => m.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_map_keeps_first_positions_through_growth_and_clear() {
        // Capacity for 8, then 10,000 distinct ids (grows many times), each seen twice.
        let mut m = OpenMap::with_capacity(8);
        let ids: Vec<u32> = (0..10_000u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % (u32::MAX - 1))
            .collect();
        for (p, &id) in ids.iter().enumerate() {
            assert_eq!(m.get_or_insert(id, p as u32), p as u32);
        }
        for (p, &id) in ids.iter().enumerate() {
            assert_eq!(m.get_or_insert(id, 99), p as u32, "id {id}");
        }
        assert_eq!(m.len, ids.len());
        m.clear();
        assert_eq!(m.get_or_insert(ids[5], 7), 7);
        // The dense and the hashed index agree.
        let mut d = Index::new(100, 1 << 20);
        let mut h = Index::new(1 << 30, 4);
        assert!(matches!(d, Index::Dense(_)) && matches!(h, Index::Sparse(_)));
        for (k, id) in [5u32, 9, 5, 0, 9, 99].into_iter().enumerate() {
            // A prefetch changes nothing, also for an id past a dense index's end
            // (the id after the last of a batch may be any value).
            for ix in [&d, &h] {
                ix.prefetch(id);
                ix.prefetch(id + 1000);
                ix.prefetch_ahead(&[id; INDEX_PREFETCH_AHEAD + 1], k);
            }
            assert_eq!(d.get_or_insert(id, k as u32), h.get_or_insert(id, k as u32));
        }
        assert_eq!(d.get_or_insert(99, 50), 5);
        assert_eq!(h.get_or_insert(99, 50), 5);
    }
}
