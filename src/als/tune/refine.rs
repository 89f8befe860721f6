//! The `refine` search in (log10 reg, log10 weight): the grid cells' centres, then
//! an opportunistic compass search (the module doc of `tune`).

use super::{grid_points, Point};
use crate::als::eval::Recall;
use crate::error::{Error, Result};

/// Steps below this (in decades) are not refined further.
pub const MIN_STEP_DECADES: f64 = 1e-3;

/// The centres of the cells between neighbouring values of one axis, in log space (the
/// geometric means, increasing); one value: itself. Values must be > 0.
pub(super) fn cell_centres(v: &[f32]) -> Vec<f32> {
    let mut s: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    s.dedup();
    if s.len() == 1 {
        return vec![s[0] as f32];
    }
    s.windows(2).map(|w| (w[0] * w[1]).sqrt() as f32).collect()
}

/// The points a refine search trains first: the centres of the grid's cells (module
/// doc), reg major. Values must be > 0.
pub fn refine_design(regs: &[f32], weights: &[f32]) -> Vec<Point> {
    grid_points(&cell_centres(regs), &cell_centres(weights))
}

/// The refine strategy's proposals (module doc): the centres of the grid's cells first,
/// then an opportunistic compass search in (log10 reg, log10 weight) inside the grid's
/// box. Pure and deterministic: the same scores give the same points.
#[derive(Debug, Clone)]
pub struct Refiner {
    design: Vec<Point>,
    trainings: usize,
    /// The box, in the values themselves (f32) and in decades.
    lo: [f32; 2],
    hi: [f32; 2],
    /// The grid's spacing per axis in decades (0: one value, the axis is not searched).
    spacing: [f64; 2],
    step: [f64; 2],
    tried: Vec<(Point, Recall)>,
    queue: Vec<Point>,
    /// A poll is under way (its points are queued or were tried without improving).
    polling: bool,
    /// The axis and sign of the last move (tried first in the next poll).
    last_move: Option<(usize, f64)>,
}

pub(super) fn coords(p: Point) -> [f64; 2] {
    [(p.reg as f64).log10(), (p.unobserved_weight as f64).log10()]
}

fn better(a: &Recall, b: &Recall) -> bool {
    (a.at20, a.at50) > (b.at20, b.at50)
}

impl Refiner {
    /// Refine around the grid `regs` x `weights` (reg major) with `trainings` in all.
    pub fn new(regs: &[f32], weights: &[f32], trainings: usize) -> Result<Self> {
        let axes = [regs, weights];
        let mut lo = [0f32; 2];
        let mut hi = [0f32; 2];
        let mut spacing = [0f64; 2];
        for (k, v) in axes.iter().enumerate() {
            if v.iter().any(|&x| x <= 0.0) {
                return Err(Error::Config(format!(
                    "--strategy refine searches in log space: every {} value must be > 0",
                    ["--reg", "--unobserved-weight"][k]
                )));
            }
            lo[k] = v.iter().copied().fold(f32::INFINITY, f32::min);
            hi[k] = v.iter().copied().fold(0.0, f32::max);
            if v.len() > 1 {
                spacing[k] =
                    ((hi[k] as f64).log10() - (lo[k] as f64).log10()) / (v.len() - 1) as f64;
            }
        }
        if spacing == [0.0, 0.0] {
            return Err(Error::Config(
                "--strategy refine needs at least two values of --reg or --unobserved-weight (the box it refines in)".into(),
            ));
        }
        let design = refine_design(regs, weights);
        if trainings < design.len() {
            return Err(Error::Config(format!(
                "refine: {trainings} trainings do not cover the {} centres of the grid's cells",
                design.len()
            )));
        }
        Ok(Refiner {
            design,
            trainings,
            lo,
            hi,
            spacing,
            step: [spacing[0] / 2.0, spacing[1] / 2.0],
            tried: Vec::new(),
            queue: Vec::new(),
            polling: false,
            last_move: None,
        })
    }

    /// The first design: the centres of the grid's cells, reg major.
    pub fn design(&self) -> &[Point] {
        &self.design
    }

    /// Whether `p` lies in the box.
    pub fn inside(&self, p: Point) -> bool {
        (self.lo[0]..=self.hi[0]).contains(&p.reg)
            && (self.lo[1]..=self.hi[1]).contains(&p.unobserved_weight)
    }

    fn best(&self) -> Option<usize> {
        let mut b: Option<usize> = None;
        for (i, (_, r)) in self.tried.iter().enumerate() {
            if b.is_none_or(|j| better(r, &self.tried[j].1)) {
                b = Some(i);
            }
        }
        b
    }

    fn known(&self, p: Point) -> bool {
        self.tried.iter().any(|(q, _)| *q == p) || self.queue.contains(&p)
    }

    /// The score expected at `c`: that of the nearest tried point other than `center`
    /// (distance in grid spacings), for the order of a poll.
    fn predicted(&self, c: [f64; 2], center: usize) -> (f64, f64) {
        let mut best: Option<(f64, usize)> = None;
        for (i, (q, _)) in self.tried.iter().enumerate() {
            if i == center {
                continue;
            }
            let x = coords(*q);
            let d: f64 = (0..2)
                .filter(|&k| self.spacing[k] > 0.0)
                .map(|k| ((x[k] - c[k]) / self.spacing[k]).powi(2))
                .sum();
            if best.is_none_or(|(bd, _)| d < bd) {
                best = Some((d, i));
            }
        }
        best.map_or((f64::NEG_INFINITY, f64::NEG_INFINITY), |(_, i)| {
            let r = &self.tried[i].1;
            (r.at20, r.at50)
        })
    }

    /// The next point to train, or `None` when the trainings are spent (or every step
    /// has shrunk below [`MIN_STEP_DECADES`]).
    pub fn propose(&mut self) -> Option<Point> {
        let n = self.tried.len();
        if n >= self.trainings {
            return None;
        }
        if n < self.design.len() {
            return Some(self.design[n]);
        }
        loop {
            if !self.queue.is_empty() {
                return Some(self.queue.remove(0));
            }
            if self.polling {
                // The last poll found nothing better: look closer.
                self.step = [self.step[0] / 2.0, self.step[1] / 2.0];
            }
            if (0..2).all(|k| self.spacing[k] == 0.0 || self.step[k] < MIN_STEP_DECADES) {
                return None;
            }
            self.polling = true;
            let center = self.best().expect("the grid was tried");
            let c = coords(self.tried[center].0);
            let mut cands: Vec<(Point, (bool, f64, f64))> = Vec::new();
            for k in 0..2 {
                if self.spacing[k] == 0.0 {
                    continue;
                }
                for sign in [1.0, -1.0] {
                    let mut x = c;
                    x[k] += sign * self.step[k];
                    let mut p = self.tried[center].0;
                    let v = 10f64.powf(x[k]) as f32;
                    if k == 0 {
                        p.reg = v;
                    } else {
                        p.unobserved_weight = v;
                    }
                    if self.inside(p) && !self.known(p) && !cands.iter().any(|(q, _)| *q == p) {
                        let (s20, s50) = self.predicted(x, center);
                        cands.push((p, (self.last_move == Some((k, sign)), s20, s50)));
                    }
                }
            }
            // The last move's direction, then the most promising; ties keep the order
            // reg up, reg down, weight up, weight down.
            cands.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
            self.queue = cands.into_iter().map(|(p, _)| p).collect();
        }
    }

    /// Record what `p` (the last proposal) scored. A refinement point that beats every
    /// earlier one becomes the centre of the next poll, at the same step, and the
    /// direction it moved in is tried first there.
    pub fn record(&mut self, p: Point, r: Recall) {
        let was = self.best();
        self.tried.push((p, r));
        if self.tried.len() > self.design.len() {
            if let Some(b) = was.filter(|&b| better(&r, &self.tried[b].1)) {
                let (from, to) = (coords(self.tried[b].0), coords(p));
                self.last_move = (0..2)
                    .find(|&k| from[k] != to[k])
                    .map(|k| (k, if to[k] > from[k] { 1.0 } else { -1.0 }));
                self.queue.clear();
                self.polling = false;
            }
        }
    }
}
