//! The epochs of the `grid` and `halving` strategies, and the trainings of `refine`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Strategy {
    /// Every point for budget / points epochs.
    Grid,
    /// Successive halving over epochs: keep the best 1/eta per rung.
    Halving,
    /// The grid, then a compass search in log space around the best point so far.
    Refine,
}

/// One rung of a schedule: how many points train, for how many epochs each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rung {
    pub points: usize,
    pub epochs: usize,
}

/// Epochs the schedule runs in all.
pub fn total_epochs(rungs: &[Rung]) -> usize {
    rungs.iter().map(|r| r.points * r.epochs).sum()
}

/// The rungs of a search over `points` settings within `budget` epochs (`None`: as
/// many as the schedule needs to reach `max_epochs`), each point training at most
/// `max_epochs` (see the module doc). Pure; refuses (exit 2) a budget too small for one
/// epoch per point.
pub fn schedule(
    strategy: Strategy,
    points: usize,
    budget: Option<usize>,
    max_epochs: usize,
    eta: usize,
) -> Result<Vec<Rung>> {
    if points == 0 {
        return Err(Error::Config("an empty grid: nothing to search".into()));
    }
    if max_epochs == 0 {
        return Err(Error::Config("--epochs 0: train at least one epoch".into()));
    }
    let too_small = |need: usize, b: usize| {
        Error::Config(format!(
            "--budget {b}: too small; {strategy:?} over {points} points needs at least {need} epochs (one per point)"
        ))
    };
    match strategy {
        Strategy::Refine => {
            let t = refine_trainings(points, budget, max_epochs)?;
            Ok(vec![Rung {
                points: t,
                epochs: max_epochs,
            }])
        }
        Strategy::Grid => {
            let b = budget.unwrap_or(points.saturating_mul(max_epochs));
            let e = (b / points).min(max_epochs);
            if e == 0 {
                return Err(too_small(points, b));
            }
            Ok(vec![Rung { points, epochs: e }])
        }
        Strategy::Halving => {
            if eta < 2 {
                return Err(Error::Config(format!("--eta {eta}: must be at least 2")));
            }
            // Rung sizes: n, n/eta, ... while at least two points are left to compare.
            let mut sizes = vec![points];
            while sizes[sizes.len() - 1] / eta >= 2 {
                sizes.push(sizes[sizes.len() - 1] / eta);
            }
            let last = sizes.len() - 1;
            // The last rung trains `top` epochs, rung k top / eta^(last - k) (at least
            // one); a rung that would train no longer than the one before is dropped.
            let build = |top: usize| -> Vec<Rung> {
                let mut rungs: Vec<Rung> = Vec::new();
                for (k, &n) in sizes.iter().enumerate() {
                    let div = (eta as u128).saturating_pow((last - k) as u32);
                    let e = ((top as u128 / div) as usize).max(1);
                    if rungs.last().is_some_and(|r| r.epochs >= e) {
                        continue;
                    }
                    rungs.push(Rung {
                        points: n,
                        epochs: e,
                    });
                }
                rungs
            };
            let Some(b) = budget else {
                return Ok(build(max_epochs));
            };
            (1..=max_epochs)
                .rev()
                .map(build)
                .find(|r| total_epochs(r) <= b)
                .ok_or_else(|| too_small(total_epochs(&build(1)), b))
        }
    }
}

/// Trainings of a refine search whose first design ([`refine_design`]) has `points`:
/// `budget / max_epochs` (every training runs `max_epochs`), by default three times the
/// design (12 for the default 2 x 2); refused (exit 2) when the budget does not cover
/// the design.
///
/// [`refine_design`]: super::refine::refine_design
pub fn refine_trainings(points: usize, budget: Option<usize>, max_epochs: usize) -> Result<usize> {
    let t = match budget {
        None => points.saturating_mul(3),
        Some(b) => b / max_epochs,
    };
    if t < points {
        return Err(Error::Config(format!(
            "--budget {}: too small; refine trains the {points} centres of the grid's cells first, {max_epochs} epochs each, so it needs at least {} epochs",
            budget.unwrap_or(0),
            points.saturating_mul(max_epochs)
        )));
    }
    Ok(t)
}
