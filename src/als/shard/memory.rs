//! How much memory one rank's share of an iALS run needs, estimated from the sizes of
//! its shards before anything large is allocated, and the limit it is held to
//! (`--mem-per-rank`, by default the node's memory divided by the ranks on the node).
//!
//! The estimate is an upper bound of what the run holds at its high-water mark:
//! the two CSR shards (held once), both table shards, the gathered rows of the fixed
//! table during a half-epoch with the send buffer that serves other ranks, the exchange
//! plans, the evaluation's fold-in rows, and a fixed allowance for the program, MPI and
//! HDF5 ([`BASE_BYTES`]). Pure arithmetic: no I/O, no communication.

use crate::als::solve::{GATHER_FLOATS, LONG_GATHER_FLOATS};
use crate::bf16::TableDtype;
use crate::mem_estimate::{MemEstimate, BASE_BYTES};
use crate::metrics::human_bytes;
use serde::{Deserialize, Serialize};

/// What one rank holds, from the dataset's sizes and this rank's shard bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSizes {
    pub ranks: usize,
    pub num_rows: u64,
    pub num_cols: u64,
    /// Rows of W and columns of H this rank owns.
    pub rows_local: u64,
    pub cols_local: u64,
    /// Training non-zeros of the owned rows and of the owned columns.
    pub nnz_rows: u64,
    pub nnz_cols: u64,
    /// All test rows, and the visible (fold-in) arcs of this rank's test rows.
    pub test_rows: u64,
    pub fold_nnz_local: u64,
    /// Bytes of this rank's test rows (ids, visible and held-out arcs), read at the
    /// start and held for the whole run.
    pub test_bytes_local: u64,
    /// Training non-zeros of the whole matrix (they fix the steps of a half-epoch).
    pub nnz_total: u64,
    /// Non-zeros of the longest owned row or column (its item vectors are gathered
    /// into one f32 copy by the solve).
    pub max_row_nnz: u64,
    /// The most training non-zeros (both sides) any rank holds: the CSR is read into
    /// memory only when every rank's fits in `--csr-buffer` (the same answer on every
    /// rank).
    pub max_csr_nnz: u64,
}

/// Where a run keeps its training CSR and how much of the fixed table it gathers at
/// once (chosen by [`layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The training CSR is read into memory (else spilled and streamed).
    pub csr_in_memory: bool,
    /// Bytes of CSR indices held at once when streamed (`--csr-buffer`).
    pub csr_buffer: u64,
    /// The most fixed-side rows one gather holds (`None`: the whole half's, once).
    pub gather_rows: Option<u64>,
    /// Solver threads' hub chunk (`--hub-chunk`; 0 = never chunked).
    pub hub_chunk: u64,
}

impl Layout {
    /// Indices in one chunk of a streamed side, for sides of at most `side_nnz`
    /// non-zeros: at most half the buffer, and the largest side cut into chunks of
    /// equal size, so that the two held at once take no more than the side itself
    /// when it has more than one (a side a little over half the buffer would
    /// otherwise hold two half-buffers).
    pub fn chunk_elems(&self, side_nnz: u64) -> u64 {
        let half = (self.csr_buffer / 8).max(1);
        side_nnz.div_ceil(side_nnz.div_ceil(half).max(1)).max(1)
    }

    /// Everything in memory, one gather per half (the layout of runs that fit).
    pub fn in_memory() -> Self {
        Layout {
            csr_in_memory: true,
            csr_buffer: u64::MAX,
            gather_rows: None,
            hub_chunk: 0,
        }
    }
}

/// `--gather-buffer`: how many bytes of the fixed table's gathered rows a rank holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum GatherBuffer {
    /// What the memory limit leaves after everything else (all of it when unknown).
    #[default]
    Auto,
    /// At most this many bytes (at least one step's rows are always gathered).
    Bytes(u64),
    /// The whole half's rows at once, whatever the limit.
    All,
}

impl std::str::FromStr for GatherBuffer {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "all" => Ok(Self::All),
            _ => match crate::metrics::parse_bytes(s) {
                Ok(0) => Err("--gather-buffer must be positive".into()),
                Ok(b) => Ok(Self::Bytes(b)),
                Err(e) => Err(format!("{e}; or auto, all")),
            },
        }
    }
}

impl std::fmt::Display for GatherBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Self::Auto => write!(f, "auto"),
            Self::All => write!(f, "all"),
            Self::Bytes(b) => write!(f, "{}", human_bytes(*b)),
        }
    }
}

/// The fewest rows an automatic gather buffer holds (below that, refuse instead).
pub const MIN_GATHER_ROWS: u64 = 1 << 16;

/// The estimate for `d`-wide tables stored as `dtype`, with the all-gather baseline's
/// dense buffers when `allgather`, steps of about `step_nnz` non-zeros and `threads`
/// solver threads.
pub fn estimate(
    s: &ShardSizes,
    d: usize,
    dtype: TableDtype,
    allgather: bool,
    step_nnz: u64,
    threads: usize,
) -> MemEstimate {
    estimate_with(
        s,
        d,
        dtype,
        allgather,
        step_nnz,
        threads,
        &Layout::in_memory(),
    )
}

/// Choose the layout for a memory limit: the CSR in memory when every rank's fits in
/// `csr_buffer` and the whole gather is kept; the gather buffer as `gather` says
/// (`Auto`: what the limit leaves, at least [`MIN_GATHER_ROWS`]). Returns the layout
/// and its estimate (which the caller checks against the limit).
#[allow(clippy::too_many_arguments)]
pub fn layout(
    s: &ShardSizes,
    d: usize,
    dtype: TableDtype,
    allgather: bool,
    step_nnz: u64,
    threads: usize,
    csr_buffer: u64,
    hub_chunk: u64,
    gather: GatherBuffer,
    limit: Option<u64>,
) -> (Layout, MemEstimate) {
    let row_bytes = (d as u64 * dtype.bytes() as u64).max(1);
    let whole = if s.ranks == 1 {
        0
    } else {
        s.num_cols.min(s.nnz_rows).max(s.num_rows.min(s.nnz_cols))
    };
    let mut lay = Layout {
        csr_in_memory: s.max_csr_nnz.saturating_mul(4) <= csr_buffer,
        csr_buffer,
        gather_rows: None,
        hub_chunk,
    };
    let est = |l: &Layout| estimate_with(s, d, dtype, allgather, step_nnz, threads, l);
    let rows = match gather {
        GatherBuffer::All => None,
        GatherBuffer::Bytes(b) => Some((b / row_bytes).max(1)),
        GatherBuffer::Auto => limit.map(|l| {
            let rest = est(&Layout {
                gather_rows: Some(0),
                csr_in_memory: false,
                ..lay
            })
            .total();
            // A gathered row also costs its id in the plans of every rank it serves, and
            // the fetch rounds' buffers grow with the rows up to their cap: leave the
            // cap, or, when that leaves nothing, twice the rows' bytes.
            let per_row = row_bytes + 4 * s.ranks as u64;
            let cap = round_buffers(super::exchange::FETCH_ROUND_BYTES as u64);
            match l.saturating_sub(rest).checked_sub(cap) {
                Some(left) if left / per_row >= MIN_GATHER_ROWS => left / per_row,
                _ => l.saturating_sub(rest) / (per_row + 2 * row_bytes),
            }
            .max(MIN_GATHER_ROWS)
        }),
    };
    if let Some(r) = rows.filter(|&r| r < whole) {
        // Gathering in blocks needs the streamed layout.
        lay.gather_rows = Some(r);
        lay.csr_in_memory = false;
    }
    let e = est(&lay);
    (lay, e)
}

/// A fetch round's send and receive buffers for rounds of `bytes`: the receive buffer
/// is kept from round to round with a quarter more room
/// ([`crate::allocs::resize_for_overwrite`]).
fn round_buffers(bytes: u64) -> u64 {
    2 * bytes + bytes / 4
}

/// [`estimate`] for a given layout.
pub fn estimate_with(
    s: &ShardSizes,
    d: usize,
    dtype: TableDtype,
    allgather: bool,
    step_nnz: u64,
    threads: usize,
    lay: &Layout,
) -> MemEstimate {
    let d = d as u64;
    let b = dtype.bytes() as u64;
    let p = s.ranks as u64;
    let offsets = (s.rows_local + 1 + s.cols_local + 1) * 8;
    let indices = (s.nnz_rows + s.nnz_cols) * 4;
    // Streamed: a half reads one side's indices, two chunks at a time (of at most
    // half the buffer each, see `Layout::chunk_elems`), and while the spill is written
    // a bitmap of the other side's ids. The chunk buffers are kept from half to half
    // (freed before an evaluation or a checkpoint).
    let chunks = if lay.csr_in_memory {
        0
    } else {
        2 * lay.chunk_elems(s.nnz_rows.max(s.nnz_cols)) * 4
    };
    let csr = if lay.csr_in_memory {
        offsets + indices
    } else {
        offsets + chunks + s.num_rows.max(s.num_cols).div_ceil(8)
    };
    let counts = (s.rows_local + s.cols_local) * 4 + s.test_bytes_local;
    let tables = (s.rows_local + s.cols_local) * d * b;
    // Rows of the other side one half-epoch gathers: each distinct id once, at most
    // the whole other table and at most one per non-zero (none on one rank).
    let (g_rows, g_cols) = if p == 1 {
        (0, 0)
    } else {
        let cap = lay.gather_rows.unwrap_or(u64::MAX);
        (
            s.num_cols.min(s.nnz_rows).min(cap),
            s.num_rows.min(s.nnz_cols).min(cap),
        )
    };
    // Plans: the needed ids of both sides and the ids served to others (when gathered
    // in blocks: one side's block at a time, served to every other rank).
    let plans = match (p, lay.gather_rows) {
        (1, _) => 0,
        (_, None) => (g_rows + g_cols) * 4 * 2,
        (_, Some(_)) => g_rows.max(g_cols) * 4 * p,
    };
    // Evaluation: the fold-in rows of H, the folded-in test rows on every rank.
    let eval = s.num_cols.min(s.fold_nnz_local) * d * b + s.test_rows * d * 4;
    // A bf16 run solves a step's rows through an f32 copy: about rows / steps of
    // them (steps are cut by non-zeros; four times that leaves room for uneven rows).
    let steps = s.nnz_total.div_ceil(step_nnz.max(1)).clamp(1, 4096);
    let scratch = if dtype == TableDtype::Bf16 {
        (s.rows_local.max(s.cols_local).div_ceil(steps) * 4).min(s.rows_local.max(s.cols_local))
            * d
            * 4
    } else {
        0
    };
    // Every solver thread gathers a batch's item vectors into an f32 copy: a few rows'
    // worth, or a whole long row (an f32 table's rows past LONG_GATHER_FLOATS are read
    // in place instead; a bf16 table's are always widened).
    // Past the cap an f32 row is read in place and a bf16 hub row is widened one hub
    // chunk at a time (by each of the threads).
    let long = s.max_row_nnz * d;
    // The copy is each thread's scratch, kept from solve to solve (and half to half):
    // past the cap an f32 row is read in place, but the rows below it are still
    // gathered, up to the cap.
    let long = match dtype {
        _ if long <= LONG_GATHER_FLOATS as u64 => long,
        TableDtype::F32 => LONG_GATHER_FLOATS as u64,
        _ if lay.hub_chunk > 0 && s.max_row_nnz > lay.hub_chunk => {
            LONG_GATHER_FLOATS as u64 + lay.hub_chunk * d
        }
        _ => long,
    };
    let cg = threads.max(1) as u64 * long.max(GATHER_FLOATS as u64) * 4;
    // During a fetch: the gathered rows plus one round's send and receive buffers, or
    // ALX's dense f32 buffer of every rank's ids.
    // A round's send and receive buffers: at most the round's bytes each, and at most
    // the other ranks' share of the gathered rows (a rank's own rows are copied).
    let round = |gathered: u64| {
        round_buffers(
            (super::exchange::FETCH_ROUND_BYTES as u64).min(gathered * d * b * (p - 1) / p),
        )
    };
    let fetch = |gathered: u64| {
        let dense = if allgather {
            p * gathered * d * 4
        } else {
            round(gathered)
        };
        // The chunk buffers are kept from half to half (a fresh one is faulted in and
        // zeroed by the kernel again), so they are held while a half fetches, whether
        // it gathers once before its chunk reader starts or in blocks between steps:
        // the round (or dense) buffers count on top of them.
        gathered * d * b + dense
    };
    let exchange = if p == 1 {
        0
    } else {
        fetch(g_rows).max(fetch(g_cols))
    };
    MemEstimate {
        parts: vec![
            ("tables", tables),
            ("CSR", csr + counts),
            ("exchange", exchange.max(eval)),
            ("plans", plans),
            ("f32 scratch", scratch),
            ("solver copies", cg),
            ("base", BASE_BYTES),
        ],
    }
}

/// `Err(message)` when the estimate exceeds the limit.
pub fn check(est: &MemEstimate, limit: Option<u64>, flag_given: bool) -> Result<(), String> {
    crate::node::check_fits(est.total(), limit, |l| {
        format!(
            "this run needs an estimated {} per rank, more than {} ({}); use more ranks, --table-dtype bf16, a smaller --dim, or raise --mem-per-rank",
            est.describe(),
            human_bytes(l),
            if flag_given {
                "--mem-per-rank"
            } else {
                "the node's memory divided by the ranks on it; --mem-per-rank overrides"
            }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(p: usize) -> ShardSizes {
        ShardSizes {
            ranks: p,
            num_rows: 1000,
            num_cols: 1000,
            rows_local: 1000 / p as u64,
            cols_local: 1000 / p as u64,
            nnz_rows: 20_000 / p as u64,
            nnz_cols: 20_000 / p as u64,
            test_rows: 100,
            fold_nnz_local: 500,
            test_bytes_local: 0,
            nnz_total: 20_000,
            max_row_nnz: 90,
            max_csr_nnz: 40_000 / p as u64,
        }
    }

    #[test]
    fn bf16_halves_the_tables_and_one_rank_exchanges_nothing() {
        let f = estimate(&sizes(2), 64, TableDtype::F32, false, 1000, 1);
        let b = estimate(&sizes(2), 64, TableDtype::Bf16, false, 1000, 1);
        let part = |e: &MemEstimate, k: &str| e.parts.iter().find(|p| p.0 == k).unwrap().1;
        assert_eq!(part(&f, "tables"), 2 * part(&b, "tables"));
        assert_eq!(part(&f, "tables"), 1000 * 64 * 4);
        // Two ranks: each gathers at most the whole other table (1000 rows), plus the
        // buffers of one round: the other rank's half of them, sent and received (the
        // CSR is in memory: no chunk buffers to share the high-water mark with).
        // (The receive buffer is kept with a quarter more room.)
        let round = 2 * (1000 * 64 * 4 / 2) + 1000 * 64 * 4 / 2 / 4;
        assert_eq!(part(&f, "exchange"), 1000 * 64 * 4 + round);
        // Streamed: the chunk buffers are kept from half to half, so a half's round
        // buffers count on top of them, whether it gathers once or in blocks.
        let streamed = |gather_rows| Layout {
            csr_in_memory: false,
            csr_buffer: 1 << 30,
            gather_rows,
            hub_chunk: 0,
        };
        for gather_rows in [None, Some(1000)] {
            let e = estimate_with(
                &sizes(2),
                64,
                TableDtype::F32,
                false,
                1000,
                1,
                &streamed(gather_rows),
            );
            assert_eq!(part(&e, "exchange"), 1000 * 64 * 4 + round);
            // The CSR part: both sides' offsets, two chunks (one side fits in half
            // the buffer here: two chunks of all of its 20,000 / 2 non-zeros), the
            // spill's bitmap and the counts.
            let offsets = (500 + 1 + 500 + 1) * 8;
            assert_eq!(
                part(&e, "CSR"),
                offsets + 2 * 20_000 / 2 * 4 + 1000 / 8 + 1000 * 4
            );
            // The test rows are held whatever the layout.
            let held = ShardSizes {
                test_bytes_local: 12_345,
                ..sizes(2)
            };
            let h = estimate_with(
                &held,
                64,
                TableDtype::F32,
                false,
                1000,
                1,
                &streamed(gather_rows),
            );
            assert_eq!(part(&h, "CSR"), part(&e, "CSR") + 12_345);
        }
        // Ten times the nodes: ten times the rows and the rounds.
        let big = ShardSizes {
            num_rows: 10_000,
            num_cols: 10_000,
            rows_local: 5_000,
            cols_local: 5_000,
            ..sizes(2)
        };
        let fb = estimate(&big, 64, TableDtype::F32, false, 1000, 1);
        assert_eq!(part(&fb, "exchange"), 10 * (1000 * 64 * 4 + round));
        let one = estimate(&sizes(1), 64, TableDtype::F32, false, 1000, 1);
        assert_eq!(part(&one, "plans"), 0);
        // One rank: only the evaluation's fold-in rows and test rows.
        assert_eq!(part(&one, "exchange"), (500 + 100) * 64 * 4);
        // 20 steps of 500 rows: the f32 copy of a step is 4 x 25 rows wide at most.
        assert_eq!(part(&b, "f32 scratch"), 100 * 64 * 4);
        // ALX's all-gather holds a dense f32 buffer of every rank's ids instead.
        let ag = estimate(&sizes(2), 64, TableDtype::F32, true, 1000, 1);
        assert_eq!(part(&ag, "exchange"), 1000 * 64 * 4 + 2 * 1000 * 64 * 4);
    }

    #[test]
    fn chunks_cut_the_side_evenly_within_half_the_buffer() {
        let lay = |csr_buffer| Layout {
            csr_in_memory: false,
            csr_buffer,
            gather_rows: None,
            hub_chunk: 0,
        };
        // Half of 100 bytes holds 12 indices.
        assert_eq!(lay(100).chunk_elems(12), 12);
        // One more: two chunks of 7, not 12 and 1.
        assert_eq!(lay(100).chunk_elems(13), 7);
        assert_eq!(lay(100).chunk_elems(25), 9);
        assert_eq!(lay(100).chunk_elems(0), 1);
        assert_eq!(lay(4).chunk_elems(5), 1);
        // Two chunks never hold more than the side once it needs more than one, nor
        // more than the buffer.
        for side in 13..500 {
            let c = lay(100).chunk_elems(side);
            assert!(c <= 12 && 2 * c <= side + 1, "{side}: {c}");
        }
    }

    #[test]
    fn solver_copies_hold_the_longest_row_per_thread() {
        let part = |e: &MemEstimate, k: &str| e.parts.iter().find(|p| p.0 == k).unwrap().1;
        // Short rows: one batch budget per thread.
        let e = estimate(&sizes(2), 64, TableDtype::F32, false, 1000, 3);
        assert_eq!(part(&e, "solver copies"), 3 * GATHER_FLOATS as u64 * 4);
        // A row longer than the budget is copied whole, per thread.
        let long = ShardSizes {
            max_row_nnz: 10_000,
            ..sizes(2)
        };
        let e = estimate(&long, 64, TableDtype::F32, false, 1000, 2);
        assert_eq!(part(&e, "solver copies"), 2 * 10_000 * 64 * 4);
        // Past the cap an f32 table's row is read in place, but the rows below the cap
        // are still copied (into a scratch kept from solve to solve): the cap counts. A
        // bf16 row is widened whole.
        let hub = ShardSizes {
            max_row_nnz: LONG_GATHER_FLOATS as u64,
            ..sizes(2)
        };
        let f = estimate(&hub, 64, TableDtype::F32, false, 1000, 1);
        assert_eq!(part(&f, "solver copies"), LONG_GATHER_FLOATS as u64 * 4);
        let b = estimate(&hub, 64, TableDtype::Bf16, false, 1000, 1);
        assert_eq!(
            part(&b, "solver copies"),
            LONG_GATHER_FLOATS as u64 * 64 * 4
        );
    }

    #[test]
    fn check_refuses_above_the_limit_and_names_the_flag() {
        let e = estimate(&sizes(2), 64, TableDtype::F32, false, 1000, 1);
        assert!(check(&e, Some(e.total()), true).is_ok());
        assert!(check(&e, None, false).is_ok());
        let msg = check(&e, Some(e.total() - 1), true).unwrap_err();
        assert!(msg.contains("--mem-per-rank"), "{msg}");
        assert!(msg.contains("tables"), "{msg}");
    }
}
