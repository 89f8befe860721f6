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
//! - bytes exchanged: `n_in (4 + 8 w)` (the id in, the row out, the gradient in);
//! - bytes of table memory: `n_in (3 a(w) + 4 s)` with `s` optimizer floats per row
//!   (read the row for the forward pass, read and write it for the update; the state is
//!   stored next to its row and read and written with it);
//! - lookups and updates: `2 n_in`.
//!
//! A data-parallel table has a replica on every rank, which
//!
//! - reads `b v a(d)` bytes to pool its own examples (`b v` lookups),
//! - all-reduces the full table gradient: `2 V d 4 (N - 1) / N` bytes exchanged,
//! - and applies that dense gradient to every row: `V (3 a(d) + 4 s)` bytes of memory.
//!
//! The all-reduce and the dense update grow with `V`, which is why replication only
//! pays for small tables. The pooling reads are charged to a replica although pooling
//! the received rows is not charged to sharded placements (below), which makes the model
//! conservative about replication. Every shard (and replica) also costs a fixed `shard_s` seconds
//! (bucketing ids per destination, one more lookup kernel, one more message segment),
//! the small overhead of cutting a table into many pieces.
//!
//! `cost_i = sum (bytes_exchanged / net_bw + bytes_memory / mem_bw + lookups lookup_s
//! + shard_s)` over the shards on `i`. The work of the requesting side (sending its
//! ids, pooling the rows it receives) is the same on every rank whatever the plan, so
//! it is left out: the model ranks plans by the owners' load. The memory of rank `i`
//! is `sum rows (w + s) 4` over its shards, exactly [`Plan::bytes_per_rank`]. Owners do
//! not deduplicate ids across sources, so [`TableStats::unique_per_global_batch`] is
//! not used, and the stats' `world` need not be the world planned for.
//!
//! # Planner
//!
//! [`plan_auto`] runs a deterministic local search from three starts and keeps the
//! plan with the lowest maximum cost (then the lowest total):
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
//! The local search repeatedly takes the best of these changes, if it lowers the
//! descending vector of rank costs lexicographically (the maximum, then the next, ...): move a shard of a table on the most loaded rank
//! to another rank, swap two table-wise tables between that rank and another, or
//! re-place such a table with any greedy candidate. Every change respects
//! `mem_per_rank`. Since the lookup-greedy plan is one of the starts and the search
//! never raises the maximum, the result is never worse than lookup-greedy under the
//! model.

use std::cmp::Ordering;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::placement::{ColumnShard, Placement, Plan, Rows};
use super::spec::ModelSpec;
use super::stats::{BatchStats, TableStats};
use crate::data::graph::block_range;
use crate::rng::{hash3, stream, SplitMix64};
use crate::{Error, Result};

/// The machine constants of the cost model; calibrate them to a cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Bytes per second a rank exchanges over the network.
    pub net_bw: f64,
    /// Bytes per second of a rank's table memory traffic.
    pub mem_bw: f64,
    /// Seconds per row lookup or update (hashing, indexing, a likely cache miss).
    pub lookup_s: f64,
    /// Fixed seconds per shard per step.
    pub shard_s: f64,
    /// Smallest memory access, in bytes (a cache line).
    pub line_bytes: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            net_bw: 5e9,
            mem_bw: 10e9,
            lookup_s: 20e-9,
            shard_s: 10e-6,
            line_bytes: 64.0,
        }
    }
}

impl CostModel {
    /// Bytes moved by one access to a row of `w` floats.
    fn access(&self, w: usize) -> f64 {
        (4.0 * w as f64).max(self.line_bytes)
    }
}

/// The model's view of one plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    /// Modelled seconds per step of each rank.
    pub cost_per_rank: Vec<f64>,
    /// Bytes of rows and optimizer state on each rank ([`Plan::bytes_per_rank`]).
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

/// One piece of a placement: the rank, rows and width it holds.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Piece {
    rank: usize,
    rows: u64,
    width: usize,
    replica: bool,
}

/// The pieces of placement `p` of a table of `vocab` rows and width `dim` (the same
/// shards as [`Plan::table_shards`]).
fn pieces(vocab: u64, dim: usize, world: usize, p: &Placement) -> Vec<Piece> {
    let piece = |rank, rows, width| Piece {
        rank,
        rows,
        width,
        replica: false,
    };
    match p {
        Placement::Table { rank } => vec![piece(*rank, vocab, dim)],
        Placement::RowBlock { ranks } => ranks
            .iter()
            .enumerate()
            .map(|(j, &r)| {
                let (lo, hi) = block_range(vocab, ranks.len(), j);
                piece(r, hi - lo, dim)
            })
            .collect(),
        Placement::RowCyclic { ranks } => ranks
            .iter()
            .enumerate()
            .map(|(j, &r)| {
                let rows = Rows::Cyclic {
                    modulus: ranks.len() as u64,
                    residue: j as u64,
                };
                piece(r, rows.len(vocab), dim)
            })
            .collect(),
        Placement::Column { shards } => shards
            .iter()
            .map(|s| piece(s.rank, vocab, s.cols[1] - s.cols[0]))
            .collect(),
        Placement::DataParallel => (0..world)
            .map(|r| Piece {
                replica: true,
                ..piece(r, vocab, dim)
            })
            .collect(),
    }
}

/// What each rank gains from one placement: `(rank, seconds, bytes)`.
type Contrib = Vec<(usize, f64, u64)>;

/// A table's new placement and what it gives each rank.
type Change = (usize, Placement, Contrib);

/// The greedy's order of candidates: resulting maximum cost, bytes added, cost added,
/// largest resulting cost of the ranks it touches.
type GreedyKey = (f64, u64, f64, f64);

/// The model, the stats and the world, checked against each other.
struct Ctx<'a> {
    spec: &'a ModelSpec,
    stats: &'a [TableStats],
    world: usize,
    batch_per_rank: f64,
    state: u64,
    model: &'a CostModel,
}

impl Ctx<'_> {
    fn n_tables(&self) -> usize {
        self.spec.tables.len()
    }

    fn piece_cost(&self, t: usize, p: &Piece) -> f64 {
        let (ts, st, m) = (&self.spec.tables[t], &self.stats[t], self.model);
        let n = self.world as f64;
        let state_bytes = 4.0 * self.state as f64;
        let (exchanged, memory, lookups) = if p.replica {
            let (v, d) = (ts.vocab as f64, ts.dim as f64);
            let ids = self.batch_per_rank * st.mean_valency;
            (
                2.0 * v * d * 4.0 * (n - 1.0) / n,
                ids * m.access(ts.dim) + v * (3.0 * m.access(ts.dim) + state_bytes),
                ids,
            )
        } else {
            let n_in = n * st.unique_per_rank_batch * p.rows as f64 / ts.vocab as f64;
            (
                n_in * (4.0 + 8.0 * p.width as f64),
                n_in * (3.0 * m.access(p.width) + state_bytes),
                2.0 * n_in,
            )
        };
        exchanged / m.net_bw + memory / m.mem_bw + lookups * m.lookup_s + m.shard_s
    }

    fn contrib(&self, t: usize, p: &Placement) -> Contrib {
        let ts = &self.spec.tables[t];
        pieces(ts.vocab, ts.dim, self.world, p)
            .iter()
            .map(|pc| {
                let bytes = pc.rows * (pc.width as u64 + self.state) * 4;
                (pc.rank, self.piece_cost(t, pc), bytes)
            })
            .collect()
    }

    /// Bytes of the whole table with its optimizer state.
    fn table_bytes(&self, t: usize) -> u64 {
        let ts = &self.spec.tables[t];
        ts.vocab * (ts.dim as u64 + self.state) * 4
    }

    /// Bytes of the largest share of a row-wise placement over all ranks.
    fn row_share(&self, t: usize) -> u64 {
        let ts = &self.spec.tables[t];
        ts.vocab.div_ceil(self.world as u64) * (ts.dim as u64 + self.state) * 4
    }

    /// Seconds of the table placed whole on one rank.
    fn table_cost(&self, t: usize) -> f64 {
        let ts = &self.spec.tables[t];
        let whole = Piece {
            rank: 0,
            rows: ts.vocab,
            width: ts.dim,
            replica: false,
        };
        self.piece_cost(t, &whole)
    }

    fn plan(&self, tables: Vec<Placement>) -> Plan {
        Plan {
            world: self.world,
            spec_digest: self.spec.digest(),
            tables,
        }
    }
}

/// Model cost and memory of every rank under `plan`.
///
/// # Panics
/// If `stats` or `plan` do not have one entry per table of `spec`.
pub fn evaluate(
    spec: &ModelSpec,
    stats: &BatchStats,
    plan: &Plan,
    model: &CostModel,
    state_per_row: u64,
) -> PlanReport {
    assert_eq!(stats.tables.len(), spec.tables.len(), "stats per table");
    assert_eq!(plan.tables.len(), spec.tables.len(), "placements per table");
    let ctx = Ctx {
        spec,
        stats: &stats.tables,
        world: plan.world,
        batch_per_rank: stats.batch_per_rank as f64,
        state: state_per_row,
        model,
    };
    let mut cost = vec![0.0; plan.world];
    for (t, p) in plan.tables.iter().enumerate() {
        for (r, c, _) in ctx.contrib(t, p) {
            cost[r] += c;
        }
    }
    PlanReport::new(cost, plan.bytes_per_rank(spec, state_per_row))
}

fn check_inputs<'a>(
    spec: &'a ModelSpec,
    stats: &'a BatchStats,
    opts: &'a PlanOptions,
) -> Result<Ctx<'a>> {
    let bad = |msg: String| Err(Error::Config(format!("planner: {msg}")));
    if opts.world == 0 {
        return bad("world must be at least 1".into());
    }
    if stats.tables.len() != spec.tables.len() {
        return bad(format!(
            "batch stats have {} tables, the model {}",
            stats.tables.len(),
            spec.tables.len()
        ));
    }
    if stats.spec_digest != spec.digest() {
        return bad(format!(
            "batch stats were made for model {}, this model is {}",
            stats.spec_digest,
            spec.digest()
        ));
    }
    if stats.batch_per_rank == 0 {
        return bad("batch stats have batch per rank 0".into());
    }
    for (t, s) in stats.tables.iter().enumerate() {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        if !(ok(s.mean_valency) && ok(s.unique_per_rank_batch) && ok(s.unique_per_global_batch)) {
            return bad(format!(
                "batch stats of table {t} are not finite and >= 0: {s:?}"
            ));
        }
    }
    let m = &opts.model;
    if !([m.net_bw, m.mem_bw]
        .iter()
        .all(|&x| x.is_finite() && x > 0.0)
        && [m.lookup_s, m.shard_s, m.line_bytes]
            .iter()
            .all(|&x| x.is_finite() && x >= 0.0))
    {
        return bad(format!("cost model constants out of range: {m:?}"));
    }
    let ctx = Ctx {
        spec,
        stats: &stats.tables,
        world: opts.world,
        batch_per_rank: stats.batch_per_rank as f64,
        state: opts.state_per_row,
        model: &opts.model,
    };
    let total: u128 = (0..ctx.n_tables())
        .map(|t| ctx.table_bytes(t) as u128)
        .sum();
    let capacity = opts.world as u128 * opts.mem_per_rank as u128;
    if total > capacity {
        return bad(format!(
            "the tables need {total} bytes (rows and {} optimizer floats per row), more than \
             {} ranks x {} bytes = {capacity} bytes",
            opts.state_per_row, opts.world, opts.mem_per_rank
        ));
    }
    Ok(ctx)
}

fn report(ctx: &Ctx, plan: &Plan) -> PlanReport {
    let mut cost = vec![0.0; ctx.world];
    for (t, p) in plan.tables.iter().enumerate() {
        for (r, c, _) in ctx.contrib(t, p) {
            cost[r] += c;
        }
    }
    PlanReport::new(cost, plan.bytes_per_rank(ctx.spec, ctx.state))
}

fn finish(ctx: &Ctx, tables: Vec<Placement>, name: &str) -> Result<(Plan, PlanReport)> {
    let plan = ctx.plan(tables);
    plan.validate(ctx.spec, ctx.world, name)?;
    let r = report(ctx, &plan);
    Ok((plan, r))
}

// ---------------------------------------------------------------------------------
// Table-wise heuristics.

/// The table-wise heuristics the planner is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heuristic {
    /// A uniform rank per table from the seed.
    Random,
    /// Tables by bytes, largest first, onto the rank with the fewest bytes.
    Size,
    /// Tables by width, widest first, onto the rank with the least sum of widths.
    Dim,
    /// Tables by lookup volume `mean_valency * dim`, largest first, onto the rank with
    /// the least lookup volume.
    Lookup,
}

impl Heuristic {
    pub const ALL: [Heuristic; 4] = [
        Heuristic::Random,
        Heuristic::Size,
        Heuristic::Dim,
        Heuristic::Lookup,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Heuristic::Random => "random",
            Heuristic::Size => "size-greedy",
            Heuristic::Dim => "dim-greedy",
            Heuristic::Lookup => "lookup-greedy",
        }
    }
}

/// Place tables whole, in descending `key` order (ties by index), each onto the rank
/// with the least accumulated `key` among ranks with room for it.
fn table_wise_greedy(
    ctx: &Ctx,
    mem: u64,
    name: &str,
    key: impl Fn(usize) -> f64,
) -> Result<Vec<Placement>> {
    let mut order: Vec<usize> = (0..ctx.n_tables()).collect();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    let mut load = vec![0.0f64; ctx.world];
    let mut bytes = vec![0u64; ctx.world];
    let mut out = vec![Placement::DataParallel; ctx.n_tables()];
    for t in order {
        let tb = ctx.table_bytes(t);
        let rank = (0..ctx.world)
            .filter(|&r| bytes[r] + tb <= mem)
            .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)))
            .ok_or_else(|| no_room(ctx, mem, name, t, &bytes))?;
        load[rank] += key(t);
        bytes[rank] += tb;
        out[t] = Placement::Table { rank };
    }
    Ok(out)
}

fn no_room(ctx: &Ctx, mem: u64, name: &str, t: usize, bytes: &[u64]) -> Error {
    let free = bytes.iter().map(|&b| mem - b).max().unwrap_or(0);
    Error::Config(format!(
        "planner {name}: table {t} ({:?}, {} bytes) fits on no rank: at most {free} of {mem} \
         bytes per rank are free",
        ctx.spec.tables[t].name,
        ctx.table_bytes(t)
    ))
}

fn random_tables(ctx: &Ctx, mem: u64, seed: u64) -> Result<Vec<Placement>> {
    let mut bytes = vec![0u64; ctx.world];
    let mut out = Vec::with_capacity(ctx.n_tables());
    for t in 0..ctx.n_tables() {
        let tb = ctx.table_bytes(t);
        let mut rng = SplitMix64::for_id(seed, stream::PLAN_RANDOM, t as u64);
        let mut rank = rng.below(ctx.world as u64) as usize;
        if bytes[rank] + tb > mem {
            let room: Vec<usize> = (0..ctx.world).filter(|&r| bytes[r] + tb <= mem).collect();
            if room.is_empty() {
                return Err(no_room(ctx, mem, "random", t, &bytes));
            }
            rank = room[rng.below(room.len() as u64) as usize];
        }
        bytes[rank] += tb;
        out.push(Placement::Table { rank });
    }
    Ok(out)
}

fn heuristic_tables(ctx: &Ctx, h: Heuristic, opts: &PlanOptions) -> Result<Vec<Placement>> {
    let mem = opts.mem_per_rank;
    let tables = &ctx.spec.tables;
    match h {
        Heuristic::Random => random_tables(ctx, mem, opts.seed),
        Heuristic::Size => table_wise_greedy(ctx, mem, h.name(), |t| ctx.table_bytes(t) as f64),
        Heuristic::Dim => table_wise_greedy(ctx, mem, h.name(), |t| tables[t].dim as f64),
        Heuristic::Lookup => table_wise_greedy(ctx, mem, h.name(), |t| {
            ctx.stats[t].mean_valency * tables[t].dim as f64
        }),
    }
}

/// A table-wise plan by heuristic `h`, evaluated by [`evaluate`]. Fails if some table
/// fits on no rank.
pub fn plan_heuristic(
    h: Heuristic,
    spec: &ModelSpec,
    stats: &BatchStats,
    opts: &PlanOptions,
) -> Result<(Plan, PlanReport)> {
    let ctx = check_inputs(spec, stats, opts)?;
    let tables = heuristic_tables(&ctx, h, opts)?;
    finish(&ctx, tables, h.name())
}

/// [`Heuristic::Random`]: each table on `SplitMix64::for_id(seed, PLAN_RANDOM, t)`'s
/// uniform rank, or a uniform rank among those with room if that one is full.
pub fn plan_random(
    spec: &ModelSpec,
    stats: &BatchStats,
    opts: &PlanOptions,
) -> Result<(Plan, PlanReport)> {
    plan_heuristic(Heuristic::Random, spec, stats, opts)
}

/// [`Heuristic::Size`].
pub fn plan_size_greedy(
    spec: &ModelSpec,
    stats: &BatchStats,
    opts: &PlanOptions,
) -> Result<(Plan, PlanReport)> {
    plan_heuristic(Heuristic::Size, spec, stats, opts)
}

/// [`Heuristic::Dim`].
pub fn plan_dim_greedy(
    spec: &ModelSpec,
    stats: &BatchStats,
    opts: &PlanOptions,
) -> Result<(Plan, PlanReport)> {
    plan_heuristic(Heuristic::Dim, spec, stats, opts)
}

/// [`Heuristic::Lookup`].
pub fn plan_lookup_greedy(
    spec: &ModelSpec,
    stats: &BatchStats,
    opts: &PlanOptions,
) -> Result<(Plan, PlanReport)> {
    plan_heuristic(Heuristic::Lookup, spec, stats, opts)
}

// ---------------------------------------------------------------------------------
// The planner.

/// Ranks in ascending order of `key` (ties by index).
fn ranks_by<T: PartialOrd>(key: &[T]) -> Vec<usize> {
    let mut r: Vec<usize> = (0..key.len()).collect();
    r.sort_by(|&a, &b| {
        key[a]
            .partial_cmp(&key[b])
            .unwrap_or(Ordering::Equal)
            .then(a.cmp(&b))
    });
    r
}

fn column_placement(dim: usize, ranks: &[usize]) -> Placement {
    let k = ranks.len();
    Placement::Column {
        shards: (0..k)
            .map(|j| {
                let (lo, hi) = block_range(dim as u64, k, j);
                ColumnShard {
                    rank: ranks[j],
                    cols: [lo as usize, hi as usize],
                }
            })
            .collect(),
    }
}

/// The placements the greedy and the local search consider for table `t`, given the
/// current costs and bytes of the ranks (without `t`).
fn candidates(ctx: &Ctx, t: usize, cost: &[f64], bytes: &[u64]) -> Vec<Placement> {
    let n = ctx.world;
    let dim = ctx.spec.tables[t].dim;
    let by_load = ranks_by(cost);
    let by_bytes = ranks_by(bytes);
    // The `k` least loaded ranks, the emptiest first (it gets the larger row block).
    let least_loaded = |k: usize| {
        let mut r = by_load[..k].to_vec();
        r.sort_by_key(|&i| (bytes[i], i));
        r
    };
    let mut v: Vec<Placement> = (0..n).map(|rank| Placement::Table { rank }).collect();
    if n > 1 {
        let mut k = 2;
        while k <= n.min(dim) {
            v.push(column_placement(dim, &by_load[..k]));
            k *= 2;
        }
        let mut k = 2;
        while k < n {
            v.push(Placement::RowBlock {
                ranks: least_loaded(k),
            });
            k *= 2;
        }
        v.push(Placement::RowBlock {
            ranks: by_bytes.clone(),
        });
        v.push(Placement::RowCyclic { ranks: by_bytes });
        v.push(Placement::DataParallel);
    }
    v
}

/// Costs and bytes per rank after adding `add`.
fn with(cost: &[f64], bytes: &[u64], add: &Contrib) -> (Vec<f64>, Vec<u64>) {
    let (mut c, mut b) = (cost.to_vec(), bytes.to_vec());
    for &(r, x, y) in add {
        c[r] += x;
        b[r] += y;
    }
    (c, b)
}

fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// Start 1: the greedy over every placement kind (see the module doc). `None` if some
/// table has no candidate that fits.
fn greedy(ctx: &Ctx, mem: u64) -> Option<Vec<Placement>> {
    let n_tables = ctx.n_tables();
    let mut order: Vec<usize> = (0..n_tables).collect();
    let tc: Vec<f64> = (0..n_tables).map(|t| ctx.table_cost(t)).collect();
    order.sort_by(|&a, &b| tc[b].total_cmp(&tc[a]).then(a.cmp(&b)));
    // Room kept on every rank for a row-wise share of each table still to place.
    let mut reserve: u64 = (0..n_tables).map(|t| ctx.row_share(t)).sum();
    let keep_escape = reserve <= mem;
    let mut cost = vec![0.0; ctx.world];
    let mut bytes = vec![0u64; ctx.world];
    let mut out = vec![Placement::DataParallel; n_tables];
    for t in order {
        reserve -= ctx.row_share(t);
        let limit = if keep_escape { mem - reserve } else { mem };
        let mut best: Option<(GreedyKey, Placement, Contrib)> = None;
        for p in candidates(ctx, t, &cost, &bytes) {
            let add = ctx.contrib(t, &p);
            let (c, b) = with(&cost, &bytes, &add);
            if add.iter().any(|&(r, _, _)| b[r] > limit) {
                continue;
            }
            let touched = add.iter().map(|&(r, _, _)| c[r]).fold(0.0, f64::max);
            let key = (
                max_of(&c),
                add.iter().map(|a| a.2).sum::<u64>(),
                add.iter().map(|a| a.1).sum::<f64>(),
                touched,
            );
            let better = match &best {
                None => true,
                Some((k, _, _)) => {
                    key.0
                        .total_cmp(&k.0)
                        .then(key.1.cmp(&k.1))
                        .then(key.2.total_cmp(&k.2))
                        .then(key.3.total_cmp(&k.3))
                        == Ordering::Less
                }
            };
            if better {
                best = Some((key, p, add));
            }
        }
        let (_, p, add) = best?;
        (cost, bytes) = with(&cost, &bytes, &add);
        out[t] = p;
    }
    Some(out)
}

/// Sorted descending.
fn sorted_desc(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    s
}

/// Whether `a` is lexicographically below `b` by more than `tol` at the first
/// position where they differ by more than `tol`.
fn lex_below(a: &[f64], b: &[f64], tol: f64) -> bool {
    for (x, y) in a.iter().zip(b) {
        if *x < y - tol {
            return true;
        }
        if *x > y + tol {
            return false;
        }
    }
    false
}

/// The local search of the module doc, from a feasible start.
fn local_search(
    ctx: &Ctx,
    mem: u64,
    mut place: Vec<Placement>,
    max_iters: usize,
) -> Vec<Placement> {
    let n_tables = ctx.n_tables();
    let mut contrib: Vec<Contrib> = (0..n_tables).map(|t| ctx.contrib(t, &place[t])).collect();
    for _ in 0..max_iters {
        let mut cost = vec![0.0; ctx.world];
        let mut bytes = vec![0u64; ctx.world];
        for c in &contrib {
            for &(r, x, y) in c {
                cost[r] += x;
                bytes[r] += y;
            }
        }
        let current = sorted_desc(&cost);
        let tol = 1e-9 * current[0];
        let a = ranks_by(&cost)[ctx.world - 1];
        let on_a: Vec<usize> = (0..n_tables)
            .filter(|&t| contrib[t].iter().any(|&(r, _, _)| r == a))
            .collect();

        let mut best: Option<(Vec<f64>, Vec<Change>)> = None;
        let mut consider = |changes: Vec<(usize, Placement)>| {
            let (mut c, mut b) = (cost.clone(), bytes.clone());
            for (t, _) in &changes {
                for &(r, x, y) in &contrib[*t] {
                    c[r] -= x;
                    b[r] -= y;
                }
            }
            let changes: Vec<Change> = changes
                .into_iter()
                .map(|(t, p)| {
                    let add = ctx.contrib(t, &p);
                    (t, p, add)
                })
                .collect();
            for (_, _, add) in &changes {
                for &(r, x, y) in add {
                    c[r] += x;
                    b[r] += y;
                }
            }
            if b.iter().any(|&x| x > mem) {
                return;
            }
            let s = sorted_desc(&c);
            if !lex_below(&s, &current, tol) {
                return;
            }
            if best.as_ref().is_none_or(|(bs, _)| lex_below(&s, bs, 0.0)) {
                best = Some((s, changes));
            }
        };

        for &t in &on_a {
            // Move the piece on `a` to a rank that holds no piece of `t`.
            let holds: Vec<bool> = (0..ctx.world)
                .map(|r| contrib[t].iter().any(|&(q, _, _)| q == r))
                .collect();
            for b in (0..ctx.world).filter(|&b| !holds[b]) {
                let moved = match &place[t] {
                    Placement::Table { .. } => Placement::Table { rank: b },
                    Placement::RowBlock { ranks } => Placement::RowBlock {
                        ranks: ranks.iter().map(|&r| if r == a { b } else { r }).collect(),
                    },
                    Placement::RowCyclic { ranks } => Placement::RowCyclic {
                        ranks: ranks.iter().map(|&r| if r == a { b } else { r }).collect(),
                    },
                    Placement::Column { shards } => Placement::Column {
                        shards: shards
                            .iter()
                            .map(|s| ColumnShard {
                                rank: if s.rank == a { b } else { s.rank },
                                cols: s.cols,
                            })
                            .collect(),
                    },
                    Placement::DataParallel => continue,
                };
                consider(vec![(t, moved)]);
            }
            // Swap with a table-wise table on another rank.
            if place[t] == (Placement::Table { rank: a }) {
                for (u, pu) in place.iter().enumerate() {
                    if let Placement::Table { rank: b } = *pu {
                        if b != a {
                            consider(vec![
                                (t, Placement::Table { rank: b }),
                                (u, Placement::Table { rank: a }),
                            ]);
                        }
                    }
                }
            }
            // Re-place it with any candidate.
            let (mut c, mut b) = (cost.clone(), bytes.clone());
            for &(r, x, y) in &contrib[t] {
                c[r] -= x;
                b[r] -= y;
            }
            for p in candidates(ctx, t, &c, &b) {
                if p != place[t] {
                    consider(vec![(t, p)]);
                }
            }
        }
        let Some((_, changes)) = best else { break };
        for (t, p, add) in changes {
            place[t] = p;
            contrib[t] = add;
        }
    }
    place
}

/// The best plan the planner finds under the cost model (see the module doc), with its
/// report. Fails with [`Error::Config`] if the tables cannot fit into
/// `world * mem_per_rank` bytes.
pub fn plan_auto(
    spec: &ModelSpec,
    stats: &BatchStats,
    opts: &PlanOptions,
) -> Result<(Plan, PlanReport)> {
    let ctx = check_inputs(spec, stats, opts)?;
    let mem = opts.mem_per_rank;
    let tc: Vec<f64> = (0..ctx.n_tables()).map(|t| ctx.table_cost(t)).collect();
    let starts = [
        greedy(&ctx, mem),
        table_wise_greedy(&ctx, mem, "lpt", |t| tc[t]).ok(),
        heuristic_tables(&ctx, Heuristic::Lookup, opts).ok(),
    ];
    let mut best: Option<(Plan, PlanReport)> = None;
    for start in starts.into_iter().flatten() {
        let plan = ctx.plan(local_search(&ctx, mem, start, opts.max_iters));
        let r = report(&ctx, &plan);
        let better = best.as_ref().is_none_or(|(_, b)| {
            r.max_cost
                .total_cmp(&b.max_cost)
                .then(r.total_cost.total_cmp(&b.total_cost))
                == Ordering::Less
        });
        if better {
            best = Some((plan, r));
        }
    }
    let (plan, r) = best.ok_or_else(|| {
        let total: u64 = (0..ctx.n_tables()).map(|t| ctx.table_bytes(t)).sum();
        Error::Config(format!(
            "planner: found no placement of {total} bytes of tables into {} ranks x {mem} \
             bytes = {} bytes (a row-wise share of every table needs {} bytes per rank)",
            opts.world,
            opts.world as u128 * mem as u128,
            (0..ctx.n_tables()).map(|t| ctx.row_share(t)).sum::<u64>()
        ))
    })?;
    plan.validate(spec, opts.world, "auto")?;
    Ok((plan, r))
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
    use super::*;
    use crate::embed::spec::{preset, Pooling, TableSpec, ValencyDist};
    use crate::embed::stats::{synthetic_stats, SCHEMA};

    fn table(name: &str, vocab: u64, dim: usize, valency: f64) -> TableSpec {
        TableSpec {
            name: name.into(),
            vocab,
            dim,
            pooling: Pooling::Sum,
            valency,
            valency_dist: ValencyDist::Poisson,
        }
    }

    fn spec_of(tables: Vec<TableSpec>) -> ModelSpec {
        ModelSpec {
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
        };
        let r = evaluate(&spec, &stats, &plan, &m, 1);
        // a's shards: n_in = 2 * 100 * 500/1000 = 100 ids; 4 + 8*16 = 132 bytes
        // exchanged per id; 3 * max(4*16, 64) + 4*1 = 196 bytes of memory per id.
        let a_half = secs(100.0 * 132.0, 100.0 * 196.0, 200.0);
        // b: n_in = 2 * 8 = 16; width 2 moves 8 bytes but an access costs 64.
        let b_whole = secs(16.0 * (4.0 + 16.0), 16.0 * (3.0 * 64.0 + 4.0), 32.0);
        assert!(close(r.cost_per_rank[0], a_half + b_whole), "{r:?}");
        assert!(close(r.cost_per_rank[1], a_half), "{r:?}");
        assert_eq!(
            r.bytes_per_rank,
            vec![500 * 17 * 4 + 10 * 3 * 4, 500 * 17 * 4]
        );
        let (hi, lo) = (a_half + b_whole, a_half);
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
        assert!(close(r.cost_per_rank[0], col4 + dp), "{r:?}");
        assert!(close(r.cost_per_rank[1], col12 + dp), "{r:?}");
        assert_eq!(
            r.bytes_per_rank,
            vec![1000 * 5 * 4 + 120, 1000 * 13 * 4 + 120]
        );
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
                assert!(auto.imbalance <= lookup.imbalance, "{auto:?} vs {lookup:?}");
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
