//! One side's training CSR out of core: its indices live in a per-rank spill file,
//! written once per run in the layout the solver reads, and come back in bounded
//! chunks of whole steps while the half-epoch proceeds (the next chunk is read by a
//! background thread while the current one is solved).
//!
//! The spill is written in two passes over the side's rows (rank-local, no
//! communication):
//! 1. Read `/train/indices` (or `/train_t`) from the prepared file a chunk at a time,
//!    check every row (ids in range, sorted, distinct), add the arcs to the transpose
//!    checksum, and write them to the spill. With several ranks, cut the steps into
//!    *gather blocks*: maximal runs of steps whose distinct fixed-side ids number at
//!    most `gather_rows` (a bitmap of the id space marks them). Each block's sorted
//!    distinct ids (its `needed` list) go to the spill's tail.
//! 2. Rewrite each block's indices in place to positions in its `needed` list (a rank
//!    query on the bitmap), so the solver indexes the gathered rows directly.
//!
//! With one gather block the positions are exactly those of the in-memory layout
//! ([`super::exchange::ExchangePlan::global_build`]): the solves, and so the tables,
//! have the same bits whether the CSR is in memory or spilled, whatever the chunk size.
//!
//! The spill file is unlinked as soon as it is created: it disappears with the
//! process, however the process ends.

use super::csr::{add_checksum, CsrShard};
use crate::data::graph::dataset::check_rows;
use crate::error::{Error, Result};
use crate::io::h5::open_h5;
use crate::io::h5::read_range;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

/// The default `--csr-buffer`: bytes of training CSR indices a rank holds at once.
pub const DEFAULT_CSR_BUFFER: u64 = 256 << 20;

/// A per-rank scratch file of `u32` values, already unlinked.
pub struct SpillFile {
    file: Arc<File>,
    /// Where it was created (for messages; the name no longer exists).
    path: PathBuf,
}

impl SpillFile {
    /// Create `dir/torusrec-spill-<pid>-<tag>.bin` and unlink it at once.
    pub fn create(dir: &Path, tag: &str) -> Result<Self> {
        let path = dir.join(format!("torusrec-spill-{}-{tag}.bin", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
        std::fs::remove_file(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        Ok(Self {
            file: Arc::new(file),
            path,
        })
    }

    fn io(&self, what: &str, source: std::io::Error) -> Error {
        Error::Io {
            path: self.path.clone(),
            source: std::io::Error::new(source.kind(), format!("spill {what}: {source}")),
        }
    }

    /// Write `data` at element offset `at`.
    pub fn write_at(&self, at: u64, data: &[u32]) -> Result<()> {
        write_u32s(&self.file, at, data).map_err(|e| self.io("write", e))
    }

    /// Read `n` elements at element offset `at` into `out` (replacing its contents).
    pub fn read_at(&self, at: u64, n: usize, out: &mut Vec<u32>) -> Result<()> {
        read_u32s(&self.file, at, n, out).map_err(|e| self.io("read", e))
    }
}

fn write_u32s(f: &File, at: u64, data: &[u32]) -> std::io::Result<()> {
    f.write_all_at(as_bytes(data), at * 4)
}

fn read_u32s(f: &File, at: u64, n: usize, out: &mut Vec<u32>) -> std::io::Result<()> {
    if spill_fault() {
        return Err(std::io::Error::other(
            "injected read error (TORUSREC_INJECT_SPILL_ERROR)",
        ));
    }
    // A recycled buffer is overwritten, not zeroed first (a pass over the chunk).
    if out.len() < n {
        out.resize(n, 0);
    }
    out.truncate(n);
    f.read_exact_at(as_bytes_mut(out), at * 4)
}

/// The bytes of `u32` values as the spill stores them (native order: the file never
/// leaves the process that wrote it).
fn as_bytes(v: &[u32]) -> &[u8] {
    // SAFETY: u32 has no padding and every byte pattern is a valid u8; the length is
    // the slice's size in bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn as_bytes_mut(v: &mut [u32]) -> &mut [u8] {
    // SAFETY: as `as_bytes`; every byte pattern is a valid u32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// `TORUSREC_INJECT_SPILL_ERROR=RANK`: spill reads on that rank fail (tests only).
fn spill_fault() -> bool {
    static RANK: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let want = RANK.get_or_init(|| {
        std::env::var("TORUSREC_INJECT_SPILL_ERROR")
            .ok()
            .and_then(|s| s.parse().ok())
    });
    want.is_some_and(|r| SPILL_RANK.with(|c| c.get()) == Some(r))
}

thread_local! {
    /// The rank a thread reads for (set by whoever opens the spill), for the fault hook.
    static SPILL_RANK: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// A bitmap over an id space with a rank query (`ones before id`).
struct Marks {
    words: Vec<u64>,
    /// Set bits before each word (filled by [`Marks::index`]).
    before: Vec<u32>,
}

impl Marks {
    fn new(n: u64) -> Self {
        Self {
            words: vec![0; n.div_ceil(64) as usize],
            before: Vec::new(),
        }
    }
    /// Set `id`; whether it was clear.
    #[inline]
    fn set(&mut self, id: u32) -> bool {
        let (w, b) = ((id >> 6) as usize, id & 63);
        let was = self.words[w] >> b & 1;
        self.words[w] |= 1 << b;
        was == 0
    }
    #[inline]
    fn clear(&mut self, id: u32) {
        self.words[(id >> 6) as usize] &= !(1u64 << (id & 63));
    }
    fn clear_all(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }
    /// The set ids, increasing.
    fn ones(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (i, &w) in self.words.iter().enumerate() {
            let mut w = w;
            while w != 0 {
                out.push((i as u32) << 6 | w.trailing_zeros());
                w &= w - 1;
            }
        }
        out
    }
    /// Prepare [`Marks::position`].
    fn index(&mut self) {
        self.before.clear();
        let mut acc = 0u32;
        for &w in &self.words {
            self.before.push(acc);
            acc += w.count_ones();
        }
    }
    /// The position of a set `id` among the set ids.
    #[inline]
    fn position(&self, id: u32) -> u32 {
        let (w, b) = ((id >> 6) as usize, id & 63);
        self.before[w] + (self.words[w] & ((1u64 << b) - 1)).count_ones()
    }
}

/// What pass 1 and 2 leave of one side.
pub struct SpilledSide {
    pub file: SpillFile,
    /// The first step of each gather block (the first is 0).
    pub block_starts: Vec<usize>,
    /// Where each block's `needed` list lies in the spill: (element offset, length).
    pub needed_at: Vec<(u64, u64)>,
    /// The side's arcs' transpose checksum (see [`super::csr::arc_checksum`]).
    pub checksum: [u64; 2],
    /// The largest gather block (distinct ids).
    pub max_block_rows: u64,
}

impl SpilledSide {
    /// Block `k`'s sorted distinct ids.
    pub fn needed(&self, k: usize) -> Result<Vec<u32>> {
        let (at, n) = self.needed_at[k];
        let mut v = Vec::new();
        self.file.read_at(at, n as usize, &mut v)?;
        Ok(v)
    }
    /// The gather block holding step `s`.
    pub fn block_of(&self, s: usize) -> usize {
        self.block_starts.partition_point(|&b| b <= s) - 1
    }
}

/// How to spill one side.
pub struct SpillSpec<'a> {
    pub path: &'a Path,
    /// `train` or `train_t`.
    pub name: &'a str,
    /// The shard: `indptr` local (from 0), `indices` not loaded, `on_disk` its first
    /// index's offset in the dataset.
    pub shard: &'a CsrShard,
    /// `steps + 1` local row boundaries.
    pub step_bounds: &'a [u64],
    /// Ids are below this (the other side's size).
    pub bound: u64,
    /// `/train_t` (for the checksum: arcs are (column, row) there).
    pub transposed: bool,
    /// Rewrite ids to positions in gather blocks of at most this many distinct ids
    /// (`None` on one rank: ids index the local table, which is the whole table).
    pub gather_rows: Option<u64>,
    /// Most indices held at once.
    pub chunk_elems: u64,
    pub dir: &'a Path,
    pub rank: usize,
}

/// Consecutive runs of steps `[s0, s1)` within `[from, to)` of at most `max_nnz`
/// non-zeros each (at least one step), cut at every `cuts` boundary.
pub fn step_chunks(
    step_bounds: &[u64],
    indptr: &[u64],
    from: usize,
    to: usize,
    max_nnz: u64,
    cuts: &[usize],
) -> Vec<(usize, usize)> {
    let nnz =
        |s0: usize, s1: usize| indptr[step_bounds[s1] as usize] - indptr[step_bounds[s0] as usize];
    let mut out = Vec::new();
    let mut s0 = from;
    while s0 < to {
        let limit = cuts.iter().copied().find(|&c| c > s0).unwrap_or(to).min(to);
        let mut s1 = s0 + 1;
        while s1 < limit && nnz(s0, s1 + 1) <= max_nnz {
            s1 += 1;
        }
        out.push((s0, s1));
        s0 = s1;
    }
    out
}

/// The chunks a [`ChunkReader`] reads for steps `[from, to)`: [`step_chunks`] of at
/// most `max_nnz` non-zeros, except the first, which is at most a sixteenth of that.
/// The solver waits for the first chunk alone (nothing is solved before it); a small
/// one lets it start at once, and solving it takes longer than reading the next.
pub fn read_ahead_chunks(
    step_bounds: &[u64],
    indptr: &[u64],
    from: usize,
    to: usize,
    max_nnz: u64,
) -> Vec<(usize, usize)> {
    let Some(&(_, s1)) = step_chunks(step_bounds, indptr, from, to, max_nnz / 16, &[]).first()
    else {
        return Vec::new();
    };
    let mut out = vec![(from, s1)];
    out.extend(step_chunks(step_bounds, indptr, s1, to, max_nnz, &[]));
    out
}

/// Rank-local: write one side's spill (both passes). Errors name the dataset or the
/// spill file.
pub fn local_spill_side(spec: &SpillSpec) -> Result<SpilledSide> {
    SPILL_RANK.with(|c| c.set(Some(spec.rank)));
    let sh = spec.shard;
    let base = sh
        .on_disk
        .expect("local_spill_side: the shard is in memory");
    let tag = format!("r{}-{}", spec.rank, spec.name);
    let file = SpillFile::create(spec.dir, &tag)?;
    let f = open_h5(spec.path)?;
    let ip = &sh.indptr;
    let sb = spec.step_bounds;
    let steps = sb.len() - 1;
    let nnz = *ip.last().unwrap_or(&0);
    let ds = format!("{}/indices", spec.name);
    let mut marks = spec.gather_rows.map(|_| Marks::new(spec.bound));
    let limit = spec.gather_rows.unwrap_or(u64::MAX);
    let mut block_starts = vec![0usize];
    let mut needed_at = Vec::new();
    let mut tail = nnz;
    let mut count = 0u64;
    let mut max_block_rows = 0u64;
    let mut checksum = [0u64; 2];
    let mut fresh: Vec<u32> = Vec::new();
    let flush = |marks: &Marks, needed_at: &mut Vec<(u64, u64)>, tail: &mut u64| {
        let ids = marks.ones();
        file.write_at(*tail, &ids)?;
        needed_at.push((*tail, ids.len() as u64));
        *tail += ids.len() as u64;
        Ok::<u64, Error>(ids.len() as u64)
    };
    // Pass 1: check, checksum, write, cut into gather blocks.
    for (s0, s1) in step_chunks(sb, ip, 0, steps, spec.chunk_elems, &[]) {
        let (r0, r1) = (sb[s0] as usize, sb[s1] as usize);
        let (a, b) = (ip[r0], ip[r1]);
        let buf = read_range::<u32>(&f, spec.path, &ds, base + a, base + b)?;
        let local_ip: Vec<u64> = ip[r0..=r1].iter().map(|x| x - a).collect();
        check_rows(
            spec.path,
            spec.name,
            sh.lo + r0 as u64,
            &local_ip,
            &buf,
            spec.bound,
        )?;
        add_checksum(
            &mut checksum,
            sh.lo + r0 as u64,
            &local_ip,
            &buf,
            spec.transposed,
        );
        if let Some(m) = marks.as_mut() {
            for s in s0..s1 {
                let (x, y) = (
                    (ip[sb[s] as usize] - a) as usize,
                    (ip[sb[s + 1] as usize] - a) as usize,
                );
                fresh.clear();
                for &id in &buf[x..y] {
                    if m.set(id) {
                        fresh.push(id);
                    }
                }
                if count > 0 && count + fresh.len() as u64 > limit {
                    // Step s opens a new block: the old one is the marks without it.
                    for &id in &fresh {
                        m.clear(id);
                    }
                    max_block_rows = max_block_rows.max(flush(m, &mut needed_at, &mut tail)?);
                    m.clear_all();
                    // Every id of step s, also those the old block had.
                    fresh.clear();
                    for &id in &buf[x..y] {
                        if m.set(id) {
                            fresh.push(id);
                        }
                    }
                    block_starts.push(s);
                    count = 0;
                }
                count += fresh.len() as u64;
            }
        }
        file.write_at(a, &buf)?;
    }
    let Some(mut m) = marks else {
        return Ok(SpilledSide {
            file,
            block_starts,
            needed_at,
            checksum,
            max_block_rows,
        });
    };
    max_block_rows = max_block_rows.max(flush(&m, &mut needed_at, &mut tail)?);
    // Pass 2: ids -> positions in their block's needed list, in place.
    local_rewrite_positions(spec, &file, &mut m, &block_starts, &needed_at)?;
    Ok(SpilledSide {
        file,
        block_starts,
        needed_at,
        checksum,
        max_block_rows,
    })
}

/// Pass 2 of [`local_spill_side`]: rewrite each gather block's indices in the spill,
/// in place, to positions in its `needed` list (read back from the spill's tail at
/// `needed_at`), marking the list's ids in `m`.
fn local_rewrite_positions(
    spec: &SpillSpec,
    file: &SpillFile,
    m: &mut Marks,
    block_starts: &[usize],
    needed_at: &[(u64, u64)],
) -> Result<()> {
    let (ip, sb) = (&spec.shard.indptr, spec.step_bounds);
    let steps = sb.len() - 1;
    let mut buf = Vec::new();
    for k in 0..block_starts.len() {
        let (from, to) = (
            block_starts[k],
            block_starts.get(k + 1).copied().unwrap_or(steps),
        );
        let (at, n) = needed_at[k];
        let mut ids = Vec::new();
        file.read_at(at, n as usize, &mut ids)?;
        m.clear_all();
        for &id in &ids {
            m.set(id);
        }
        m.index();
        for (s0, s1) in step_chunks(sb, ip, from, to, spec.chunk_elems, &[]) {
            let (a, b) = (ip[sb[s0] as usize], ip[sb[s1] as usize]);
            file.read_at(a, (b - a) as usize, &mut buf)?;
            for x in buf.iter_mut() {
                *x = m.position(*x);
            }
            file.write_at(a, &buf)?;
        }
    }
    Ok(())
}

/// A chunk of a spilled side: steps `s0..s1`, their indices from non-zero `a` on.
pub struct Chunk {
    pub s0: usize,
    pub s1: usize,
    pub a: u64,
    pub indices: Vec<u32>,
}

/// Reads chunks of a spill in order on a background thread, one ahead of the
/// consumer (two chunks in memory at most). Dropping it stops the thread. A chunk the
/// consumer is done with goes back through [`ChunkReader::recycle`], so the reader
/// fills it again instead of faulting in a fresh buffer for every chunk; and
/// [`ChunkReader::finish`] hands the buffers back for the next half's reader.
pub struct ChunkReader {
    rx: Receiver<Result<Chunk>>,
    spare: SyncSender<Vec<u32>>,
    thread: std::thread::JoinHandle<Vec<Vec<u32>>>,
}

impl ChunkReader {
    /// Chunks `ranges` (steps) of the side with local `indptr` and `step_bounds`.
    pub fn start(
        spill: &SpilledSide,
        indptr: &[u64],
        step_bounds: &[u64],
        ranges: Vec<(usize, usize)>,
        rank: usize,
        buffers: Vec<Vec<u32>>,
    ) -> Self {
        let file = Arc::clone(&spill.file.file);
        let path = spill.file.path.clone();
        let spans: Vec<(usize, usize, u64, u64)> = ranges
            .into_iter()
            .map(|(s0, s1)| {
                (
                    s0,
                    s1,
                    indptr[step_bounds[s0] as usize],
                    indptr[step_bounds[s1] as usize],
                )
            })
            .collect();
        let (tx, rx) = sync_channel(0);
        let (spare, spares) = sync_channel::<Vec<u32>>(2);
        // The buffers of an earlier reader are filled first (a fresh one of the
        // chunk's size is page-faulted and zeroed by the kernel again).
        for b in buffers.into_iter().take(2) {
            let _ = spare.try_send(b);
        }
        // Every buffer is made the size of the largest chunk once, so that a larger
        // chunk after a smaller one does not grow it again (a copy into fresh pages).
        let largest = spans
            .iter()
            .map(|s| (s.3 - s.2) as usize)
            .max()
            .unwrap_or(0);
        let thread = std::thread::spawn(move || {
            SPILL_RANK.with(|c| c.set(Some(rank)));
            let mut left = Vec::new();
            for (s0, s1, a, b) in spans {
                let mut indices = spares.try_recv().unwrap_or_default();
                // The small buffer goes first: never three at once.
                crate::allocs::regrow_exact(&mut indices, largest);
                let r = read_u32s(&file, a, (b - a) as usize, &mut indices)
                    .map(|()| Chunk { s0, s1, a, indices })
                    .map_err(|e| Error::Io {
                        path: path.clone(),
                        source: std::io::Error::new(e.kind(), format!("spill read: {e}")),
                    });
                let failed = r.is_err();
                if let Err(std::sync::mpsc::SendError(r)) = tx.send(r) {
                    // The consumer is gone: keep the chunk's buffer.
                    if let Ok(c) = r {
                        left.push(c.indices);
                    }
                    break;
                }
                if failed {
                    break;
                }
            }
            left.extend(spares.try_iter());
            left
        });
        Self { rx, spare, thread }
    }

    /// Stops the reader and returns its buffers (with `last`, the chunk in use):
    /// the two largest, for the next reader ([`ChunkReader::start`]).
    pub fn finish(self, last: Option<Chunk>) -> Vec<Vec<u32>> {
        let ChunkReader { rx, spare, thread } = self;
        // A send the thread is blocked in fails: it stops.
        drop(rx);
        drop(spare);
        let mut out = thread.join().unwrap_or_default();
        out.extend(last.map(|c| c.indices));
        // Two are all a reader holds at once (the memory estimate counts two).
        out.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
        out.truncate(2);
        out
    }

    /// Hands a consumed chunk's buffer back for a later chunk (dropped if the reader
    /// holds enough spares or has stopped).
    pub fn recycle(&self, chunk: Chunk) {
        let _ = self.spare.try_send(chunk.indices);
    }

    /// The next chunk (an error if the reader stopped early).
    pub fn next(&self) -> Result<Chunk> {
        self.rx.recv().unwrap_or_else(|_| {
            Err(Error::Comm(
                "the spill reader stopped before the last chunk".into(),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_rank_positions_equal_the_sorted_order() {
        let mut m = Marks::new(200);
        let ids = [150u32, 3, 64, 63, 199, 0, 128];
        for &i in &ids {
            assert!(m.set(i));
        }
        assert!(!m.set(3));
        let ones = m.ones();
        let mut sorted = ids.to_vec();
        sorted.sort();
        assert_eq!(ones, sorted);
        m.index();
        for (k, &id) in sorted.iter().enumerate() {
            assert_eq!(m.position(id), k as u32);
        }
        m.clear(64);
        assert_eq!(m.ones().len(), 6);
        m.clear_all();
        assert!(m.ones().is_empty());
    }

    #[test]
    fn the_first_read_ahead_chunk_is_small_and_the_rest_cover_the_steps() {
        // 40 steps of one row of 10 non-zeros each.
        let step_bounds: Vec<u64> = (0..=40).collect();
        let indptr: Vec<u64> = (0..=40).map(|r| r * 10).collect();
        let c = read_ahead_chunks(&step_bounds, &indptr, 3, 40, 160);
        assert_eq!(c[0], (3, 4)); // 160 / 16 = 10 non-zeros: one step
        assert_eq!(c[1], (4, 20)); // then 16 steps of 10
        assert_eq!(c.last().unwrap().1, 40);
        for w in c.windows(2) {
            assert_eq!(w[0].1, w[1].0, "{c:?}");
        }
        assert!(read_ahead_chunks(&step_bounds, &indptr, 40, 40, 160).is_empty());
    }

    #[test]
    fn step_chunks_respect_the_budget_and_the_cuts() {
        // 6 steps of one row each with 1, 2, 3, 4, 5, 6 non-zeros.
        let ip = vec![0u64, 1, 3, 6, 10, 15, 21];
        let sb: Vec<u64> = (0..=6).collect();
        assert_eq!(
            step_chunks(&sb, &ip, 0, 6, 6, &[]),
            vec![(0, 3), (3, 4), (4, 5), (5, 6)]
        );
        assert_eq!(
            step_chunks(&sb, &ip, 0, 6, 100, &[2, 5]),
            vec![(0, 2), (2, 5), (5, 6)]
        );
        // A step over the budget is a chunk of its own.
        assert_eq!(step_chunks(&sb, &ip, 4, 6, 1, &[]), vec![(4, 5), (5, 6)]);
        assert!(step_chunks(&sb, &ip, 3, 3, 10, &[]).is_empty());
    }
}
