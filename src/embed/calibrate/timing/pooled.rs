//! The pooled training-step points ([`PooledPoint`]): which are measured, and their
//! runs through the real training step on every rank, round-major over the points
//! with the extra passes of the MLP and collective points between the rounds.

use crate::comm::Comm;
use crate::data::clicks::gen::ClickGen;
use crate::data::clicks::source::Source;
use crate::embed::calibrate::options::CalibOptions;
use crate::embed::calibrate::points::{rows_of, PooledPoint, POOLED_PLACEMENTS, POOLED_TABLE_OPT};
use crate::embed::calibrate::reduce::median;
use crate::embed::train::trainer::{EmbedConfig, EmbedTrainer};
use crate::error::Result;

/// The pooled points `o` measures at `p` ranks, in the order they run: per width
/// (that `p` divides) and pooling factor, `p` tables (one per rank) whole, in `p`
/// column pieces and in `p` row blocks, and whole in `rows` mode; then the whole
/// tables of the other sizes in both modes, and the together points
/// (`pooled_together` tables per rank, both modes, each after its partner: one such
/// table a rank).
fn pooled_points(o: &CalibOptions, p: usize) -> Vec<PooledPoint> {
    let point = |dim, pooling, bytes, placement: &str| PooledPoint {
        dim,
        pooling,
        tables: p,
        rows: rows_of(bytes, dim),
        batch: o.pooled_batch,
        placement: placement.to_string(),
        pieces: if placement == "table" { 1 } else { p },
        mode: "pooled".to_string(),
        seconds: 0.0,
    };
    let rows_point = |dim, pooling| PooledPoint {
        mode: "rows".to_string(),
        ..point(dim, pooling, o.table_bytes, "table")
    };
    // Per width and pooling, the three placements at the reference size and the
    // whole tables in `rows` mode; then the whole tables of the other sizes.
    let mut groups: Vec<Vec<PooledPoint>> = Vec::new();
    for &dim in o.pooled_dims.iter().filter(|&&d| d % p == 0) {
        for &pooling in &o.pooled_poolings {
            let mut g: Vec<PooledPoint> = POOLED_PLACEMENTS
                .iter()
                .map(|pl| point(dim, pooling, o.table_bytes, pl))
                .collect();
            g.push(rows_point(dim, pooling));
            groups.push(g);
        }
    }
    // The whole tables of the other sizes, in both modes: `pooled` for the pooled
    // size factor, `rows` for the owners' (`CostModel::rows_size_factor`).
    let (d, pl) = (o.pooled_size_dim, o.pooled_size_pooling);
    let sizes = o.pooled_sizes.iter().filter(|&&b| b != o.table_bytes);
    groups.push(
        sizes
            .flat_map(|&b| {
                let pooled = point(d, pl, b, "table");
                let rows = PooledPoint {
                    mode: "rows".to_string(),
                    ..pooled.clone()
                };
                [pooled, rows]
            })
            .collect(),
    );
    // The together points: `pooled_together` whole tables on every rank, in both
    // modes (the interference of a rank's tables in a real step).
    if o.pooled_together > 1 {
        let together = PooledPoint {
            tables: o.pooled_together * p,
            ..point(d, o.pooled_together_pooling, o.table_bytes, "table")
        };
        let rows = PooledPoint {
            mode: "rows".to_string(),
            ..together.clone()
        };
        // Each beside its partner (one such table a rank) in the same rounds: the
        // interference is fitted to their ratio, which a slow minute moves less.
        groups.push(vec![
            PooledPoint::partner(&together, p),
            together,
            PooledPoint::partner(&rows, p),
            rows,
        ]);
    }
    groups.into_iter().flatten().collect()
}

/// Collective: every rank must call. The pooled points (`pooled_points`), trained
/// with the real step; each point keeps the median of its runs. None on one rank
/// (nothing is split).
///
/// The runs are round-major over all the points (every point once per round, in
/// order), so that a point's runs are spread over the whole pooled phase; `between`
/// runs the extra passes of the MLP and collective points (`CalibOptions::spread`
/// less the first) after the rounds that spread them evenly, the last one after the
/// last round.
pub fn global_pooled_points<C: Comm>(
    comm: &C,
    o: &CalibOptions,
    between: &mut dyn FnMut(&C) -> Result<()>,
) -> Result<Vec<PooledPoint>> {
    let p = comm.size();
    let mut out = Vec::new();
    if p < 2 {
        return Ok(out);
    }
    let mut pts = pooled_points(o, p);
    let mut runs = vec![Vec::new(); pts.len()];
    let reps = o.pooled_reps.max(1);
    let after = pass_rounds(reps, o.spread.saturating_sub(1));
    for round in 1..=reps {
        for (q, r) in pts.iter().zip(runs.iter_mut()) {
            r.push(global_pooled_run(comm, o, q)?);
        }
        for _ in after.iter().filter(|&&a| a == round) {
            between(comm)?;
        }
    }
    for (q, r) in pts.iter_mut().zip(runs) {
        // At least 1 ns, as the kernels' points.
        q.seconds = median(r).max(1e-9);
    }
    out.extend(pts);
    Ok(out)
}

/// After which of `reps` rounds (1-based) each of `extra` passes runs: pass `j`
/// (1-based) after round `ceil(j reps / extra)`, so that they are spread evenly and
/// the last is after the last round.
fn pass_rounds(reps: usize, extra: usize) -> Vec<usize> {
    (1..=extra).map(|j| (j * reps).div_ceil(extra)).collect()
}

/// Collective: every rank must call. One run of point `q`: `pooled_warmup` steps,
/// then the seconds per step of the embedding phases (lookup, pooling, backward and
/// update, their collectives included; each phase the slowest rank's) over
/// `pooled_steps`: what the planner's per-rank cost stands for in a step.
fn global_pooled_run<C: Comm>(comm: &C, o: &CalibOptions, q: &PooledPoint) -> Result<f64> {
    let (p, rank) = (comm.size(), comm.rank());
    let spec = q.spec();
    let plan = q.plan(&spec, p);
    let steps = o.pooled_warmup + o.pooled_steps * 50;
    let cfg = EmbedConfig::new(spec.clone(), o.seed, q.batch * p, steps, POOLED_TABLE_OPT);
    let source = Source::Generated(ClickGen::new(&spec, o.seed));
    let mut tr = comm.agree(EmbedTrainer::new(cfg, source, &plan, rank))?;
    comm.agree(tr.local_preload(p, rank, 0, o.pooled_warmup))?;
    let t = std::time::Instant::now();
    for _ in 0..o.pooled_warmup {
        tr.global_step(comm, false)?;
    }
    // The warm-up's interval, discarded; its seconds set the timed steps: at least
    // `pooled_steps`, and enough for `pooled_min_seconds` (the slowest rank's).
    tr.global_interval(comm)?;
    let per = t.elapsed().as_secs_f64() / o.pooled_warmup.max(1) as f64;
    let want = (o.pooled_min_seconds / per.max(1e-9)).ceil() as u64;
    let mine = want.clamp(o.pooled_steps, o.pooled_steps * 50);
    let timed = comm.all_reduce_max(mine);
    let w = o.pooled_warmup;
    comm.agree(tr.local_preload(p, rank, w, w + timed))?;
    for _ in 0..timed {
        tr.global_step(comm, false)?;
    }
    let r = tr.global_interval(comm)?;
    let phases = r.seconds_lookup + r.seconds_pool + r.seconds_backward + r.seconds_update;
    Ok(phases / r.steps.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::pass_rounds;

    #[test]
    fn extra_passes_are_spread_over_the_rounds_the_last_after_the_last() {
        assert_eq!(pass_rounds(3, 2), vec![2, 3]);
        assert_eq!(pass_rounds(3, 1), vec![3]);
        assert_eq!(pass_rounds(3, 3), vec![1, 2, 3]);
        assert_eq!(pass_rounds(1, 2), vec![1, 1]);
        assert_eq!(pass_rounds(6, 2), vec![3, 6]);
        assert!(pass_rounds(3, 0).is_empty());
    }
}
