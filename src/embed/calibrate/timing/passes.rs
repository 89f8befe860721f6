//! The passes of the MLP and collective points (`CalibOptions::spread`): their
//! seconds per pass, and each point's median of its passes.

use super::collectives::global_collectives;
use super::mlp::global_mlp_points;
use crate::comm::Comm;
use crate::embed::calibrate::options::CalibOptions;
use crate::embed::calibrate::points::{CollPoint, Costs};
use crate::embed::calibrate::reduce::median_over_passes;
use crate::error::Result;

/// The passes of the MLP and collective points (`CalibOptions::spread`): their
/// seconds per pass, in the points' order.
pub struct Passes {
    pub mlp: Vec<Vec<f64>>,
    pub a2a: Vec<Vec<f64>>,
    pub ar: Vec<Vec<f64>>,
}

impl Passes {
    /// The first pass: the points of `c` as measured.
    pub fn first(c: &Costs) -> Self {
        Passes {
            mlp: vec![c.mlp.iter().map(|p| p.seconds).collect()],
            a2a: vec![c.all_to_all.iter().map(|p| p.seconds).collect()],
            ar: vec![c.all_reduce.iter().map(|p| p.seconds).collect()],
        }
    }

    /// Passes so far.
    pub fn count(&self) -> usize {
        self.mlp.len()
    }

    /// Collective: every rank must call. One more pass.
    pub fn global_add<C: Comm>(&mut self, comm: &C, o: &CalibOptions) -> Result<()> {
        let mlp = global_mlp_points(comm, o)?;
        let (a2a, ar) = global_collectives(comm, o)?;
        let secs = |v: &[CollPoint]| v.iter().map(|p| p.seconds).collect();
        self.mlp.push(mlp.iter().map(|p| p.seconds).collect());
        self.a2a.push(secs(&a2a));
        self.ar.push(secs(&ar));
        Ok(())
    }

    /// Each point's seconds: the median of its passes' (at least 1 ns, as the
    /// kernels' points).
    pub fn apply(&self, c: &mut Costs) {
        set_medians(c.mlp.iter_mut().map(|p| &mut p.seconds), &self.mlp);
        set_medians(c.all_to_all.iter_mut().map(|p| &mut p.seconds), &self.a2a);
        set_medians(c.all_reduce.iter_mut().map(|p| &mut p.seconds), &self.ar);
    }
}

/// `dst`, in order: the median of each point's passes, at least 1 ns.
fn set_medians<'a>(dst: impl Iterator<Item = &'a mut f64>, passes: &[Vec<f64>]) {
    for (d, s) in dst.zip(median_over_passes(passes)) {
        *d = s.max(1e-9);
    }
}
