//! The only impure module of the calibration: it times the kernels, the MLP, the
//! collectives and pooled training steps on every rank and gathers the points (see
//! the parent module's doc for what is measured and how each point's seconds are
//! kept).
//!
//! - `kernels.rs`: the gather-pool and scatter-update points;
//! - `mlp.rs`: the MLP points, in interleaved rounds;
//! - `collectives.rs`: all-to-all-v and all-reduce;
//! - `pooled.rs`: pooled training steps, through the real training step;
//! - `passes.rs`: the passes of the MLP and collective points spread over the run.

mod collectives;
mod kernels;
mod mlp;
mod passes;
mod pooled;

pub use collectives::global_collectives;
pub use mlp::global_mlp_points;
pub use passes::Passes;
pub use pooled::global_pooled_points;

use crate::comm::Comm;
use crate::embed::calibrate::fit::fit;
use crate::embed::calibrate::options::CalibOptions;
use crate::embed::calibrate::points::{Conditions, Costs, Fit, SCHEMA};
use crate::error::Result;

/// Collective: every rank must call. Measure everything of `o` (see the module doc)
/// but the pooled points and fit it; `cond` are the conditions (the caller's: CPU,
/// commit, threads).
pub fn global_calibrate<C: Comm>(comm: &C, o: &CalibOptions, cond: Conditions) -> Result<Costs> {
    let (mut gather, mut scatter) = kernels::global_kernel_rounds(comm, o, &kernels::settings(o));
    let mlp = global_mlp_points(comm, o)?;
    // Kernel seconds: the mean over ranks (the MLP points are the ranks' already).
    kernels::global_mean_seconds(comm, &mut gather, &mut scatter);
    let (all_to_all, all_reduce) = global_collectives(comm, o)?;
    let mut c = Costs {
        schema: SCHEMA.to_string(),
        conditions: cond,
        gather,
        scatter,
        mlp,
        all_to_all,
        all_reduce,
        pooled: Vec::new(),
        fit: Fit::unfitted(),
    };
    // Seconds too small to time (a clock tick) would fit nothing: at least 1 ns.
    for p in c.gather.iter_mut().chain(c.scatter.iter_mut()) {
        p.seconds = p.seconds.max(1e-9);
    }
    for p in c.mlp.iter_mut() {
        p.seconds = p.seconds.max(1e-9);
    }
    for p in c.all_to_all.iter_mut().chain(c.all_reduce.iter_mut()) {
        p.seconds = p.seconds.max(1e-9);
    }
    c.fit = fit(&c);
    Ok(c)
}

/// Collective: every rank must call. The whole calibration of `torusrec calibrate`:
/// [`global_calibrate`] (its MLP and collective points the first pass), then the
/// pooled points with the other passes between their rounds (and after them, up to
/// `o.spread`), each MLP and collective point the median of its passes, and the fit
/// of it all. The passes are returned for the report.
pub fn global_measure<C: Comm>(
    comm: &C,
    o: &CalibOptions,
    cond: Conditions,
) -> Result<(Costs, Passes)> {
    let mut costs = global_calibrate(comm, o, cond)?;
    let mut passes = Passes::first(&costs);
    costs.pooled = global_pooled_points(comm, o, &mut |c: &C| passes.global_add(c, o))?;
    while passes.count() < o.spread {
        passes.global_add(comm, o)?;
    }
    passes.apply(&mut costs);
    costs.fit = fit(&costs);
    Ok((costs, passes))
}
