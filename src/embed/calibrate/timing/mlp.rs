//! The MLP points: every shape at every batch, timed in interleaved rounds on every
//! rank together.

use std::time::Instant;

use crate::comm::Comm;
use crate::embed::calibrate::options::CalibOptions;
use crate::embed::calibrate::points::MlpPoint;
use crate::embed::calibrate::reduce::synchronized_seconds;
use crate::embed::dense::mlp::{Mlp, Workspace};
use crate::error::Result;

/// Collective: every rank must call. The MLP step (forward and backward) of every
/// shape of `o.mlp_shapes` over every batch of `o.mlp_batches`, timed in
/// `o.mlp_rounds` interleaved rounds (one call of each point per round, after one
/// untimed call of each). A slow spell of a shared machine lasting a second or two
/// then falls on one round of every point, not on all the calls of the point timed
/// during it. Every call starts after a barrier, as a training step's dense phase
/// starts after the lookup's collectives: the ranks run it together, as they do there
/// (unsynchronized, 4 ranks on 2 cores measured a third less than training's rate).
///
/// A point's seconds are what a step pays for it ([`synchronized_seconds`]): the
/// slowest rank's seconds of each round, averaged over the rounds. A step's dense
/// phase ends in a collective, so the step waits for the slowest rank, and a
/// training run's seconds per step are a mean over its steps, slow ones included.
/// (With each rank's median of its rounds, averaged over ranks, the dense phase of
/// three costs benches measured, in the median over their runs, 1.11, 1.18 and 1.27
/// times its prediction; docs/calibrate.md.)
///
/// One pass of `o.spread`: `o.mlp_rounds / o.spread` rounds (at least one).
pub fn global_mlp_points<C: Comm>(comm: &C, o: &CalibOptions) -> Result<Vec<MlpPoint>> {
    struct Case {
        mlp: Mlp,
        batch: usize,
        x: Vec<f32>,
        labels: Vec<f32>,
        grad: Vec<f32>,
        dx: Vec<f32>,
        ws: Workspace,
        times: Vec<f64>,
    }
    impl Case {
        fn call(&mut self) -> f64 {
            let n_in = self.mlp.n_in();
            let xv = ndarray::ArrayView2::from_shape((self.batch, n_in), &self.x)
                .expect("the input is batch x n_in by construction");
            let s = Instant::now();
            let l = self.mlp.forward_backward(
                xv,
                &self.labels,
                1.0 / self.batch as f32,
                &mut self.grad,
                &mut self.dx,
                &mut self.ws,
            );
            std::hint::black_box(l);
            s.elapsed().as_secs_f64()
        }
    }
    let made: Result<Vec<Case>> = o
        .mlp_shapes
        .iter()
        .flat_map(|layers| o.mlp_batches.iter().map(move |&batch| (layers, batch)))
        .map(|(layers, batch)| {
            let mlp = Mlp::new(layers, o.seed)?;
            let n_in = mlp.n_in();
            Ok(Case {
                grad: vec![0.0f32; mlp.n_params()],
                mlp,
                batch,
                x: (0..batch * n_in).map(|i| (i % 13) as f32 * 0.01).collect(),
                labels: (0..batch).map(|i| (i % 2) as f32).collect(),
                dx: vec![0.0f32; batch * n_in],
                ws: Workspace::default(),
                times: Vec::new(),
            })
        })
        .collect();
    let mut cases = comm.agree(made)?;
    // Round 0 is the untimed call of each point.
    for round in 0..=o.mlp_rounds.div_ceil(o.spread.max(1)).max(1) {
        for c in cases.iter_mut() {
            comm.barrier();
            let t = c.call();
            if round > 0 {
                c.times.push(t);
            }
        }
    }
    // Every rank's rounds of every point, point-major: [rank][point][round].
    let rounds = cases.first().map_or(0, |c| c.times.len());
    let mine: Vec<f64> = cases.iter().flat_map(|c| c.times.iter().copied()).collect();
    let all = comm.all_gather_v(&mine)?;
    let per_rank: Vec<&[f64]> = (0..comm.size()).map(|r| all.from_rank(r)).collect();
    Ok(cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let of_point: Vec<&[f64]> = per_rank
                .iter()
                .map(|t| &t[i * rounds..(i + 1) * rounds])
                .collect();
            MlpPoint {
                layers: c.mlp.layers().to_vec(),
                batch: c.batch,
                seconds: synchronized_seconds(&of_point),
            }
        })
        .collect())
}
