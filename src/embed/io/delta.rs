//! Incremental checkpoints of the embedding model (`embed --checkpoint-full-every N`,
//! after Check-N-Run, Eisenman et al., NSDI'22): a delta checkpoint holds only the
//! table rows (and their optimizer state) changed since the previous checkpoint, the
//! MLP and its optimizer state whole, and names its base; restore loads the chain's
//! full checkpoint and applies each delta in order, on any rank count and plan.
//!
//! Layout of a delta `ckpt-<step>.h5` (root attributes `format`, `manifest` with a
//! `delta` object: base file name and the hash of its manifest, the chain length, the
//! rows' dtype; `spec`). Per fixed or modulo table `t`, its changed rows as
//! segments (one per writing shard, in rank order):
//!
//! | object | type | shape | content |
//! |---|---|---|---|
//! | `/delta/<t>/segments` | u64 | [S, 3] | per segment: first column, end column, rows `n` |
//! | `/delta/<t>/ids` | u64 | [E] | the rows' global ids, segment after segment |
//! | `/delta/<t>/rows` | f32 (u16: bf16 bits) | [sum n x width] | their columns of the segment |
//! | `/delta/<t>/state` | f32 | [sum n x s] | optimizer state of the segments starting at column 0 |
//! | `/mlp/params`, `/mlp/state` | f32 | | as in a full checkpoint |
//!
//! Per hash table `t`, its entries whole (admissions, evictions, counts and last-seen
//! steps change at every step), under `/tables/<t>` as a full checkpoint stores them
//! (`ranks`, `entries_per_rank`, `keys`, `slots`, `counts`, `last_seen`; see
//! [`super::hashio`]) but without `rows` and `state`, and its changed entries (a slot
//! whose row the optimizer updated or that took a new key) by key:
//!
//! | object | type | shape | content |
//! |---|---|---|---|
//! | `/delta/<t>/records_per_rank` | u64 | [P] | changed entries of each writing rank |
//! | `/delta/<t>/keys` | u64 | [D] | their keys, rank after rank |
//! | `/delta/<t>/rows` | f32 (u16: bf16 bits) | [D x dim] | their rows |
//! | `/delta/<t>/state` | f32 | [D x s] | their optimizer state |
//!
//! A restore takes the last checkpoint's entries and each key's row from the newest
//! checkpoint of the chain that holds it ([`super::hashio::RowsFrom::Chain`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ckpt::commit::{corrupt, global_write_atomic};
use crate::comm::Comm;
use crate::embed::tables::placement::Rows;
use crate::embed::tables::store::{LocalShard, Store};
use crate::embed::train::trainer::EmbedTrainer;
use crate::io::h5::ctx as h5;
use crate::io::h5::{write_attrs, Attr};
use crate::{Error, Result};

pub use super::rowcodec::DeltaDtype;
use super::rowcodec::{create_rows, read_rows, write_rows};

/// How often a checkpoint is full (`--checkpoint-full-every`, `--ckpt-delta-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaPolicy {
    /// Every N-th checkpoint is full, the others deltas (1: every one full).
    pub full_every: u64,
    pub dtype: DeltaDtype,
}

impl Default for DeltaPolicy {
    fn default() -> Self {
        DeltaPolicy {
            full_every: 1,
            dtype: DeltaDtype::F32,
        }
    }
}

impl DeltaPolicy {
    /// Refuse (exit 2) what cannot act: no `full_every`, bf16 without deltas.
    pub fn validate(&self) -> Result<()> {
        if self.full_every == 0 {
            return Err(Error::Config(
                "--checkpoint-full-every 0: must be at least 1 (1: every checkpoint full)".into(),
            ));
        }
        if self.full_every == 1 && self.dtype != DeltaDtype::F32 {
            return Err(Error::Config(
                format!("--ckpt-delta-dtype {} needs --checkpoint-full-every 2 or more (with 1 every checkpoint is full, f32)", self.dtype.name()),
            ));
        }
        Ok(())
    }
}

/// What a delta's manifest says of its chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaInfo {
    /// The base: a checkpoint file in the same directory.
    pub file: String,
    /// [`crate::ckpt::hash_str`] of the base's `manifest` attribute, hex.
    pub manifest_hash: String,
    /// Deltas since the chain's full checkpoint, this one included.
    pub chain: u64,
    pub dtype: DeltaDtype,
    /// Changed rows written (over every table and writing shard).
    pub rows: u64,
}

/// The chain a run writes on: its last committed (or restored) checkpoint.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    pub policy: DeltaPolicy,
    /// File name and manifest hash of the last checkpoint, when the next may be a delta.
    pub base: Option<(String, String)>,
    /// Deltas since the last full checkpoint.
    pub since_full: u64,
}

impl Chain {
    /// The delta the checkpoint of `step` is (`None`: a full one). A checkpoint that
    /// replaces its own base (a run resumed at its end writes its step again) is full.
    pub fn next(&self, step: u64) -> Option<DeltaInfo> {
        let (file, hash) = self.base.as_ref()?;
        let more = self.since_full + 1 < self.policy.full_every;
        (more && *file != crate::ckpt::file_name(step)).then(|| DeltaInfo {
            file: file.clone(),
            manifest_hash: hash.clone(),
            chain: self.since_full + 1,
            dtype: self.policy.dtype,
            rows: 0,
        })
    }

    /// After committing `path` with the manifest `json` (a delta of chain length
    /// `chain`, or full: 0).
    pub fn committed(&mut self, path: &Path, json: &str, chain: u64) {
        let name = path
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        self.base = Some((name, manifest_hash(json)));
        self.since_full = chain;
    }
}

/// The hash a delta records of its base's manifest.
pub fn manifest_hash(json: &str) -> String {
    format!("{:016x}", crate::ckpt::hash_str(json))
}

/// Rank-local: the raw `manifest` attribute of a checkpoint (`None` for a model file).
pub fn local_raw_manifest(path: &Path) -> Result<Option<String>> {
    let f = crate::ckpt::commit::local_open(path)?;
    Ok(crate::io::h5::read_str_attr(&f, path, "manifest").ok())
}

#[derive(Deserialize)]
struct DeltaOnly {
    #[serde(default)]
    step: u64,
    #[serde(default)]
    delta: Option<DeltaInfo>,
}

/// Rank-local: the chain of the checkpoint at `path`, its full checkpoint first, each
/// with its delta info (`None` for the full one). A base that is missing, or is not
/// the file the delta was written on, is refused (exit 2) naming both files.
pub fn local_chain(path: &Path) -> Result<Vec<(PathBuf, Option<DeltaInfo>)>> {
    let mut chain = Vec::new();
    let mut cur = path.to_path_buf();
    let mut raw = local_raw_manifest(&cur)?;
    loop {
        let parsed = raw
            .as_deref()
            .and_then(|j| serde_json::from_str::<DeltaOnly>(j).ok());
        let Some(DeltaOnly {
            step,
            delta: Some(d),
        }) = parsed
        else {
            chain.push((cur, None));
            break;
        };
        let base = cur.with_file_name(&d.file);
        let broken = |why: String| {
            Error::input(
                &cur,
                format!("incremental checkpoint: its base {} {why}; the chain is broken (restore an older full checkpoint, or train from scratch)", base.display()),
            )
        };
        if !base.is_file() {
            return Err(broken("is missing".into()));
        }
        let base_step = crate::ckpt::parse_step(&d.file);
        if base_step.is_none_or(|b| b >= step) {
            return Err(corrupt(
                &cur,
                format!("its base {} is not an earlier checkpoint", d.file),
            ));
        }
        raw = local_raw_manifest(&base)?;
        let got = raw.as_deref().map(manifest_hash).unwrap_or_default();
        if got != d.manifest_hash {
            return Err(broken(format!(
                "is not the checkpoint it was written on (manifest hash {got}, the delta's {})",
                d.manifest_hash
            )));
        }
        chain.push((cur, Some(d)));
        cur = base;
    }
    chain.reverse();
    Ok(chain)
}

/// Whether a shard of rows `rows` holds global row `id`.
fn holds(rows: Rows, id: u64) -> bool {
    match rows {
        Rows::All => true,
        Rows::Block { lo, hi } => (lo..hi).contains(&id),
        Rows::Cyclic { modulus, residue } => id % modulus == residue,
    }
}

/// One writing shard's changed rows.
struct Segment {
    table: usize,
    cols: std::ops::Range<usize>,
    ids: Vec<u64>,
    rows: Vec<f32>,
    state: Vec<f32>,
}

/// This rank's segments: its shards' changed rows (a replica: rank 0's only).
fn local_segments(tr: &EmbedTrainer, rank: usize) -> Result<Vec<Segment>> {
    let dirty = tr.dirty.as_ref().ok_or_else(|| {
        Error::Config("an incremental checkpoint without changed-row tracking".into())
    })?;
    let mut out = Vec::new();
    for (li, ls) in tr.store.local.iter().enumerate() {
        let t = ls.shard.table;
        if tr.store.is_hash(t) || (ls.shard.replica && rank != 0) {
            continue;
        }
        let (w, sp) = (ls.shard.width(), tr.store.state_per_row(t));
        let local = dirty.rows(li);
        let mut seg = Segment {
            table: t,
            cols: ls.shard.cols.clone(),
            ids: local.iter().map(|&r| ls.shard.rows.global(r)).collect(),
            rows: Vec::with_capacity(local.len() * w),
            state: Vec::new(),
        };
        let mut row = vec![0.0f32; w];
        for &r in &local {
            ls.row_into(r, &mut row);
            seg.rows.extend_from_slice(&row);
        }
        if sp > 0 && seg.cols.start == 0 {
            for &r in &local {
                let r = r as usize;
                seg.state.extend_from_slice(&ls.state[r * sp..(r + 1) * sp]);
            }
        }
        out.push(seg);
    }
    Ok(out)
}

/// One hash table's changed entries on this rank, by key.
struct HashPart {
    table: usize,
    keys: Vec<u64>,
    rows: Vec<f32>,
    state: Vec<f32>,
}

/// This rank's hash tables' changed entries: the held slots marked in
/// [`EmbedTrainer::dirty`] (their row updated, or a new key in them), in slot order.
fn local_hash_parts(tr: &EmbedTrainer) -> Result<Vec<HashPart>> {
    let dirty = tr.dirty.as_ref().ok_or_else(|| {
        Error::Config("an incremental checkpoint without changed-row tracking".into())
    })?;
    let mut out = Vec::new();
    for (t, shard) in tr.store.hash.iter().enumerate() {
        let Some(shard) = shard else { continue };
        let li = tr.store.hash_local(t)?;
        let ls = &tr.store.local[li];
        let (w, sp) = (ls.shard.width(), tr.store.state_per_row(t));
        let marked = dirty.rows(li);
        let mut part = HashPart {
            table: t,
            keys: Vec::new(),
            rows: Vec::new(),
            state: Vec::new(),
        };
        let mut m = marked.iter().peekable();
        for e in shard.entries() {
            let s = u64::from(e.slot);
            while m.next_if(|&&r| r < s).is_some() {}
            if m.next_if_eq(&&s).is_none() {
                continue;
            }
            let s = s as usize;
            part.keys.push(e.key);
            part.rows.extend_from_slice(&ls.data[s * w..(s + 1) * w]);
            part.state
                .extend_from_slice(&ls.state[s * sp..(s + 1) * sp]);
        }
        out.push(part);
    }
    Ok(out)
}

/// Per table, per rank (zeros for fixed tables): the hash tables' entries and changed
/// entries.
struct HashCounts {
    entries: Vec<Vec<u64>>,
    records: Vec<Vec<u64>>,
}

fn global_hash_counts<C: Comm>(
    comm: &C,
    tr: &EmbedTrainer,
    parts: &[HashPart],
) -> Result<HashCounts> {
    let n = tr.store.hash.len();
    let mut mine = vec![0u64; 2 * n];
    for (t, h) in tr.store.hash.iter().enumerate() {
        mine[2 * t] = h.as_ref().map_or(0, |h| h.len() as u64);
    }
    for p in parts {
        mine[2 * p.table + 1] = p.keys.len() as u64;
    }
    let all = comm.all_gather_v(&mine)?.data;
    let per = |t: usize, k: usize| {
        (0..comm.size())
            .map(|r| all[r * 2 * n + 2 * t + k])
            .collect()
    };
    Ok(HashCounts {
        entries: (0..n).map(|t| per(t, 0)).collect(),
        records: (0..n).map(|t| per(t, 1)).collect(),
    })
}

/// Rank 0: hash table `t`'s datasets in the delta `f` (at `tmp`).
fn local_create_hash(
    tr: &EmbedTrainer,
    f: &hdf5::File,
    tmp: &Path,
    t: usize,
    counts: &HashCounts,
    dtype: DeltaDtype,
) -> Result<()> {
    super::hashio::local_create(f, tmp, &tr.store, t, &counts.entries[t], false)?;
    let (w, sp) = (tr.cfg.spec.tables[t].dim, tr.store.state_per_row(t));
    let d: u64 = counts.records[t].iter().sum();
    let d = d as usize;
    let g = h5(tmp, "group", f.create_group(&format!("delta/{t}")))?;
    let at = |n: &str| format!("/delta/{t}/{n}");
    h5(
        tmp,
        at("records_per_rank"),
        g.new_dataset_builder()
            .with_data(&counts.records[t])
            .create("records_per_rank"),
    )?;
    h5(
        tmp,
        at("keys"),
        g.new_dataset::<u64>().shape(d).create("keys"),
    )?;
    create_rows(&g, tmp, &format!("/delta/{t}"), dtype, (d * w, d))?;
    if sp > 0 {
        h5(
            tmp,
            at("state"),
            g.new_dataset::<f32>().shape(d * sp).create("state"),
        )?;
    }
    Ok(())
}

/// This rank's turn for its hash tables: their entries, and their changed entries
/// at their offsets.
fn local_write_hash(
    tr: &EmbedTrainer,
    f: &hdf5::File,
    tmp: &Path,
    rank: usize,
    parts: &[HashPart],
    counts: &HashCounts,
    dtype: DeltaDtype,
) -> Result<()> {
    for part in parts {
        let t = part.table;
        let first: u64 = counts.entries[t][..rank].iter().sum();
        super::hashio::local_write(f, tmp, &tr.store, t, first as usize, false)?;
        let n = part.keys.len();
        if n == 0 {
            continue;
        }
        let (w, sp) = (tr.cfg.spec.tables[t].dim, tr.store.state_per_row(t));
        let i: u64 = counts.records[t][..rank].iter().sum();
        let i = i as usize;
        let ds = |name: &str| {
            let at = format!("/delta/{t}/{name}");
            h5(tmp, &at, f.dataset(&at)).map(|d| (d, at))
        };
        let (d, at) = ds("keys")?;
        h5(tmp, &at, d.write_slice(&part.keys, i..i + n))?;
        let group = format!("/delta/{t}");
        write_rows(f, tmp, &group, dtype, (&part.rows, w), (i * w, i))?;
        if sp > 0 {
            let (d, at) = ds("state")?;
            h5(tmp, &at, d.write_slice(&part.state, i * sp..(i + n) * sp))?;
        }
    }
    Ok(())
}

/// Every segment over all ranks, in rank order: `(rank, table, col_lo, col_hi, n)`.
type Desc = (usize, usize, usize, usize, usize);

fn global_descs<C: Comm>(comm: &C, mine: &[Segment]) -> Result<Vec<Desc>> {
    let flat: Vec<u64> = mine
        .iter()
        .flat_map(|s| [s.table, s.cols.start, s.cols.end, s.ids.len()].map(|x| x as u64))
        .collect();
    let all = comm.all_gather_v(&flat)?;
    let mut out = Vec::new();
    let mut at = 0;
    for (rank, &c) in all.counts.iter().enumerate() {
        for q in all.data[at..at + c].chunks_exact(4) {
            out.push((
                rank,
                q[0] as usize,
                q[1] as usize,
                q[2] as usize,
                q[3] as usize,
            ));
        }
        at += c;
    }
    Ok(out)
}

/// Offsets of segment `k` of `descs` in its table's `ids`, `rows` and `state`, and
/// the three totals (`k = descs.len()`: the totals of table `t`).
fn offsets(descs: &[Desc], k: usize, t: usize, sp: usize) -> (usize, usize, usize) {
    let (mut i, mut r, mut s) = (0, 0, 0);
    for &(_, tt, lo, hi, n) in &descs[..k] {
        if tt == t {
            i += n;
            r += n * (hi - lo);
            s += if lo == 0 { n * sp } else { 0 };
        }
    }
    (i, r, s)
}

/// Rank 0: create the delta file `tmp` (every dataset, the segments, the MLP).
fn local_create(
    tr: &EmbedTrainer,
    tmp: &Path,
    attrs: &[(&str, Attr)],
    (descs, counts): (&[Desc], &HashCounts),
    dtype: DeltaDtype,
) -> Result<()> {
    let f = h5(tmp, "create", crate::io::h5::create(tmp))?;
    for t in 0..tr.cfg.spec.tables.len() {
        if tr.store.is_hash(t) {
            local_create_hash(tr, &f, tmp, t, counts, dtype)?;
            continue;
        }
        let sp = tr.store.state_per_row(t);
        let segs: Vec<u64> = descs
            .iter()
            .filter(|d| d.1 == t)
            .flat_map(|d| [d.2 as u64, d.3 as u64, d.4 as u64])
            .collect();
        let (ni, nr, ns) = offsets(descs, descs.len(), t, sp);
        let g = h5(tmp, "group", f.create_group(&format!("delta/{t}")))?;
        let at = |n: &str| format!("/delta/{t}/{n}");
        let ds = h5(
            tmp,
            at("segments"),
            g.new_dataset::<u64>()
                .shape((segs.len() / 3, 3))
                .create("segments"),
        )?;
        if !segs.is_empty() {
            h5(tmp, at("segments"), ds.write_raw(&segs))?;
        }
        h5(
            tmp,
            at("ids"),
            g.new_dataset::<u64>().shape(ni).create("ids"),
        )?;
        create_rows(&g, tmp, &format!("/delta/{t}"), dtype, (nr, ni))?;
        if sp > 0 {
            h5(
                tmp,
                at("state"),
                g.new_dataset::<f32>().shape(ns).create("state"),
            )?;
        }
    }
    let g = h5(tmp, "group", f.create_group("mlp"))?;
    let flat = tr.mlp.flat();
    h5(
        tmp,
        "/mlp/params",
        g.new_dataset_builder().with_data(&flat).create("params"),
    )?;
    h5(
        tmp,
        "/mlp/state",
        g.new_dataset_builder()
            .with_data(tr.dense_state.state())
            .create("state"),
    )?;
    write_attrs(&f, tmp, attrs)?;
    // The tables' dtype, as a full checkpoint records it (absent: f32); the rows are
    // the 16-bit values widened to f32 (exact) unless `--ckpt-delta-dtype bf16`.
    let table_dtype = tr.cfg.spec.table_dtype;
    if !table_dtype.is_f32() {
        let d = Attr::Str(table_dtype.name().into());
        crate::io::h5::write_attr(&f, tmp, "table_dtype", &d)?;
    }
    h5(tmp, "close", f.close())
}

/// This rank's turn: write its segments at their offsets.
fn local_write(
    tr: &EmbedTrainer,
    tmp: &Path,
    rank: usize,
    (mine, parts): (&[Segment], &[HashPart]),
    (descs, counts): (&[Desc], &HashCounts),
    dtype: DeltaDtype,
) -> Result<()> {
    let f = h5(tmp, "open", crate::io::h5::open_rw(tmp))?;
    local_write_hash(tr, &f, tmp, rank, parts, counts, dtype)?;
    let first = descs
        .iter()
        .position(|d| d.0 == rank)
        .unwrap_or(descs.len());
    for (k, seg) in mine.iter().enumerate() {
        let n = seg.ids.len();
        if n == 0 {
            continue;
        }
        let t = seg.table;
        let sp = tr.store.state_per_row(t);
        let (i, r, s) = offsets(descs, first + k, t, sp);
        let ds = |name: &str| {
            let at = format!("/delta/{t}/{name}");
            h5(tmp, &at, f.dataset(&at)).map(|d| (d, at))
        };
        let (d, at) = ds("ids")?;
        h5(tmp, &at, d.write_slice(&seg.ids, i..i + n))?;
        let (group, w) = (format!("/delta/{t}"), seg.cols.len());
        write_rows(&f, tmp, &group, dtype, (&seg.rows, w), (r, i))?;
        if !seg.state.is_empty() {
            let (d, at) = ds("state")?;
            h5(tmp, &at, d.write_slice(&seg.state, s..s + seg.state.len()))?;
        }
    }
    h5(tmp, "close", f.close())
}

/// Collective: every rank must call. Write the delta of `tr` (its rows changed since
/// the base, [`EmbedTrainer::dirty`]) to `path` atomically, with the root attributes
/// `attrs`.
pub(crate) fn global_write_delta<C: Comm>(
    comm: &C,
    tr: &EmbedTrainer,
    path: &Path,
    attrs: &[(&str, Attr)],
    dtype: DeltaDtype,
) -> Result<()> {
    let mine = comm.agree(local_segments(tr, comm.rank()))?;
    let parts = comm.agree(local_hash_parts(tr))?;
    let descs = global_descs(comm, &mine)?;
    let counts = global_hash_counts(comm, tr, &parts)?;
    global_write_atomic(
        comm,
        path,
        |tmp| local_create(tr, tmp, attrs, (&descs, &counts), dtype),
        |tmp| {
            let (me, data, offsets) = (comm.rank(), (&mine[..], &parts[..]), (&descs[..], &counts));
            local_write(tr, tmp, me, data, offsets, dtype)
        },
    )
}

/// Collective: every rank must call. The changed rows the next delta would hold, over
/// all ranks (its manifest records it).
pub(crate) fn global_delta_rows<C: Comm>(comm: &C, tr: &EmbedTrainer) -> u64 {
    let mine = tr.dirty.as_ref().map_or(0, |d| {
        tr.store
            .local
            .iter()
            .enumerate()
            .filter(|(_, ls)| !(ls.shard.replica && comm.rank() != 0))
            .map(|(li, _)| d.rows(li).len() as u64)
            .sum()
    });
    let mut v = [mine];
    comm.all_reduce_sum(&mut v);
    v[0]
}

/// One table's delta as read: segments, ids, rows (as f32), state.
struct TableDelta {
    segs: Vec<u64>,
    ids: Vec<u64>,
    rows: Vec<f32>,
    state: Vec<f32>,
}

fn local_read_table(
    f: &hdf5::File,
    path: &Path,
    t: usize,
    dtype: DeltaDtype,
    sp: usize,
) -> Result<TableDelta> {
    let ds = |name: &str| {
        let at = format!("/delta/{t}/{name}");
        f.dataset(&at)
            .map_err(|_| corrupt(path, format!("dataset {at} is missing")))
    };
    let bad = |name: &str, e: hdf5::Error| {
        corrupt(
            path,
            format!("dataset /delta/{t}/{name} is unreadable: {e}"),
        )
    };
    let segs: Vec<u64> = ds("segments")?.read_raw().map_err(|e| bad("segments", e))?;
    let ids: Vec<u64> = ds("ids")?.read_raw().map_err(|e| bad("ids", e))?;
    // One width per row: each segment's columns.
    let widths: Vec<usize> = segs
        .chunks_exact(3)
        .flat_map(|q| std::iter::repeat_n(q[1].saturating_sub(q[0]) as usize, q[2] as usize))
        .collect();
    if widths.len() != ids.len() {
        return Err(corrupt(
            path,
            format!(
                "/delta/{t}: its segments hold {} rows, its ids {}",
                widths.len(),
                ids.len()
            ),
        ));
    }
    let rows = read_rows(f, path, &format!("/delta/{t}"), dtype, &widths, (0, 0))?;
    let state: Vec<f32> = if sp > 0 {
        ds("state")?.read_raw().map_err(|e| bad("state", e))?
    } else {
        Vec::new()
    };
    Ok(TableDelta {
        segs,
        ids,
        rows,
        state,
    })
}

/// Apply one table's delta to one local shard (`sp` state floats per row).
fn apply_to_shard(
    ls: &mut LocalShard,
    d: &TableDelta,
    (sp, dim, vocab): (usize, usize, u64),
    path: &Path,
) -> Result<()> {
    let (mut i, mut r, mut s) = (0usize, 0usize, 0usize);
    let w = ls.shard.width();
    for q in d.segs.chunks_exact(3) {
        let (lo, hi, n) = (q[0] as usize, q[1] as usize, q[2] as usize);
        let sw = hi.saturating_sub(lo);
        let has_state = lo == 0 && sp > 0;
        let end_s = s + if has_state { n * sp } else { 0 };
        let past = hi < lo
            || hi > dim
            || i + n > d.ids.len()
            || r + n * sw > d.rows.len()
            || (has_state && end_s > d.state.len());
        if past {
            return Err(corrupt(
                path,
                "a delta's segments do not match its ids, rows or state",
            ));
        }
        let (c0, c1) = (lo.max(ls.shard.cols.start), hi.min(ls.shard.cols.end));
        for k in 0..n {
            let id = d.ids[i + k];
            if id >= vocab {
                return Err(corrupt(
                    path,
                    format!("a delta's row id {id} is past the table's {vocab} rows"),
                ));
            }
            if !holds(ls.shard.rows, id) {
                continue;
            }
            let lr = ls.shard.rows.local(id) as usize;
            if c0 < c1 {
                let src = &d.rows[r + k * sw + (c0 - lo)..r + k * sw + (c1 - lo)];
                let a = lr * w + (c0 - ls.shard.cols.start);
                if ls.dtype.is_f32() {
                    ls.data[a..a + (c1 - c0)].copy_from_slice(src);
                } else {
                    // Exact: the delta holds the 16-bit rows widened to f32.
                    ls.dtype.narrow(src, &mut ls.half[a..a + (c1 - c0)]);
                }
            }
            if has_state {
                ls.state[lr * sp..(lr + 1) * sp]
                    .copy_from_slice(&d.state[s + k * sp..s + (k + 1) * sp]);
            }
        }
        i += n;
        r += n * sw;
        s = end_s;
    }
    Ok(())
}

/// Rank-local: apply the delta at `path` (its rows' dtype `dtype`) to `store`: every
/// local shard (replicas included) takes the rows and columns it holds.
pub(crate) fn local_apply(store: &mut Store, path: &Path, dtype: DeltaDtype) -> Result<hdf5::File> {
    let f = crate::ckpt::commit::local_open(path)?;
    for t in 0..store.spec.tables.len() {
        if store.is_hash(t) {
            continue;
        }
        let sp = store.state_per_row(t);
        let (vocab, dim) = (store.spec.tables[t].vocab, store.spec.tables[t].dim);
        let d = local_read_table(&f, path, t, dtype, sp)?;
        for ls in store.local.iter_mut().filter(|ls| ls.shard.table == t) {
            apply_to_shard(ls, &d, (sp, dim, vocab), path)?;
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_refuses_what_cannot_act() {
        let p = |full_every, dtype| DeltaPolicy { full_every, dtype };
        assert!(p(1, DeltaDtype::F32).validate().is_ok());
        assert!(p(4, DeltaDtype::Bf16).validate().is_ok());
        let e = p(0, DeltaDtype::F32).validate().unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = p(1, DeltaDtype::Bf16).validate().unwrap_err();
        assert!(e.to_string().contains("--checkpoint-full-every 2"), "{e}");
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn a_chain_is_full_every_n() {
        let mut c = Chain {
            policy: DeltaPolicy {
                full_every: 3,
                dtype: DeltaDtype::F32,
            },
            ..Chain::default()
        };
        let mut kinds = Vec::new();
        for s in 1..=7u64 {
            let d = c.next(s);
            kinds.push(d.as_ref().map_or(0, |d| d.chain));
            let path = PathBuf::from(crate::ckpt::file_name(s));
            c.committed(
                &path,
                &format!("{{\"step\":{s}}}"),
                d.map_or(0, |d| d.chain),
            );
        }
        assert_eq!(kinds, vec![0, 1, 2, 0, 1, 2, 0]);
        let d = c.next(8).unwrap();
        assert_eq!(d.file, crate::ckpt::file_name(7));
        assert_eq!(d.manifest_hash, manifest_hash("{\"step\":7}"));
        // Step 7 again (a resume at the end): full, not a delta on itself.
        assert!(c.next(7).is_none());
    }

    #[test]
    fn holds_matches_the_placements_rows() {
        let cyc = Rows::Cyclic {
            modulus: 3,
            residue: 1,
        };
        let got: Vec<u64> = (0..10).filter(|&i| holds(cyc, i)).collect();
        assert_eq!(got, vec![1, 4, 7]);
        assert!(got
            .iter()
            .enumerate()
            .all(|(k, &i)| cyc.local(i) == k as u64));
        let blk = Rows::Block { lo: 2, hi: 5 };
        let got: Vec<u64> = (0..10).filter(|&i| holds(blk, i)).collect();
        assert_eq!(got, vec![2, 3, 4]);
        assert!(holds(Rows::All, 9));
    }
}
