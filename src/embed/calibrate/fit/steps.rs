//! The fit's training-step phases: from the pooled points, the pooled owners' and the
//! asking side's coefficients, their size factors, and the interference the
//! together points give, fitted in turn until it settles.

use super::{IDENTIFIES, TOGETHER_ROUNDS};
use crate::embed::calibrate::points::{rows_of, Costs, PooledPoint};
use crate::embed::planner::CostModel;
use crate::lsq::nonneg_least_squares;

/// The training steps' coefficients at `m`'s interference, then the interference
/// the together points give with them, until it settles (the coefficients of the
/// points with pieces of several tables on a rank depend on it); at most
/// [`TOGETHER_ROUNDS`] rounds.
pub(super) fn training_steps(c: &Costs, m: &mut CostModel) {
    for round in 0..=TOGETHER_ROUNDS {
        if let Some(([occ, occ_float, ex], sizes)) = pooled_fit(c, m) {
            m.pooled_measured = true;
            m.pooled_occ_s = occ;
            m.pooled_occ_float_s = occ_float;
            m.pooled_example_s = ex;
            m.pooled_size_factor = sizes;
        }
        if let Some([occ, occ_float, ex]) = rows_fit(c, m) {
            m.ask_measured = true;
            m.ask_occ_s = occ;
            m.ask_occ_float_s = occ_float;
            m.ask_example_s = ex;
        }
        if round == TOGETHER_ROUNDS {
            break;
        }
        let (beta, rows) = match together_fit(c, m) {
            Some(betas) => betas,
            // The size law has no variable at the together points (their bytes cost
            // no more per row access than one table's on this machine's size
            // points), yet their steps may cost more than their pieces' sum: the
            // table count's law prices what they measure, if it identifies it.
            None if round == 0 && !m.interference_count => {
                m.interference_count = true;
                match together_fit(c, m) {
                    // Above rounding: a slope of 2e-16 is none.
                    Some(betas) if betas.0 > 1e-9 || betas.1.is_some_and(|b| b > 1e-9) => betas,
                    _ => {
                        m.interference_count = false;
                        break;
                    }
                }
            }
            None => break,
        };
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.max(1e-3);
        let settled = near(beta, m.interference)
            && near(rows.unwrap_or(beta), m.rows_interference())
            && rows.is_some() == m.interference_rows.is_some();
        m.interference = beta;
        m.interference_rows = rows;
        if settled {
            break;
        }
    }
}

/// `[pooled_occ_s, pooled_occ_float_s, pooled_example_s]` and the pooled size
/// factor from the pooled points (`None` without them). The coefficients: least
/// relative squares through the origin, over the points at the reference size, of
/// each point's measured seconds less what `m` models for its plan with the
/// measured path at zero coefficients (the asking side, the exchange, `shard_s`),
/// over its rank's interference multiplier, against the occurrences its pieces see,
/// the same times their width, and the examples they serve, per rank; kept >= 0
/// (of the subsets of the three terms whose fit has no negative coefficient, the
/// one with the least residual). The size factor: per other size, the factor of
/// the occurrence terms that explains its point (at least 0.05), with 1 at the
/// reference; empty without other sizes.
fn pooled_fit(c: &Costs, m: &CostModel) -> Option<([f64; 3], Vec<[f64; 2]>)> {
    let world = c.conditions.ranks.max(1);
    let pooled: Vec<&PooledPoint> = c
        .pooled
        .iter()
        .filter(|q| q.mode == "pooled" && !q.together(world) && !a_partner(c, q, world))
        .collect();
    if pooled.is_empty() {
        return None;
    }
    let zero = CostModel {
        pooled_measured: true,
        pooled_occ_s: 0.0,
        pooled_occ_float_s: 0.0,
        pooled_example_s: 0.0,
        pooled_size_factor: Vec::new(),
        ..m.clone()
    };
    let tb = c.conditions.table_bytes;
    // Per point: the three terms' work and the seconds to explain, each divided by
    // the point's measured seconds (relative errors: a pooling-1 step is a tenth of
    // a pooling-32 one).
    let terms = |q: &PooledPoint| -> ([f64; 3], f64) {
        let (o, e) = q.per_rank_work(world);
        let w = q.piece_width() as f64;
        let mult = q.interference(m, world);
        let y = (q.seconds - q.modelled(&zero, world)) / mult;
        let s = q.seconds;
        ([o / s, o * w / s, e / s], y / s)
    };
    let at_ref = |q: &&PooledPoint| q.rows == rows_of(tb, q.dim);
    let size_pts: Vec<&PooledPoint> = pooled.iter().copied().filter(|q| !at_ref(q)).collect();
    let ref_pts: Vec<&PooledPoint> = pooled.iter().copied().filter(at_ref).collect();
    // The coefficients from the reference size; then per size measured, the
    // occurrences' factor that explains its point.
    let rows: Vec<([f64; 3], f64)> = ref_pts.iter().map(|q| terms(q)).collect();
    let coef = nonneg_least_squares(&rows, 0);
    let mut sizes: Vec<[f64; 2]> = size_pts
        .iter()
        .filter_map(|q| {
            let (a, y) = terms(q);
            let occ = a[0] * coef[0] + a[1] * coef[1];
            (occ > 0.0).then(|| [q.span_bytes(), ((y - a[2] * coef[2]) / occ).max(0.05)])
        })
        .collect();
    with_reference(&mut sizes, tb);
    Some((coef, sizes))
}

/// Size-factor pairs `sizes` (when any) with the reference size `tb` at factor 1
/// added, sorted by bytes, sizes within 5 % of one another kept once.
fn with_reference(sizes: &mut Vec<[f64; 2]>, tb: u64) {
    if !sizes.is_empty() {
        sizes.push([tb as f64, 1.0]);
        sizes.sort_by(|a, b| a[0].total_cmp(&b[0]));
        sizes.dedup_by(|b, a| (b[0] / a[0] - 1.0).abs() < 0.05);
    }
}

/// `[ask_occ_s, ask_occ_float_s, ask_example_s]` from the `rows` points (`None`
/// without them): what each point's step took beyond what `m` prices with a free
/// asking side (the owners' pieces), against the occurrences the rank asked for, the
/// same times the width, and its examples per table; least squares of the relative
/// errors with coefficients >= 0, as [`pooled_fit`]'s.
fn rows_fit(c: &Costs, m: &CostModel) -> Option<[f64; 3]> {
    let world = c.conditions.ranks.max(1);
    let tb = c.conditions.table_bytes;
    // At the reference size: the other sizes' points are the rows size factor's
    // ([`rows_size_fit`]).
    let rows: Vec<&PooledPoint> = c
        .pooled
        .iter()
        .filter(|q| q.mode == "rows" && !q.together(world) && !a_partner(c, q, world))
        .filter(|q| q.rows == rows_of(tb, q.dim))
        .collect();
    if rows.is_empty() {
        return None;
    }
    let free = CostModel {
        ask_measured: true,
        ask_occ_s: 0.0,
        ask_occ_float_s: 0.0,
        ask_example_s: 0.0,
        ..m.clone()
    };
    let pts: Vec<([f64; 3], f64)> = rows
        .iter()
        .map(|q| {
            let (o, e) = q.per_rank_work(world);
            let w = q.dim as f64;
            // The asking side is not under the interference (it works on the rows
            // it received, not on the rank's tables).
            let y = q.seconds - q.modelled(&free, world);
            let s = q.seconds;
            ([o / s, o * w / s, e / s], y / s)
        })
        .collect();
    Some(nonneg_least_squares(&pts, 0))
}

/// The `rows` size factor ([`CostModel::rows_size_factor`]) from the `rows` points
/// of whole tables larger than the reference (empty without them): per size, the
/// factor of the owners' row accesses and lookups that makes `m` price the point at
/// its measured seconds (at least 0.05, at most 50), with 1 at the reference and
/// below it. The price is linear in that factor, so two prices (at factor 1 and 2)
/// give it. A point where what the factor multiplies is under [`IDENTIFIES`] of its
/// measured seconds is left out. The smaller tables' points are not used: what they
/// save is the asking side's (it pools from few distinct rows, which stay in cache),
/// and charged to the owners it priced them at the clamp (4 ranks, 4 MiB: 0.05).
pub(super) fn rows_size_fit(c: &Costs, m: &CostModel) -> Vec<[f64; 2]> {
    let world = c.conditions.ranks.max(1);
    let tb = c.conditions.table_bytes;
    let at = |f: f64| CostModel {
        rows_size_factor: vec![[1.0, f]],
        ..m.clone()
    };
    let (one, two) = (at(1.0), at(2.0));
    let mut sizes: Vec<[f64; 2]> = c
        .pooled
        .iter()
        .filter(|q| q.mode == "rows" && q.placement == "table" && !q.together(world))
        .filter(|q| !a_partner(c, q, world) && q.rows > rows_of(tb, q.dim))
        .filter_map(|q| {
            let g1 = q.modelled(&one, world);
            let slope = q.modelled(&two, world) - g1;
            // A point where the factor moves under `IDENTIFIES` of its price does
            // not identify it.
            (slope.is_finite() && slope >= IDENTIFIES * q.seconds).then(|| {
                [
                    q.span_bytes(),
                    (1.0 + (q.seconds - g1) / slope).clamp(0.05, 50.0),
                ]
            })
        })
        .collect();
    with_reference(&mut sizes, tb);
    sizes
}

/// The together point's partner: one table a rank of the same width, pooling, rows,
/// batch and mode, measured in the same rounds ([`PooledPoint::partner`]).
fn partner_of<'a>(c: &'a Costs, q: &PooledPoint, world: usize) -> Option<&'a PooledPoint> {
    c.pooled.iter().find(|a| a.is_partner_of(q, world))
}

/// Whether `q` is a together point's partner: it serves as that point's reference
/// only ([`together_fit`]), not in the coefficients' fits, so that they are what
/// they were without partners.
fn a_partner(c: &Costs, q: &PooledPoint, world: usize) -> bool {
    c.pooled.iter().any(|t| q.is_partner_of(t, world))
}

/// The interference from the together points (`None` without them): the
/// least-squares slope through the origin, relative to each point's seconds, of
/// its seconds less what `m` prices it at without interference against what an
/// interference of 1 adds to that price (its owners' seconds times the law's
/// variable, [`CostModel::interference_x`]); at least 0. Points where that
/// addition is under [`IDENTIFIES`] of the price are left out. Where the point has a
/// partner (one table a rank, otherwise the same, timed in the same rounds), both
/// prices are first scaled by the partner's measured over modelled seconds: the
/// interference is then what the tables together cost beyond one table each as
/// measured in the same minutes, and a slow or fast minute of a shared machine,
/// which moves both points, does not move it. The slope is fitted per output mode,
/// over the mode's points: `(pooled, Some(rows))` when both modes' points identify
/// one, else `(the one fitted, None)`, which prices both modes.
fn together_fit(c: &Costs, m: &CostModel) -> Option<(f64, Option<f64>)> {
    let world = c.conditions.ranks.max(1);
    let free = CostModel {
        interference: 0.0,
        interference_rows: None,
        ..m.clone()
    };
    let one = CostModel {
        interference: 1.0,
        interference_rows: None,
        ..m.clone()
    };
    // Per point, relative to its seconds: what is left to explain without
    // interference, and what an interference of 1 adds (the owners' seconds times
    // the law's variable; the asking side is not multiplied). Per mode: [pooled,
    // rows].
    let (mut num, mut den) = ([0.0; 2], [0.0; 2]);
    for q in c.pooled.iter().filter(|q| q.together(world)) {
        let scale = partner_of(c, q, world)
            .map(|a| a.seconds / a.modelled(m, world))
            .filter(|r| r.is_finite() && *r > 0.0)
            .unwrap_or(1.0);
        let base = q.modelled(&free, world) * scale;
        let a = (q.modelled(&one, world) * scale - base) / q.seconds;
        if a < IDENTIFIES {
            continue;
        }
        let y = (q.seconds - base) / q.seconds;
        let k = usize::from(q.mode == "rows");
        num[k] += a * y;
        den[k] += a * a;
    }
    let beta = |k: usize| (den[k] > 0.0).then(|| (num[k] / den[k]).max(0.0));
    match (beta(0), beta(1)) {
        (Some(p), Some(r)) => Some((p, Some(r))),
        (Some(b), None) | (None, Some(b)) => Some((b, None)),
        (None, None) => None,
    }
}
