//! How much memory one rank's share of an iALS run needs, estimated from the sizes of
//! its shards before anything large is allocated, and the limit it is held to
//! (`--mem-per-rank`, by default the node's memory divided by the ranks on the node).
//!
//! The estimate is an upper bound of what the run holds at its high-water mark:
//! the two CSR shards (held once), both table shards, the gathered rows of the fixed
//! table during a half-epoch with the send buffer that serves other ranks, the exchange
//! plans, the evaluation's fold-in rows, and a fixed allowance for the program, MPI and
//! HDF5. Pure arithmetic: no I/O, no communication.

use super::solve::{GATHER_FLOATS, LONG_GATHER_FLOATS};
use crate::bf16::TableDtype;
use crate::metrics::human_bytes;

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
    /// Training non-zeros of the whole matrix (they fix the steps of a half-epoch).
    pub nnz_total: u64,
    /// Non-zeros of the longest owned row or column (its item vectors are gathered
    /// into one f32 copy by the solve).
    pub max_row_nnz: u64,
}

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
    let d = d as u64;
    let b = dtype.bytes() as u64;
    let p = s.ranks as u64;
    let csr = (s.rows_local + 1 + s.cols_local + 1) * 8 + (s.nnz_rows + s.nnz_cols) * 4;
    let counts = (s.rows_local + s.cols_local) * 4;
    let tables = (s.rows_local + s.cols_local) * d * b;
    // Rows of the other side one half-epoch gathers: each distinct id once, at most
    // the whole other table and at most one per non-zero (none on one rank).
    let (g_rows, g_cols) = if p == 1 {
        (0, 0)
    } else {
        (s.num_cols.min(s.nnz_rows), s.num_rows.min(s.nnz_cols))
    };
    // Plans: the needed ids of both sides and the ids served to others.
    let plans = if p == 1 { 0 } else { (g_rows + g_cols) * 4 * 2 };
    // During a fetch: the gathered rows plus one round's send and receive buffers, or
    // ALX's dense f32 buffer of every rank's ids.
    let round = 2 * super::exchange::FETCH_ROUND_BYTES as u64;
    let fetch = |gathered: u64| {
        let dense = if allgather {
            p * gathered * d * 4
        } else {
            round
        };
        gathered * d * b + dense
    };
    let exchange = if p == 1 {
        0
    } else {
        fetch(g_rows).max(fetch(g_cols))
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
    let long = s.max_row_nnz * d;
    let long = match dtype {
        TableDtype::F32 if long > LONG_GATHER_FLOATS as u64 => 0,
        _ => long,
    };
    let cg = threads.max(1) as u64 * long.max(GATHER_FLOATS as u64) * 4;
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

/// The node's memory: the smaller of `MemTotal` and a cgroup limit, if readable.
pub fn node_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let total = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()?
        * 1024;
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok());
    Some(cgroup.map_or(total, |c| c.min(total)))
}

/// Ranks that share this node, from the launcher's environment (1 if unknown).
pub fn ranks_on_node() -> usize {
    [
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "SLURM_NTASKS_PER_NODE",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
    .unwrap_or(1)
    .max(1)
}

/// `--mem-per-rank`, else the node's memory divided by the ranks on it.
pub fn limit(flag: Option<u64>) -> Option<u64> {
    flag.or_else(|| node_memory_bytes().map(|m| m / ranks_on_node() as u64))
}

/// `Err(message)` when the estimate exceeds the limit.
pub fn check(est: &MemEstimate, limit: Option<u64>, flag_given: bool) -> Result<(), String> {
    match limit {
        Some(l) if est.total() > l => Err(format!(
            "this run needs an estimated {} per rank, more than {} ({}); use more ranks, --table-dtype bf16, a smaller --dim, or raise --mem-per-rank",
            est.describe(),
            human_bytes(l),
            if flag_given {
                "--mem-per-rank"
            } else {
                "the node's memory divided by the ranks on it; --mem-per-rank overrides"
            }
        )),
        _ => Ok(()),
    }
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
            nnz_total: 20_000,
            max_row_nnz: 90,
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
        // buffers of one round.
        let round = 2 * crate::als::exchange::FETCH_ROUND_BYTES as u64;
        assert_eq!(part(&f, "exchange"), 1000 * 64 * 4 + round);
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
        // Past the cap an f32 table's row is read in place; a bf16 one is still widened.
        let hub = ShardSizes {
            max_row_nnz: LONG_GATHER_FLOATS as u64,
            ..sizes(2)
        };
        let f = estimate(&hub, 64, TableDtype::F32, false, 1000, 1);
        assert_eq!(part(&f, "solver copies"), GATHER_FLOATS as u64 * 4);
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
