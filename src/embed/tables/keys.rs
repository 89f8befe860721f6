//! From a feature's ids to the rows the exchange looks up, per table's
//! [`VocabKind`]:
//!
//! - `fixed`: the ids are the rows `0..vocab` (a 64-bit id of a click log from
//!   `prepare clicks` must be below `vocab`);
//! - `modulo`: row `id mod vocab` (the hashing trick: distinct ids may share a row);
//! - `hash`: a hash table of `vocab` rows over all ranks, keyed by the raw 64-bit
//!   id ([`super::hashtab`]). The table is placed row-cyclic over ranks `0..P`: slot
//!   `s` of rank `o` is the table's row `s * P + o`, so once every key of a step is
//!   resolved to its row, the exchange, the optimizer, checkpoints of the rows and the
//!   output modes treat it as any row-cyclic table.
//!
//! Resolution ([`global_resolve`], collective) happens once per optimizer step, over
//! all of the step's micro-batches, before the lookup: each rank deduplicates its
//! keys per table and counts their occurrences, sends `(key, count)` to the key's
//! owner ([`owner`]) in one all-to-all-v for all hash tables, and each owner resolves
//! them in rank order of the senders (so the result does not depend on timing:
//! counts, admission, eviction and the rows (re)initialized for new keys), answering
//! with the row, or [`NO_ROW`] for a key not admitted (yet) or refused by a full
//! table. A key without a row looks up nothing: it is left out of its bag (a sum
//! pools zeros for it; a mean is taken over the rows found) and it gets no gradient.
//! Evaluation resolves read-only ([`Resolve::Lookup`]): unknown keys look up
//! nothing, counts do not move.

use super::hashtab::{owner, Stats};
use super::placement::{Placement, Plan};
use super::store::{init_row, Store};
use crate::comm::{Comm, Received};
use crate::data::clicks::batch::{Bags, Batch, KeyBags};
use crate::rng::mix64;
use crate::spec::{ModelSpec, VocabKind};
use crate::{Error, Result};

/// The answer for a key without a row.
pub const NO_ROW: u32 = u32::MAX;

/// What one table's ids need before the lookup, given what the data holds (u32 ids
/// below the data's vocabulary, or raw 64-bit keys) and the model's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// Rows already (the default path: a generated or v1 log into a fixed table at
    /// least as large as the data's id space).
    Keep,
    /// u32 ids that must be checked against a smaller fixed vocabulary.
    CheckBelow(u64),
    /// u32 ids or 64-bit keys, reduced mod `vocab`.
    Modulo(u64),
    /// 64-bit keys that must be rows below `vocab`.
    KeysAsRows(u64),
    /// A hash table: u32 ids become keys (the data's ids are the keys).
    ToKeys,
    /// A hash table over keys the data already holds.
    Keys,
}

/// How each table's ids become rows (built once per run from the data and the model).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdMap {
    actions: Vec<Action>,
    names: Vec<String>,
}

impl IdMap {
    /// `data`: the model the examples were generated for (its vocabularies bound the
    /// u32 ids), `keyed`: the examples carry 64-bit keys (a `prepare clicks` log).
    pub fn new(data: &ModelSpec, model: &ModelSpec, keyed: bool) -> Result<IdMap> {
        if data.tables.len() != model.tables.len() || data.n_dense != model.n_dense {
            return Err(Error::Config(format!(
                "the model has {} tables and {} dense features, the data {} and {}",
                model.tables.len(),
                model.n_dense,
                data.tables.len(),
                data.n_dense
            )));
        }
        let actions = data
            .tables
            .iter()
            .zip(&model.tables)
            .map(|(d, m)| match (m.vocab_kind, keyed) {
                (VocabKind::Hash, true) => Action::Keys,
                (VocabKind::Hash, false) => Action::ToKeys,
                (VocabKind::Modulo, _) => Action::Modulo(m.vocab),
                (VocabKind::Fixed, true) => Action::KeysAsRows(m.vocab),
                (VocabKind::Fixed, false) if m.vocab >= d.vocab => Action::Keep,
                (VocabKind::Fixed, false) => Action::CheckBelow(m.vocab),
            })
            .collect();
        Ok(IdMap {
            actions,
            names: model.tables.iter().map(|t| t.name.clone()).collect(),
        })
    }

    /// Nothing to do for any table.
    pub fn is_identity(&self) -> bool {
        self.actions.iter().all(|a| *a == Action::Keep)
    }

    /// Turn `batch`'s ids into rows (fixed and modulo tables) or keys (hash tables,
    /// whose rows [`global_resolve`] fills in). `what` names the examples in errors.
    pub fn apply(&self, batch: &mut Batch, what: &dyn Fn() -> String) -> Result<()> {
        if self.is_identity() {
            return Ok(());
        }
        let tables = self.actions.len();
        if batch.keys.len() < tables {
            batch.keys.resize_with(tables, KeyBags::default);
        }
        for (t, &a) in self.actions.iter().enumerate() {
            let (bags, keys) = (&mut batch.bags[t], &mut batch.keys[t]);
            let bad = |e: usize, id: u64, vocab: u64| {
                let keyed = if a == Action::KeysAsRows(vocab) {
                    "; the examples hold raw 64-bit ids, not rows"
                } else {
                    ""
                };
                Error::Config(format!(
                    "{}: table {:?}: id {id} of example {e} of the step is not below its vocab {vocab} (a fixed vocabulary{keyed}; use --vocab modulo or hash)",
                    what(),
                    self.names[t]
                ))
            };
            match a {
                Action::Keep => {}
                Action::CheckBelow(v) => {
                    if let Some(i) = bags.ids.iter().position(|&id| id as u64 >= v) {
                        let e = bags.offsets.partition_point(|&o| o as usize <= i) - 1;
                        return Err(bad(e, bags.ids[i] as u64, v));
                    }
                }
                Action::Modulo(v) => {
                    if keys.offsets.is_empty() {
                        bags.ids
                            .iter_mut()
                            .for_each(|id| *id = (*id as u64 % v) as u32);
                    } else {
                        bags.offsets.clone_from(&keys.offsets);
                        bags.ids.clear();
                        bags.ids.extend(keys.ids.iter().map(|&k| (k % v) as u32));
                    }
                }
                Action::KeysAsRows(v) => {
                    if let Some(i) = keys.ids.iter().position(|&k| k >= v) {
                        let e = keys.offsets.partition_point(|&o| o as usize <= i) - 1;
                        return Err(bad(e, keys.ids[i], v));
                    }
                    bags.offsets.clone_from(&keys.offsets);
                    bags.ids.clear();
                    bags.ids.extend(keys.ids.iter().map(|&k| k as u32));
                }
                Action::ToKeys => {
                    keys.offsets.clone_from(&bags.offsets);
                    keys.ids.clear();
                    keys.ids.extend(bags.ids.iter().map(|&id| id as u64));
                }
                Action::Keys => {}
            }
            // Keys stay only where a hash table resolves them.
            if !matches!(a, Action::ToKeys | Action::Keys) && !keys.offsets.is_empty() {
                *keys = KeyBags::default();
            }
        }
        Ok(())
    }
}

/// Train (count, admit, evict) or only look up (evaluation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolve {
    Train { step: u64 },
    Lookup { step: u64 },
}

/// What a resolution did on this rank (summed over the hash tables).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ResolveCounts {
    /// Key occurrences in this rank's batch.
    pub occurrences: u64,
    /// Distinct keys this rank sent to owners.
    pub sent: u64,
    /// Of the keys this rank sent, those that came back without a row.
    pub no_row: u64,
}

impl std::ops::AddAssign for ResolveCounts {
    fn add_assign(&mut self, o: Self) {
        self.occurrences += o.occurrences;
        self.sent += o.sent;
        self.no_row += o.no_row;
    }
}

/// One slot of a [`KeyIndex`]: key, value and the generation that wrote them, side by
/// side (one cache line holds four, so a probe costs one memory access).
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    key: u64,
    val: u32,
    gen: u32,
}

/// How many keys ahead a dedup pass asks the cache for a key's home slot.
const PREFETCH_AHEAD: usize = 16;

/// A map from 64-bit keys to first-seen positions: open addressing, linear probing,
/// a power-of-two number of slots in use (`mask + 1`), at most half of them full (it
/// doubles past that). A slot is empty unless written in the current generation, so
/// [`KeyIndex::start`] empties the map without touching it.
#[derive(Debug, Default)]
struct KeyIndex {
    slots: Vec<Slot>,
    mask: usize,
    gen: u32,
    len: usize,
}

impl KeyIndex {
    /// Empty, ready for about `n` distinct keys (more make it grow).
    fn start(&mut self, n: usize) {
        let cap = (2 * n.max(8)).next_power_of_two();
        if self.slots.len() < cap {
            self.slots = vec![Slot::default(); cap];
            self.gen = 0;
        }
        self.gen = self.gen.wrapping_add(1);
        if self.gen == 0 {
            // After 2^32 - 1 generations: forget them all.
            self.slots.fill(Slot::default());
            self.gen = 1;
        }
        self.mask = cap - 1;
        self.len = 0;
    }

    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        (mix64(key) as usize) & self.mask
    }

    /// Ask the cache for the home slot of `key` (a later probe then finds it near).
    #[inline(always)]
    fn prefetch(&self, key: u64) {
        super::hashtab::prefetch(&self.slots[self.home(key)]);
    }

    /// [`KeyIndex::prefetch`] of the key [`PREFETCH_AHEAD`] past position `i` of
    /// `keys` (none past the end), for a pass that inserts `keys` in order.
    #[inline(always)]
    fn prefetch_ahead(&self, keys: &[u64], i: usize) {
        if let Some(&k) = keys.get(i + PREFETCH_AHEAD) {
            self.prefetch(k);
        }
    }

    /// The value of `key`, or `next` (recorded) when it is new.
    #[inline]
    fn get_or_insert(&mut self, key: u64, next: u32) -> u32 {
        let mut h = self.home(key);
        loop {
            let s = &mut self.slots[h];
            if s.gen != self.gen {
                *s = Slot {
                    key,
                    val: next,
                    gen: self.gen,
                };
                self.len += 1;
                if 2 * self.len > self.mask + 1 {
                    self.grow();
                }
                return next;
            }
            if s.key == key {
                return s.val;
            }
            h = (h + 1) & self.mask;
        }
    }

    /// Twice the slots in use, the entries kept (a new generation holds them).
    #[cold]
    fn grow(&mut self) {
        let held: Vec<(u64, u32)> = self.slots[..=self.mask]
            .iter()
            .filter(|s| s.gen == self.gen)
            .map(|s| (s.key, s.val))
            .collect();
        self.start(self.mask + 1);
        for (key, val) in held {
            self.get_or_insert(key, val);
        }
    }
}

/// Buffers of [`global_resolve`], kept across steps.
#[derive(Debug, Default)]
pub struct ResolveBufs {
    index: KeyIndex,
    /// Per hash table (in table order): distinct keys, their counts, and each
    /// occurrence's index into them.
    distinct: Vec<Vec<u64>>,
    counts: Vec<Vec<u32>>,
    occ: Vec<Vec<u32>>,
    /// Per hash table: each distinct key's owner, and its position among the keys
    /// of that table sent to that owner.
    dest_of: Vec<Vec<u32>>,
    pos: Vec<Vec<u32>>,
    dest: Vec<u32>,
    rows: Vec<u32>,
    /// Owner side: the step's distinct keys of one table, their summed counts and
    /// rows, and each received pair's distinct key (then its row).
    own_keys: Vec<u64>,
    own_counts: Vec<u32>,
    own_rows: Vec<u32>,
    pair_key: Vec<u32>,
    send: Vec<u64>,
    recv: Received<u64>,
    reply: Vec<u32>,
    answers: Received<u32>,
    fresh: Vec<(u32, u64)>,
}

/// The initial row of `key` of hash table `t`: the row a fixed table of `capacity`
/// rows gives id `key` ([`init_row`]: uniform in `±sqrt(1/capacity)`, drawn from
/// (seed, table, key)), so that it depends neither on the placement, the slot nor
/// when the key arrived, and a hash table over an id space it holds whole starts as
/// the fixed table does.
pub fn init_key_row(seed: u64, t: usize, capacity: u64, key: u64, out: &mut [f32]) {
    let w = out.len();
    init_row(seed, t, capacity, key, out, 0..w);
}

/// The ranks that hold hash table `t`'s keys, in the plan's order: a key goes to
/// `ranks[owner(key, t, ranks.len())]`, and slot `s` of `ranks[j]` is row
/// `s * ranks.len() + j` (one rank for a table-wise placement).
pub fn key_ranks(plan: &Plan, t: usize) -> &[usize] {
    match &plan.tables[t] {
        Placement::Table { rank } => std::slice::from_ref(rank),
        Placement::RowCyclic { ranks } => ranks,
        p => panic!(
            "hash table {t} placed {}: refused when the store was built",
            p.kind()
        ),
    }
}

/// The hash tables of `store`'s model, in table order.
pub fn hash_tables(spec: &ModelSpec) -> Vec<usize> {
    (0..spec.tables.len())
        .filter(|&t| spec.tables[t].vocab_kind == VocabKind::Hash)
        .collect()
}

/// Collective: every rank must call (with its own batch, possibly empty). Resolve
/// every key of `batch`'s hash tables to its row at the owners and write the rows
/// into `batch.bags` (keys without a row are left out of their bags).
///
/// Phases: 1. the distinct keys per table ([`local_distinct_keys`]); 2. one request
/// per owner ([`local_pack_requests`]), sent in one all-to-all-v; 3. the owners
/// resolve each distinct key once ([`local_check_requests`], [`local_resolve_table`])
/// and answer ([`local_pack_answers`]) in a second one; 4. the rows into the bags
/// ([`local_rows_into_bags`]).
pub fn global_resolve<C: Comm>(
    comm: &C,
    store: &mut Store,
    batch: &mut Batch,
    how: Resolve,
    b: &mut ResolveBufs,
) -> Result<ResolveCounts> {
    let hts = hash_tables(&store.spec);
    let mut counts = ResolveCounts::default();
    if hts.is_empty() {
        return Ok(counts);
    }
    let _phase = comm.stats().phase("resolve");
    let (p, me) = (comm.size(), comm.rank());
    let h = hts.len();
    b.distinct.resize_with(h, Vec::new);
    b.counts.resize_with(h, Vec::new);
    b.occ.resize_with(h, Vec::new);
    b.pos.resize_with(h, Vec::new);
    b.dest_of.resize_with(h, Vec::new);

    // 1. Distinct keys per table with their occurrence counts, in first-seen order.
    local_distinct_keys(&hts, batch, b, &mut counts);

    // 2. One message per owner: per hash table a count, then for each table its
    // (key, count) pairs in first-seen order.
    let (sent_to, send_counts) = local_pack_requests(store, &hts, p, b);
    comm.all_to_all_v_into(&b.send, &send_counts, &mut b.recv)?;

    // 3. Owners resolve each distinct key of the step once, with its occurrences
    // summed over the senders (in first-seen order: senders in rank order), and
    // answer every sender with the same row.
    let pairs_from = local_check_requests(&b.recv, &hts, p)?;
    // Per received pair (senders in rank order within each table), its distinct key.
    b.pair_key.clear();
    let mut pair_start = vec![0usize; p * h];
    for (j, &t) in hts.iter().enumerate() {
        let total: usize = (0..p).map(|src| pairs_from[src * h + j].1).sum();
        if total == 0 {
            for src in 0..p {
                pair_start[src * h + j] = b.pair_key.len();
            }
            continue;
        }
        local_resolve_table(store, t, j, h, how, me, &pairs_from, &mut pair_start, b)?;
    }
    let reply_counts = local_pack_answers(&pairs_from, &pair_start, p, h, b);
    comm.all_to_all_v_into(&b.reply, &reply_counts, &mut b.answers)?;

    // 4. Rows into the bags, in the order of the occurrences.
    local_rows_into_bags(&hts, batch, &sent_to, p, b, &mut counts)?;
    Ok(counts)
}

/// Phase 1 of [`global_resolve`]: per hash table (index `j` in `hts`), the batch's
/// distinct keys in first-seen order with their occurrence counts, and each
/// occurrence's index into them.
fn local_distinct_keys(
    hts: &[usize],
    batch: &Batch,
    b: &mut ResolveBufs,
    counts: &mut ResolveCounts,
) {
    for (j, &t) in hts.iter().enumerate() {
        let keys = batch.keys.get(t).map(|k| &k.ids[..]).unwrap_or(&[]);
        counts.occurrences += keys.len() as u64;
        let (distinct, cnt, occ) = (&mut b.distinct[j], &mut b.counts[j], &mut b.occ[j]);
        // Sized for the table's distinct keys of the last call (a quarter of the
        // occurrences the first time), at most the occurrences: a smaller index stays
        // in the cache.
        let last = distinct.len();
        let hint = if last == 0 {
            keys.len() / 4
        } else {
            last + last / 4
        };
        b.index.start(hint.min(keys.len()));
        distinct.clear();
        cnt.clear();
        occ.clear();
        for (x, &k) in keys.iter().enumerate() {
            b.index.prefetch_ahead(keys, x);
            let next = distinct.len() as u32;
            let i = b.index.get_or_insert(k, next);
            if i == next {
                distinct.push(k);
                cnt.push(1);
            } else {
                cnt[i as usize] = cnt[i as usize].saturating_add(1);
            }
            occ.push(i);
        }
        counts.sent += distinct.len() as u64;
    }
}

/// Phase 2 of [`global_resolve`]: each distinct key's owner and position among the
/// keys of its table sent there (`b.dest_of`, `b.pos`), and the request in `b.send`:
/// per owner a header of one count per hash table, then per table its (key, count)
/// pairs. Returns the keys sent to each owner `o` of each table `j` (at `o * h + j`)
/// and the values sent to each owner.
fn local_pack_requests(
    store: &Store,
    hts: &[usize],
    p: usize,
    b: &mut ResolveBufs,
) -> (Vec<usize>, Vec<usize>) {
    let h = hts.len();
    let mut sent_to = vec![0usize; p * h];
    for j in 0..h {
        let t = hts[j];
        b.dest.clear();
        b.pos[j].clear();
        let n = b.distinct[j].len();
        match key_ranks(&store.plan, t) {
            // One owner (a table-wise placement): every key goes there, in order.
            &[o] => {
                b.dest.resize(n, o as u32);
                b.pos[j].extend(0..n as u32);
                sent_to[o * h + j] = n;
            }
            ranks => {
                b.dest.extend(
                    b.distinct[j]
                        .iter()
                        .map(|&k| ranks[owner(k, t, ranks.len())] as u32),
                );
                for &o in &b.dest {
                    let c = &mut sent_to[o as usize * h + j];
                    b.pos[j].push(*c as u32);
                    *c += 1;
                }
            }
        }
        std::mem::swap(&mut b.dest, &mut b.dest_of[j]);
    }
    let mut send_counts = Vec::with_capacity(p);
    // Where table `j`'s pairs start in the message to owner `o` (at `o * h + j`).
    let mut pairs_at = vec![0usize; p * h];
    let mut at = 0;
    for o in 0..p {
        let start = at;
        at += h;
        for j in 0..h {
            pairs_at[o * h + j] = at;
            at += 2 * sent_to[o * h + j];
        }
        send_counts.push(at - start);
    }
    b.send.clear();
    b.send.resize(at, 0);
    for o in 0..p {
        let hdr = pairs_at[o * h] - h;
        for j in 0..h {
            b.send[hdr + j] = sent_to[o * h + j] as u64;
        }
    }
    for j in 0..h {
        for (i, (&k, &c)) in b.distinct[j].iter().zip(&b.counts[j]).enumerate() {
            let o = b.dest_of[j][i] as usize;
            let x = pairs_at[o * h + j] + 2 * b.pos[j][i] as usize;
            b.send[x] = k;
            b.send[x + 1] = c as u64;
        }
    }
    (sent_to, send_counts)
}

/// Phase 3 of [`global_resolve`], first part: check each sender's request against
/// its header. Returns, per sender `src` and table `j` (at `src * h + j`), where its
/// pairs start in `recv.data` and how many there are.
fn local_check_requests(
    recv: &Received<u64>,
    hts: &[usize],
    p: usize,
) -> Result<Vec<(usize, usize)>> {
    let h = hts.len();
    let recv_off = recv.offsets();
    let mut pairs_from = vec![(0usize, 0usize); p * h];
    for src in 0..p {
        let (lo, hi) = (recv_off[src], recv_off[src + 1]);
        if hi - lo < h {
            return Err(Error::Comm(format!(
                "key resolution: rank {src} sent {} values, fewer than its {h}-table header",
                hi - lo
            )));
        }
        let mut x = lo + h;
        for (j, &t) in hts.iter().enumerate() {
            let n = recv.data[lo + j] as usize;
            if x + 2 * n > hi {
                return Err(Error::Comm(format!(
                    "key resolution: rank {src} announced {n} keys of table {t}, sent fewer"
                )));
            }
            pairs_from[src * h + j] = (x, n);
            x += 2 * n;
        }
        if x != hi {
            return Err(Error::Comm(format!(
                "key resolution: rank {src} sent {} values past its announced keys",
                hi - x
            )));
        }
    }
    Ok(pairs_from)
}

/// Phase 3 of [`global_resolve`], the owner's part for hash table `t` (index `j` of
/// `h`): each distinct key of the step resolved once, with its counts summed over the
/// senders in rank order (new rows initialized when training), and every received
/// pair's row appended to `b.pair_key` (where sender `src`'s start: `pair_start`).
#[allow(clippy::too_many_arguments)]
fn local_resolve_table(
    store: &mut Store,
    t: usize,
    j: usize,
    h: usize,
    how: Resolve,
    me: usize,
    pairs_from: &[(usize, usize)],
    pair_start: &mut [usize],
    b: &mut ResolveBufs,
) -> Result<()> {
    let p = pair_start.len() / h;
    let total: usize = (0..p).map(|src| pairs_from[src * h + j].1).sum();
    let ranks = key_ranks(&store.plan, t);
    let (k, j_me) = (ranks.len() as u64, ranks.iter().position(|&r| r == me));
    let j_me = j_me.ok_or_else(|| {
        Error::Comm(format!(
            "key resolution: keys of table {t} came to rank {me}, which holds none"
        ))
    })? as u64;
    let li = store.hash_local(t)?;
    b.own_keys.clear();
    b.own_counts.clear();
    b.index.start(total);
    for src in 0..p {
        pair_start[src * h + j] = b.pair_key.len();
        let (x, n) = pairs_from[src * h + j];
        let pairs = &b.recv.data[x..x + 2 * n];
        for (y, pair) in pairs.chunks_exact(2).enumerate() {
            if let Some(&ahead) = pairs.get(2 * (y + PREFETCH_AHEAD)) {
                b.index.prefetch(ahead);
            }
            let next = b.own_keys.len() as u32;
            let i = b.index.get_or_insert(pair[0], next);
            if i == next {
                b.own_keys.push(pair[0]);
                b.own_counts.push(0);
            }
            let c = &mut b.own_counts[i as usize];
            *c = c.saturating_add(pair[1].min(u32::MAX as u64) as u32);
            b.pair_key.push(i);
        }
    }
    let cap = store.spec.tables[t].vocab;
    let seed = store.seed;
    let sp = store.state_per_row(t);
    let shard = store.hash[t]
        .as_mut()
        .ok_or_else(|| Error::Comm(format!("table {t} has no hash shard on rank {me}")))?;
    let ls = &mut store.local[li];
    let w = ls.shard.width();
    b.own_rows.clear();
    // The shard's probes are random accesses: ask for a bucket 16 keys ahead and, once
    // it is near, for its entry 8 keys ahead.
    let keys = &b.own_keys;
    for (i, (&key, &c)) in keys.iter().zip(&b.own_counts).enumerate() {
        if let Some(&k) = keys.get(i + 16) {
            shard.prefetch_bucket(k);
        }
        if let Some(&k) = keys.get(i + 8) {
            shard.prefetch_entry(k);
        }
        let slot = match how {
            Resolve::Train { step } => {
                b.fresh.clear();
                let r = shard.resolve(key, c, step, &mut b.fresh);
                for &(fs, fk) in &b.fresh {
                    let fs = fs as usize;
                    init_key_row(seed, t, cap, fk, &mut ls.data[fs * w..(fs + 1) * w]);
                    ls.state[fs * sp..(fs + 1) * sp].fill(0.0);
                }
                r
            }
            Resolve::Lookup { step } => shard.get(key, step),
        };
        b.own_rows.push(match slot {
            Some(s) => (s as u64 * k + j_me) as u32,
            None => NO_ROW,
        });
    }
    // Rows by pair, in place of the distinct indices.
    let start = pair_start[j];
    for i in &mut b.pair_key[start..] {
        *i = b.own_rows[*i as usize];
    }
    Ok(())
}

/// Phase 3 of [`global_resolve`], last part: the answer to each sender in `b.reply`
/// (its pairs' rows, table after table). Returns the values sent to each sender.
fn local_pack_answers(
    pairs_from: &[(usize, usize)],
    pair_start: &[usize],
    p: usize,
    h: usize,
    b: &mut ResolveBufs,
) -> Vec<usize> {
    b.reply.clear();
    let mut reply_counts = Vec::with_capacity(p);
    for src in 0..p {
        let start = b.reply.len();
        for j in 0..h {
            let (s0, n) = (pair_start[src * h + j], pairs_from[src * h + j].1);
            b.reply.extend_from_slice(&b.pair_key[s0..s0 + n]);
        }
        reply_counts.push(b.reply.len() - start);
    }
    reply_counts
}

/// Phase 4 of [`global_resolve`]: check each owner's answer against what was asked
/// (`sent_to`), and write the rows into `batch.bags` in the order of the occurrences
/// (keys without a row left out).
fn local_rows_into_bags(
    hts: &[usize],
    batch: &mut Batch,
    sent_to: &[usize],
    p: usize,
    b: &mut ResolveBufs,
    counts: &mut ResolveCounts,
) -> Result<()> {
    let h = hts.len();
    let ans_off = b.answers.offsets();
    // Where table `j`'s answers start in owner `o`'s reply (at `o * h + j`).
    let mut answers_at = vec![0usize; p * h];
    for o in 0..p {
        let asked: usize = sent_to[o * h..(o + 1) * h].iter().sum();
        if ans_off[o + 1] - ans_off[o] != asked {
            return Err(Error::Comm(format!(
                "key resolution: rank {o} answered {} keys, {asked} were asked",
                ans_off[o + 1] - ans_off[o]
            )));
        }
        let mut acc = ans_off[o];
        for j in 0..h {
            answers_at[o * h + j] = acc;
            acc += sent_to[o * h + j];
        }
    }
    for (j, &t) in hts.iter().enumerate() {
        b.rows.clear();
        b.rows.extend((0..b.distinct[j].len()).map(|i| {
            b.answers.data[answers_at[b.dest_of[j][i] as usize * h + j] + b.pos[j][i] as usize]
        }));
        let rows = &b.rows;
        counts.no_row += rows.iter().filter(|&&r| r == NO_ROW).count() as u64;
        let no_keys = KeyBags::default();
        let keys = batch.keys.get(t).unwrap_or(&no_keys);
        let bags: &mut Bags = &mut batch.bags[t];
        bags.offsets.clear();
        bags.ids.clear();
        bags.offsets.push(0);
        let occ = &b.occ[j];
        for e in 0..keys.len() {
            let (lo, hi) = (keys.offsets[e] as usize, keys.offsets[e + 1] as usize);
            for &i in &occ[lo..hi] {
                let r = rows[i as usize];
                if r != NO_ROW {
                    bags.ids.push(r);
                }
            }
            bags.offsets.push(bags.ids.len() as u32);
        }
        if keys.offsets.is_empty() {
            // No keys for this table in this batch: one empty bag per example.
            bags.offsets.resize(batch.n + 1, 0);
        }
    }
    Ok(())
}

/// Every hash shard's counters on this rank, summed.
pub fn local_stats(store: &Store) -> Stats {
    let mut s = Stats::default();
    for h in store.hash.iter().flatten() {
        let x = h.stats();
        s.inserted += x.inserted;
        s.evicted += x.evicted;
        s.expired += x.expired;
        s.refused += x.refused;
    }
    s
}

/// For statistics only: each hash table's keys as rows `mix(key) mod capacity` (a
/// key's row is not known before it is resolved, but keys spread over the table's
/// rows as they spread over its owners, which is what the planner's costs need).
pub fn pseudo_rows(spec: &ModelSpec, batch: &mut Batch) {
    for t in hash_tables(spec) {
        let Some(keys) = batch.keys.get(t) else {
            continue;
        };
        let v = spec.tables[t].vocab;
        let bags = &mut batch.bags[t];
        bags.offsets.clone_from(&keys.offsets);
        bags.ids.clear();
        bags.ids.extend(
            keys.ids
                .iter()
                .map(|&k| (mix64(k ^ mix64(t as u64)) % v) as u32),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::clicks::gen::ClickGen;
    use crate::spec::{preset, Evict, Pooling, TableSpec, ValencyDist};

    fn table(name: &str, vocab: u64, kind: VocabKind) -> TableSpec {
        TableSpec {
            name: name.into(),
            vocab,
            dim: 2,
            pooling: Pooling::Sum,
            valency: 2.0,
            valency_dist: ValencyDist::Poisson,
            vocab_kind: kind,
            admit_after: 1,
            evict: Evict::Lfu,
        }
    }

    fn spec(tables: Vec<TableSpec>) -> ModelSpec {
        ModelSpec {
            table_dtype: Default::default(),
            arch: Default::default(),
            n_dense: 1,
            hidden: vec![4],
            zipf: 1.05,
            tables,
        }
    }

    fn bags<I: Copy>(b: &[&[I]]) -> Bags<I> {
        let mut out = Bags {
            offsets: vec![0],
            ids: Vec::new(),
        };
        for bag in b {
            out.ids.extend_from_slice(bag);
            out.offsets.push(out.ids.len() as u32);
        }
        out
    }

    /// A batch of `n` examples with these ids (one `Bags` per table) and keys (one
    /// `KeyBags` per table, or none).
    fn batch(n: usize, ids: Vec<Bags>, keys: Vec<KeyBags>) -> Batch {
        Batch {
            n,
            n_dense: 1,
            dense: vec![0.25; n],
            labels: vec![1.0; n],
            bags: ids,
            keys,
        }
    }

    fn what() -> String {
        "the examples".into()
    }

    #[test]
    fn the_key_index_keeps_first_positions_through_growth_and_generations() {
        let keys: Vec<u64> = (0..10_000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i << 60))
            .collect();
        let mut ix = KeyIndex::default();
        // Sized for 8: grows many times; every key seen twice keeps its first position.
        ix.start(8);
        for (p, &k) in keys.iter().enumerate() {
            ix.prefetch_ahead(&keys, p);
            assert_eq!(ix.get_or_insert(k, p as u32), p as u32);
        }
        for (p, &k) in keys.iter().enumerate() {
            assert_eq!(ix.get_or_insert(k, u32::MAX - 1), p as u32, "key {k}");
        }
        assert_eq!(ix.len, keys.len());
        assert!(2 * ix.len <= ix.mask + 1);
        // A new generation forgets them, in a smaller part of the same slots as well;
        // keys 0 and u64::MAX are keys like any other.
        for n in [10_000, 4] {
            ix.start(n);
            assert_eq!(ix.len, 0);
            assert_eq!(ix.get_or_insert(keys[5], 7), 7);
            assert_eq!(ix.get_or_insert(0, 8), 8);
            assert_eq!(ix.get_or_insert(u64::MAX, 9), 9);
            assert_eq!(ix.get_or_insert(keys[5], 1), 7);
            assert_eq!(ix.get_or_insert(0, 1), 8);
        }
        // The generation counter wrapping around empties every slot.
        ix.gen = u32::MAX;
        ix.start(4);
        assert_eq!(ix.gen, 1);
        assert_eq!(ix.get_or_insert(keys[5], 3), 3);
    }

    #[test]
    fn modulo_reduces_u32_ids() {
        let data = spec(vec![table("m", 1000, VocabKind::Fixed)]);
        let model = spec(vec![table("m", 7, VocabKind::Modulo)]);
        let ids = IdMap::new(&data, &model, false).unwrap();
        assert!(!ids.is_identity());
        let mut b = batch(3, vec![bags(&[&[0, 6, 7][..], &[], &[999, 13]])], vec![]);
        ids.apply(&mut b, &what).unwrap();
        assert_eq!(b.bags[0], bags(&[&[0, 6, 0][..], &[], &[5, 6]]));
        // No keys stay behind for a table that is not a hash table.
        assert_eq!(b.keys, vec![KeyBags::default()]);
    }

    #[test]
    fn modulo_reduces_64_bit_keys() {
        let data = spec(vec![table("m", 1000, VocabKind::Fixed)]);
        let model = spec(vec![table("m", 7, VocabKind::Modulo)]);
        let ids = IdMap::new(&data, &model, true).unwrap();
        let keys = bags(&[&[u64::MAX, 7][..], &[1 << 40], &[], &[3]]);
        // The rows before the mapping are meaningless (a keyed log's).
        let stale = bags(&[&[1u32][..], &[2], &[3], &[4]]);
        let mut b = batch(4, vec![stale], vec![keys]);
        ids.apply(&mut b, &what).unwrap();
        let want = [u64::MAX % 7, 0, (1u64 << 40) % 7, 3].map(|k| k as u32);
        assert_eq!(b.bags[0], bags(&[&want[..2], &want[2..3], &[], &want[3..]]));
        assert_eq!(b.keys, vec![KeyBags::default()]);
    }

    #[test]
    fn fixed_tables_take_keys_below_their_vocab_as_rows_and_refuse_others() {
        let data = spec(vec![table("x", 5000, VocabKind::Fixed)]);
        let model = spec(vec![table("x", 1000, VocabKind::Fixed)]);
        let ids = IdMap::new(&data, &model, true).unwrap();
        let keys = bags(&[&[0u64, 999][..], &[], &[5]]);
        let mut b = batch(3, vec![Bags::default()], vec![keys]);
        ids.apply(&mut b, &what).unwrap();
        assert_eq!(b.bags[0], bags(&[&[0, 999][..], &[], &[5]]));
        assert_eq!(b.keys, vec![KeyBags::default()]);

        // Key 1000 of example 2 (example 1 is empty): named with its table.
        let keys = bags(&[&[3u64][..], &[], &[4, 1000], &[u64::MAX]]);
        let mut b = batch(4, vec![Bags::default()], vec![keys]);
        let e = ids.apply(&mut b, &what).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Config(_)), "{e:?}");
        for part in [
            "the examples",
            "table \"x\"",
            "id 1000 ",
            "example 2 ",
            "vocab 1000",
        ] {
            assert!(msg.contains(part), "{part:?} not in {msg}");
        }
        // The first example holds the key.
        let keys = bags(&[&[u64::MAX][..]]);
        let mut b = batch(1, vec![Bags::default()], vec![keys]);
        let msg = ids.apply(&mut b, &what).unwrap_err().to_string();
        assert!(
            msg.contains(&format!("id {} of example 0 ", u64::MAX)),
            "{msg}"
        );
    }

    #[test]
    fn fixed_u32_ids_into_a_smaller_vocab_are_checked() {
        let data = spec(vec![
            table("big", 100, VocabKind::Fixed),
            table("small", 100, VocabKind::Fixed),
        ]);
        let model = spec(vec![
            table("big", 100, VocabKind::Fixed),
            table("small", 10, VocabKind::Fixed),
        ]);
        let ids = IdMap::new(&data, &model, false).unwrap();
        assert!(!ids.is_identity());
        // Ids below 10: left as they are.
        let ok = vec![bags(&[&[99][..], &[50]]), bags(&[&[0, 9][..], &[]])];
        let mut b = batch(2, ok.clone(), vec![]);
        ids.apply(&mut b, &what).unwrap();
        assert_eq!(b.bags, ok);
        // Id 10 of example 1 in table "small" (99 in "big" is fine).
        let bad = vec![bags(&[&[99][..], &[50]]), bags(&[&[0, 9][..], &[3, 10]])];
        let mut b = batch(2, bad, vec![]);
        let msg = ids.apply(&mut b, &what).unwrap_err().to_string();
        for part in ["table \"small\"", "id 10 ", "example 1 ", "vocab 10"] {
            assert!(msg.contains(part), "{part:?} not in {msg}");
        }
    }

    #[test]
    fn hash_tables_get_the_u32_ids_as_keys_and_keep_their_keys() {
        let data = spec(vec![
            table("f", 50, VocabKind::Fixed),
            table("h", 50, VocabKind::Fixed),
        ]);
        let model = spec(vec![
            table("f", 50, VocabKind::Fixed),
            table("h", 8, VocabKind::Hash),
        ]);
        let ids = IdMap::new(&data, &model, false).unwrap();
        let f = bags(&[&[1][..], &[], &[2, 3]]);
        let h = bags(&[&[49, 0][..], &[], &[7, 7]]);
        let mut b = batch(3, vec![f.clone(), h], vec![]);
        ids.apply(&mut b, &what).unwrap();
        assert_eq!(b.bags[0], f);
        assert_eq!(b.keys.len(), 2);
        assert_eq!(b.keys[0], KeyBags::default());
        assert_eq!(b.keys[1], bags(&[&[49u64, 0][..], &[], &[7, 7]]));
        // A keyed log: the keys are left as they are, the fixed table's become rows.
        let ids = IdMap::new(&data, &model, true).unwrap();
        let kf = bags(&[&[4u64][..], &[], &[5]]);
        let kh = bags(&[&[u64::MAX][..], &[0], &[1 << 63]]);
        let mut b = batch(
            3,
            vec![Bags::default(), Bags::default()],
            vec![kf, kh.clone()],
        );
        ids.apply(&mut b, &what).unwrap();
        assert_eq!(b.bags[0], bags(&[&[4][..], &[], &[5]]));
        assert_eq!(b.keys, vec![KeyBags::default(), kh]);
    }

    #[test]
    fn the_identity_leaves_a_batch_alone() {
        let data = preset("tiny", 1.0).unwrap();
        // Fixed tables at least as large as the data's ids: nothing to do.
        let mut model = data.clone();
        model.tables[0].vocab += 5;
        for m in [&data, &model] {
            let ids = IdMap::new(&data, m, false).unwrap();
            assert!(ids.is_identity());
            let b0 = ClickGen::new(&data, 3).batch(10, 40);
            let mut b = b0.clone();
            ids.apply(&mut b, &what).unwrap();
            assert_eq!(b, b0);
            assert!(b.keys.is_empty());
        }
        assert!(IdMap::default().is_identity());
        // Keyed data is never the identity, nor a modulo table.
        assert!(!IdMap::new(&data, &data, true).unwrap().is_identity());
        let mut m = data.clone();
        m.tables[4].vocab_kind = VocabKind::Modulo;
        assert!(!IdMap::new(&data, &m, false).unwrap().is_identity());
    }

    #[test]
    fn a_model_with_other_tables_or_dense_features_is_refused() {
        let data = preset("tiny", 1.0).unwrap();
        let mut fewer = data.clone();
        fewer.tables.pop();
        let mut dense = data.clone();
        dense.n_dense += 1;
        for m in [&fewer, &dense] {
            let e = IdMap::new(&data, m, false).unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{e:?}");
        }
    }

    #[test]
    fn pseudo_rows_spread_keys_over_the_capacity_deterministically() {
        let model = spec(vec![
            table("f", 10, VocabKind::Fixed),
            table("h", 13, VocabKind::Hash),
            table("g", 1000, VocabKind::Hash),
        ]);
        let f = bags(&[&[1][..], &[9]]);
        let keys: Vec<u64> = (0..2000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        // Table "h": the same 1000 keys in both examples; table "g": 2000 keys.
        let kh = Bags {
            offsets: vec![0, 1000, 2000],
            ids: [&keys[..1000], &keys[..1000]].concat(),
        };
        let mut kg = Bags {
            offsets: vec![0, 1000, 2000],
            ids: keys.clone(),
        };
        kg.ids.reverse();
        let mut b = batch(
            2,
            vec![f.clone(), Bags::default(), Bags::default()],
            vec![KeyBags::default(), kh.clone(), kg.clone()],
        );
        pseudo_rows(&model, &mut b);
        assert_eq!(b.bags[0], f);
        for (t, k, cap) in [(1, &kh, 13u64), (2, &kg, 1000)] {
            let rows = &b.bags[t];
            assert_eq!(rows.offsets, k.offsets, "table {t}");
            assert_eq!(rows.ids.len(), k.ids.len());
            assert!(rows.ids.iter().all(|&r| (r as u64) < cap), "table {t}");
            // Every row of the small table is used; the same key, the same row.
            let used: std::collections::BTreeSet<u32> = rows.ids.iter().copied().collect();
            if cap == 13 {
                assert_eq!(used.len(), 13);
            } else {
                // 2000 keys into 1000 rows: about 1000 (1 - e^-2) = 865 rows used.
                assert!(used.len() > 800, "{} rows of 1000", used.len());
            }
            let mut again = batch(
                2,
                vec![f.clone(), Bags::default(), Bags::default()],
                vec![KeyBags::default(), kh.clone(), kg.clone()],
            );
            pseudo_rows(&model, &mut again);
            assert_eq!(again.bags[t], *rows);
        }
        // A key gets one row wherever it occurs.
        assert_eq!(b.bags[1].bag(0), b.bags[1].bag(1));
        // A batch without keys (no hash table in its data): rows untouched.
        let mut none = batch(2, vec![f.clone(), f.clone(), f.clone()], vec![]);
        pseudo_rows(&model, &mut none);
        assert_eq!(none.bags, vec![f.clone(), f.clone(), f]);
    }

    #[test]
    fn initial_key_rows_depend_on_seed_table_and_key_only() {
        let row = |seed, t, cap, key| {
            let mut v = vec![0f32; 16];
            init_key_row(seed, t, cap, key, &mut v);
            v
        };
        let a = row(1, 0, 100, 42);
        assert_eq!(a, row(1, 0, 100, 42));
        let bound = (1.0f64 / 100.0).sqrt() as f32;
        assert!(a.iter().all(|v| v.abs() <= bound && *v != 0.0), "{a:?}");
        for other in [row(2, 0, 100, 42), row(1, 1, 100, 42), row(1, 0, 100, 43)] {
            assert_ne!(a, other);
        }
        // The capacity scales the row: the same draws.
        let b = row(1, 0, 400, 42);
        for (x, y) in a.iter().zip(&b) {
            assert!((x / 2.0 - y).abs() <= 1e-7, "{x} {y}");
        }
        // Keys 0 and u64::MAX get rows of their own.
        assert_ne!(row(1, 0, 100, 0), row(1, 0, 100, u64::MAX));
    }
}
