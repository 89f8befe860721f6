//! Choosing a [`Plan`]: a cost model of one optimizer step, a planner that mixes every
//! placement kind, and the table-wise heuristics it is compared with.
//!
//! # Cost model
//!
//! All quantities are per optimizer step and per rank `i`; the cost of a rank is the sum
//! over the shards it holds. `N` is the world, `b` the batch per rank, and for table `t`
//! of `V` rows and width `d`, `U` is [`TableStats::unique_per_rank_batch`] and `v` is
//! [`TableStats::mean_valency`]. A row access of `w` floats moves
//! `a(w) = max(4 w, line_bytes)` bytes: narrow column shards still cost a cache line.
//!
//! A non-replicated shard holding `rows` rows and `w` columns (table-wise: all rows and
//! columns; row-wise: a block or residue class of rows; column-wise: all rows, some
//! columns) serves the fraction `f = rows / V` of the ids, since hot ids are spread
//! uniformly over rows (the generator scatters ids):
//!
//! - ids arriving at the owner: `n_in = N U f` (each source deduplicates its ids);
//! - bytes exchanged: `n_in (4 + (e + 4) w)` (the id in, the row out at `e` bytes a
//!   value, 4 at f32 and 2 at `table_dtype` bf16/f16, the f32 gradient in);
//! - bytes of table memory: `n_in (3 a(w) + 4 s)` with `s` optimizer floats per row
//!   (read the row for the forward pass, read and write it for the update; the state is
//!   stored next to its row and read and written with it);
//! - lookups and updates: `2 n_in`.
//!
//! A data-parallel table has a replica on every rank, which
//!
//! - reads `b v a(d)` bytes to pool its own examples (`b v` lookups),
//! - all-reduces the full table gradient: `2 V d 4 (N - 1) / N` bytes exchanged, at
//!   `allreduce_bw` (a torus all-reduce has its own rate; this machine's model keeps
//!   it equal to `net_bw`),
//! - and applies that dense gradient to every row: `V (3 a(d) + 4 s)` bytes of memory.
//!
//! The all-reduce and the dense update grow with `V`, which is why replication only
//! pays for small tables. The pooling reads are charged to a replica although pooling
//! the received rows is not charged to sharded placements (below), which makes the model
//! conservative about replication. Every shard (and replica) also costs a fixed `shard_s` seconds
//! (bucketing ids per destination, one more lookup kernel, one more message segment),
//! the small overhead of cutting a table into many pieces.
//!
//! `cost_i = sum (exchange(bytes_exchanged) + bytes_memory / mem_bw +
//! lookups lookup_s + shard_s)` over the shards on `i` (a replica's all-reduced bytes
//! over `allreduce_bw`). Every rank asks an owner for the same share of the ids, the
//! owner itself included, and the owner's own share never crosses the network: of `B`
//! bytes exchanged, `exchange(B) = B (N - 1) / N / net_bw + 2 B / N / mem_bw` (the own
//! share is a copy, read and written). With the default constants the two rates agree
//! (`net_bw = mem_bw / 2`), so this only matters for a calibrated model, e.g. a TPU's
//! HBM beside its links. The work of the requesting side (sending its ids, pooling the
//! rows it receives) is the same on every rank whatever the plan, so it is left out:
//! the model ranks plans by the owners' load. The memory of rank `i`
//! is `sum rows (e w + 4 s)` over its shards, exactly [`Plan::bytes_per_rank`]. Owners do
//! not deduplicate ids across sources, so [`TableStats::unique_per_global_batch`] is
//! not used, and the stats' `world` need not be the world planned for.
//!
//! # Output modes
//!
//! A sharded table's lookups come back as rows (`rows`, the model above) or as one
//! pooled vector per example (`pooled`, see `embed::sharding::pooled`). Per piece, `pooled` brings
//! `n_in` distinct ids, `o_in = N b v f` occurrences and `E = N b` examples to the owner:
//! `4 n_in + 4 o_in + 4 E + 8 E w` bytes exchanged (ids, occurrence indices, per-example
//! counts; the pooled vectors out and their gradients in), `o_in (a(w) + 4 w) + n_in
//! (2 a(w) + 4 s)` bytes of memory (pool every occurrence from the table, add its
//! gradient; update each distinct row) and `2 n_in` lookups (each distinct row is a
//! likely miss when pooled and when updated; repeated occurrences hit the cache). The asking side is
//! no longer the same under both modes, so every rank is also charged, per sharded
//! table, its asking work: deduplicating its `b v` ids (`lookup_s` each) and, for
//! `rows`, `2 b v + 2 U` row accesses (pool the occurrences and add their gradients;
//! place the distinct rows and read their gradients), for `pooled`, `(k + 1) b 4 d`
//! bytes (add the partials of the table's `k` pieces, scale the gradients). Pooling
//! moves work from the asking ranks to the owners, so the modes change the balance of
//! a placement: the planner searches twice (below), once with every owner charged in
//! `rows` and once with each table charged in its preferred mode (the cheaper one over
//! all ranks when the table is placed whole). After each search the modes are chosen
//! under its placements: from the modes it searched with, tables in order of the
//! modelled saving, each switched to the other mode when that lowers the plan's
//! (maximum, total) cost. `torusrec plan` prints each table's mode with both modes'
//! bytes and seconds.
//!
//! # Planner
//!
//! [`plan_auto`] runs, in each of its two passes (output modes above), a deterministic
//! local search from three starts, and keeps the plan with the lowest maximum cost
//! (then the lowest total) over both passes:
//!
//! 1. a greedy over every placement kind: tables by descending table-wise cost, each
//!    given the candidate that minimizes the resulting maximum cost (ties: least memory,
//!    then least added cost, then the least loaded ranks). Candidates: table-wise on any
//!    rank; column-wise into `k = 2, 4, ...` `<= min(N, d)` shards of even width on the
//!    `k` least loaded ranks; row-wise block over the `k = 2, 4, ... < N` least loaded
//!    ranks; row-wise block and cyclic over all ranks; data-parallel. While it is
//!    possible, every choice leaves each rank room for a row-wise share of every table
//!    still to place, so the greedy cannot paint itself into a corner;
//! 2. table-wise longest-processing-time first under the cost model;
//! 3. [`plan_lookup_greedy`].
//!
//! The second pass starts from the first pass's plan instead of the greedy (1.): under
//! pooled costs the greedy's search took minutes at 128 ranks and ended worse.
//!
//! The local search repeatedly takes the best of these changes, if it lowers the
//! descending vector of rank costs lexicographically (the maximum, then the next, ...): move a shard of a table on the most loaded rank
//! to another rank, swap two table-wise tables between that rank and another, or
//! re-place such a table with any greedy candidate. Every change respects
//! `mem_per_rank`. Since the lookup-greedy plan is one of the starts, the search
//! never raises the maximum and choosing modes never raises it either, the result is
//! never worse than lookup-greedy under the model.
//!
//! # Files
//!
//! - `mod.rs`: the public API: [`PlanOptions`], [`PlanReport`], the re-exports of the
//!   planners and [`sample_tasks`], and the tests;
//! - `cost.rs`: the cost model ([`CostModel`], [`evaluate`]) and the checked inputs
//!   every planner starts from;
//! - `heuristics.rs`: the table-wise heuristics ([`Heuristic`], [`plan_heuristic`]);
//! - `search.rs`: the planner's greedy and local search ([`plan_auto`]).
//!
//! Measured costs (`torusrec calibrate`), their file and fit, and the predicted
//! seconds of a step are [`crate::embed::calibrate`]'s.
//!
//! # Measured costs
//!
//! A [`CostModel`] fitted by [`crate::embed::calibrate::fit()`] carries two terms the defaults leave out:
//! a factor per embedding width on the row-access seconds (memory traffic and
//! lookups of the owners and of the asking side), so that a width costs what was
//! measured for it, and the multi-table interference `beta`: a rank holding `k`
//! pieces of `B` bytes costs `1 + beta x` times their sum, `x` the size factor of
//! `B` over that of the pieces' cost-weighted mean size, less 1
//! ([`CostModel::interference_x_sized`]; `1 - 1/k` without a size factor). It also prices the asking side of a `rows` table per occurrence as the
//! calibrated kernels (a gather and a scatter of a row; [`CostModel::ask_row_access`]).
//! The greedy and the local search
//! compare ranks by that cost; with `beta = 0` and no factors (the defaults) every
//! cost is the sum above, bit for bit.
//!
//! [`Plan`]: crate::embed::tables::placement::Plan
//! [`Plan::bytes_per_rank`]: crate::embed::tables::placement::Plan::bytes_per_rank
//! [`TableStats::unique_per_rank_batch`]: crate::embed::train::batch_stats::TableStats::unique_per_rank_batch
//! [`TableStats::unique_per_global_batch`]: crate::embed::train::batch_stats::TableStats::unique_per_global_batch
//! [`TableStats::mean_valency`]: crate::embed::train::batch_stats::TableStats::mean_valency

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::rng::{hash3, stream, SplitMix64};
use crate::spec::ModelSpec;

mod cost;
mod heuristics;
mod search;

pub use cost::{evaluate, mode_costs, CostModel, ModeCosts};
pub use heuristics::{
    plan_dim_greedy, plan_heuristic, plan_lookup_greedy, plan_random, plan_size_greedy, Heuristic,
};
pub use search::plan_auto;

/// The model's view of one plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    /// Modelled seconds per step of each rank.
    pub cost_per_rank: Vec<f64>,
    /// Bytes of rows and optimizer state on each rank ([`Plan::bytes_per_rank`]).
    ///
    /// [`Plan::bytes_per_rank`]: crate::embed::tables::placement::Plan::bytes_per_rank
    pub bytes_per_rank: Vec<u64>,
    pub max_cost: f64,
    pub total_cost: f64,
    /// `N max_i B_i / sum_i B_i` (1 is perfect balance).
    pub imbalance: f64,
    /// `min_i B_i / max_i B_i` (1 is perfect balance).
    pub balance: f64,
}

impl PlanReport {
    fn new(cost_per_rank: Vec<f64>, bytes_per_rank: Vec<u64>) -> Self {
        let max_cost = cost_per_rank.iter().copied().fold(0.0, f64::max);
        let min_cost = cost_per_rank.iter().copied().fold(f64::INFINITY, f64::min);
        let total_cost: f64 = cost_per_rank.iter().sum();
        let n = cost_per_rank.len() as f64;
        let (imbalance, balance) = if max_cost > 0.0 {
            (n * max_cost / total_cost, min_cost / max_cost)
        } else {
            (1.0, 1.0)
        };
        PlanReport {
            cost_per_rank,
            bytes_per_rank,
            max_cost,
            total_cost,
            imbalance,
            balance,
        }
    }

    /// This plan is the better one: a lower maximum cost over the ranks, then a lower
    /// total (what the planner minimizes).
    pub(super) fn better_than(&self, other: &PlanReport) -> bool {
        self.max_cost
            .total_cmp(&other.max_cost)
            .then(self.total_cost.total_cmp(&other.total_cost))
            == std::cmp::Ordering::Less
    }
}

/// What a plan is made for.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanOptions {
    pub world: usize,
    /// Bytes of rows and optimizer state a rank may hold.
    pub mem_per_rank: u64,
    /// Optimizer floats per row (0 for SGD, 1 for row-wise Adagrad).
    pub state_per_row: u64,
    /// Seed of [`plan_random`].
    pub seed: u64,
    pub model: CostModel,
    /// Bound on the improving steps of each local search.
    pub max_iters: usize,
}

impl PlanOptions {
    /// SGD, seed 0, the default cost model and search bound.
    pub fn new(world: usize, mem_per_rank: u64) -> Self {
        PlanOptions {
            world,
            mem_per_rank,
            state_per_row: 0,
            seed: 0,
            model: CostModel::default(),
            max_iters: 1000,
        }
    }
}

/// Table tasks in the manner of AutoShard and DreamShard: `n_tasks` random subsets of
/// the pool's tables (in pool order), each of a uniform size in `tables_per_task`
/// (clamped to `1..=pool size`), deterministic from `seed`.
pub fn sample_tasks(
    pool: &ModelSpec,
    n_tasks: usize,
    tables_per_task: Range<usize>,
    seed: u64,
) -> Vec<ModelSpec> {
    let n = pool.tables.len();
    let lo = tables_per_task.start.clamp(1, n.max(1));
    let hi = tables_per_task.end.clamp(lo + 1, n + 1);
    let task_seed = hash3(seed, stream::PLAN_RANDOM, u64::MAX);
    (0..n_tasks)
        .map(|i| {
            let mut rng = SplitMix64::for_id(task_seed, stream::PLAN_RANDOM, i as u64);
            let k = lo + rng.below((hi - lo) as u64) as usize;
            let mut idx: Vec<usize> = (0..n).collect();
            rng.shuffle(&mut idx);
            idx.truncate(k);
            idx.sort_unstable();
            ModelSpec {
                table_dtype: Default::default(),
                arch: Default::default(),
                n_dense: pool.n_dense,
                hidden: pool.hidden.clone(),
                zipf: pool.zipf,
                tables: idx.iter().map(|&t| pool.tables[t].clone()).collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::cost::{check_inputs, pieces, Piece};
    use super::search::candidates;
    use super::*;
    use crate::embed::tables::placement::{ColumnShard, OutputMode, Placement, Plan};
    use crate::embed::train::batch_stats::{synthetic_stats, SCHEMA};
    use crate::embed::train::batch_stats::{BatchStats, TableStats};
    use crate::spec::{preset, Evict, Pooling, TableSpec, ValencyDist, VocabKind};
    use crate::Error;

    fn table(name: &str, vocab: u64, dim: usize, valency: f64) -> TableSpec {
        TableSpec {
            name: name.into(),
            vocab,
            dim,
            pooling: Pooling::Sum,
            valency,
            valency_dist: ValencyDist::Poisson,
            vocab_kind: VocabKind::Fixed,
            admit_after: 1,
            evict: Evict::Lfu,
        }
    }

    fn spec_of(tables: Vec<TableSpec>) -> ModelSpec {
        ModelSpec {
            table_dtype: Default::default(),
            arch: Default::default(),
            n_dense: 1,
            hidden: vec![4],
            zipf: 1.05,
            tables,
        }
    }

    fn stats_of(spec: &ModelSpec, world: usize, bpr: usize, t: &[(f64, f64, f64)]) -> BatchStats {
        BatchStats {
            schema: SCHEMA.into(),
            spec_digest: spec.digest(),
            seed: 0,
            batch_per_rank: bpr,
            world,
            sampled_batches: 1,
            source: String::new(),
            tables: t
                .iter()
                .map(|&(v, r, g)| TableStats {
                    mean_valency: v,
                    unique_per_rank_batch: r,
                    unique_per_global_batch: g,
                })
                .collect(),
        }
    }

    /// Stats of a task whose tables come from `pool`, cut out of the pool's stats
    /// (the same tables, so the same numbers).
    fn task_stats(pool: &ModelSpec, pool_stats: &BatchStats, task: &ModelSpec) -> BatchStats {
        let tables = task
            .tables
            .iter()
            .map(|t| {
                let i = pool.tables.iter().position(|p| p.name == t.name).unwrap();
                pool_stats.tables[i].clone()
            })
            .collect();
        BatchStats {
            spec_digest: task.digest(),
            tables,
            ..pool_stats.clone()
        }
    }

    fn total_bytes(spec: &ModelSpec, state: u64) -> u64 {
        spec.tables
            .iter()
            .map(|t| t.vocab * (t.dim as u64 + state) * 4)
            .sum()
    }

    #[test]
    fn the_planner_pools_long_bags_and_keeps_rows_for_hot_single_ids() {
        // "bags": 30 ids per example, almost all distinct; "hot": one id per example
        // from 50 hot rows.
        let spec = spec_of(vec![
            table("bags", 1_000_000, 64, 30.0),
            table("hot", 100, 64, 1.0),
        ]);
        let stats = stats_of(
            &spec,
            2,
            2048,
            &[(30.0, 58_000.0, 110_000.0), (1.0, 50.0, 60.0)],
        );
        let opts = PlanOptions::new(2, u64::MAX);
        let (plan, rep) = plan_auto(&spec, &stats, &opts).unwrap();
        assert_eq!(plan.mode(0), OutputMode::Pooled, "{plan:?}");
        assert_eq!(plan.mode(1), OutputMode::Rows, "{plan:?}");
        let mc = mode_costs(&spec, &stats, &plan, &opts.model, opts.state_per_row);
        assert!(mc[0].pooled_bytes < mc[0].rows_bytes / 10.0, "{mc:?}");
        assert!(mc[1].rows_bytes < mc[1].pooled_bytes / 10.0, "{mc:?}");
        // Never worse than the same placements with every table in rows mode.
        let rows = evaluate(
            &spec,
            &stats,
            &plan.clone().with_modes(OutputMode::Rows),
            &opts.model,
            opts.state_per_row,
        );
        assert!(rep.max_cost < rows.max_cost, "{rep:?} vs {rows:?}");
    }

    #[test]
    fn searching_in_the_preferred_modes_balances_the_owners_better_on_the_peer_workload() {
        // torchrec-peer at P = 2: pooling moves work to the owners, so placements
        // balanced for `rows` become unbalanced once tables are pooled (the planner of
        // the previous stop kept 11 tables in `rows` for that reason, and measured
        // slower than all-pooled).
        let spec = preset("torchrec-peer", 1.0).unwrap();
        let stats = synthetic_stats(&spec, 2, 2048);
        let opts = PlanOptions::new(2, u64::MAX);
        let base = check_inputs(&spec, &stats, &opts).unwrap();
        let (rows_plan, rows_pass) =
            super::search::plan_pass(&base.searching_in(Vec::new()), &opts, None)
                .expect("the rows pass finds a plan");
        let preferred = base.preferred_modes();
        assert!(
            preferred
                .iter()
                .filter(|&&m| m == OutputMode::Pooled)
                .count()
                > 20,
            "{preferred:?}"
        );
        let (_, moded_pass) =
            super::search::plan_pass(&base.searching_in(preferred), &opts, Some(rows_plan.tables))
                .expect("the mode-aware pass finds a plan");
        let (plan, auto) = plan_auto(&spec, &stats, &opts).unwrap();
        assert!(
            moded_pass.max_cost < rows_pass.max_cost * 0.99,
            "{moded_pass:?} vs {rows_pass:?}"
        );
        // plan_auto keeps the better pass, and reports it.
        assert_eq!(auto.max_cost, moded_pass.max_cost.min(rows_pass.max_cost));
        let again = evaluate(&spec, &stats, &plan, &opts.model, opts.state_per_row);
        assert_eq!(again.max_cost, auto.max_cost);
    }

    #[test]
    fn evaluate_matches_the_formulas_by_hand() {
        let spec = spec_of(vec![table("a", 1000, 16, 3.0), table("b", 10, 2, 1.0)]);
        let stats = stats_of(&spec, 2, 50, &[(3.0, 100.0, 300.0), (1.0, 8.0, 10.0)]);
        let m = CostModel::default();
        let secs =
            |exch: f64, mem: f64, lookups: f64| exch / 5e9 + mem / 10e9 + lookups * 20e-9 + 10e-6;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1e-30);

        // a: row blocks of 500 rows on ranks 1 and 0; b whole on rank 0; Adagrad (s = 1).
        let plan = Plan {
            world: 2,
            spec_digest: spec.digest(),
            tables: vec![
                Placement::RowBlock { ranks: vec![1, 0] },
                Placement::Table { rank: 0 },
            ],
            modes: Vec::new(),
        };
        let r = evaluate(&spec, &stats, &plan, &m, 1);
        // a's shards: n_in = 2 * 100 * 500/1000 = 100 ids; 4 + 8*16 = 132 bytes
        // exchanged per id; 3 * max(4*16, 64) + 4*1 = 196 bytes of memory per id.
        let a_half = secs(100.0 * 132.0, 100.0 * 196.0, 200.0);
        // b: n_in = 2 * 8 = 16; width 2 moves 8 bytes but an access costs 64.
        let b_whole = secs(16.0 * (4.0 + 16.0), 16.0 * (3.0 * 64.0 + 4.0), 32.0);
        // Every rank also asks (rows mode): for a, 50 x 3 occurrences pooled and
        // their gradients added (2 x 150 accesses of 64 bytes), 100 distinct rows
        // placed and their gradients read (2 x 100), 150 ids deduplicated; for b,
        // 2 x 50 and 2 x 8 accesses, 50 ids.
        let ask_a = (2.0 * 150.0 * 64.0 + 2.0 * 100.0 * 64.0) / 10e9 + 150.0 * 20e-9;
        let ask_b = (2.0 * 50.0 * 64.0 + 2.0 * 8.0 * 64.0) / 10e9 + 50.0 * 20e-9;
        let ask = ask_a + ask_b;
        assert!(close(r.cost_per_rank[0], a_half + b_whole + ask), "{r:?}");
        assert!(close(r.cost_per_rank[1], a_half + ask), "{r:?}");
        assert_eq!(
            r.bytes_per_rank,
            vec![500 * 17 * 4 + 10 * 3 * 4, 500 * 17 * 4]
        );
        let (hi, lo) = (a_half + b_whole + ask, a_half + ask);
        assert!(close(r.max_cost, hi));
        assert!(close(r.imbalance, 2.0 * hi / (hi + lo)));
        assert!(close(r.balance, lo / hi));

        // a: columns 0..4 on rank 0 and 4..16 on rank 1; b replicated.
        let plan = Plan {
            tables: vec![
                Placement::Column {
                    shards: vec![
                        ColumnShard {
                            rank: 0,
                            cols: [0, 4],
                        },
                        ColumnShard {
                            rank: 1,
                            cols: [4, 16],
                        },
                    ],
                },
                Placement::DataParallel,
            ],
            ..plan
        };
        let r = evaluate(&spec, &stats, &plan, &m, 1);
        // Every column shard sees all n_in = 200 ids; widths 4 and 12 both pay 64 bytes
        // per access.
        let col4 = secs(200.0 * (4.0 + 32.0), 200.0 * 196.0, 400.0);
        let col12 = secs(200.0 * (4.0 + 96.0), 200.0 * 196.0, 400.0);
        // b's replica: all-reduce 2 * 10 * 2 * 4 * 1/2 bytes; pooling reads 50 * 1
        // rows of 64 bytes; dense update of 10 rows at 196 bytes; 50 lookups.
        let dp = secs(80.0, 50.0 * 64.0 + 10.0 * 196.0, 50.0);
        // b is replicated: only a is asked for.
        assert!(close(r.cost_per_rank[0], col4 + dp + ask_a), "{r:?}");
        assert!(close(r.cost_per_rank[1], col12 + dp + ask_a), "{r:?}");
        assert_eq!(
            r.bytes_per_rank,
            vec![1000 * 5 * 4 + 120, 1000 * 13 * 4 + 120]
        );
    }

    #[test]
    fn the_size_factor_prices_a_small_tables_rows_below_a_large_ones() {
        // Two tables with the same traffic (same width, same ids per batch), one of
        // 1,000 rows on rank 0 and one of 1,000,000 on rank 1, in rows mode.
        let spec = spec_of(vec![
            table("small", 1000, 16, 3.0),
            table("large", 1_000_000, 16, 3.0),
        ]);
        let stats = stats_of(&spec, 2, 50, &[(3.0, 100.0, 200.0), (3.0, 100.0, 200.0)]);
        let plan = Plan {
            world: 2,
            spec_digest: spec.digest(),
            tables: vec![Placement::Table { rank: 0 }, Placement::Table { rank: 1 }],
            modes: vec![OutputMode::Rows, OutputMode::Rows],
        };
        let m = CostModel::default();
        let r = evaluate(&spec, &stats, &plan, &m, 1);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
        assert!(close(r.cost_per_rank[0], r.cost_per_rank[1]), "{r:?}");
        // The small table's rows (64 kB) at half the reference price, the large
        // one's (64 MB) at twice: the owners' row accesses A become A/2 and 2A, and
        // nothing else moves, so rank 1 gains twice what rank 0 saves.
        let sized = CostModel {
            size_factor: vec![[64e3, 0.5], [64e6, 2.0]],
            ..m.clone()
        };
        let s = evaluate(&spec, &stats, &plan, &sized, 1);
        let saved = r.cost_per_rank[0] - s.cost_per_rank[0];
        let gained = s.cost_per_rank[1] - r.cost_per_rank[1];
        assert!(saved > 0.0, "{s:?}");
        assert!(close(gained, 2.0 * saved), "{saved} {gained}");
        // A size factor of 1 everywhere prices as without one.
        let ones = CostModel {
            size_factor: vec![[1e3, 1.0], [1e9, 1.0]],
            ..m
        };
        let o = evaluate(&spec, &stats, &plan, &ones, 1);
        for (a, b) in o.cost_per_rank.iter().zip(&r.cost_per_rank) {
            assert!(close(*a, *b), "{o:?} vs {r:?}");
        }
    }

    #[test]
    fn only_the_bytes_sent_to_other_ranks_cross_the_network() {
        // A slow network (1 GB/s) and fast memory (100 GB/s): a rank's share of the
        // bytes to itself is a copy in memory, read and written.
        let m = CostModel {
            net_bw: 1e9,
            mem_bw: 100e9,
            ..CostModel::default()
        };
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1e-30);
        let spec = spec_of(vec![table("a", 1000, 16, 3.0)]);
        for world in [1usize, 2, 4] {
            // Every rank asks 100 distinct ids of a per batch of 50.
            let stats = stats_of(&spec, world, 50, &[(3.0, 100.0, 300.0)]);
            let plan = Plan {
                world,
                spec_digest: spec.digest(),
                tables: vec![Placement::Table { rank: 0 }],
                modes: Vec::new(),
            };
            let r = evaluate(&spec, &stats, &plan, &m, 1);
            let n = world as f64;
            let n_in = n * 100.0;
            let exch = n_in * (4.0 + 8.0 * 16.0);
            let owner = exch * (n - 1.0) / n / 1e9
                + 2.0 * exch / n / 100e9
                + n_in * 196.0 / 100e9
                + 2.0 * n_in * 20e-9
                + 10e-6;
            let ask = (2.0 * 150.0 * 64.0 + 2.0 * 100.0 * 64.0) / 100e9 + 150.0 * 20e-9;
            assert!(
                close(r.cost_per_rank[0], owner + ask),
                "world {world}: {r:?}"
            );
            // Occurrences priced as the calibrated kernels: per occurrence a gather
            // (a lookup and 64 bytes) and a scatter (a lookup and 128 bytes) instead
            // of 128 streamed bytes; the owner's cost is unchanged.
            let k = CostModel {
                ask_row_access: true,
                ..m.clone()
            };
            let rk = evaluate(&spec, &stats, &plan, &k, 1);
            let ask_k = 150.0 * (2.0 * 20e-9 + 3.0 * 64.0 / 100e9)
                + 2.0 * 100.0 * 64.0 / 100e9
                + 150.0 * 20e-9;
            assert!(
                close(rk.cost_per_rank[0], owner + ask_k),
                "world {world}: {rk:?}"
            );
            assert!(ask_k > ask, "{ask_k} {ask}");
        }
    }

    /// Four equal small tables at 2 ranks, three of them on rank 0 (in `modes`).
    fn three_on_rank_0(modes: Vec<OutputMode>) -> (ModelSpec, BatchStats, Plan) {
        let spec = spec_of(
            (0..4)
                .map(|i| table(&format!("t{i}"), 1000, 16, 2.0))
                .collect(),
        );
        let stats = synthetic_stats(&spec, 2, 64);
        let plan = Plan {
            world: 2,
            spec_digest: spec.digest(),
            tables: vec![
                Placement::Table { rank: 0 },
                Placement::Table { rank: 0 },
                Placement::Table { rank: 0 },
                Placement::Table { rank: 1 },
            ],
            modes,
        };
        (spec, stats, plan)
    }

    #[test]
    fn interference_multiplies_a_ranks_cost_by_its_pieces() {
        let (spec, stats, plan) = three_on_rank_0(Vec::new());
        let plain = evaluate(&spec, &stats, &plan, &CostModel::default(), 0);
        let m = CostModel {
            interference: 0.5,
            ..CostModel::default()
        };
        let inter = evaluate(&spec, &stats, &plan, &m, 0);
        // Equal tables: rank 0 owns three pieces (3 o), rank 1 one (o), and every
        // rank asks the same `a`. Under interference the owners' three pieces cost
        // 1 + 0.5 (1 - 1/3) times their sum; the asking side and rank 1: as is.
        let o = (plain.cost_per_rank[0] - plain.cost_per_rank[1]) / 2.0;
        let a = plain.cost_per_rank[1] - o;
        assert!(o > 0.0 && a > 0.0, "{plain:?}");
        let want = (1.0 + 0.5 * 2.0 / 3.0) * 3.0 * o + a;
        assert!(
            (inter.cost_per_rank[0] - want).abs() <= 1e-12 * want,
            "{inter:?}"
        );
        assert_eq!(inter.cost_per_rank[1], plain.cost_per_rank[1]);
        // Planned under it, no rank ends up as loaded as rank 0 here.
        let opts = PlanOptions {
            model: m,
            ..PlanOptions::new(2, u64::MAX)
        };
        let (p, r) = plan_auto(&spec, &stats, &opts).unwrap();
        assert!(r.max_cost < inter.max_cost, "{p:?} {r:?}");
        assert_eq!(r, evaluate(&spec, &stats, &p, &opts.model, 0));
    }

    #[test]
    fn each_output_mode_pays_its_own_interference() {
        // Rank 0 owns three tables, t0 in the `pooled` mode and t1, t2 in `rows`.
        let (spec, stats, plan) = three_on_rank_0(vec![
            OutputMode::Pooled,
            OutputMode::Rows,
            OutputMode::Rows,
            OutputMode::Rows,
        ]);
        let at = |interference: f64, rows: Option<f64>| {
            let m = CostModel {
                interference,
                interference_rows: rows,
                ..CostModel::default()
            };
            evaluate(&spec, &stats, &plan, &m, 0).cost_per_rank
        };
        let plain = at(0.0, None);
        // Each mode's pieces alone: the extra cost of rank 0 is linear in each
        // mode's interference, its variable the same 1 - 1/3 for both.
        let pooled_only = at(0.5, Some(0.0))[0] - plain[0];
        let rows_only = at(0.0, Some(0.5))[0] - plain[0];
        assert!(
            pooled_only > 0.0 && rows_only > 0.0,
            "{pooled_only} {rows_only}"
        );
        let both = at(0.5, Some(0.5))[0] - plain[0];
        assert!(
            (both - pooled_only - rows_only).abs() <= 1e-9 * both,
            "{both}"
        );
        // Unset, the `rows` pieces take the shared value.
        for (a, b) in at(0.5, None).iter().zip(at(0.5, Some(0.5))) {
            assert!((a - b).abs() <= 1e-12 * a, "{a} {b}");
        }
        let split = at(0.2, Some(0.8))[0] - plain[0];
        let want = 0.4 * pooled_only + 1.6 * rows_only;
        assert!((split - want).abs() <= 1e-9 * want, "{split} {want}");
        // Rank 1 owns one piece: no interference (up to the order of the additions).
        assert!((at(0.2, Some(0.8))[1] - plain[1]).abs() <= 1e-12 * plain[1]);
        // The model's own law: x = 1 - 1/4 for 4 pieces without a size factor.
        let m = CostModel {
            interference: 0.2,
            interference_rows: Some(0.6),
            ..CostModel::default()
        };
        let got = m.with_interference_split(3.0, 1.0, 4, 1e9, 2.5e8);
        assert!((got - (2.0 * 1.15 + 1.45)).abs() < 1e-12, "{got}");
        let one = CostModel {
            interference_rows: None,
            ..m.clone()
        };
        assert_eq!(
            one.with_interference_split(3.0, 1.0, 4, 1e9, 2.5e8),
            one.with_interference_sized(3.0, 4, 1e9, 2.5e8)
        );
        assert!((m.with_interference_mode(2.0, 4, 1e9, true) - 2.0 * 1.45).abs() < 1e-12);
        assert!((m.with_interference_mode(2.0, 4, 1e9, false) - 2.0 * 1.15).abs() < 1e-12);
    }

    #[test]
    fn interference_prices_a_rank_at_its_pieces_cost_weighted_size() {
        // A large table doing most of the work and a small one beside it on rank 0.
        let spec = spec_of(vec![
            table("hot", 1 << 20, 64, 30.0),
            table("cold", 1000, 16, 1.0),
        ]);
        let stats = synthetic_stats(&spec, 2, 256);
        let plan = |cold: usize| Plan {
            world: 2,
            spec_digest: spec.digest(),
            tables: vec![
                Placement::Table { rank: 0 },
                Placement::Table { rank: cold },
            ],
            modes: Vec::new(),
        };
        let sized = |interference: f64| CostModel {
            interference,
            size_factor: vec![[1e5, 1.0], [1e9, 3.0]],
            ..CostModel::default()
        };
        // Without interference: together, rank 0 pays o0 + o1 + a; apart, rank 0
        // pays o0 + a and rank 1 o1 + a (the asking side `a` is the same).
        let together = evaluate(&spec, &stats, &plan(0), &sized(0.0), 0).cost_per_rank;
        let apart = evaluate(&spec, &stats, &plan(1), &sized(0.0), 0).cost_per_rank;
        let o0 = together[0] - apart[1];
        let o1 = together[0] - apart[0];
        let a = apart[0] - o0;
        assert!(
            o0 > 50.0 * o1 && o1 > 0.0 && a > 0.0,
            "{together:?} {apart:?}"
        );
        let (b0, b1) = ((1u64 << 20) as f64 * 64.0 * 4.0, 1000.0 * 16.0 * 4.0);
        let m = sized(1.0);
        let size = (o0 * b0 + o1 * b1) / (o0 + o1);
        let x = m.size_factor_at(b0 + b1) / m.size_factor_at(size) - 1.0;
        let want = (o0 + o1) * (1.0 + x) + a;
        let inter = evaluate(&spec, &stats, &plan(0), &m, 0).cost_per_rank;
        assert!(
            (inter[0] - want).abs() <= 1e-9 * want,
            "{inter:?} want {want}"
        );
        // The cold table adds its few bytes to the hot one's: a small charge (x
        // below 0.5 %), where the plain mean size (b0 + b1) / 2 charges the owners
        // about 6 % more.
        let mean = (o0 + o1) * m.with_interference(1.0, 2, b0 + b1) + a;
        assert!(x > 0.0 && x < 5e-3, "{x}");
        assert!(
            mean - want > 0.04 * (o0 + o1),
            "mean-size law {mean}, weighted {want}"
        );
        // Apart, nothing shares: interference changes no rank (up to the order of
        // the additions).
        let alone = evaluate(&spec, &stats, &plan(1), &m, 0).cost_per_rank;
        for (got, want) in alone.iter().zip(&apart) {
            assert!(
                (got - want).abs() <= 1e-12 * want.abs(),
                "{alone:?} {apart:?}"
            );
        }
        // Two equal tables on one rank: the weighted size is the mean size, and the
        // rank is priced as under the equal-size law.
        let twins = spec_of(vec![
            table("a", 1 << 20, 64, 4.0),
            table("b", 1 << 20, 64, 4.0),
        ]);
        let stats = synthetic_stats(&twins, 2, 256);
        let plan = |b: usize| Plan {
            world: 2,
            spec_digest: twins.digest(),
            tables: vec![Placement::Table { rank: 0 }, Placement::Table { rank: b }],
            modes: Vec::new(),
        };
        let together = evaluate(&twins, &stats, &plan(0), &sized(0.0), 0).cost_per_rank;
        let apart = evaluate(&twins, &stats, &plan(1), &sized(0.0), 0).cost_per_rank;
        let (oa, ob) = (together[0] - apart[1], together[0] - apart[0]);
        let a = apart[0] - oa;
        let bt = (1u64 << 20) as f64 * 64.0 * 4.0;
        let want = m.with_interference(oa + ob, 2, 2.0 * bt) + a;
        let got = evaluate(&twins, &stats, &plan(0), &m, 0).cost_per_rank[0];
        assert!(m.interference_x(2, 2.0 * bt) > 0.03);
        assert!((got - want).abs() <= 1e-12 * want, "{got} want {want}");
    }

    #[test]
    fn pieces_are_the_shards_of_the_plan() {
        let spec = preset("tiny", 1.0).unwrap();
        for world in 1..=5 {
            let stats = synthetic_stats(&spec, world, 8);
            let opts = PlanOptions::new(world, u64::MAX);
            let ctx = check_inputs(&spec, &stats, &opts).unwrap();
            let cost: Vec<f64> = (0..world).map(|r| (r * 7 % 3) as f64).collect();
            let bytes: Vec<u64> = (0..world).map(|r| (r * 5 % 4) as u64).collect();
            for (t, ts) in spec.tables.iter().enumerate() {
                for p in candidates(&ctx, t, &cost, &bytes) {
                    let mut plan = Plan::uniform(&spec, world, "table").unwrap();
                    plan.tables[t] = p.clone();
                    plan.validate(&spec, world, "test").unwrap();
                    let want: Vec<Piece> = plan
                        .table_shards(&spec, t)
                        .iter()
                        .map(|s| Piece {
                            rank: s.rank,
                            rows: s.rows.len(ts.vocab),
                            width: s.width(),
                            replica: s.replica,
                        })
                        .collect();
                    assert_eq!(pieces(ts.vocab, ts.dim, world, &p), want, "{p:?}");
                }
            }
        }
    }

    /// Pools small enough to plan many times, with their synthetic stats.
    fn pools(world: usize) -> Vec<(ModelSpec, BatchStats)> {
        ["tiny", "dlrm-synthetic", "google-ads", "torchrec-peer"]
            .iter()
            .zip([1.0, 0.02, 0.03, 0.02])
            .map(|(name, scale)| {
                let p = preset(name, scale).unwrap();
                let s = synthetic_stats(&p, world, 256);
                (p, s)
            })
            .collect()
    }

    #[test]
    fn plans_validate_and_never_exceed_memory() {
        let mut planned = 0;
        for world in [1, 2, 3, 4, 8] {
            for (pi, (pool, pool_stats)) in pools(world).iter().enumerate() {
                for (ti, task) in sample_tasks(pool, 4, 2..pool.tables.len() + 1, pi as u64)
                    .iter()
                    .enumerate()
                {
                    let stats = task_stats(pool, pool_stats, task);
                    let state = (ti % 2) as u64;
                    let total = total_bytes(task, state);
                    let row_share: u64 = task
                        .tables
                        .iter()
                        .map(|t| t.vocab.div_ceil(world as u64) * (t.dim as u64 + state) * 4)
                        .sum();
                    let even = total.div_ceil(world as u64);
                    for mem in [
                        even,
                        even + even / 50,
                        row_share,
                        even + even / 10,
                        even * 3 / 2,
                        total,
                    ] {
                        let mut opts = PlanOptions::new(world, mem);
                        opts.state_per_row = state;
                        let auto = plan_auto(task, &stats, &opts);
                        if mem >= row_share {
                            assert!(auto.is_ok(), "P={world} mem={mem}: {:?}", auto.err());
                        }
                        let mut results = vec![auto];
                        for h in Heuristic::ALL {
                            results.push(plan_heuristic(h, task, &stats, &opts));
                        }
                        for (plan, report) in results.into_iter().flatten() {
                            plan.validate(task, world, "test").unwrap();
                            let b = plan.bytes_per_rank(task, state);
                            assert!(b.iter().all(|&x| x <= mem), "{b:?} > {mem}: {plan:?}");
                            assert_eq!(report.bytes_per_rank, b);
                            assert_eq!(report, evaluate(task, &stats, &plan, &opts.model, state));
                            planned += 1;
                        }
                    }
                }
            }
        }
        assert!(planned > 500, "{planned}");
    }

    #[test]
    fn impossible_memory_is_a_config_error() {
        let spec = preset("tiny", 1.0).unwrap();
        let stats = synthetic_stats(&spec, 3, 16);
        let total = total_bytes(&spec, 1);
        let mut opts = PlanOptions::new(3, total / 3 - 1);
        opts.state_per_row = 1;
        let e = plan_auto(&spec, &stats, &opts).unwrap_err();
        assert!(matches!(e, Error::Config(_)));
        let msg = e.to_string();
        assert!(msg.contains(&total.to_string()), "{msg}");
        assert!(msg.contains(&(3 * (total / 3 - 1)).to_string()), "{msg}");
        for h in Heuristic::ALL {
            assert!(plan_heuristic(h, &spec, &stats, &opts).is_err());
        }
        // With room for the total, the planner succeeds.
        opts.mem_per_rank = total;
        assert!(plan_auto(&spec, &stats, &opts).is_ok());
    }

    #[test]
    fn a_table_larger_than_a_rank_is_split() {
        let spec = spec_of(vec![
            table("big", 100_000, 32, 10.0),
            table("s1", 1000, 32, 2.0),
            table("s2", 500, 16, 4.0),
        ]);
        let stats = synthetic_stats(&spec, 4, 64);
        let opts = PlanOptions::new(4, spec.tables[0].bytes() / 2);
        let e = plan_lookup_greedy(&spec, &stats, &opts)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"big\""), "{e}");
        let (plan, report) = plan_auto(&spec, &stats, &opts).unwrap();
        assert!(
            !matches!(plan.tables[0], Placement::Table { .. }),
            "{plan:?}"
        );
        assert!(report
            .bytes_per_rank
            .iter()
            .all(|&b| b <= opts.mem_per_rank));
    }

    #[test]
    fn same_inputs_same_plan() {
        let pool = preset("dlrm-synthetic", 0.02).unwrap();
        let task = &sample_tasks(&pool, 1, 8..9, 3)[0];
        let stats = synthetic_stats(task, 4, 128);
        let mut opts = PlanOptions::new(4, total_bytes(task, 0) / 2);
        assert_eq!(
            plan_auto(task, &stats, &opts).unwrap(),
            plan_auto(task, &stats, &opts).unwrap()
        );
        let a = plan_random(task, &stats, &opts).unwrap();
        assert_eq!(a, plan_random(task, &stats, &opts).unwrap());
        opts.seed = 1;
        assert_ne!(a.0, plan_random(task, &stats, &opts).unwrap().0);
    }

    #[test]
    fn tasks_are_deterministic_subsets_of_the_pool() {
        let pool = preset("dlrm-synthetic", 0.05).unwrap();
        let tasks = sample_tasks(&pool, 20, 5..12, 9);
        assert_eq!(tasks, sample_tasks(&pool, 20, 5..12, 9));
        assert_ne!(tasks, sample_tasks(&pool, 20, 5..12, 10));
        let mut sizes = std::collections::BTreeSet::new();
        for t in &tasks {
            assert!((5..12).contains(&t.tables.len()));
            sizes.insert(t.tables.len());
            let idx: Vec<usize> = t
                .tables
                .iter()
                .map(|x| pool.tables.iter().position(|p| p == x).unwrap())
                .collect();
            assert!(idx.windows(2).all(|w| w[0] < w[1]), "{idx:?}");
            t.validate("task").unwrap();
        }
        assert!(sizes.len() > 3, "{sizes:?}");
        // A range past the pool is clamped to it.
        let all = sample_tasks(&pool, 1, 1000..2000, 0);
        assert_eq!(all[0].tables, pool.tables);
    }

    #[test]
    fn planner_beats_table_wise_heuristics_on_dlrm_tasks() {
        let pool = preset("dlrm-synthetic", 0.05).unwrap();
        let tasks = sample_tasks(&pool, 10, 10..31, 2024);
        for world in [4, 8] {
            let pool_stats = synthetic_stats(&pool, world, 2048);
            let mut sum = [0.0f64; 5];
            for task in &tasks {
                let stats = task_stats(&pool, &pool_stats, task);
                // Adagrad, and room for twice an even share of the tables and at least
                // twice the largest table, so that the table-wise heuristics fit too.
                let largest = task
                    .tables
                    .iter()
                    .map(|t| t.vocab * (t.dim as u64 + 1) * 4)
                    .max();
                let even = total_bytes(task, 1) / world as u64;
                let mut opts = PlanOptions::new(world, (2 * even).max(2 * largest.unwrap()));
                opts.state_per_row = 1;
                let (plan, auto) = plan_auto(task, &stats, &opts).unwrap();
                let (_, lookup) = plan_lookup_greedy(task, &stats, &opts).unwrap();
                assert!(
                    auto.max_cost <= lookup.max_cost * (1.0 + 1e-12),
                    "{auto:?} vs {lookup:?}"
                );
                // (Imbalance, the maximum over the mean, is compared over all tasks
                // below, not task by task: auto pools tables, which lowers the mean
                // cost that the all-`rows` heuristics are divided by.)
                let mut kinds = std::collections::BTreeMap::new();
                for p in &plan.tables {
                    *kinds.entry(p.kind()).or_insert(0) += 1;
                }
                let mut line = format!(
                    "P={world} tables={:2} auto {:.3} (max {:.2} ms) {kinds:?}",
                    task.tables.len(),
                    auto.imbalance,
                    auto.max_cost * 1e3
                );
                sum[0] += auto.imbalance;
                for (i, h) in Heuristic::ALL.iter().enumerate() {
                    let (_, r) = plan_heuristic(*h, task, &stats, &opts).unwrap();
                    assert!(auto.max_cost <= r.max_cost * (1.0 + 1e-12), "{}", h.name());
                    line += &format!(" {} {:.3}", h.name(), r.imbalance);
                    sum[i + 1] += r.imbalance;
                }
                eprintln!("{line}");
            }
            let mean: Vec<f64> = sum.iter().map(|s| s / tasks.len() as f64).collect();
            eprintln!(
                "P={world} mean imbalance: auto {:.3} random {:.3} size {:.3} dim {:.3} \
                 lookup {:.3}",
                mean[0], mean[1], mean[2], mean[3], mean[4]
            );
            assert!(mean[0] <= 1.10, "mean imbalance {mean:?}");
        }
    }

    #[test]
    fn replication_is_chosen_only_when_the_model_favours_it_and_it_fits() {
        // Eight hot tables of 64 rows, every row seen by every rank each step: with free
        // memory traffic and no cost per shard, a replica (all-reduce of 28 KiB per
        // rank) beats shipping 64 rows of 64 floats to and from each of 8 ranks.
        let spec = spec_of(
            (0..8)
                .map(|i| table(&format!("h{i}"), 64, 64, 10.0))
                .collect(),
        );
        let stats = synthetic_stats(&spec, 8, 4096);
        assert!(stats.tables[0].unique_per_rank_batch > 63.9);
        let mut opts = PlanOptions::new(8, u64::MAX / 8);
        opts.model.mem_bw = 1e15;
        opts.model.lookup_s = 0.0;
        opts.model.shard_s = 0.0;
        let (plan, _) = plan_auto(&spec, &stats, &opts).unwrap();
        assert!(
            plan.tables.iter().all(|p| *p == Placement::DataParallel),
            "{plan:?}"
        );
        // A replica (16 KiB) and row-wise shares of the other seven tables (2 KiB each)
        // do not fit into 24 KiB per rank: none is replicated.
        opts.mem_per_rank = total_bytes(&spec, 0) * 3 / 16;
        let (plan, _) = plan_auto(&spec, &stats, &opts).unwrap();
        assert!(
            plan.tables.iter().all(|p| *p != Placement::DataParallel),
            "{plan:?}"
        );
        // With the default model the pooling reads make replicas lose.
        opts.model = CostModel::default();
        opts.mem_per_rank = u64::MAX / 8;
        let (plan, _) = plan_auto(&spec, &stats, &opts).unwrap();
        assert!(
            plan.tables.iter().all(|p| *p != Placement::DataParallel),
            "{plan:?}"
        );
    }

    #[test]
    fn the_greedy_keeps_room_for_the_tables_still_to_place() {
        // Eight hot tables that the model would rather replicate (16 KiB a replica, 2 KiB
        // a row share at P = 8) and a cold table of 800 KiB (100 KiB a row share) that
        // comes last in cost order and fits on no single rank. With room for two
        // replicas besides the row shares, greedily replicating every hot table would
        // leave the cold one nowhere to go.
        let mut tables: Vec<TableSpec> = (0..8)
            .map(|i| table(&format!("h{i}"), 64, 64, 10.0))
            .collect();
        tables.push(table("cold", 25_600, 8, 1.0));
        let spec = spec_of(tables);
        let mut per_table = vec![(10.0, 64.0, 64.0); 8];
        per_table.push((1.0, 1.0, 8.0));
        let stats = stats_of(&spec, 8, 4096, &per_table);
        let row_shares = 8 * 2048 + 102_400;
        let mut opts = PlanOptions::new(8, row_shares + 2 * 16_384);
        opts.model.mem_bw = 1e15;
        opts.model.lookup_s = 0.0;
        opts.model.shard_s = 0.0;
        assert!(plan_lookup_greedy(&spec, &stats, &opts).is_err());
        let (plan, report) = plan_auto(&spec, &stats, &opts).unwrap();
        let replicated = plan
            .tables
            .iter()
            .filter(|p| **p == Placement::DataParallel)
            .count();
        assert_eq!(replicated, 2, "{plan:?}");
        assert!(report
            .bytes_per_rank
            .iter()
            .all(|&b| b <= opts.mem_per_rank));
    }
}
