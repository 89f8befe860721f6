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
mod tests;
