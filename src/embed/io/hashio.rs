//! Hash tables in model files and checkpoints: stored by key, so that they restore
//! exactly on the same rank count and re-shard onto any other.
//!
//! Layout of hash table `t` (E entries over all ranks, `s` optimizer floats per row):
//!
//! | object | type | shape | content |
//! |---|---|---|---|
//! | `/tables/<t>` attributes | | | `name`, `kind = "hash"`, `capacity` (rows over all ranks) |
//! | `/tables/<t>/ranks` | u64 | [k] | the ranks that held its keys (its placement: `ranks[owner(key)]`) |
//! | `/tables/<t>/entries_per_rank` | u64 | [P] | entries of each writing rank, in rank order |
//! | `/tables/<t>/keys` | u64 | [E] | the keys: rank 0's in slot order, then rank 1's, ... |
//! | `/tables/<t>/slots` | u32 | [E] | each key's slot on its rank |
//! | `/tables/<t>/counts` | u32 | [E] | occurrences seen (saturating) |
//! | `/tables/<t>/last_seen` | u64 | [E] | the optimizer step that last saw it |
//! | `/tables/<t>/rows` | f32 | [E, dim] | its row |
//! | `/tables/<t>/state` | f32 | [E, s] | its optimizer state (absent for SGD) |
//!
//! Restore on the same rank count and capacity puts every entry back in its slot
//! ([`HashShard::restore`]): the run continues bit for bit. On another rank count (or
//! capacity), every rank reads the entries in blocks, keeps the keys it now owns
//! ([`owner`]) and inserts them in increasing key order; if they do not fit, the ones
//! the eviction policy would evict first are dropped (and counted).

use std::path::Path;

use ndarray::{s, ArrayView2};

use super::rowcodec::{read_rows, DeltaDtype};
use crate::ckpt::commit::corrupt;
use crate::embed::tables::hashtab::{owner, Entry, HashShard};
use crate::embed::tables::store::Store;
use crate::io::h5::ctx as h5;
use crate::io::h5::{write_attr, Attr};
use crate::spec::Evict;
use crate::{Error, Result};

/// Entries read at a time when re-sharding.
const BLOCK: usize = 1 << 20;

/// Rank 0: create hash table `t`'s group and datasets for `per_rank` entries
/// (`with_rows` false: the entries only, an incremental checkpoint's table, whose
/// changed rows are under `/delta/<t>`).
pub(crate) fn local_create(
    f: &hdf5::File,
    tmp: &Path,
    store: &Store,
    t: usize,
    per_rank: &[u64],
    with_rows: bool,
) -> Result<()> {
    let ts = &store.spec.tables[t];
    let sp = store.state_per_row(t);
    let e: u64 = per_rank.iter().sum();
    let e = e as usize;
    let g = h5(tmp, "group", f.create_group(&format!("tables/{t}")))?;
    write_attr(&g, tmp, "name", &Attr::Str(ts.name.clone()))?;
    write_attr(&g, tmp, "kind", &Attr::Str("hash".into()))?;
    write_attr(&g, tmp, "capacity", &Attr::U64(ts.vocab))?;
    let at = |n: &str| format!("/tables/{t}/{n}");
    let ranks: Vec<u64> = crate::embed::tables::keys::key_ranks(&store.plan, t)
        .iter()
        .map(|&r| r as u64)
        .collect();
    h5(
        tmp,
        at("ranks"),
        g.new_dataset_builder().with_data(&ranks).create("ranks"),
    )?;
    h5(
        tmp,
        at("entries_per_rank"),
        g.new_dataset_builder()
            .with_data(per_rank)
            .create("entries_per_rank"),
    )?;
    h5(
        tmp,
        at("keys"),
        g.new_dataset::<u64>().shape(e).create("keys"),
    )?;
    h5(
        tmp,
        at("slots"),
        g.new_dataset::<u32>().shape(e).create("slots"),
    )?;
    h5(
        tmp,
        at("counts"),
        g.new_dataset::<u32>().shape(e).create("counts"),
    )?;
    h5(
        tmp,
        at("last_seen"),
        g.new_dataset::<u64>().shape(e).create("last_seen"),
    )?;
    if !with_rows {
        return Ok(());
    }
    h5(
        tmp,
        at("rows"),
        g.new_dataset::<f32>().shape((e, ts.dim)).create("rows"),
    )?;
    if sp > 0 {
        h5(
            tmp,
            at("state"),
            g.new_dataset::<f32>().shape((e, sp)).create("state"),
        )?;
    }
    Ok(())
}

/// This rank's turn: write its entries of hash table `t` at entry `first` (and with
/// `with_rows` their rows and state).
pub(crate) fn local_write(
    f: &hdf5::File,
    tmp: &Path,
    store: &Store,
    t: usize,
    first: usize,
    with_rows: bool,
) -> Result<()> {
    let Some(shard) = &store.hash[t] else {
        return Ok(());
    };
    let entries = shard.entries();
    if entries.is_empty() {
        return Ok(());
    }
    let ls = local_shard(store, t)?;
    let (w, sp) = (ls.shard.width(), store.state_per_row(ls.shard.table));
    let n = entries.len();
    let range = first..first + n;
    let write1 = |name: &str, r: hdf5::Result<()>| h5(tmp, format!("/tables/{t}/{name}"), r);
    let ds = |name: &str| {
        h5(
            tmp,
            format!("/tables/{t}/{name}"),
            f.dataset(&format!("tables/{t}/{name}")),
        )
    };
    let keys: Vec<u64> = entries.iter().map(|e| e.key).collect();
    write1("keys", ds("keys")?.write_slice(&keys, range.clone()))?;
    let slots: Vec<u32> = entries.iter().map(|e| e.slot).collect();
    write1("slots", ds("slots")?.write_slice(&slots, range.clone()))?;
    let counts: Vec<u32> = entries.iter().map(|e| e.count).collect();
    write1("counts", ds("counts")?.write_slice(&counts, range.clone()))?;
    let seen: Vec<u64> = entries.iter().map(|e| e.last_seen).collect();
    write1(
        "last_seen",
        ds("last_seen")?.write_slice(&seen, range.clone()),
    )?;
    if !with_rows {
        return Ok(());
    }
    let mut rows = Vec::with_capacity(n * w);
    let mut state = Vec::with_capacity(n * sp);
    for e in &entries {
        let s = e.slot as usize;
        rows.extend_from_slice(&ls.data[s * w..(s + 1) * w]);
        state.extend_from_slice(&ls.state[s * sp..(s + 1) * sp]);
    }
    let view = ArrayView2::from_shape((n, w), &rows).map_err(|e| Error::Comm(e.to_string()))?;
    write1("rows", ds("rows")?.write_slice(view, s![range.clone(), ..]))?;
    if sp > 0 {
        let view =
            ArrayView2::from_shape((n, sp), &state).map_err(|e| Error::Comm(e.to_string()))?;
        write1("state", ds("state")?.write_slice(view, s![range, ..]))?;
    }
    Ok(())
}

fn local_shard(store: &Store, t: usize) -> Result<&crate::embed::tables::store::LocalShard> {
    Ok(&store.local[store.hash_local(t)?])
}

/// What a restore of hash tables did on this rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Entries placed here.
    pub entries: u64,
    /// Entries this rank owns that did not fit its capacity (re-sharding only).
    pub dropped: u64,
    /// Whether the entries went back to their slots (same ranks and capacity).
    pub exact: bool,
}

impl Restored {
    /// Both restores' entries and drops; exact when both are.
    pub fn and(self, o: Restored) -> Restored {
        Restored {
            entries: self.entries + o.entries,
            dropped: self.dropped + o.dropped,
            exact: self.exact && o.exact,
        }
    }
}

/// Read one 1-D dataset range, checked.
fn read1<T: hdf5::H5Type>(
    f: &hdf5::File,
    path: &Path,
    name: &str,
    lo: usize,
    hi: usize,
) -> Result<Vec<T>> {
    crate::io::h5::read_range(f, path, name, lo as u64, hi as u64)
        .map_err(|e| corrupt(path, e.to_string()))
}

fn read2(
    f: &hdf5::File,
    path: &Path,
    name: &str,
    lo: usize,
    hi: usize,
    w: usize,
) -> Result<Vec<f32>> {
    let ds = f
        .dataset(name)
        .map_err(|_| corrupt(path, format!("dataset {name} is missing")))?;
    let shape = ds.shape();
    if shape.len() != 2 || shape[1] != w || shape[0] < hi {
        return Err(corrupt(
            path,
            format!("dataset {name} has shape {shape:?}, the table needs at least {hi} x {w}"),
        ));
    }
    if lo == hi {
        return Ok(Vec::new());
    }
    let a = ds
        .read_slice_2d::<f32, _>(s![lo..hi, ..])
        .map_err(|e| corrupt(path, format!("dataset {name} is unreadable: {e}")))?;
    Ok(a.iter().copied().collect())
}

/// Where a restore finds the rows of the entries it reads.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RowsFrom<'a> {
    /// The entries' own `/tables/<t>/rows` and `state` (a full checkpoint, a model).
    Here,
    /// The last checkpoint of an incremental chain: each key's row and state from the
    /// newest checkpoint of the chain that holds them: the deltas' changed entries
    /// (`/delta/<t>`, newest first), then the full checkpoint `base`'s entries.
    /// `deltas` are oldest first, each with the dtype of its rows.
    Chain {
        base: &'a Path,
        deltas: &'a [(std::path::PathBuf, DeltaDtype)],
    },
}

/// Rank-local: restore hash table `t` from the open file `f` (at `path`) into
/// `store`, the rows from `rows`. `reset_seen`: a warm start, where the entries count
/// as seen at step 0 of the new run.
///
/// Reads the table's header (kind, capacity, entries per rank, the ranks that held
/// it), then puts the entries back to their slots when the ranks and the capacity are
/// the same ([`local_restore_exact`]), or re-shards them onto this rank's keys
/// ([`local_restore_resharded`]).
pub(crate) fn local_restore(
    f: &hdf5::File,
    path: &Path,
    store: &mut Store,
    t: usize,
    reset_seen: bool,
    rows: RowsFrom<'_>,
) -> Result<Restored> {
    let p = store.plan.world;
    let ts = store.spec.tables[t].clone();
    let sp = store.state_per_row(t);
    let at = |n: &str| format!("/tables/{t}/{n}");
    let g = f
        .group(&format!("tables/{t}"))
        .map_err(|_| corrupt(path, format!("group /tables/{t} is missing")))?;
    let kind = crate::io::h5::read_str_attr(&g, path, "kind").unwrap_or_default();
    if kind != "hash" {
        return Err(corrupt(
            path,
            format!(
                "table {t} ({:?}) is not stored as a hash table; the model has one",
                ts.name
            ),
        ));
    }
    let capacity = crate::io::h5::read_u64_attr(&g, path, "capacity")?;
    let per_rank: Vec<u64> = read1(f, path, &at("entries_per_rank"), 0, {
        let ds = f.dataset(&at("entries_per_rank")).map_err(|_| {
            corrupt(
                path,
                format!("dataset {} is missing", at("entries_per_rank")),
            )
        })?;
        ds.size()
    })?;
    let total: u64 = per_rank.iter().sum();
    let total = usize::try_from(total).map_err(|_| corrupt(path, "too many entries"))?;
    let li = store.hash_local(t)?;
    let target = ShardTarget {
        t,
        li,
        cap_here: store.local[li].rows as usize,
        w: store.local[li].shard.width(),
        sp,
        reset_seen,
        rows,
    };

    let ranks_now: Vec<u64> = crate::embed::tables::keys::key_ranks(&store.plan, t)
        .iter()
        .map(|&r| r as u64)
        .collect();
    let ranks_then: Vec<u64> = {
        let name = at("ranks");
        let n = f
            .dataset(&name)
            .map_err(|_| corrupt(path, format!("dataset {name} is missing")))?
            .size();
        read1(f, path, &name, 0, n)?
    };
    if per_rank.len() == p && capacity == ts.vocab && ranks_now == ranks_then {
        return local_restore_exact(f, path, store, &target, &per_rank);
    }
    local_restore_resharded(f, path, store, &target, total, &ranks_now)
}

/// Hash table `t`'s shard on this rank, as a restore fills it: its local shard `li`
/// of `cap_here` rows of width `w`, `sp` optimizer floats per row.
struct ShardTarget<'a> {
    t: usize,
    li: usize,
    cap_here: usize,
    w: usize,
    sp: usize,
    /// A warm start: entries count as seen at step 0.
    reset_seen: bool,
    rows: RowsFrom<'a>,
}

impl ShardTarget<'_> {
    /// The step an entry last seen at `s` counts as seen at.
    fn seen(&self, s: u64) -> u64 {
        if self.reset_seen {
            0
        } else {
            s
        }
    }
}

/// [`local_restore`] on the same ranks and capacity: this rank's entries (its range
/// of `per_rank`) back to their slots.
fn local_restore_exact(
    f: &hdf5::File,
    path: &Path,
    store: &mut Store,
    target: &ShardTarget,
    per_rank: &[u64],
) -> Result<Restored> {
    let me = store.rank;
    let ShardTarget {
        t,
        li,
        cap_here,
        w,
        sp,
        ..
    } = *target;
    let (admit, evict) = (store.spec.tables[t].admit_after, store.spec.tables[t].evict);
    let at = |n: &str| format!("/tables/{t}/{n}");
    let lo = per_rank[..me].iter().sum::<u64>() as usize;
    let hi = lo + per_rank[me] as usize;
    let keys: Vec<u64> = read1(f, path, &at("keys"), lo, hi)?;
    let slots: Vec<u32> = read1(f, path, &at("slots"), lo, hi)?;
    let counts: Vec<u32> = read1(f, path, &at("counts"), lo, hi)?;
    let last: Vec<u64> = read1(f, path, &at("last_seen"), lo, hi)?;
    let (rows, state) = match target.rows {
        RowsFrom::Here => (
            read2(f, path, &at("rows"), lo, hi, w)?,
            if sp > 0 {
                read2(f, path, &at("state"), lo, hi, sp)?
            } else {
                Vec::new()
            },
        ),
        RowsFrom::Chain { base, deltas } => {
            local_rows_by_key(base, deltas, path, t, &keys, (w, sp))?
        }
    };
    let entries: Vec<Entry> = (0..hi - lo)
        .map(|i| Entry {
            slot: slots[i],
            key: keys[i],
            count: counts[i],
            last_seen: target.seen(last[i]),
        })
        .collect();
    let shard = HashShard::restore(cap_here, admit, evict, &entries)
        .map_err(|e| corrupt(path, format!("hash table {t} on rank {me}: {e}")))?;
    let ls = &mut store.local[li];
    for (i, e) in entries.iter().enumerate() {
        let s = e.slot as usize;
        ls.data[s * w..(s + 1) * w].copy_from_slice(&rows[i * w..(i + 1) * w]);
        ls.state[s * sp..(s + 1) * sp].copy_from_slice(&state[i * sp..(i + 1) * sp]);
    }
    store.hash[t] = Some(shard);
    Ok(Restored {
        entries: entries.len() as u64,
        dropped: 0,
        exact: true,
    })
}

/// [`local_restore`] onto other ranks or another capacity: the `total` entries read
/// in blocks, those this rank owns now (among `ranks_now`) kept (the ones the
/// eviction policy would keep when they do not fit) and inserted by key.
fn local_restore_resharded(
    f: &hdf5::File,
    path: &Path,
    store: &mut Store,
    target: &ShardTarget,
    total: usize,
    ranks_now: &[u64],
) -> Result<Restored> {
    let me = store.rank;
    let ShardTarget {
        t,
        li,
        cap_here,
        w,
        sp,
        ..
    } = *target;
    let ts = &store.spec.tables[t];
    let (admit, evict) = (ts.admit_after, ts.evict);
    let at = |n: &str| format!("/tables/{t}/{n}");
    // Re-shard: the keys this rank owns now, read in blocks.
    struct Mine {
        key: u64,
        count: u32,
        last_seen: u64,
        at: usize,
    }
    let mut mine: Vec<Mine> = Vec::new();
    let mut rows = Vec::new();
    let mut state = Vec::new();
    let mut lo = 0;
    while lo < total {
        let hi = (lo + BLOCK).min(total);
        let keys: Vec<u64> = read1(f, path, &at("keys"), lo, hi)?;
        let counts: Vec<u32> = read1(f, path, &at("counts"), lo, hi)?;
        let last: Vec<u64> = read1(f, path, &at("last_seen"), lo, hi)?;
        let here = matches!(target.rows, RowsFrom::Here);
        let r = if here {
            read2(f, path, &at("rows"), lo, hi, w)?
        } else {
            Vec::new()
        };
        let st = if sp > 0 && here {
            read2(f, path, &at("state"), lo, hi, sp)?
        } else {
            Vec::new()
        };
        for i in 0..hi - lo {
            if ranks_now[owner(keys[i], t, ranks_now.len())] == me as u64 {
                mine.push(Mine {
                    key: keys[i],
                    count: counts[i],
                    last_seen: target.seen(last[i]),
                    at: mine.len(),
                });
                if here {
                    rows.extend_from_slice(&r[i * w..(i + 1) * w]);
                    state.extend_from_slice(&st[i * sp..(i + 1) * sp]);
                }
            }
        }
        lo = hi;
    }
    let mut dropped = 0;
    if mine.len() > cap_here {
        // Keep what the eviction policy would keep.
        match evict {
            Evict::Lfu => mine.sort_unstable_by(|a, b| {
                (b.count, b.last_seen, a.key).cmp(&(a.count, a.last_seen, b.key))
            }),
            Evict::Ttl(_) => mine.sort_unstable_by(|a, b| {
                (b.last_seen, b.count, a.key).cmp(&(a.last_seen, a.count, b.key))
            }),
        }
        dropped = (mine.len() - cap_here) as u64;
        mine.truncate(cap_here);
    }
    mine.sort_unstable_by_key(|m| m.key);
    if let RowsFrom::Chain { base, deltas } = target.rows {
        let keys: Vec<u64> = mine.iter().map(|m| m.key).collect();
        (rows, state) = local_rows_by_key(base, deltas, path, t, &keys, (w, sp))?;
        mine.iter_mut().enumerate().for_each(|(i, m)| m.at = i);
    }
    let mut shard = HashShard::new(cap_here, admit, evict)
        .map_err(|e| Error::Config(format!("hash table {:?}: {e}", ts.name)))?;
    let ls = &mut store.local[li];
    for m in &mine {
        let s = shard
            .insert_entry(m.key, m.count, m.last_seen)
            .map_err(|e| corrupt(path, format!("hash table {t}: {e}")))? as usize;
        ls.data[s * w..(s + 1) * w].copy_from_slice(&rows[m.at * w..(m.at + 1) * w]);
        ls.state[s * sp..(s + 1) * sp].copy_from_slice(&state[m.at * sp..(m.at + 1) * sp]);
    }
    store.hash[t] = Some(shard);
    Ok(Restored {
        entries: mine.len() as u64,
        dropped,
        exact: false,
    })
}

/// Rank-local: the rows and optimizer state of hash table `t`'s `keys` (in their
/// order) in an incremental chain: each from the newest delta whose changed entries
/// hold the key, else from the full checkpoint `base`. A key found nowhere means the
/// chain does not match the entries of its last checkpoint `last` (corrupt).
///
/// Exact: a key's entry stayed in its slot since the newest checkpoint that wrote its
/// row (a slot that took a new key, or whose row changed, is in the next delta).
fn local_rows_by_key(
    base: &Path,
    deltas: &[(std::path::PathBuf, DeltaDtype)],
    last: &Path,
    t: usize,
    keys: &[u64],
    (w, sp): (usize, usize),
) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut by = ByKey {
        want: keys.iter().enumerate().map(|(i, &k)| (k, i)).collect(),
        rows: vec![0f32; keys.len() * w],
        state: vec![0f32; keys.len() * sp],
        w,
        sp,
    };
    for (path, dtype) in deltas.iter().rev() {
        let f = crate::ckpt::commit::local_open(path)?;
        let at = |n: &str| format!("/delta/{t}/{n}");
        let n = dataset_len(&f, path, &at("keys"))?;
        let mut lo = 0;
        while lo < n {
            let hi = (lo + BLOCK).min(n);
            let ks: Vec<u64> = read1(&f, path, &at("keys"), lo, hi)?;
            let widths = vec![w; hi - lo];
            let group = format!("/delta/{t}");
            let r = read_rows(&f, path, &group, *dtype, &widths, (lo * w, lo))?;
            let st: Vec<f32> = if sp > 0 {
                read1(&f, path, &at("state"), lo * sp, hi * sp)?
            } else {
                Vec::new()
            };
            by.take(&ks, &r, &st);
            lo = hi;
        }
    }
    let f = crate::ckpt::commit::local_open(base)?;
    let at = |n: &str| format!("/tables/{t}/{n}");
    let n = dataset_len(&f, base, &at("keys"))?;
    let mut lo = 0;
    while lo < n && !by.want.is_empty() {
        let hi = (lo + BLOCK).min(n);
        let ks: Vec<u64> = read1(&f, base, &at("keys"), lo, hi)?;
        let r = read2(&f, base, &at("rows"), lo, hi, w)?;
        let st = if sp > 0 {
            read2(&f, base, &at("state"), lo, hi, sp)?
        } else {
            Vec::new()
        };
        by.take(&ks, &r, &st);
        lo = hi;
    }
    if let Some((k, _)) = by.want.iter().min() {
        return Err(corrupt(
            last,
            format!(
                "hash table {t}: {} of its keys (key {k} first) have a row in no checkpoint of its chain (from {})",
                by.want.len(),
                base.display()
            ),
        ));
    }
    Ok((by.rows, by.state))
}

/// [`local_rows_by_key`]'s keys still wanted (key -> position) and what was found.
struct ByKey {
    want: std::collections::HashMap<u64, usize>,
    rows: Vec<f32>,
    state: Vec<f32>,
    w: usize,
    sp: usize,
}

impl ByKey {
    /// Take the wanted keys among `ks` (rows `r`, state `st`, in their order).
    fn take(&mut self, ks: &[u64], r: &[f32], st: &[f32]) {
        let (w, sp) = (self.w, self.sp);
        for (i, k) in ks.iter().enumerate() {
            if let Some(j) = self.want.remove(k) {
                self.rows[j * w..(j + 1) * w].copy_from_slice(&r[i * w..(i + 1) * w]);
                self.state[j * sp..(j + 1) * sp].copy_from_slice(&st[i * sp..(i + 1) * sp]);
            }
        }
    }
}

/// The number of elements of the 1-D dataset `name` of `f` (at `path`).
fn dataset_len(f: &hdf5::File, path: &Path, name: &str) -> Result<usize> {
    Ok(f.dataset(name)
        .map_err(|_| corrupt(path, format!("dataset {name} is missing")))?
        .size())
}
