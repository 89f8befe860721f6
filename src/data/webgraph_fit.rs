//! Fitting the copying model ([`super::webgraph_copy`]) to a real graph from its
//! statistics ([`super::graph_stats`]), never from a training result.
//!
//! Two kinds of parameters:
//!
//! * **read off** the graph: the fraction of pages without links, the out-degree
//!   quantile function (knots at fixed survival levels of the positive out-degrees,
//!   in units of their mean), its tail beyond the last knot (the out-degree tail
//!   exponent less one) and its cap (the largest degree over the mean);
//! * **matched by simulation**: the rest. The model is generated at the graph's size
//!   with a fixed seed, its statistics measured, and each parameter moved by a power
//!   of the ratio of its statistic's target to its measured value (a damped
//!   fixed-point iteration; each parameter has one statistic that it moves most):
//!
//!   | parameter | statistic |
//!   |---|---|
//!   | `local` | arcs with gap < 2^4 |
//!   | `dir_mean` | arcs with gap < 2^8 |
//!   | `host_mean` | arcs with gap < 2^12 |
//!   | global share (1 - template - copy - local) | arcs with gap >= 2^16 |
//!   | `degree_corr` | adjacent Jaccard |
//!   | `up_link`, `copy_sibling` | reciprocity |
//!   | `template` | top-1 % in-link share |
//!   | `host_sigma` | in-degree 99.9 % quantile |
//!   | `host_zipf` | in-degree 90 % quantile |
//!   | `template_pages` | in-degree 99 % quantile |
//!
//!   The iteration keeps the parameters of the smallest loss (the sum of squared
//!   log ratios over these statistics) seen in [`ROUNDS`] rounds.
//!
//! Everything here is pure computation over in-memory graphs (the caller reads G).

use super::graph::LocalRows;
use super::graph_stats::{profile_of_rows, GraphProfile, GraphStats, Histogram};
use super::webgraph_copy::{CopyModel, CopyingParams, PARAMS_VERSION};

/// Rounds of the simulation fit.
pub const ROUNDS: usize = 24;
/// Survival levels of the out-degree knots.
pub const KNOT_SURVIVALS: [f64; 16] = [
    1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001, 3e-4, 1e-4,
];
/// The seed of the fit's simulations (the fit does not depend on the twin's seed).
pub const FIT_SEED: u64 = 0x05ee_df17;

/// The statistics the simulation matches, in the order of the module doc's table.
pub fn matched(s: &GraphStats) -> [f64; 10] {
    [
        s.gap_below[0],
        s.gap_below[1],
        s.gap_below[2],
        1.0 - s.gap_below[3],
        s.adjacent_jaccard,
        s.reciprocity,
        s.top1_in_share,
        s.in_degree.quantiles[3] as f64,
        s.in_degree.quantiles[1] as f64,
        s.in_degree.quantiles[2] as f64,
    ]
}

/// Names of [`matched`]'s statistics, for logs.
pub const MATCHED_NAMES: [&str; 10] = [
    "gap<2^4",
    "gap<2^8",
    "gap<2^12",
    "gap>=2^16",
    "adjacent_jaccard",
    "reciprocity",
    "top1_in_share",
    "in_q99.9",
    "in_q90",
    "in_q99",
];

/// The knots, tail and cap of the positive out-degrees of `hist`.
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

/// Starting values of the simulated parameters.
fn initial(target: &GraphStats) -> CopyingParams {
    let far = 1.0 - target.gap_below[3];
    CopyingParams {
        version: PARAMS_VERSION,
        fitted_to: String::new(),
        zero_out: 0.0,
        out_knots: vec![[1.0, 1.0]],
        out_tail: 1.0,
        out_cap: 1.0,
        host_mean: 1000.0,
        host_sigma: 1.5,
        dir_mean: 30.0,
        degree_corr: 0.5,
        template: 0.3,
        template_pages: 2.0,
        copy: 0.3,
        copy_sibling: 0.5,
        up_link: 0.5,
        local: 0.2,
        local_gap: 4.0,
        host_zipf: 1.0,
        global_zipf: 1.0,
    }
    .with_global(far.clamp(1e-4, 0.5))
}

trait WithGlobal {
    fn with_global(self, g: f64) -> Self;
}

impl WithGlobal for CopyingParams {
    /// Scales template, copy and local so that the global share is `g`.
    fn with_global(mut self, g: f64) -> Self {
        let rest = self.template + self.copy + self.local;
        let f = (1.0 - g) / rest.max(1e-12);
        self.template *= f;
        self.copy *= f;
        self.local *= f;
        self
    }
}

/// The sum of squared log ratios of measured to target statistics.
pub fn loss(target: &[f64; 10], got: &[f64; 10]) -> f64 {
    target
        .iter()
        .zip(got)
        .map(|(&t, &g)| ((g.max(1e-6)) / t.max(1e-6)).ln().powi(2))
        .sum()
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
    pub stats: [f64; 10],
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
    let goal = matched(t);
    let mut p = initial(t);
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
    for round in 0..ROUNDS {
        let prof = simulate(&p, t.nodes, t.arcs, FIT_SEED)?;
        let got = matched(&prof.stats);
        let l = loss(&goal, &got);
        progress(&FitRound {
            round,
            loss: l,
            stats: got,
        });
        if best.as_ref().is_none_or(|b| l < b.0) {
            best = Some((l, p.clone()));
        }
        p = step(&p, &goal, &got, round);
    }
    Ok(best.expect("at least one round").1)
}

/// The damped multiplicative update of every simulated parameter.
fn step(p: &CopyingParams, goal: &[f64; 10], got: &[f64; 10], round: usize) -> CopyingParams {
    let damp = if round < 8 { 0.7 } else { 0.4 };
    let ratio = |i: usize, gain: f64| -> f64 {
        let r = goal[i].max(1e-6) / got[i].max(1e-6);
        r.powf(gain * damp).clamp(0.5, 2.0)
    };
    let mut q = p.clone();
    // Shares: the global share towards the far-link fraction, then template, copy
    // and local by their statistics, renormalized to the rest.
    let g = (1.0 - p.template - p.copy - p.local).max(1e-5);
    let g = (g * ratio(3, 1.0)).clamp(1e-5, 0.9);
    q.local = p.local * ratio(0, 1.5);
    q.degree_corr = (p.degree_corr * ratio(4, 1.5)).clamp(0.0, 1.0);
    q.template = p.template * ratio(6, 1.5);
    q = q.with_global(g);
    q.dir_mean = (p.dir_mean * ratio(1, -2.0)).clamp(2.0, 1e5);
    q.host_mean = (p.host_mean * ratio(2, -2.0)).clamp(2.0, 1e7);
    q.up_link = (p.up_link * ratio(5, 0.75)).clamp(0.0, 1.0);
    q.copy_sibling = (p.copy_sibling * ratio(5, 0.75)).clamp(0.01, 1.0);
    q.host_sigma = (p.host_sigma * ratio(7, 0.5)).clamp(0.1, 3.0);
    q.template_pages = (p.template_pages * ratio(9, 1.0)).clamp(0.05, 1e3);
    q.host_zipf = (p.host_zipf * ratio(8, -1.0)).clamp(0.0, 3.0);
    q
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

#[cfg(test)]
mod scratch {
    use super::*;
    #[test]
    #[ignore]
    fn fit_cnr() {
        let (_, mut rows) = crate::data::readers::read_bv(
            std::path::Path::new("../shared/data/cnr-2000/cnr-2000"),
            0,
            1,
        )
        .unwrap();
        rows.local_clean();
        let g = profile_of_rows(&rows, rows.num_rows() as u64);
        println!("target {:?}", matched(&g.stats));
        let t0 = std::time::Instant::now();
        let p = fit(&g, "cnr-2000", |r| {
            println!(
                "round {} loss {:.4} {:?}",
                r.round,
                r.loss,
                r.stats.map(|x| (x * 1000.0).round() / 1000.0)
            )
        })
        .unwrap();
        println!("fit in {:.1} s", t0.elapsed().as_secs_f64());
        println!("{}", p.render(false));
        println!("{}", p.render(false));
        let twin = simulate(&p, g.stats.nodes, g.stats.arcs, 42).unwrap();
        println!("G    {}", serde_json::to_string(&g.stats).unwrap());
        println!("twin {}", serde_json::to_string(&twin.stats).unwrap());
    }
}
