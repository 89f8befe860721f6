//! Fitting the copying model ([`super::webgraph_copy`]) to a real graph from its
//! statistics ([`super::stats`]), never from a training result.
//!
//! Two kinds of parameters:
//!
//! * **read off** the graph: the fraction of pages without links, the out-degree
//!   quantile function (knots at the [`KNOT_SURVIVALS`] levels of the positive
//!   out-degrees, in units of their mean), its tail beyond the last knot (the
//!   out-degree tail exponent less one) and its cap (the largest degree over the
//!   mean);
//! * **matched by simulation**: the rest, as [`SIMULATED`] unconstrained coordinates
//!   (log ratios of the template, local, mutual and global shares to the copy share;
//!   logits of `degree_corr`, `up_link`, `hidden`, `copy_sibling`; logarithms of
//!   `dir_mean`, `host_mean`, `host_sigma`, `host_zipf`, `template_pages`,
//!   `local_gap`, `global_zipf`, `parent_zipf`, `host_max`; logits of `parent_back`,
//!   `clone`, `global_pages` and `zero_hidden`; `host_max` starts at the smallest power of two past the gaps of
//!   99 % of the arcs). The model is generated at the graph's size with a fixed seed and
//!   these [`MATCHED`] statistics measured (the in-degree quantiles interpolated
//!   within their atom, [`smooth_quantile`], so that they move continuously):
//!
//!   | statistic | parameters that move it most |
//!   |---|---|
//!   | arcs with gap < 2^4 | local share, `local_gap`, mutual share |
//!   | arcs with gap < 2^8 | `dir_mean`, `local_gap` |
//!   | arcs with gap >= 2^12 | `host_mean` |
//!   | arcs with gap >= 2^16 (weight 0.3) | global share |
//!   | adjacent Jaccard | `degree_corr`, copy and template shares |
//!   | reciprocity | `up_link`, mutual share |
//!   | top-1 % in-link share | template share |
//!   | in-degree 99.9 % quantile | `host_sigma` |
//!   | in-degree 90 % quantile | `host_zipf` |
//!   | in-degree 99 % quantile | `template_pages` |
//!   | fraction of nodes with in-degree <= 1 | `hidden` |
//!   | in-degree tail exponent | `copy_sibling`, `host_zipf` |
//!   | far-target share (weight 0.5) | `global_zipf` |
//!   | arcs with gap < 2^2, < 2^6 | `local_gap`, mutual share, `parent_zipf` |
//!   | arcs with gap >= 2^10, >= 2^13, >= 2^14 | `host_mean`, `host_max`, `parent_back` |
//!   | fraction of nodes without in-links (plus 0.01) | `hidden` |
//!   | in-degree median | `clone`, `hidden` |
//!   | sink in-link share | `zero_hidden` |
//!   | far-source share | `global_pages` |
//!
//!   The fit minimizes the (weighted) sum of squared log ratios of measured to
//!   target statistics: a forward-difference Jacobian of the log statistics (one
//!   simulation per coordinate, a step of [`PROBE`]), then Levenberg-Marquardt steps
//!   from the best point so far (each coordinate moving at most [`MAX_MOVE`]; the
//!   damping shrinks after a step that lowers the loss and grows after one that
//!   does not), the Jacobian corrected by Broyden's rank-one update after every
//!   simulation, and differenced afresh at the best point when the damping has
//!   grown past [`RESTART_LAMBDA`] (the updates no longer point downhill; the k-th
//!   time with a step of `PROBE / (1 + k)`, backwards for odd k). It returns the parameters of the smallest loss seen in [`ROUNDS`]
//!   simulations.
//!
//! Everything here is pure computation over in-memory graphs (the caller reads G).

use super::rows::LocalRows;
use super::stats::{profile_of_rows, GraphProfile, GraphStats, Histogram};
use super::webgraph_copy::{CopyModel, CopyingParams, PARAMS_VERSION};

/// Rounds of the simulation fit.
pub const ROUNDS: usize = 160;
/// Survival levels of the out-degree knots: every 5 % in the body, then finer.
pub const KNOT_SURVIVALS: [f64; 40] = [
    1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2,
    0.15, 0.1, 0.075, 0.05, 0.04, 0.03, 0.02, 0.015, 0.01, 0.007, 0.005, 0.003, 0.002, 0.0015,
    0.001, 7e-4, 5e-4, 3e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5,
];
/// The seed of the fit's simulations (the fit does not depend on the twin's seed).
pub const FIT_SEED: u64 = 0x05ee_df17;
/// Number of matched statistics.
pub const MATCHED: usize = 22;

/// The degree at quantile `q` of `hist`, interpolated within the atom that holds it
/// (`d - 1/2` at the atom's first position to `d + 1/2` at its last): a continuous
/// version of the nearest-rank quantile, which it rounds to.
pub fn smooth_quantile(hist: &Histogram, q: f64) -> f64 {
    let n: u64 = hist.values().sum();
    if n == 0 {
        return 0.0;
    }
    let pos = q * n as f64;
    let mut seen = 0u64;
    for (&d, &c) in hist {
        if (seen + c) as f64 >= pos {
            let t = ((pos - seen as f64) / c as f64).clamp(0.0, 1.0);
            return d as f64 - 0.5 + t;
        }
        seen += c;
    }
    *hist.keys().next_back().expect("non-empty") as f64
}

/// The statistics the simulation matches, in the order of the module doc's table.
pub fn matched(prof: &GraphProfile) -> [f64; MATCHED] {
    let s = &prof.stats;
    let n: u64 = prof.in_hist.values().sum();
    let le1: u64 = prof.in_hist.range(..=1).map(|(_, &c)| c).sum();
    [
        s.gap_below[0],
        s.gap_below[1],
        1.0 - s.gap_below[2],
        1.0 - s.gap_below[3],
        s.adjacent_jaccard,
        s.reciprocity,
        s.top1_in_share,
        smooth_quantile(&prof.in_hist, 0.999).max(0.5),
        smooth_quantile(&prof.in_hist, 0.9).max(0.5),
        smooth_quantile(&prof.in_hist, 0.99).max(0.5),
        le1 as f64 / n.max(1) as f64,
        s.in_degree.tail_exponent,
        s.far_target_share.max(1e-3),
        gap_below(prof, 2),
        gap_below(prof, 6),
        1.0 - gap_below(prof, 10),
        (1.0 - gap_below(prof, 14)).max(1e-4),
        s.in_degree.zero_fraction + 0.01,
        smooth_quantile(&prof.in_hist, 0.5).max(0.5),
        1.0 - gap_below(prof, 13),
        s.far_source_share.max(1e-3),
        s.sink_in_share.max(1e-3),
    ]
}

/// The fraction of arcs with `|v - u| < 2^b`, from the gap histogram.
fn gap_below(prof: &GraphProfile, b: usize) -> f64 {
    let all: u64 = prof.gap_log2.iter().sum();
    let below: u64 = prof.gap_log2[..b].iter().sum();
    below as f64 / all.max(1) as f64
}

/// Names of [`matched`]'s statistics, for logs.
pub const MATCHED_NAMES: [&str; MATCHED] = [
    "gap<2^4",
    "gap<2^8",
    "gap>=2^12",
    "gap>=2^16",
    "adjacent_jaccard",
    "reciprocity",
    "top1_in_share",
    "in_q99.9",
    "in_q90",
    "in_q99",
    "in<=1",
    "in_tail",
    "far_target_share",
    "gap<2^2",
    "gap<2^6",
    "gap>=2^10",
    "gap>=2^14",
    "in_zero+0.01",
    "in_q50",
    "gap>=2^13",
    "far_source_share",
    "sink_in_share",
];

/// The knots and cap of the positive out-degrees of `hist`.
fn out_degree_shape(hist: &Histogram) -> (Vec<[f64; 2]>, f64) {
    let positive: Vec<(u64, u64)> = hist
        .iter()
        .filter(|(&d, _)| d > 0)
        .map(|(&d, &c)| (d, c))
        .collect();
    let n: u64 = positive.iter().map(|x| x.1).sum();
    if n == 0 {
        return (vec![[1.0, 1.0]], 1.0);
    }
    let total: f64 = positive.iter().map(|&(d, c)| d as f64 * c as f64).sum();
    let mean = total / n as f64;
    let at = |pos: u64| {
        let mut seen = 0;
        for &(d, c) in &positive {
            seen += c;
            if seen >= pos {
                return d;
            }
        }
        positive[positive.len() - 1].0
    };
    let mut knots: Vec<[f64; 2]> = Vec::new();
    for &s in &KNOT_SURVIVALS {
        if (s * n as f64) < 1.0 {
            break;
        }
        // The degree at survival s: position ceil((1 - s) n) of the sorted degrees.
        let pos = (((1.0 - s) * n as f64).ceil() as u64).clamp(1, n);
        let d = at(pos) as f64 / mean;
        if let Some(last) = knots.last() {
            if d < last[1] {
                continue;
            }
        }
        knots.push([s, d]);
    }
    let max = positive[positive.len() - 1].0 as f64 / mean;
    (knots, max.max(1.0))
}

/// `x` to 6 significant digits (parameter files stay short and parse back exactly).
fn sig6(x: f64) -> f64 {
    format!("{x:.5e}").parse().unwrap_or(x)
}

/// Every number of `p` to 6 significant digits.
fn tidy(mut p: CopyingParams) -> CopyingParams {
    for k in &mut p.out_knots {
        *k = k.map(sig6);
    }
    for x in [
        &mut p.zero_out,
        &mut p.out_tail,
        &mut p.out_cap,
        &mut p.host_mean,
        &mut p.host_sigma,
        &mut p.host_max,
        &mut p.dir_mean,
        &mut p.degree_corr,
        &mut p.template,
        &mut p.template_pages,
        &mut p.copy,
        &mut p.copy_sibling,
        &mut p.up_link,
        &mut p.local,
        &mut p.local_gap,
        &mut p.host_zipf,
        &mut p.global_zipf,
        &mut p.hidden,
        &mut p.mutual,
        &mut p.parent_back,
        &mut p.parent_zipf,
        &mut p.clone,
        &mut p.global_pages,
        &mut p.zero_hidden,
    ] {
        *x = sig6(*x);
    }
    p
}

/// Starting values of the simulated parameters.
fn initial(target: &GraphStats) -> CopyingParams {
    let far = 1.0 - target.gap_below[3];
    // Shape parameters from an earlier fit to a crawl; the fit moves all of them.
    CopyingParams {
        version: PARAMS_VERSION,
        fitted_to: String::new(),
        zero_out: 0.0,
        out_knots: vec![[1.0, 1.0]],
        out_tail: 1.0,
        out_cap: 1.0,
        host_mean: 2000.0,
        host_sigma: 2.0,
        host_max: 65536.0,
        dir_mean: 10.0,
        degree_corr: 0.95,
        template: 0.3,
        template_pages: 1.3,
        copy: 0.3,
        copy_sibling: 0.3,
        up_link: 0.95,
        local: 0.25,
        local_gap: 16.0,
        host_zipf: 1.3,
        global_zipf: 1.0,
        hidden: 0.9,
        mutual: 0.13,
        parent_back: 0.35,
        parent_zipf: 1.0,
        clone: 0.5,
        global_pages: 0.2,
        zero_hidden: 0.5,
    }
    .with_global(far.clamp(1e-4, 0.5))
}

trait WithGlobal {
    fn with_global(self, g: f64) -> Self;
}

impl WithGlobal for CopyingParams {
    /// Scales template, copy, mutual and local so that the global share is `g`.
    fn with_global(mut self, g: f64) -> Self {
        let rest = self.template + self.copy + self.mutual + self.local;
        let f = (1.0 - g) / rest.max(1e-12);
        self.template *= f;
        self.copy *= f;
        self.mutual *= f;
        self.local *= f;
        self
    }
}

/// The weighted sum of squared log ratios of measured to target statistics.
pub fn loss(target: &[f64; MATCHED], got: &[f64; MATCHED]) -> f64 {
    residual(target, got).iter().map(|r| r * r).sum()
}

/// One simulation: the model's graph at `nodes`/`arcs` and its profile.
pub fn simulate(
    p: &CopyingParams,
    nodes: u64,
    arcs: u64,
    seed: u64,
) -> Result<GraphProfile, String> {
    let m = CopyModel::new(p, nodes, arcs, seed)?;
    let (indptr, targets) = m.generate_rows(0, nodes);
    let rows = LocalRows {
        lo: 0,
        indptr,
        targets,
    };
    Ok(profile_of_rows(&rows, nodes))
}

/// A step of the fit: what it tried and how close it came.
#[derive(Debug, Clone)]
pub struct FitRound {
    pub round: usize,
    pub loss: f64,
    pub stats: [f64; MATCHED],
}

/// Fits the copying model to `target` (the profile of a graph of `target.stats.nodes`
/// nodes and `.arcs` arcs). `progress` sees every round.
pub fn fit(
    target: &GraphProfile,
    name: &str,
    mut progress: impl FnMut(&FitRound),
) -> Result<CopyingParams, String> {
    let t = &target.stats;
    if t.nodes < 2 || t.arcs < 1 {
        return Err(format!(
            "{name}: {} nodes and {} arcs are too few to fit a model to",
            t.nodes, t.arcs
        ));
    }
    let goal = matched(target);
    let mut p = initial(t);
    // Hosts start as long as the gaps of 99 % of the arcs.
    p.host_max = (1..32)
        .find(|&b| gap_below(target, b) >= 0.99)
        .map_or(f64::from(u32::MAX), |b| 2f64.powi(b as i32));
    p.fitted_to = name.to_string();
    p.zero_out = t.out_degree.zero_fraction.min(0.999);
    let (knots, cap) = out_degree_shape(&target.out_hist);
    p.out_knots = knots;
    p.out_cap = cap;
    p.out_tail = (t.out_degree.tail_exponent - 1.0).clamp(0.2, 10.0);
    // A graph needs as many arcs as pages with links.
    let positive = ((1.0 - p.zero_out) * t.nodes as f64).round().max(1.0);
    if (t.arcs as f64) < positive {
        p.zero_out = 1.0 - t.arcs as f64 / t.nodes as f64;
    }
    p.validate()?;
    let mut best: Option<(f64, CopyingParams)> = None;
    let base = p.clone();
    let mut search = Search::new(encode(&p));
    for round in 0..ROUNDS {
        let prof = simulate(&p, t.nodes, t.arcs, FIT_SEED)?;
        let got = matched(&prof);
        let l = loss(&goal, &got);
        progress(&FitRound {
            round,
            loss: l,
            stats: got,
        });
        if best.as_ref().is_none_or(|b| l < b.0) {
            best = Some((l, p.clone()));
        }
        p = decode(&search.next(&goal, &got), &base);
    }
    Ok(tidy(best.expect("at least one round").1))
}

/// Number of simulated parameters (the coordinates of [`encode`]).
pub const SIMULATED: usize = 21;
/// Weights of the matched statistics' log ratios in the loss: the far-link fraction
/// is tiny and noisy, the rest count alike.
const WEIGHTS: [f64; MATCHED] = [
    1.0, 1.0, 1.0, 0.3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0,
    1.0, 1.0, 1.0,
];

fn logit(p: f64) -> f64 {
    let p = p.clamp(1e-4, 1.0 - 1e-4);
    (p / (1.0 - p)).ln()
}

fn logistic(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The simulated parameters as unconstrained coordinates: the shares of template,
/// local and global links as log ratios to the copy share, logits of the
/// probabilities, logarithms of the rest.
fn encode(p: &CopyingParams) -> [f64; SIMULATED] {
    let c = p.copy.max(1e-6);
    let g = (1.0 - p.template - p.copy - p.mutual - p.local).max(1e-6);
    [
        (p.local.max(1e-6) / c).ln(),
        p.dir_mean.ln(),
        p.host_mean.ln(),
        (g / c).ln(),
        logit(p.degree_corr),
        logit(p.up_link),
        (p.template.max(1e-6) / c).ln(),
        p.host_sigma.max(0.01).ln(),
        p.host_zipf.max(0.01).ln(),
        p.template_pages.max(1e-3).ln(),
        logit(p.hidden),
        logit(p.copy_sibling),
        (p.mutual.max(1e-6) / c).ln(),
        p.local_gap.max(0.05).ln(),
        p.global_zipf.max(0.01).ln(),
        logit(p.parent_back),
        p.parent_zipf.max(0.01).ln(),
        logit(p.clone),
        p.host_max.ln(),
        logit(p.global_pages),
        logit(p.zero_hidden),
    ]
}

/// The inverse of [`encode`] on top of `base` (the read-off parameters), clamped to
/// sane ranges.
fn decode(x: &[f64; SIMULATED], base: &CopyingParams) -> CopyingParams {
    let mut q = base.clone();
    let [el, eg, et, em] = [x[0], x[3], x[6], x[12]].map(|a| a.min(30.0).exp());
    let z = 1.0 + el + eg + et + em;
    q.copy = 1.0 / z;
    q.local = el / z;
    q.template = et / z;
    q.mutual = em / z;
    // The global share is what is left (1 - the others), kept non-negative.
    let sum = q.copy + q.local + q.template + q.mutual;
    if sum > 1.0 {
        q.copy /= sum;
        q.local /= sum;
        q.template /= sum;
        q.mutual /= sum;
    }
    q.dir_mean = x[1].exp().clamp(1.0, 1e6);
    q.host_mean = x[2].exp().clamp(1.0, 1e8);
    q.degree_corr = logistic(x[4]);
    q.up_link = logistic(x[5]);
    q.host_sigma = x[7].exp().clamp(0.05, 2.5);
    q.host_zipf = x[8].exp().clamp(0.0, 4.0);
    q.template_pages = x[9].exp().clamp(1e-3, 1e4);
    q.hidden = logistic(x[10]);
    q.copy_sibling = logistic(x[11]);
    q.local_gap = x[13].exp().clamp(0.05, 1e3);
    q.global_zipf = x[14].exp().clamp(0.01, 4.0);
    q.parent_back = logistic(x[15]);
    q.parent_zipf = x[16].exp().clamp(0.01, 4.0);
    q.clone = logistic(x[17]);
    q.host_max = x[18].exp().clamp(1.0, 4e9);
    // An outward page places at most all its links globally.
    let g = (1.0 - q.copy - q.local - q.template - q.mutual).max(0.0);
    q.global_pages = logistic(x[19]).max(g).max(1e-4);
    q.zero_hidden = logistic(x[20]);
    q
}

/// Weighted log ratios `w (ln goal - ln got)`.
fn residual(goal: &[f64; MATCHED], got: &[f64; MATCHED]) -> [f64; MATCHED] {
    let mut r = [0.0; MATCHED];
    for i in 0..MATCHED {
        r[i] = WEIGHTS[i] * (goal[i].max(1e-6).ln() - got[i].max(1e-6).ln());
    }
    r
}

/// Solves `(J^T J + lambda diag(J^T J)) d = J^T r` (Levenberg-Marquardt) by
/// Gaussian elimination with partial pivoting.
#[allow(clippy::needless_range_loop)]
fn lm_step(j: &[[f64; SIMULATED]; MATCHED], r: &[f64; MATCHED], lambda: f64) -> [f64; SIMULATED] {
    const N: usize = SIMULATED;
    let mut a = [[0.0; N + 1]; N];
    for p in 0..N {
        for q in 0..N {
            a[p][q] = (0..MATCHED).map(|i| j[i][p] * j[i][q]).sum();
        }
        a[p][N] = (0..MATCHED).map(|i| j[i][p] * r[i]).sum();
    }
    for (p, row) in a.iter_mut().enumerate() {
        row[p] += lambda * row[p] + 1e-6;
    }
    for c in 0..N {
        let piv = (c..N)
            .max_by(|&x, &y| a[x][c].abs().total_cmp(&a[y][c].abs()))
            .expect("non-empty");
        a.swap(c, piv);
        let d = a[c][c];
        if d.abs() < 1e-300 {
            continue;
        }
        for rr in 0..N {
            if rr != c {
                let f = a[rr][c] / d;
                if f != 0.0 {
                    for cc in c..=N {
                        a[rr][cc] -= f * a[c][cc];
                    }
                }
            }
        }
    }
    let mut d = [0.0; N];
    for p in 0..N {
        d[p] = if a[p][p].abs() < 1e-300 {
            0.0
        } else {
            a[p][N] / a[p][p]
        };
    }
    d
}

/// The fit's search: a forward-difference Jacobian of the log statistics in the
/// coordinates of [`encode`], then Levenberg-Marquardt steps from the best point with
/// Broyden updates of the Jacobian after every simulation.
struct Search {
    x: [f64; SIMULATED],
    best_x: [f64; SIMULATED],
    best_loss: f64,
    best_got: [f64; MATCHED],
    jac: [[f64; SIMULATED]; MATCHED],
    /// The coordinate being differenced (`SIMULATED` when done).
    probe: usize,
    lambda: f64,
    /// Times the Jacobian was differenced afresh (each time with a smaller step of
    /// the other sign, so that a restart at the same point does not retrace the
    /// last one).
    restarts: u32,
}

/// Forward-difference step of the Jacobian.
pub const PROBE: f64 = 0.25;
/// Largest move of one coordinate in a step.
pub const MAX_MOVE: f64 = 1.0;
/// The damping past which the search differences its Jacobian afresh (after five
/// steps in a row that did not lower the loss).
pub const RESTART_LAMBDA: f64 = 100.0;

impl Search {
    fn new(x: [f64; SIMULATED]) -> Self {
        Self {
            x,
            best_x: x,
            best_loss: f64::INFINITY,
            best_got: [0.0; MATCHED],
            jac: [[0.0; SIMULATED]; MATCHED],
            probe: 0,
            lambda: 0.1,
            restarts: 0,
        }
    }

    /// Takes the statistics `got` measured at `self.x`; returns the next point.
    #[allow(clippy::needless_range_loop)]
    fn next(&mut self, goal: &[f64; MATCHED], got: &[f64; MATCHED]) -> [f64; SIMULATED] {
        let l = loss(goal, got);
        if self.best_loss.is_infinite() {
            // The starting point.
            self.best_loss = l;
            self.best_got = *got;
            return self.probe_point();
        }
        let dx: Vec<f64> = (0..SIMULATED).map(|p| self.x[p] - self.best_x[p]).collect();
        let dy: Vec<f64> = (0..MATCHED)
            .map(|i| WEIGHTS[i] * (got[i].max(1e-6).ln() - self.best_got[i].max(1e-6).ln()))
            .collect();
        if self.probe < SIMULATED {
            let p = self.probe;
            for i in 0..MATCHED {
                self.jac[i][p] = dy[i] / dx[p];
            }
            self.probe += 1;
            if self.probe < SIMULATED {
                return self.probe_point();
            }
        } else {
            // Broyden's rank-one update along the step just taken.
            let dd: f64 = dx.iter().map(|v| v * v).sum();
            if dd > 0.0 {
                for i in 0..MATCHED {
                    let pred: f64 = (0..SIMULATED).map(|p| self.jac[i][p] * dx[p]).sum();
                    let c = (dy[i] - pred) / dd;
                    for p in 0..SIMULATED {
                        self.jac[i][p] += c * dx[p];
                    }
                }
            }
            if l < self.best_loss {
                self.best_loss = l;
                self.best_x = self.x;
                self.best_got = *got;
                self.lambda = (self.lambda / 3.0).max(1e-4);
            } else {
                self.lambda *= 4.0;
                if self.lambda > RESTART_LAMBDA {
                    // Stuck: the updated Jacobian no longer points downhill.
                    // Difference it afresh at the best point.
                    self.probe = 0;
                    self.lambda = 0.1;
                    self.restarts += 1;
                    return self.probe_point();
                }
            }
        }
        let r = residual(goal, &self.best_got);
        let d = lm_step(&self.jac, &r, self.lambda);
        let mut x = self.best_x;
        for p in 0..SIMULATED {
            x[p] += d[p].clamp(-MAX_MOVE, MAX_MOVE);
        }
        self.x = x;
        x
    }

    fn probe_point(&mut self) -> [f64; SIMULATED] {
        let mut x = self.best_x;
        // Probabilities near 1 are probed downwards; a restart probes the other way
        // with a smaller step.
        let step =
            PROBE / (1.0 + self.restarts as f64) * if self.restarts % 2 == 1 { -1.0 } else { 1.0 };
        x[self.probe] += if x[self.probe] > 4.0 {
            -step.abs()
        } else {
            step
        };
        self.x = x;
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knots_follow_the_histogram() {
        let mut h = Histogram::new();
        h.insert(0, 10);
        h.insert(1, 50);
        h.insert(2, 30);
        h.insert(10, 20);
        let (k, cap) = out_degree_shape(&h);
        // 100 positive degrees, mean (50 + 60 + 200) / 100 = 3.1.
        assert_eq!(k[0], [1.0, 1.0 / 3.1]);
        assert!((cap - 10.0 / 3.1).abs() < 1e-12);
        assert!(k
            .windows(2)
            .all(|w| w[0][0] > w[1][0] && w[0][1] <= w[1][1]));
    }
}
