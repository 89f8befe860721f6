//! The fit ([`fit`]): the points of a calibration to a [`CostModel`] and the rates
//! beside it, by phases (the parent module's doc gives the laws):
//!
//! - the kernel points (`kernels.rs`): the row access's seconds and width factor,
//!   the size factor, the kernel points' interference, the Zipf ratio;
//! - the collectives (a line per collective, `line.rs`) and the MLP's rate;
//! - the pooled training steps (`steps.rs`): their coefficients and the together
//!   points' interference, in turn until it settles, then the `rows` size factor.

mod kernels;
mod line;
mod steps;

use line::link_fit;

use crate::embed::calibrate::points::{mlp_flops, rows_of, Costs, Fit, KernelPoint};
use crate::embed::planner::CostModel;

/// Most rounds of the interference and the training steps' coefficients fitted in
/// turn ([`fit`]).
const TOGETHER_ROUNDS: usize = 50;

/// Least share of a point's price that an interference of 1 must add for the point
/// to say anything about the interference. Where the law's variable is near 0 (the
/// tables' bytes together fall within one size factor), the slope through such
/// points is the ratio of two small numbers: a quick calibration's kernel points
/// (two tables of 1 MB, sizes measured to 4 MB, factors within 2 %) measured 1.24
/// times alone and gave an interference of 26, under which two pieces of 128 kB
/// cost 6 times their sum.
const IDENTIFIES: f64 = 0.05;

/// Bytes a row access of `w` floats moves (as [`CostModel`] counts it).
fn access(m: &CostModel, w: usize) -> f64 {
    (4.0 * w as f64).max(m.line_bytes)
}

/// The model and rates the points give (see the module doc).
pub fn fit(c: &Costs) -> Fit {
    let mut m = CostModel::default();
    // The points at the reference table size (the others are the size points).
    let tb = c.conditions.table_bytes;
    let at_ref = |q: &KernelPoint| q.rows == rows_of(tb, q.dim);
    let widths = kernels::row_access(c, &at_ref, &mut m);
    // Interference: per-id seconds of k tables together over alone, against the
    // law's variable (the size factor of their bytes together over one's; without
    // size points the saturating 1 - 1/k).
    m.size_factor = kernels::size_factor(c, &at_ref);
    let together_ratio = kernels::kernel_interference(c, &mut m);
    m.ask_row_access = true;
    let (a2a_lat, ar_lat) = collectives(c, &mut m);
    let zipf_ratio = kernels::zipf_ratio(c, &widths, &at_ref);
    // The asking side of a `rows` table at the Zipf ids' rate: only with the pooled
    // points (files from before them keep their plans).
    if !c.pooled.is_empty() {
        m.ask_zipf_factor = zipf_ratio.iter().map(|&[w, r]| [w, r.min(1.0)]).collect();
    }
    let kernel_interference = m.interference;
    steps::training_steps(c, &mut m);
    // One `rows` table a rank: no interference, so after the loop.
    m.rows_size_factor = steps::rows_size_fit(c, &m);
    Fit {
        kernel_interference,
        model: m,
        all_to_all_latency_s: a2a_lat,
        all_reduce_latency_s: ar_lat,
        mlp_flops: mlp_rate(c),
        zipf_ratio,
        together_ratio,
    }
}

/// `m.net_bw` and `m.allreduce_bw` from the collective points, and the latencies of
/// all-to-all and all-reduce, by least relative squares over the bytes that cross
/// to other ranks; on one rank nothing crosses (the defaults kept, latencies 0).
fn collectives(c: &Costs, m: &mut CostModel) -> (f64, f64) {
    let p = c.conditions.ranks.max(1) as f64;
    let cross = if p > 1.0 { (p - 1.0) / p } else { 1.0 };
    let a2a: Vec<(f64, f64)> = c
        .all_to_all
        .iter()
        .map(|q| (q.bytes as f64 * cross, q.seconds))
        .collect();
    let ar: Vec<(f64, f64)> = c
        .all_reduce
        .iter()
        .map(|q| (2.0 * q.bytes as f64 * cross, q.seconds))
        .collect();
    let (mut a2a_lat, mut ar_lat) = (0.0, 0.0);
    if p > 1.0 {
        if let Some((lat, bw)) = link_fit(&a2a) {
            m.net_bw = bw;
            a2a_lat = lat;
        }
        if let Some((lat, bw)) = link_fit(&ar) {
            m.allreduce_bw = bw;
            ar_lat = lat;
        }
    }
    (a2a_lat, ar_lat)
}

/// The MLP's FLOP/s over every shape: their flops over their seconds (1e9 without
/// points).
fn mlp_rate(c: &Costs) -> f64 {
    // MLP: flops over seconds.
    let (mut f, mut s) = (0.0, 0.0);
    for q in &c.mlp {
        f += mlp_flops(&q.layers, q.batch);
        s += q.seconds;
    }
    if s > 0.0 && f > 0.0 {
        f / s
    } else {
        1e9
    }
}
