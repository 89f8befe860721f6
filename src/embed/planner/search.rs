//! The planner: a greedy over every placement kind and a local search from three
//! starts (see the module doc of `planner`).

use std::cmp::Ordering;

use super::cost::{check_inputs, report, Contrib, Ctx, Load};
use super::heuristics::{heuristic_tables, table_wise_greedy, Heuristic};
use super::{PlanOptions, PlanReport};
use crate::blocks::block_range;
use crate::embed::tables::placement::{ColumnShard, Placement, Plan};
use crate::embed::train::batch_stats::BatchStats;
use crate::spec::{ModelSpec, VocabKind};
use crate::{Error, Result};

/// A table's new placement and what it gives each rank.
type Change = (usize, Placement, Contrib);

/// The greedy's order of candidates: resulting maximum cost, bytes added, cost added,
/// largest resulting cost of the ranks it touches.
type GreedyKey = (f64, u64, f64, f64);

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
pub(super) fn candidates(ctx: &Ctx, t: usize, cost: &[f64], bytes: &[u64]) -> Vec<Placement> {
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
    if ctx.spec.tables[t].vocab_kind == VocabKind::Hash {
        // Keys are spread by their hash: whole on one rank, or over all of them.
        if n > 1 {
            v.push(Placement::RowCyclic { ranks: by_bytes });
        }
        return v;
    }
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
    let mut load = Load::new(ctx.world);
    let mut out = vec![Placement::DataParallel; n_tables];
    for t in order {
        reserve -= ctx.row_share(t);
        let limit = if keep_escape { mem - reserve } else { mem };
        let mut best: Option<(GreedyKey, Placement, Contrib)> = None;
        for p in candidates(ctx, t, &load.cost, &load.bytes) {
            let add = ctx.contrib(t, &p);
            let next = load.with(&add);
            if add.iter().any(|&(r, _, _, _)| next.bytes[r] > limit) {
                continue;
            }
            let c = ctx.effective(&next);
            let touched = add.iter().map(|&(r, _, _, _)| c[r]).fold(0.0, f64::max);
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
        load.add(&add);
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
        let mut load = Load::new(ctx.world);
        contrib.iter().for_each(|c| load.add(c));
        let eff = ctx.effective(&load);
        let current = sorted_desc(&eff);
        let tol = 1e-9 * current[0];
        let a = ranks_by(&eff)[ctx.world - 1];
        let on_a: Vec<usize> = (0..n_tables)
            .filter(|&t| contrib[t].iter().any(|&(r, _, _, _)| r == a))
            .collect();

        let mut best: Option<(Vec<f64>, Vec<Change>)> = None;
        let mut consider = |changes: Vec<(usize, Placement)>| {
            let mut l = load.clone();
            for (t, _) in &changes {
                l.remove(&contrib[*t]);
            }
            let changes: Vec<Change> = changes
                .into_iter()
                .map(|(t, p)| {
                    let add = ctx.contrib(t, &p);
                    (t, p, add)
                })
                .collect();
            for (_, _, add) in &changes {
                l.add(add);
            }
            if l.bytes.iter().any(|&x| x > mem) {
                return;
            }
            let s = sorted_desc(&ctx.effective(&l));
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
                .map(|r| contrib[t].iter().any(|&(q, _, _, _)| q == r))
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
            let mut l = load.clone();
            l.remove(&contrib[t]);
            for p in candidates(ctx, t, &l.cost, &l.bytes) {
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

/// One pass of [`plan_auto`]: placements searched from three starts with the owners
/// charged in `ctx`'s search modes, then each start's output modes chosen under its
/// placements (from those modes); the best of the three. The starts: `first` (by
/// default the greedy over every placement kind), table-wise longest processing time
/// first, and lookup-greedy. `None` when no start fits.
pub(super) fn plan_pass(
    ctx: &Ctx,
    opts: &PlanOptions,
    first: Option<Vec<Placement>>,
) -> Option<(Plan, PlanReport)> {
    let mem = opts.mem_per_rank;
    let tc: Vec<f64> = (0..ctx.n_tables()).map(|t| ctx.table_cost(t)).collect();
    let starts = [
        first.or_else(|| greedy(ctx, mem)),
        table_wise_greedy(ctx, mem, "lpt", |t| tc[t]).ok(),
        heuristic_tables(ctx, Heuristic::Lookup, opts).ok(),
    ];
    let mut best: Option<(Plan, PlanReport)> = None;
    for start in starts.into_iter().flatten() {
        let tables = local_search(ctx, mem, start, opts.max_iters);
        let plan = ctx.choose_modes(tables, &ctx.search_modes);
        let r = report(ctx, &plan);
        if best.as_ref().is_none_or(|(_, b)| r.better_than(b)) {
            best = Some((plan, r));
        }
    }
    best
}

/// The best plan the planner finds under the cost model (see the module doc), with its
/// report. Fails with [`Error::Config`] if the tables cannot fit into
/// `world * mem_per_rank` bytes.
pub fn plan_auto(
    spec: &ModelSpec,
    stats: &BatchStats,
    opts: &PlanOptions,
) -> Result<(Plan, PlanReport)> {
    let base = check_inputs(spec, stats, opts)?;
    // Two passes. First with every owner charged in `rows`; then with each table
    // charged in its preferred mode (pooling moves work to the owners, so the balance
    // depends on the modes), starting from the first pass's placements instead of the
    // greedy (which is slow under pooled costs on hundreds of ranks: minutes at 128,
    // for a worse plan). The better plan is kept.
    let mut best = plan_pass(&base, opts, None);
    let moded = base.searching_in(base.preferred_modes());
    if let Some((p, r)) = plan_pass(&moded, opts, best.as_ref().map(|(p, _)| p.tables.clone())) {
        if best.as_ref().is_none_or(|(_, b)| r.better_than(b)) {
            best = Some((p, r));
        }
    }
    let (ctx, mem) = (&base, opts.mem_per_rank);
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
