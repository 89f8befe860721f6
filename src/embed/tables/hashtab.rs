//! Owner-side shard of a hash-table embedding (Meituan / Monolith style): a table keyed
//! by raw 64-bit feature ids, with a frequency counter, admission and eviction.
//!
//! One rank owns a shard of one table (see [`owner`]): at most `capacity` slots. Slot
//! `s` holds one entry (key, saturating count, last-seen optimizer step); the embedding
//! row and the optimizer state of that entry are row `s` of the caller's arrays. As in
//! Meituan's design the key, its counter and its row are aggregated under one slot
//! index, so a lookup costs one probe and no second map; as in Monolith, entries expire
//! and are evicted, so a bounded table can follow an unbounded, drifting id space.
//!
//! Semantics of [`HashShard::resolve`] (train time, one call per distinct key of a
//! step with its `c >= 1` occurrences; steps never decrease across calls):
//! 1. present, not expired: `count += c` (saturating), `last_seen = step`;
//! 2. present but expired (`Ttl(t)` and `step - last_seen > t`): restarts in the same
//!    slot as a new entry (`count = c`), pushed onto `fresh`, `stats.expired += 1`;
//! 3. absent with a free slot: takes the smallest free slot, pushed onto `fresh`,
//!    `stats.inserted += 1`;
//! 4. absent, table full: one eviction pass over the candidates (entries with
//!    `last_seen < step`; an entry touched this step still has a pending gradient).
//!    Under `Ttl` every expired candidate is removed; if none was (and always under
//!    `Lfu`), the `max(1, capacity / 16)` smallest candidates are removed, ordered by
//!    `(count, last_seen, key)` for `Lfu` and `(last_seen, count, key)` (LRU) for
//!    `Ttl`. The key then goes as in 3; with no candidate at all it is refused
//!    (`stats.refused += 1`, nothing stored).
//!
//! In every case the slot is returned iff the entry's count is `>= admit_after`;
//! otherwise the caller looks up zeros and drops the gradient. The smallest free slot
//! is always taken, so the same call sequence gives the same slots, and a table rebuilt
//! by [`HashShard::restore`] continues exactly like the original.
//!
//! Layout: struct-of-arrays over slots (key u64, count u32, last_seen u64, one used bit)
//! plus an open-addressing (linear probing, backward-shift deletion) index of u32 slot
//! numbers, `u32::MAX` marking an empty bucket, with a power-of-two number of buckets
//! at least twice the capacity (load <= 1/2), and a u32 scratch per slot for the
//! eviction selection, plus one bit per slot marking the slots renewed since the last
//! incremental checkpoint. Memory per slot: 8 + 4 + 8 + 4 (scratch) + 8..16 (index)
//! bytes, i.e. 32 to 40 bytes, all allocated by [`HashShard::new`]; the hot path allocates
//! nothing (only the caller's `fresh` vector may grow). Nothing panics on bad input:
//! a decreasing step is tolerated (ages saturate at 0), a count of 0 is a plain touch.

use std::fmt;

use crate::rng::mix64;
use crate::spec::{Evict, ModelSpec, VocabKind};
use crate::{Error, Result};

/// One held entry, as listed by [`HashShard::entries`] and taken by
/// [`HashShard::restore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub slot: u32,
    pub key: u64,
    pub count: u32,
    pub last_seen: u64,
}

/// Counters since [`HashShard::new`] or [`HashShard::restore`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Absent keys stored by `resolve` (rule 3, including after an eviction pass).
    pub inserted: u64,
    /// Entries removed by eviction passes (expired or selected).
    pub evicted: u64,
    /// Expired entries restarted in place by `resolve` (rule 2).
    pub expired: u64,
    /// Keys refused because every entry was touched in the current step.
    pub refused: u64,
}

/// Marks an empty index bucket.
const EMPTY: u32 = u32::MAX;

/// The most bytes a slot takes besides its row and optimizer state (for memory
/// estimates): key, count, last seen, scratch and up to four index buckets.
pub const SLOT_BYTES: u64 = 40;

/// Allocates a vector of `n` copies of `v`, reporting failure instead of aborting.
fn alloc_vec<T: Clone>(n: usize, v: T, what: &str) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|e| format!("hash table: cannot allocate {n} {what}: {e}"))?;
    out.resize(n, v);
    Ok(out)
}

/// The owner-side shard of one hash table. See the module documentation.
#[derive(Clone)]
pub struct HashShard {
    capacity: usize,
    admit_after: u32,
    evict: Evict,
    /// Per slot: the key (meaningful only when the slot is used).
    keys: Vec<u64>,
    /// Per slot: the saturating occurrence count.
    counts: Vec<u32>,
    /// Per slot: the last step the key was resolved at.
    last_seen: Vec<u64>,
    /// Bit `s % 64` of word `s / 64` set iff slot `s` is used; the bits past
    /// `capacity` in the last word are set, so they are never taken.
    used: Vec<u64>,
    /// Every word before this one is full.
    free_hint: usize,
    /// Open-addressing index: bucket -> slot, `EMPTY` if none.
    index: Vec<u32>,
    /// `index.len() - 1` (a power of two minus one).
    mask: usize,
    len: usize,
    admitted: usize,
    stats: Stats,
    /// Eviction candidates (slot numbers), reused across passes.
    scratch: Vec<u32>,
    /// Bit `s % 64` of word `s / 64` set iff slot `s` took a new entry (inserted, or
    /// restarted after expiring) since the last [`HashShard::take_renewed`]: its row
    /// was reinitialised (incremental checkpoints track it).
    renewed: Vec<u64>,
}

impl fmt::Debug for HashShard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HashShard")
            .field("capacity", &self.capacity)
            .field("admit_after", &self.admit_after)
            .field("evict", &self.evict)
            .field("len", &self.len)
            .field("admitted", &self.admitted)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Result of probing the index for a key.
enum Probe {
    /// The key is held in this slot.
    Found(u32),
    /// The key is absent; this empty bucket ends its probe sequence.
    Vacant(usize),
}

impl HashShard {
    /// An empty shard of `capacity` slots (`1 <= capacity < u32::MAX`) admitting a key
    /// at its `admit_after`-th occurrence (`>= 1`).
    pub fn new(capacity: usize, admit_after: u32, evict: Evict) -> Result<HashShard, String> {
        if capacity == 0 {
            return Err("hash table: capacity must be >= 1".into());
        }
        if capacity >= EMPTY as usize {
            return Err(format!(
                "hash table: capacity {capacity} must be < {EMPTY} (u32 slot numbers)"
            ));
        }
        if admit_after == 0 {
            return Err("hash table: admit_after must be >= 1".into());
        }
        if evict == Evict::Ttl(0) {
            return Err("hash table: ttl must be >= 1 step".into());
        }
        let buckets = capacity
            .checked_mul(2)
            .and_then(usize::checked_next_power_of_two)
            .ok_or_else(|| format!("hash table: capacity {capacity} too large"))?;
        let words = capacity.div_ceil(64);
        let mut used = alloc_vec(words, 0u64, "used-bit words")?;
        let renewed = alloc_vec(words, 0u64, "renewed-bit words")?;
        let tail = capacity % 64;
        if let (true, Some(last)) = (tail != 0, used.last_mut()) {
            *last = !0u64 << tail;
        }
        let mut scratch = Vec::new();
        scratch
            .try_reserve_exact(capacity)
            .map_err(|e| format!("hash table: cannot allocate {capacity} scratch slots: {e}"))?;
        Ok(HashShard {
            capacity,
            admit_after,
            evict,
            keys: alloc_vec(capacity, 0u64, "keys")?,
            counts: alloc_vec(capacity, 0u32, "counts")?,
            last_seen: alloc_vec(capacity, 0u64, "steps")?,
            used,
            free_hint: 0,
            index: alloc_vec(buckets, EMPTY, "index buckets")?,
            mask: buckets - 1,
            len: 0,
            admitted: 0,
            stats: Stats::default(),
            scratch,
            renewed,
        })
    }

    /// Maximum number of entries (slots).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries held, admitted or not.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no entry is held.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries whose count reached `admit_after`.
    #[inline]
    pub fn admitted(&self) -> usize {
        self.admitted
    }

    /// Counters since `new` or `restore`.
    #[inline]
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Occurrences needed before a key gets its row.
    #[inline]
    pub fn admit_after(&self) -> u32 {
        self.admit_after
    }

    /// The eviction policy.
    #[inline]
    pub fn evict(&self) -> Evict {
        self.evict
    }

    /// Home bucket of `key`.
    #[inline]
    fn home(&self, key: u64) -> usize {
        (mix64(key) as usize) & self.mask
    }

    /// Looks `key` up in the index.
    #[inline]
    fn probe(&self, key: u64) -> Probe {
        let mut i = self.home(key);
        loop {
            let s = self.index[i];
            if s == EMPTY {
                return Probe::Vacant(i);
            }
            if self.keys[s as usize] == key {
                return Probe::Found(s);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Ask the cache for `key`'s home bucket of the index (a later probe of it then
    /// finds the bucket near). Changes nothing.
    #[inline(always)]
    pub fn prefetch_bucket(&self, key: u64) {
        prefetch(&self.index[self.home(key)]);
    }

    /// Ask the cache for the entry in `key`'s home bucket (its key, count and step),
    /// once the bucket itself is near ([`HashShard::prefetch_bucket`] some keys
    /// earlier). Changes nothing.
    #[inline(always)]
    pub fn prefetch_entry(&self, key: u64) {
        let s = self.index[self.home(key)];
        if s != EMPTY {
            let s = s as usize;
            prefetch(&self.keys[s]);
            prefetch(&self.counts[s]);
            prefetch(&self.last_seen[s]);
        }
    }

    /// True when an entry last seen at `last` has expired at `step`.
    #[inline]
    fn expired(&self, last: u64, step: u64) -> bool {
        match self.evict {
            Evict::Ttl(t) => step.saturating_sub(last) > t,
            Evict::Lfu => false,
        }
    }

    /// The slot of `key` for a train step; see the module documentation for the rules.
    /// `fresh` receives `(slot, key)` for every slot whose row and optimizer state the
    /// caller must (re)initialize. Returns `None` while the key is not admitted or
    /// when it was refused.
    #[inline]
    pub fn resolve(
        &mut self,
        key: u64,
        count: u32,
        step: u64,
        fresh: &mut Vec<(u32, u64)>,
    ) -> Option<u32> {
        match self.probe(key) {
            Probe::Found(slot) => {
                let s = slot as usize;
                let old = self.counts[s];
                let new = if self.expired(self.last_seen[s], step) {
                    // Rule 2: restart in place as a new entry.
                    fresh.push((slot, key));
                    self.renewed[s / 64] |= 1u64 << (s % 64);
                    self.stats.expired += 1;
                    count
                } else {
                    old.saturating_add(count)
                };
                self.counts[s] = new;
                self.last_seen[s] = step;
                match (old >= self.admit_after, new >= self.admit_after) {
                    (false, true) => self.admitted += 1,
                    (true, false) => self.admitted -= 1,
                    _ => {}
                }
                (new >= self.admit_after).then_some(slot)
            }
            Probe::Vacant(pos) => self.insert_absent(key, count, step, pos, fresh),
        }
    }

    /// Rules 3 and 4 of `resolve`: `key` is absent and `pos` ends its probe sequence.
    fn insert_absent(
        &mut self,
        key: u64,
        count: u32,
        step: u64,
        mut pos: usize,
        fresh: &mut Vec<(u32, u64)>,
    ) -> Option<u32> {
        if self.len == self.capacity {
            if !self.evict_pass(step) {
                self.stats.refused += 1;
                return None;
            }
            // Deletions shifted buckets: find the end of the probe sequence again.
            pos = self.vacant_bucket(key);
        }
        let Some(slot) = self.take_free() else {
            self.stats.refused += 1;
            return None;
        };
        self.place(pos, slot, key, count, step);
        self.stats.inserted += 1;
        fresh.push((slot, key));
        self.renewed[slot as usize / 64] |= 1u64 << (slot % 64);
        (count >= self.admit_after).then_some(slot)
    }

    /// The first empty bucket of the probe sequence of an absent `key`.
    #[inline]
    fn vacant_bucket(&self, key: u64) -> usize {
        let mut i = self.home(key);
        while self.index[i] != EMPTY {
            i = (i + 1) & self.mask;
        }
        i
    }

    /// Stores an entry in free slot `slot` (already marked used) and bucket `pos`.
    #[inline]
    fn place(&mut self, pos: usize, slot: u32, key: u64, count: u32, last_seen: u64) {
        let s = slot as usize;
        self.index[pos] = slot;
        self.keys[s] = key;
        self.counts[s] = count;
        self.last_seen[s] = last_seen;
        self.len += 1;
        if count >= self.admit_after {
            self.admitted += 1;
        }
    }

    /// Marks the smallest free slot used and returns it.
    #[inline]
    fn take_free(&mut self) -> Option<u32> {
        if self.len >= self.capacity {
            return None;
        }
        let mut w = self.free_hint;
        while let Some(&word) = self.used.get(w) {
            if word != !0u64 {
                let bit = (!word).trailing_zeros() as usize;
                self.used[w] = word | (1u64 << bit);
                self.free_hint = w;
                return u32::try_from(w * 64 + bit).ok();
            }
            w += 1;
        }
        None
    }

    /// True when slot `s` is used.
    #[inline]
    fn is_used(&self, s: usize) -> bool {
        self.used[s / 64] >> (s % 64) & 1 == 1
    }

    /// Removes the entry of slot `s`: frees the slot and deletes its bucket by
    /// backward shifting, so every remaining key stays reachable from its home bucket.
    fn remove_slot(&mut self, s: usize) {
        let slot = s as u32;
        let mut hole = self.home(self.keys[s]);
        loop {
            match self.index[hole] {
                EMPTY => return, // not indexed (cannot happen): leave the table as is
                x if x == slot => break,
                _ => hole = (hole + 1) & self.mask,
            }
        }
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let t = self.index[j];
            if t == EMPTY {
                break;
            }
            // The entry at `j` may fill the hole iff its home is not in (hole, j].
            let home = self.home(self.keys[t as usize]);
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.index[hole] = t;
                hole = j;
            }
        }
        self.index[hole] = EMPTY;
        self.used[s / 64] &= !(1u64 << (s % 64));
        self.free_hint = self.free_hint.min(s / 64);
        self.len -= 1;
        if self.counts[s] >= self.admit_after {
            self.admitted -= 1;
        }
        self.stats.evicted += 1;
    }

    /// One eviction pass at `step` (rule 4). Returns false when there was no candidate.
    fn evict_pass(&mut self, step: u64) -> bool {
        let mut cand = std::mem::take(&mut self.scratch);
        cand.clear();
        let mut removed = 0usize;
        for w in 0..self.used.len() {
            let mut bits = self.used[w];
            while bits != 0 {
                let s = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if s >= self.capacity {
                    break;
                }
                let last = self.last_seen[s];
                if last >= step {
                    continue;
                }
                if self.expired(last, step) {
                    self.remove_slot(s);
                    removed += 1;
                } else {
                    cand.push(s as u32);
                }
            }
        }
        if removed == 0 && !cand.is_empty() {
            let b = (self.capacity / 16).max(1).min(cand.len());
            if b < cand.len() {
                let (keys, counts, last) = (&self.keys, &self.counts, &self.last_seen);
                match self.evict {
                    Evict::Lfu => cand.select_nth_unstable_by_key(b - 1, |&s| {
                        let s = s as usize;
                        (counts[s], last[s], keys[s])
                    }),
                    Evict::Ttl(_) => cand.select_nth_unstable_by_key(b - 1, |&s| {
                        let s = s as usize;
                        (last[s], counts[s], keys[s])
                    }),
                };
            }
            for &s in &cand[..b] {
                self.remove_slot(s as usize);
            }
            removed = b;
        }
        cand.clear();
        self.scratch = cand;
        removed > 0
    }

    /// The slot of `key` for evaluation at `step`: present, admitted and not expired.
    #[inline]
    pub fn get(&self, key: u64, step: u64) -> Option<u32> {
        match self.probe(key) {
            Probe::Found(slot) => {
                let s = slot as usize;
                (self.counts[s] >= self.admit_after && !self.expired(self.last_seen[s], step))
                    .then_some(slot)
            }
            Probe::Vacant(_) => None,
        }
    }

    /// The slots that took a new entry since the last call (or since `new` /
    /// `restore`), ascending; forgets them.
    pub fn take_renewed(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        for (w, word) in self.renewed.iter_mut().enumerate() {
            let mut x = std::mem::take(word);
            while x != 0 {
                out.push((w * 64) as u32 + x.trailing_zeros());
                x &= x - 1;
            }
        }
        out
    }

    /// Entries in increasing slot order.
    pub fn entries(&self) -> Vec<Entry> {
        let mut out = Vec::with_capacity(self.len);
        for w in 0..self.used.len() {
            let mut bits = self.used[w];
            while bits != 0 {
                let s = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if s >= self.capacity {
                    break;
                }
                out.push(Entry {
                    slot: s as u32,
                    key: self.keys[s],
                    count: self.counts[s],
                    last_seen: self.last_seen[s],
                });
            }
        }
        out
    }

    /// Exact restore at the same capacity: every entry back in its slot (in any input
    /// order). Refuses a slot `>= capacity`, a duplicate slot or a duplicate key.
    /// The stats restart at zero.
    pub fn restore(
        capacity: usize,
        admit_after: u32,
        evict: Evict,
        entries: &[Entry],
    ) -> Result<HashShard, String> {
        let mut t = HashShard::new(capacity, admit_after, evict)?;
        for e in entries {
            let s = e.slot as usize;
            if s >= capacity {
                return Err(format!(
                    "hash table restore: slot {} of key {} out of range (capacity {capacity})",
                    e.slot, e.key
                ));
            }
            if t.is_used(s) {
                return Err(format!(
                    "hash table restore: duplicate slot {} (key {})",
                    e.slot, e.key
                ));
            }
            let Probe::Vacant(pos) = t.probe(e.key) else {
                return Err(format!(
                    "hash table restore: duplicate key {} (slot {})",
                    e.key, e.slot
                ));
            };
            t.used[s / 64] |= 1u64 << (s % 64);
            t.place(pos, e.slot, e.key, e.count, e.last_seen);
        }
        Ok(t)
    }

    /// Re-sharding: puts an entry into the smallest free slot, keeping its count and
    /// last-seen step; never evicts. Errs when the table is full or the key is held.
    /// Returns the slot. Not counted in `stats`.
    pub fn insert_entry(&mut self, key: u64, count: u32, last_seen: u64) -> Result<u32, String> {
        let pos = match self.probe(key) {
            Probe::Found(slot) => {
                return Err(format!(
                    "hash table insert: key {key} already held in slot {slot}"
                ))
            }
            Probe::Vacant(pos) => pos,
        };
        let Some(slot) = self.take_free() else {
            return Err(format!(
                "hash table insert: key {key} refused, table full ({} slots)",
                self.capacity
            ));
        };
        self.place(pos, slot, key, count, last_seen);
        Ok(slot)
    }
}

/// A hint to the cache to load the line of `x` (reads nothing).
#[inline(always)]
pub(crate) fn prefetch<T>(x: &T) {
    let p: *const T = x;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing (and `p` points at a live value); SSE is part
    // of every x86_64 CPU.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    let _ = p;
}

/// The rank that owns `key` of table `table` among `p >= 1` ranks (0 when `p == 0`):
/// the key mixed with a per-table salt, reduced by a multiply-high. Depends on nothing
/// but `(key, table, p)`.
#[inline]
pub fn owner(key: u64, table: usize, p: usize) -> usize {
    let h = mix64(key ^ mix64((table as u64).wrapping_add(0x5157)));
    ((h as u128 * p as u128) >> 64) as usize
}

/// Every hash table's shard on this rank (`None` for other tables and for the hash
/// tables this rank holds no rows of), sized by the rank's rows of the table.
pub fn local_hash_shards(
    spec: &ModelSpec,
    rows_here: &[Option<u64>],
) -> Result<Vec<Option<HashShard>>> {
    spec.tables
        .iter()
        .zip(rows_here)
        .map(|(t, &rows)| {
            let Some(rows) = rows.filter(|_| t.vocab_kind == VocabKind::Hash) else {
                return Ok(None);
            };
            HashShard::new(rows as usize, t.admit_after, t.evict)
                .map(Some)
                .map_err(|e| Error::Config(format!("hash table {:?}: {e}", t.name)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// A tiny SplitMix64 stream for test inputs.
    struct Sm(u64);

    impl Sm {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            mix64(self.0)
        }
        /// Uniform in `0..n`.
        fn below(&mut self, n: u64) -> u64 {
            ((self.next() as u128 * n as u128) >> 64) as u64
        }
        /// Uniform in `[0, 1)`.
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// Obviously-correct reference: ordered maps, full sorts.
    struct Model {
        cap: usize,
        admit: u32,
        evict: Evict,
        /// key -> (count, last_seen, slot)
        map: BTreeMap<u64, (u32, u64, u32)>,
        free: BTreeSet<u32>,
        stats: Stats,
    }

    fn model_expired(evict: Evict, last: u64, step: u64) -> bool {
        matches!(evict, Evict::Ttl(t) if step - last > t)
    }

    impl Model {
        fn new(cap: usize, admit: u32, evict: Evict) -> Model {
            Model {
                cap,
                admit,
                evict,
                map: BTreeMap::new(),
                free: (0..cap as u32).collect(),
                stats: Stats::default(),
            }
        }

        fn resolve(
            &mut self,
            key: u64,
            c: u32,
            step: u64,
            fresh: &mut Vec<(u32, u64)>,
        ) -> Option<u32> {
            if let Some(e) = self.map.get_mut(&key) {
                if model_expired(self.evict, e.1, step) {
                    *e = (c, step, e.2);
                    fresh.push((e.2, key));
                    self.stats.expired += 1;
                } else {
                    e.0 = e.0.saturating_add(c);
                    e.1 = step;
                }
                return (e.0 >= self.admit).then_some(e.2);
            }
            if self.free.is_empty() {
                let cands: Vec<(u64, u32, u64, u32)> = self
                    .map
                    .iter()
                    .filter(|(_, e)| e.1 < step)
                    .map(|(&k, &(cnt, last, slot))| (k, cnt, last, slot))
                    .collect();
                if cands.is_empty() {
                    self.stats.refused += 1;
                    return None;
                }
                let expired: Vec<(u64, u32, u64, u32)> = cands
                    .iter()
                    .copied()
                    .filter(|c| model_expired(self.evict, c.2, step))
                    .collect();
                let victims = if !expired.is_empty() {
                    expired
                } else {
                    let mut sorted = cands;
                    match self.evict {
                        Evict::Lfu => sorted.sort_by_key(|c| (c.1, c.2, c.0)),
                        Evict::Ttl(_) => sorted.sort_by_key(|c| (c.2, c.1, c.0)),
                    }
                    sorted.truncate((self.cap / 16).max(1));
                    sorted
                };
                for v in victims {
                    self.map.remove(&v.0);
                    self.free.insert(v.3);
                    self.stats.evicted += 1;
                }
            }
            let slot = *self.free.iter().next().unwrap();
            self.free.remove(&slot);
            self.map.insert(key, (c, step, slot));
            self.stats.inserted += 1;
            fresh.push((slot, key));
            (c >= self.admit).then_some(slot)
        }

        fn get(&self, key: u64, step: u64) -> Option<u32> {
            let &(c, last, slot) = self.map.get(&key)?;
            let expired = matches!(self.evict, Evict::Ttl(t) if step.saturating_sub(last) > t);
            (c >= self.admit && !expired).then_some(slot)
        }

        fn entries(&self) -> Vec<Entry> {
            let mut v: Vec<Entry> = self
                .map
                .iter()
                .map(|(&key, &(count, last_seen, slot))| Entry {
                    slot,
                    key,
                    count,
                    last_seen,
                })
                .collect();
            v.sort_by_key(|e| e.slot);
            v
        }

        fn admitted(&self) -> usize {
            self.map.values().filter(|e| e.0 >= self.admit).count()
        }
    }

    /// Internal consistency: every used slot is reachable through the index, the index
    /// holds exactly the used slots, and the counters match.
    fn check_invariants(t: &HashShard) {
        let entries = t.entries();
        assert_eq!(entries.len(), t.len());
        let occupied = t.index.iter().filter(|&&s| s != EMPTY).count();
        assert_eq!(occupied, t.len());
        for e in &entries {
            assert!(matches!(t.probe(e.key), Probe::Found(s) if s == e.slot));
        }
        let adm = entries
            .iter()
            .filter(|e| e.count >= t.admit_after())
            .count();
        assert_eq!(adm, t.admitted());
        for w in 0..t.used.len() {
            if w < t.free_hint {
                assert_eq!(t.used[w], !0u64, "free_hint past a free slot");
            }
        }
    }

    type Stream = Vec<(u64, Vec<(u64, u32)>)>;

    /// What `resolve` returned and pushed, call by call.
    type Outputs = Vec<(Option<u32>, Vec<(u32, u64)>)>;

    /// A random train stream: Zipf-like keys (log-uniform rank over `universe`, with
    /// keys 0 and u64::MAX among the most frequent, some one-off random keys), 1..=6
    /// draws per step aggregated per distinct key, steps advancing by 1 or jumping.
    fn gen_stream(seed: u64, steps: usize, universe: u64) -> Stream {
        let mut rng = Sm(seed);
        let mut step = 0u64;
        let mut out = Vec::with_capacity(steps);
        for _ in 0..steps {
            let n = 1 + rng.below(6);
            let mut keys: Vec<(u64, u32)> = Vec::new();
            for _ in 0..n {
                let key = if rng.below(10) == 0 {
                    rng.next()
                } else {
                    let r = ((universe as f64 + 1.0).powf(rng.unit()) as u64).saturating_sub(1);
                    match r {
                        0 => 0,
                        1 => u64::MAX,
                        r if r % 2 == 0 => r,
                        r => mix64(r) & 0xffff_ffff,
                    }
                };
                let c = if rng.below(500) == 0 { u32::MAX / 2 } else { 1 };
                match keys.iter_mut().find(|(k, _)| *k == key) {
                    Some(e) => e.1 = e.1.saturating_add(c),
                    None => keys.push((key, c)),
                }
            }
            out.push((step, keys));
            step += if rng.below(20) == 0 {
                2 + rng.below(12)
            } else {
                1
            };
        }
        out
    }

    fn compare_with_model(
        cap: usize,
        admit: u32,
        evict: Evict,
        steps: usize,
        seed: u64,
        total: &mut Stats,
    ) {
        let universe = 4 * cap as u64 + 20;
        let stream = gen_stream(seed, steps, universe);
        let mut t = HashShard::new(cap, admit, evict).unwrap();
        let mut m = Model::new(cap, admit, evict);
        let mut rng = Sm(seed ^ 0xabcd);
        let (mut f1, mut f2) = (Vec::new(), Vec::new());
        let every = if cap <= 16 { 1 } else { 37 };
        for (i, (step, keys)) in stream.iter().enumerate() {
            for &(key, c) in keys {
                f1.clear();
                f2.clear();
                let a = t.resolve(key, c, *step, &mut f1);
                let b = m.resolve(key, c, *step, &mut f2);
                let ctx = format!("cap {cap} admit {admit} {evict} step {step} key {key}");
                assert_eq!(a, b, "{ctx}");
                assert_eq!(f1, f2, "{ctx}");
            }
            for _ in 0..3 {
                let key = match rng.below(4) {
                    0 => rng.next(),
                    _ => keys[rng.below(keys.len() as u64) as usize].0,
                };
                let at = step + rng.below(8);
                assert_eq!(t.get(key, at), m.get(key, at), "get {key} at {at}");
            }
            if i % every == 0 || i + 1 == stream.len() {
                assert_eq!(t.entries(), m.entries(), "cap {cap} {evict} step {step}");
                assert_eq!(t.stats(), m.stats);
                assert_eq!(t.admitted(), m.admitted());
                check_invariants(&t);
            }
        }
        let s = t.stats();
        assert!(s.inserted > 0);
        total.inserted += s.inserted;
        total.evicted += s.evicted;
        total.expired += s.expired;
        total.refused += s.refused;
        if cap <= 16 {
            assert!(s.evicted > 0, "cap {cap} {evict}: no eviction exercised");
        }
    }

    #[test]
    fn matches_reference_model() {
        let mut seed = 1;
        let mut total = Stats::default();
        for &cap in &[1usize, 2, 3, 7, 16, 40, 100, 1000] {
            for &admit in &[1u32, 3] {
                for &evict in &[Evict::Lfu, Evict::Ttl(1), Evict::Ttl(5)] {
                    let steps = if cap >= 1000 { 8000 } else { 4000 };
                    compare_with_model(cap, admit, evict, steps, seed, &mut total);
                    seed += 1;
                }
            }
        }
        // Every rule was exercised.
        assert!(total.evicted > 1000 && total.expired > 100, "{total:?}");
        assert!(total.refused > 100, "{total:?}");
    }

    #[test]
    fn new_refuses_bad_parameters() {
        assert!(HashShard::new(0, 1, Evict::Lfu)
            .unwrap_err()
            .contains("capacity"));
        assert!(HashShard::new(u32::MAX as usize, 1, Evict::Lfu).is_err());
        assert!(HashShard::new(4, 0, Evict::Lfu)
            .unwrap_err()
            .contains("admit_after"));
        assert!(HashShard::new(4, 1, Evict::Ttl(0))
            .unwrap_err()
            .contains("ttl"));
        let t = HashShard::new(5, 2, Evict::Ttl(3)).unwrap();
        assert_eq!(
            (t.capacity(), t.admit_after(), t.evict()),
            (5, 2, Evict::Ttl(3))
        );
        assert!(t.is_empty());
        assert_eq!(t.index.len(), 16);
    }

    #[test]
    fn admission_at_nth_occurrence() {
        let mut t = HashShard::new(4, 3, Evict::Lfu).unwrap();
        let mut f = Vec::new();
        assert_eq!(t.resolve(7, 1, 0, &mut f), None);
        assert_eq!(f, vec![(0, 7)]);
        f.clear();
        assert_eq!(t.resolve(7, 1, 1, &mut f), None);
        assert_eq!(t.get(7, 1), None);
        assert_eq!((t.len(), t.admitted()), (1, 0));
        assert_eq!(t.resolve(7, 1, 2, &mut f), Some(0));
        assert!(f.is_empty(), "no re-initialization on admission");
        assert_eq!((t.len(), t.admitted()), (1, 1));
        assert_eq!(t.get(7, 2), Some(0));
        // Three occurrences in one step admit at once.
        assert_eq!(t.resolve(u64::MAX, 3, 2, &mut f), Some(1));
        assert_eq!(t.resolve(0, 2, 2, &mut f), None);
        assert_eq!(f, vec![(1, u64::MAX), (2, 0)]);
        assert_eq!(t.get(0, 2), None);
        assert_eq!(t.get(12345, 2), None);
        assert_eq!(
            t.stats(),
            Stats {
                inserted: 3,
                ..Stats::default()
            }
        );
    }

    #[test]
    fn ttl_expiry_restarts_in_place() {
        let mut t = HashShard::new(4, 2, Evict::Ttl(5)).unwrap();
        let mut f = Vec::new();
        assert_eq!(t.resolve(8, 1, 0, &mut f), None);
        assert_eq!(t.resolve(9, 2, 10, &mut f), Some(1));
        assert_eq!(f, vec![(0, 8), (1, 9)]);
        f.clear();
        // 15 - 10 = 5 is not > 5: still alive.
        assert_eq!(t.resolve(9, 1, 15, &mut f), Some(1));
        assert!(f.is_empty());
        assert_eq!(t.get(9, 20), Some(1));
        assert_eq!(t.get(9, 21), None);
        // 21 - 15 = 6 > 5: restarts with count 1, not admitted.
        assert_eq!(t.resolve(9, 1, 21, &mut f), None);
        assert_eq!(f, vec![(1, 9)]);
        assert_eq!(t.stats().expired, 1);
        assert_eq!(t.admitted(), 0);
        let e = t.entries();
        assert_eq!(
            e[1],
            Entry {
                slot: 1,
                key: 9,
                count: 1,
                last_seen: 21
            }
        );
        f.clear();
        assert_eq!(t.resolve(9, 1, 21, &mut f), Some(1));
        assert!(f.is_empty());
        assert_eq!(t.admitted(), 1);
        // An expired restart that is admitted at once.
        assert_eq!(t.resolve(9, 4, 40, &mut f), Some(1));
        assert_eq!(f, vec![(1, 9)]);
        assert_eq!(t.entries()[1].count, 4);
        assert_eq!(
            t.stats(),
            Stats {
                inserted: 2,
                evicted: 0,
                expired: 2,
                refused: 0
            }
        );
    }

    #[test]
    fn current_step_entries_are_never_evicted() {
        for evict in [Evict::Lfu, Evict::Ttl(1)] {
            let mut t = HashShard::new(2, 1, evict).unwrap();
            let mut f = Vec::new();
            assert_eq!(t.resolve(1, 1, 5, &mut f), Some(0));
            assert_eq!(t.resolve(2, 1, 5, &mut f), Some(1));
            assert_eq!(t.resolve(3, 1, 5, &mut f), None);
            assert_eq!(f.len(), 2);
            assert_eq!(
                t.stats(),
                Stats {
                    inserted: 2,
                    evicted: 0,
                    expired: 0,
                    refused: 1
                }
            );
            assert_eq!(t.get(3, 5), None);
            assert_eq!(t.len(), 2);
            // Next step both are candidates; the tie (1, 5, key) goes to key 1.
            assert_eq!(t.resolve(3, 1, 6, &mut f), Some(0));
            assert_eq!(f[2], (0, 3));
            assert_eq!(t.get(1, 6), None);
            assert_eq!(t.get(2, 6), Some(1));
            check_invariants(&t);
        }
        // The only candidate goes even with the highest count.
        let mut t = HashShard::new(2, 1, Evict::Lfu).unwrap();
        let mut f = Vec::new();
        t.resolve(1, 10, 1, &mut f);
        t.resolve(2, 1, 1, &mut f);
        t.resolve(2, 1, 2, &mut f);
        assert_eq!(t.resolve(3, 1, 2, &mut f), Some(0));
        assert_eq!(t.get(1, 2), None);
        assert_eq!(t.stats().evicted, 1);
    }

    #[test]
    fn lfu_order_count_then_last_seen_then_key() {
        let mut t = HashShard::new(4, 1, Evict::Lfu).unwrap();
        let mut f = Vec::new();
        t.resolve(10, 5, 1, &mut f); // slot 0
        t.resolve(40, 2, 1, &mut f); // slot 1
        t.resolve(30, 2, 1, &mut f); // slot 2
        t.resolve(20, 2, 2, &mut f); // slot 3
                                     // (2,1,30) < (2,1,40) < (2,2,20) < (5,1,10): key 30 goes.
        assert_eq!(t.resolve(50, 1, 5, &mut f), Some(2));
        // Now (1,5,50) is the smallest.
        assert_eq!(t.resolve(60, 1, 6, &mut f), Some(2));
        // Then (1,6,60) again; at step 6 it is protected, so (2,1,40) goes.
        assert_eq!(t.resolve(70, 1, 6, &mut f), Some(1));
        let keys: Vec<u64> = t.entries().iter().map(|e| e.key).collect();
        assert_eq!(keys, vec![10, 70, 60, 20]);
        assert_eq!(t.stats().evicted, 3);

        // capacity 32: each pass removes 32 / 16 = 2 entries.
        let mut t = HashShard::new(32, 1, Evict::Lfu).unwrap();
        for k in 0..32u64 {
            assert_eq!(
                t.resolve(100 + k, (k % 5) as u32 + 1, 1, &mut f),
                Some(k as u32)
            );
        }
        // Count-1 keys are 100, 105, 110, ...; 100 and 105 go (slots 0 and 5).
        assert_eq!(t.resolve(999, 1, 2, &mut f), Some(0));
        assert_eq!(t.resolve(998, 1, 2, &mut f), Some(5));
        assert_eq!(t.stats().evicted, 2);
        // 999 and 998 are protected at step 2: 110 and 115 go.
        assert_eq!(t.resolve(997, 1, 2, &mut f), Some(10));
        assert_eq!(t.get(115, 2), None);
        assert_eq!(t.get(120, 2), Some(20));
        assert_eq!(t.stats().evicted, 4);
        assert_eq!(t.len(), 31);
        check_invariants(&t);
    }

    #[test]
    fn ttl_removes_all_expired_else_lru() {
        let mut t = HashShard::new(3, 1, Evict::Ttl(100)).unwrap();
        let mut f = Vec::new();
        t.resolve(1, 50, 1, &mut f);
        t.resolve(2, 1, 2, &mut f);
        t.resolve(3, 1, 3, &mut f);
        // Nothing expired: least recently used goes, whatever its count.
        assert_eq!(t.resolve(4, 1, 4, &mut f), Some(0));
        assert_eq!(t.get(1, 4), None);

        let mut t = HashShard::new(4, 1, Evict::Ttl(2)).unwrap();
        t.resolve(1, 1, 1, &mut f);
        t.resolve(2, 9, 1, &mut f);
        t.resolve(3, 1, 3, &mut f);
        t.resolve(4, 1, 4, &mut f);
        // 4 - 1 = 3 > 2: keys 1 and 2 both expire in one pass.
        assert_eq!(t.resolve(5, 1, 4, &mut f), Some(0));
        assert_eq!(t.stats().evicted, 2);
        assert_eq!(t.resolve(6, 1, 4, &mut f), Some(1));
        assert_eq!(
            t.stats(),
            Stats {
                inserted: 6,
                evicted: 2,
                expired: 0,
                refused: 0
            }
        );
        check_invariants(&t);
    }

    #[test]
    fn count_saturates() {
        let mut t = HashShard::new(2, 1, Evict::Lfu).unwrap();
        let mut f = Vec::new();
        t.resolve(1, u32::MAX - 1, 0, &mut f);
        t.resolve(1, 5, 1, &mut f);
        assert_eq!(t.entries()[0].count, u32::MAX);
        t.resolve(1, u32::MAX, 2, &mut f);
        assert_eq!(t.entries()[0].count, u32::MAX);
        assert_eq!(t.entries()[0].last_seen, 2);
    }

    #[test]
    fn colliding_keys_survive_deletions() {
        // Many keys, tiny-probe clusters broken by repeated eviction: every held key
        // must stay reachable.
        let mut t = HashShard::new(64, 1, Evict::Lfu).unwrap();
        let mut f = Vec::new();
        let mut rng = Sm(77);
        for step in 0..20_000u64 {
            let key = rng.below(300);
            t.resolve(key, 1, step, &mut f);
            if step % 97 == 0 {
                check_invariants(&t);
            }
        }
        check_invariants(&t);
        // A pass removes 64 / 16 = 4 entries, then refills one slot at a time.
        assert!((61..=64).contains(&t.len()));
        assert!(t.stats().evicted > 1000);
    }

    fn run(t: &mut HashShard, stream: &[(u64, Vec<(u64, u32)>)]) -> Outputs {
        let mut out = Vec::new();
        for (step, keys) in stream {
            for &(k, c) in keys {
                let mut f = Vec::new();
                let r = t.resolve(k, c, *step, &mut f);
                out.push((r, f));
            }
        }
        out
    }

    #[test]
    fn restore_continues_identically() {
        for (i, &(cap, admit, evict)) in [
            (1usize, 1u32, Evict::Lfu),
            (7, 3, Evict::Ttl(5)),
            (50, 1, Evict::Ttl(1)),
            (200, 3, Evict::Lfu),
        ]
        .iter()
        .enumerate()
        {
            let stream = gen_stream(100 + i as u64, 4000, 4 * cap as u64 + 20);
            let (head, tail) = stream.split_at(2000);
            let mut a = HashShard::new(cap, admit, evict).unwrap();
            run(&mut a, head);
            let snap = a.stats();
            let mut entries = a.entries();
            entries.reverse(); // any order is accepted
            let mut b = HashShard::restore(cap, admit, evict, &entries).unwrap();
            assert_eq!(b.entries(), a.entries());
            assert_eq!(b.stats(), Stats::default());
            assert_eq!((b.len(), b.admitted()), (a.len(), a.admitted()));
            check_invariants(&b);
            assert_eq!(run(&mut a, tail), run(&mut b, tail));
            assert_eq!(a.entries(), b.entries());
            let (sa, sb) = (a.stats(), b.stats());
            assert_eq!(sb.inserted, sa.inserted - snap.inserted);
            assert_eq!(sb.evicted, sa.evicted - snap.evicted);
            assert_eq!(sb.expired, sa.expired - snap.expired);
            assert_eq!(sb.refused, sa.refused - snap.refused);
        }
    }

    /// `take_renewed` lists exactly the slots that took a new entry (an insert, an
    /// expired entry restarting) since the last call, ascending, and forgets them; a
    /// touch of a held entry and a restore renew nothing.
    #[test]
    fn renewed_slots_are_the_new_entries() {
        let mut fresh = Vec::new();
        let mut a = HashShard::new(4, 1, Evict::Ttl(2)).unwrap();
        for key in [10, 11, 12] {
            a.resolve(key, 1, 0, &mut fresh);
        }
        assert_eq!(a.take_renewed(), vec![0, 1, 2]);
        assert!(a.take_renewed().is_empty());
        a.resolve(11, 1, 1, &mut fresh); // a touch
        assert!(a.take_renewed().is_empty());
        a.resolve(10, 1, 9, &mut fresh); // expired: restarts in slot 0
        a.resolve(13, 1, 9, &mut fresh); // inserted into slot 3
        assert_eq!(a.take_renewed(), vec![0, 3]);
        let mut b = HashShard::restore(4, 1, Evict::Ttl(2), &a.entries()).unwrap();
        assert!(b.take_renewed().is_empty());
        let want: Vec<u32> = fresh.iter().map(|f| f.0).collect();
        assert_eq!(want, vec![0, 1, 2, 0, 3]);
    }

    #[test]
    fn restore_refuses_bad_input() {
        let e = |slot, key| Entry {
            slot,
            key,
            count: 1,
            last_seen: 0,
        };
        let err = HashShard::restore(4, 1, Evict::Lfu, &[e(0, 1), e(4, 2)]).unwrap_err();
        assert!(
            err.contains("slot 4") && err.contains("out of range"),
            "{err}"
        );
        let err = HashShard::restore(4, 1, Evict::Lfu, &[e(2, 1), e(2, 2)]).unwrap_err();
        assert!(err.contains("duplicate slot 2"), "{err}");
        let err = HashShard::restore(4, 1, Evict::Lfu, &[e(0, 9), e(3, 9)]).unwrap_err();
        assert!(err.contains("duplicate key 9"), "{err}");
        assert!(HashShard::restore(0, 1, Evict::Lfu, &[]).is_err());
        let t = HashShard::restore(4, 1, Evict::Lfu, &[e(3, u64::MAX), e(1, 0)]).unwrap();
        assert_eq!(t.get(0, 0), Some(1));
        assert_eq!(t.get(u64::MAX, 0), Some(3));
    }

    #[test]
    fn insert_entry_takes_smallest_free_slot() {
        let e = |slot, key| Entry {
            slot,
            key,
            count: 1,
            last_seen: 0,
        };
        let mut t = HashShard::restore(4, 2, Evict::Lfu, &[e(1, 10), e(3, 30)]).unwrap();
        assert_eq!(t.insert_entry(5, 7, 9), Ok(0));
        assert!(t.insert_entry(10, 1, 1).unwrap_err().contains("already"));
        assert_eq!(t.insert_entry(6, 1, 9), Ok(2));
        assert!(t.insert_entry(7, 1, 1).unwrap_err().contains("full"));
        assert_eq!(
            t.entries()[0],
            Entry {
                slot: 0,
                key: 5,
                count: 7,
                last_seen: 9
            }
        );
        assert_eq!(t.admitted(), 1);
        assert_eq!(t.stats(), Stats::default());
        check_invariants(&t);
    }

    #[test]
    fn resharding_preserves_entries() {
        let cap = 300;
        let stream = gen_stream(5, 5000, 2000);
        let mut a = HashShard::new(cap, 3, Evict::Ttl(5)).unwrap();
        run(&mut a, &stream);
        let mut entries = a.entries();
        assert!(entries.len() > 100);
        let last_step = stream.last().unwrap().0;
        let want: BTreeSet<(u64, u32, u64)> = entries
            .iter()
            .map(|e| (e.key, e.count, e.last_seen))
            .collect();
        entries.sort_by_key(|e| e.key);
        let table = 3;
        for q in 1..=4usize {
            let mut parts: Vec<HashShard> = (0..q)
                .map(|_| HashShard::new(cap, 3, Evict::Ttl(5)).unwrap())
                .collect();
            for e in &entries {
                let r = owner(e.key, table, q);
                parts[r].insert_entry(e.key, e.count, e.last_seen).unwrap();
            }
            let mut got = BTreeSet::new();
            for (r, p) in parts.iter().enumerate() {
                for (i, e) in p.entries().iter().enumerate() {
                    assert_eq!(e.slot as usize, i, "slots fill from 0");
                    assert_eq!(owner(e.key, table, q), r);
                    assert!(got.insert((e.key, e.count, e.last_seen)));
                }
                check_invariants(p);
            }
            assert_eq!(got, want, "q = {q}");
            for e in &entries {
                let p = &parts[owner(e.key, table, q)];
                let old = a.get(e.key, last_step).is_some();
                assert_eq!(p.get(e.key, last_step).is_some(), old);
            }
        }
    }

    #[test]
    fn owner_in_range_and_balanced() {
        for p in 2..=4usize {
            for table in [0usize, 1, 25] {
                for criteo in [false, true] {
                    let mut n = vec![0usize; p];
                    for i in 0..100_000u64 {
                        let key = if criteo { mix64(i) & 0xffff_ffff } else { i };
                        let r = owner(key, table, p);
                        assert!(r < p);
                        n[r] += 1;
                    }
                    let mean = 100_000.0 / p as f64;
                    for &c in &n {
                        assert!((c as f64 - mean).abs() < 0.1 * mean, "p {p}: {n:?}");
                    }
                }
            }
        }
        let mut rng = Sm(3);
        for _ in 0..10_000 {
            let p = 1 + rng.below(1000) as usize;
            let (key, table) = (rng.next(), rng.below(40) as usize);
            let r = owner(key, table, p);
            assert!(r < p);
            assert_eq!(r, owner(key, table, p));
        }
        assert_eq!(owner(u64::MAX, 0, 1), 0);
        assert_eq!(owner(0, 7, 1), 0);
        // The table salt decorrelates tables: about 1/4 agreement at p = 4.
        let same = (0..10_000u64)
            .filter(|&k| owner(k, 0, 4) == owner(k, 1, 4))
            .count();
        assert!((2000..3000).contains(&same), "{same}");
    }

    #[test]
    fn evict_parse_display() {
        for e in [
            Evict::Lfu,
            Evict::Ttl(1),
            Evict::Ttl(5),
            Evict::Ttl(u64::MAX),
        ] {
            let s = e.to_string();
            assert_eq!(Evict::parse(&s), Ok(e));
        }
        assert_eq!(Evict::Ttl(5).to_string(), "ttl:5");
        assert_eq!(Evict::Lfu.to_string(), "lfu");
        assert_eq!(Evict::default(), Evict::Lfu);
        for bad in [
            "",
            "LFU",
            "lru",
            "ttl",
            "ttl:",
            "ttl:0",
            "ttl:-1",
            "ttl:+5",
            "ttl:5x",
            "ttl: 5",
            " lfu",
            "ttl:99999999999999999999",
        ] {
            let err = Evict::parse(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }
}
