//! Hyper-parameter search for iALS (`torusrec tune`): `reg` x `unobserved_weight` scored
//! by Recall@20 on a validation split carved from the training rows.
//!
//! **Validation split.** Among the training rows that have arcs (test rows are empty in
//! `/train`, so they are never candidates), the `floor(r * fraction)` rows with the
//! smallest `(hash3(val_seed, VAL_ROWS, row), row)` are validation rows — the test
//! split's rule (`data::prepare::global_select_rows_by`) with its own stream and count.
//! A validation row's arcs are shuffled by `(val_seed, VAL_HOLDOUT_SHUFFLE, row)` and
//! `max(1, floor(n/4))` are held out; the rest are its visible (fold-in) arcs, exactly as
//! for a test row. During the search a validation row is what a test row is during
//! `als`: empty in training (its arcs leave both `/train` and `/train_t`), folded in
//! from its visible arcs at evaluation, scored against its held-out arcs. The choice
//! depends only on the dataset, the fraction and the seed, so it is the same at any
//! rank count; the test rows are not read by the search at all (the derived shards hold
//! the validation rows where the test rows were).
//!
//! **Why in memory.** The derived split is built from each rank's loaded shards: the
//! row side drops the validation rows' arcs locally, the column side drops them after
//! one all-gather of the validation row ids (4 bytes per validation row), and the
//! validation fold-in/holdout CSRs take the test set's place in [`Shards`]. No second
//! dataset is written, so there is no temporary file to clean up after a crash or a
//! preemption, no extra disk traffic, and nothing to keep consistent with the source
//! file; the cost is one extra copy of the CSRs in memory (the full shards are dropped
//! before the search trains).
//!
//! **Search.** Every point trains from the same initial tables (from `--seed`) for its
//! epochs and is scored once on the validation rows. `grid` gives every point
//! `min(budget / points, max_epochs)` epochs. `halving` (successive halving) runs rungs:
//! rung 0 trains every point, each later rung keeps the best `floor(n / eta)` of the
//! previous rung (while at least two are left) and trains them `eta` times longer; the
//! last rung trains `top` epochs and rung k `max(1, top / eta^(last - k))`, where `top`
//! is `max_epochs` or, when the budget is smaller than that schedule needs, the largest
//! that fits (a rung that would train no longer than the one before is dropped). A survivor is retrained
//! from the initial tables (its tables are not kept between rungs, so the memory stays
//! that of one model); the budget counts every epoch run. The best point is the
//! arg-max of validation Recall@20 (then Recall@50, then the earlier point) over the
//! last rung.
//!
//! `refine` (the default) searches in (log10 reg, log10 weight) inside the grid's box
//! (from its smallest to its largest value on each axis), every point for `max_epochs`,
//! `budget / max_epochs` trainings in all ([`Refiner`]). It first trains the centres of
//! the grid's cells (in log space: the geometric mean of each pair of neighbouring
//! values; an axis with one value keeps it), a 2 x 2 design for the default 3 x 3 grid,
//! so that most of the budget is left for the search; then it runs an opportunistic
//! compass search: it polls the best point so far at plus and minus one step on each
//! axis (the first step half the grid's spacing, so a centre's poll reaches the grid's
//! points around it; after a move the direction that succeeded is tried first again,
//! the rest of the poll ordered by the score of the nearest point already trained, best
//! first; points outside the box or trained already are skipped), moves to the first
//! poll point that beats every earlier point and polls again from there at the same
//! step, and halves the steps when a whole poll finds nothing better. Every point trains
//! the same epochs, so the best is the arg-max over all of them. Recall surfaces of iALS
//! are steep in the unobserved weight (a decade apart, the best of a grid depends on
//! where the grid happens to fall), which is why the search spends its trainings on
//! steps rather than on the edges and corners of a wide box, where the optimum seldom
//! is (a poll still reaches them).
//!
//! A preemption signal, between or inside points, stops every rank with
//! [`Error::Interrupted`] (exit 1, not 75: a tune writes no checkpoint, so there is
//! nothing to resume and a rerun starts over).
//!
//! Files: this one parses the values and builds the grid; `schedule.rs` plans the
//! `grid` and `halving` strategies' epochs, `refine.rs` is the `refine` search
//! ([`Refiner`]), `validation.rs` carves the validation split from the loaded shards
//! ([`global_validation_shards`]) and `search.rs` trains and scores the points
//! ([`global_search`], [`global_refine`]).
//!
//! [`Shards`]: super::shard::read::Shards
//! [`Error::Interrupted`]: crate::error::Error::Interrupted

use serde::{Deserialize, Serialize};

mod refine;
mod schedule;
mod search;
mod validation;

#[cfg(test)]
use refine::{cell_centres, coords};
pub use refine::{refine_design, Refiner, MIN_STEP_DECADES};
pub use schedule::{refine_trainings, schedule, total_epochs, Rung, Strategy};
pub use search::{arg_best, global_refine, global_search, PointResult, SearchReport};
pub use validation::{global_validation_shards, ValSpec, ValStats};

/// One setting of the search.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub reg: f32,
    pub unobserved_weight: f32,
}

/// Parse `--reg` / `--unobserved-weight`: one value, a comma-separated list, or
/// `LO:HI:N` (N log-spaced points from LO to HI, both included). Values must be finite
/// and >= 0 (ranges > 0); duplicates are dropped, the order kept.
pub fn parse_values(s: &str) -> std::result::Result<Vec<f32>, String> {
    let q = crate::error::quote(s);
    let num = |t: &str| -> std::result::Result<f64, String> {
        let v: f64 = t
            .trim()
            .parse()
            .map_err(|_| format!("{q}: `{}` is not a number", t.trim()))?;
        if !v.is_finite() || v < 0.0 {
            return Err(format!("{q}: {v} must be a finite number >= 0"));
        }
        Ok(v)
    };
    let mut out: Vec<f32> = Vec::new();
    if s.contains(':') {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 3 {
            return Err(format!("{q}: a range is LO:HI:N, e.g. 1e-5:1e-2:4"));
        }
        let (lo, hi) = (num(parts[0])?, num(parts[1])?);
        let n: usize = parts[2]
            .trim()
            .parse()
            .map_err(|_| format!("{q}: N must be a point count"))?;
        if n == 0 {
            return Err(format!("{q}: N = 0 makes an empty grid"));
        }
        if lo <= 0.0 || hi < lo {
            return Err(format!("{q}: a log range needs 0 < LO <= HI"));
        }
        if n > 1000 {
            return Err(format!("{q}: at most 1000 points per axis"));
        }
        for i in 0..n {
            let v = if i == 0 {
                lo
            } else if i == n - 1 {
                hi
            } else {
                let t = i as f64 / (n - 1) as f64;
                10f64.powf(lo.log10() + t * (hi.log10() - lo.log10()))
            };
            out.push(v as f32);
        }
    } else {
        for t in s.split(',') {
            if t.trim().is_empty() {
                continue;
            }
            out.push(num(t)? as f32);
        }
    }
    let mut seen: Vec<f32> = Vec::new();
    out.retain(|v| {
        let new = !seen.contains(v);
        seen.push(*v);
        new
    });
    if out.is_empty() {
        return Err(format!("{q}: an empty list of values"));
    }
    Ok(out)
}

/// One axis of the grid as given on the command line (see [`parse_values`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Values(pub Vec<f32>);

impl std::str::FromStr for Values {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        parse_values(s).map(Values)
    }
}

/// The grid: every (reg, weight) pair, reg major.
pub fn grid_points(regs: &[f32], weights: &[f32]) -> Vec<Point> {
    regs.iter()
        .flat_map(|&reg| {
            weights.iter().map(move |&w| Point {
                reg,
                unobserved_weight: w,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::als::eval::Recall;

    #[test]
    fn values_lists_and_log_ranges() {
        assert_eq!(parse_values("0.1").unwrap(), vec![0.1]);
        assert_eq!(parse_values("1e-3, 1e-2,1e-3").unwrap(), vec![1e-3, 1e-2]);
        assert_eq!(
            parse_values("1e-5:1e-2:4").unwrap(),
            vec![1e-5, 1e-4, 1e-3, 1e-2]
        );
        assert_eq!(parse_values("2:2:1").unwrap(), vec![2.0]);
        for bad in [
            "",
            ",",
            "-1",
            "1e-3:1e-2:0",
            "0:1:3",
            "1:0.1:3",
            "a",
            "1:2",
            "nan",
        ] {
            assert!(parse_values(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn grid_schedule_divides_the_budget() {
        let r = schedule(Strategy::Grid, 12, Some(100), 16, 3).unwrap();
        assert_eq!(
            r,
            vec![Rung {
                points: 12,
                epochs: 8
            }]
        );
        let r = schedule(Strategy::Grid, 12, Some(1000), 16, 3).unwrap();
        assert_eq!(r[0].epochs, 16);
        assert_eq!(
            schedule(Strategy::Grid, 12, None, 16, 3).unwrap()[0].epochs,
            16
        );
        assert!(schedule(Strategy::Grid, 12, Some(11), 16, 3).is_err());
        assert!(schedule(Strategy::Grid, 0, Some(11), 16, 3).is_err());
    }

    #[test]
    fn halving_rungs_respect_the_budget() {
        for points in 1..40 {
            for eta in 2..5 {
                for max in [1, 2, 5, 8, 16] {
                    let full = schedule(Strategy::Halving, points, None, max, eta).unwrap();
                    assert_eq!(full[full.len() - 1].epochs, max);
                    for budget in [points, 2 * points, 5 * points, 20 * points] {
                        let Ok(r) = schedule(Strategy::Halving, points, Some(budget), max, eta)
                        else {
                            // Refused only when one epoch per point does not fit.
                            assert!(
                                budget
                                    < total_epochs(
                                        &schedule(Strategy::Halving, points, None, 1, eta).unwrap()
                                    )
                            );
                            continue;
                        };
                        assert!(total_epochs(&r) <= budget);
                        assert_eq!(r[0].points, points);
                        for w in r.windows(2) {
                            assert!(w[1].points <= w[0].points / eta);
                            assert!(w[1].points >= 2);
                            assert!(w[1].epochs > w[0].epochs);
                        }
                        assert!(r[r.len() - 1].epochs <= max);
                        // The whole schedule is used when the budget allows it.
                        if total_epochs(&full) <= budget {
                            assert_eq!(r, full);
                        }
                    }
                }
            }
        }
        let r = |p, b, m, eta| schedule(Strategy::Halving, p, b, m, eta).unwrap();
        let sizes = |v: Vec<Rung>| v.iter().map(|r| (r.points, r.epochs)).collect::<Vec<_>>();
        assert_eq!(sizes(r(12, Some(96), 8, 3)), vec![(12, 2), (4, 8)]);
        assert_eq!(sizes(r(12, Some(48), 8, 3)), vec![(12, 2), (4, 6)]);
        assert_eq!(sizes(r(12, None, 8, 3)), vec![(12, 2), (4, 8)]);
        assert_eq!(sizes(r(8, Some(30), 4, 2)), vec![(8, 1), (4, 2), (2, 4)]);
        assert_eq!(sizes(r(12, Some(12), 8, 3)), vec![(12, 1)]);
        assert!(schedule(Strategy::Halving, 12, Some(11), 8, 3).is_err());
        assert!(schedule(Strategy::Halving, 12, Some(96), 8, 1).is_err());
    }

    #[test]
    fn best_is_the_arg_max_with_ties_to_the_earlier_point() {
        let mk = |index, at20, at50| PointResult {
            index,
            rung: 0,
            point: Point {
                reg: 0.0,
                unobserved_weight: 1.0,
            },
            epochs: 1,
            recall: Recall {
                at20,
                at50,
                test_rows: 1,
            },
            loss: 0.0,
            seconds: 0.0,
        };
        let v = vec![
            mk(0, 0.5, 0.5),
            mk(1, 0.7, 0.1),
            mk(2, 0.7, 0.2),
            mk(3, 0.7, 0.2),
        ];
        assert_eq!(arg_best(&v), Some(2));
        assert_eq!(arg_best(&[]), None);
    }

    /// Drive a refiner with `score` until it stops; the points in proposal order.
    fn drive(rf: &mut Refiner, score: impl Fn(Point) -> f64) -> Vec<(Point, Recall)> {
        let mut out = Vec::new();
        while let Some(p) = rf.propose() {
            let s = score(p);
            let r = Recall {
                at20: s,
                at50: s / 2.0,
                test_rows: 1,
            };
            rf.record(p, r);
            out.push((p, r));
        }
        out
    }

    #[test]
    fn refine_design_is_the_centres_of_the_grid_cells() {
        let c = |v: &[f32]| cell_centres(v);
        let close = |a: &[f32], b: &[f64]| {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| ((*x as f64) / y - 1.0).abs() < 1e-5)
        };
        assert!(close(
            &c(&parse_values("1e-8:1e-2:3").unwrap()),
            &[10f64.powf(-6.5), 10f64.powf(-3.5)]
        ));
        assert!(close(
            &c(&parse_values("1e-5:1:3").unwrap()),
            &[10f64.powf(-3.75), 10f64.powf(-1.25)]
        ));
        // Unsorted lists and duplicates: the cells between sorted neighbours.
        assert!(close(&c(&[1e-1, 1e-3, 1e-1]), &[1e-2]));
        assert!(close(&c(&[4.0, 1.0, 16.0]), &[2.0, 8.0]));
        assert_eq!(c(&[0.5]), vec![0.5]);
        let d = refine_design(&[1e-8, 1e-5, 1e-2], &[1e-5, 3.1622776e-3, 1.0]);
        assert_eq!(d.len(), 4);
        assert_eq!(d[0].reg, d[1].reg, "reg major");
        let rf = Refiner::new(&[1e-8, 1e-5, 1e-2], &[1e-5, 3.1622776e-3, 1.0], 4).unwrap();
        assert_eq!(rf.design(), d.as_slice());
        assert!(d.iter().all(|&p| rf.inside(p)));
    }

    /// A smooth peak at (log10 reg, log10 weight) = `at`, `steep` times steeper in weight.
    fn peak(at: [f64; 2], steep: f64) -> impl Fn(Point) -> f64 {
        move |p: Point| {
            let x = coords(p);
            1.0 - 0.02 * (x[0] - at[0]).powi(2) - 0.02 * steep * (x[1] - at[1]).powi(2)
        }
    }

    #[test]
    fn refine_trains_the_design_then_climbs_inside_the_box() {
        let regs = parse_values("1e-6:1e-2:3").unwrap();
        let weights = parse_values("1e-5:1e-2:3").unwrap();
        // A peak at reg 3e-5, weight 2e-4 (between the design's points), steep in weight.
        let f = peak([3e-5f64.log10(), 2e-4f64.log10()], 10.0);
        let mut rf = Refiner::new(&regs, &weights, 12).unwrap();
        let design = rf.design().to_vec();
        let got = drive(&mut rf, &f);
        assert_eq!(got.len(), 12, "one training per budgeted point");
        let ps: Vec<Point> = got.iter().map(|g| g.0).collect();
        assert_eq!(
            &ps[..4],
            design.as_slice(),
            "the design comes first, in order"
        );
        for (i, p) in ps.iter().enumerate() {
            assert!(rf.inside(*p), "{p:?} outside the box");
            assert!(!ps[..i].contains(p), "{p:?} trained twice");
        }
        let best_design = design.iter().map(|&p| f(p)).fold(f64::MIN, f64::max);
        let best = got.iter().map(|g| g.1.at20).fold(f64::MIN, f64::max);
        assert!(
            best > best_design,
            "the search found nothing better: {got:?}"
        );
        // The same scores propose the same points.
        let again = drive(&mut Refiner::new(&regs, &weights, 12).unwrap(), &f);
        assert_eq!(again, got);
        // A peak on the box's corner: the search reaches it, stays inside and stops
        // shrinking at MIN_STEP_DECADES, so a long budget can end early.
        let corner = |p: Point| -(p.reg as f64) - (p.unobserved_weight as f64);
        let mut rf = Refiner::new(&regs, &weights, 1000).unwrap();
        let got = drive(&mut rf, corner);
        assert!(got.len() < 1000 && got.len() > 4);
        assert!(got.iter().all(|g| rf.inside(g.0)));
        assert!(got
            .iter()
            .any(|g| g.0.reg == regs[0] && g.0.unobserved_weight == weights[0]));
    }

    #[test]
    fn refine_at_12_trainings_ends_above_the_3x3_grid_on_peaks_off_the_grid() {
        // The default box; peaks spread over it, none on a point of its 3 x 3 grid.
        let regs = parse_values("1e-8:1e-2:3").unwrap();
        let weights = parse_values("1e-5:1:3").unwrap();
        let grid = grid_points(&regs, &weights);
        let mut wins = 0;
        let mut cases = 0;
        for &x in &[-7.3, -5.7, -4.2, -2.9] {
            for &y in &[-4.4, -3.7, -2.0, -0.5] {
                for steep in [1.0, 10.0] {
                    let f = peak([x, y], steep);
                    let got = drive(&mut Refiner::new(&regs, &weights, 12).unwrap(), &f);
                    let best = got.iter().map(|g| g.1.at20).fold(f64::MIN, f64::max);
                    let grid_best = grid.iter().map(|&p| f(p)).fold(f64::MIN, f64::max);
                    cases += 1;
                    wins += usize::from(best > grid_best);
                }
            }
        }
        // 12 trainings from the 2 x 2 centres end above the best of the 9-point grid on
        // at least 90% of these peaks (the grid's points are not tried unless a poll
        // reaches them).
        assert!(wins * 10 >= cases * 9, "{wins} of {cases}");
    }

    #[test]
    fn refine_along_one_axis_and_refusals() {
        let regs = [1e-3f32];
        let weights = parse_values("1e-4:1:5").unwrap();
        let mut rf = Refiner::new(&regs, &weights, 9).unwrap();
        let got = drive(&mut rf, |p| {
            -((p.unobserved_weight as f64).log10() + 1.7).abs()
        });
        assert_eq!(got.len(), 9);
        assert!(got.iter().all(|g| g.0.reg == 1e-3));
        let best = got
            .iter()
            .max_by(|a, b| a.1.at20.partial_cmp(&b.1.at20).unwrap())
            .unwrap();
        assert!(((best.0.unobserved_weight as f64).log10() + 1.7).abs() < 0.3);
        assert!(
            Refiner::new(&[1e-3], &[1e-2], 4).is_err(),
            "nothing to refine"
        );
        assert!(
            Refiner::new(&[0.0, 1e-3], &[1e-2], 4).is_err(),
            "0 has no log"
        );
        assert!(
            Refiner::new(&[1e-3, 1e-2, 1e-1], &[1e-2, 1e-1], 1).is_err(),
            "budget under the design"
        );
        assert_eq!(refine_trainings(6, None, 8).unwrap(), 18);
        assert_eq!(refine_trainings(6, Some(100), 8).unwrap(), 12);
        assert!(refine_trainings(6, Some(47), 8).is_err());
        let r = schedule(Strategy::Refine, 6, Some(96), 8, 3).unwrap();
        assert_eq!(
            r,
            vec![Rung {
                points: 12,
                epochs: 8
            }]
        );
    }
}
