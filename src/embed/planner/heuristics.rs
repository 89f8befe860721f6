//! Table-wise heuristics: the fixed placements the planner is compared with.

use super::cost::{check_inputs, finish, Ctx};
use super::{PlanOptions, PlanReport};
use crate::embed::tables::placement::{Placement, Plan};
use crate::embed::train::batch_stats::BatchStats;
use crate::rng::{stream, SplitMix64};
use crate::spec::ModelSpec;
use crate::{Error, Result};

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
pub(super) fn table_wise_greedy(
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

pub(super) fn heuristic_tables(
    ctx: &Ctx,
    h: Heuristic,
    opts: &PlanOptions,
) -> Result<Vec<Placement>> {
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
///
/// [`evaluate`]: super::evaluate
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
