//! The predicted seconds of a training step from a calibration: the planner's
//! embedding costs, the MLP at its measured rate, the all-reduce of its gradient.

use serde::Serialize;

use super::points::{mlp_flops, Costs};

/// The predicted seconds of one training step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepPrediction {
    /// The planner's cost per rank (embedding lookups, exchange, update).
    pub embedding_per_rank: Vec<f64>,
    pub embedding_max: f64,
    /// The MLP's forward and backward over the rank's examples.
    pub dense: f64,
    /// The all-reduce of the MLP's gradient.
    pub allreduce: f64,
    pub step: f64,
}

impl Costs {
    /// The predicted step of a rank holding `batch_per_rank` examples with the MLP
    /// `layers`, under `world` ranks, whose embedding costs are `embedding_per_rank`
    /// (a [`crate::embed::planner::PlanReport`]'s `cost_per_rank` under [`Costs::model`]).
    pub fn predict(
        &self,
        embedding_per_rank: Vec<f64>,
        layers: &[usize],
        batch_per_rank: usize,
        world: usize,
    ) -> StepPrediction {
        let f = &self.fit;
        let embedding_max = embedding_per_rank.iter().copied().fold(0.0, f64::max);
        let threads = self.conditions.threads.max(1) as f64;
        let dense =
            mlp_flops(layers, batch_per_rank) / self.mlp_rate(layers, batch_per_rank) / threads;
        let n = world as f64;
        let params: f64 = layers.windows(2).map(|w| (w[0] * w[1] + w[1]) as f64).sum();
        let allreduce = if world > 1 {
            f.all_reduce_latency_s + 2.0 * params * 4.0 * (n - 1.0) / n / f.model.allreduce_bw
        } else {
            0.0
        };
        StepPrediction {
            embedding_per_rank,
            embedding_max,
            dense,
            allreduce,
            step: embedding_max + dense + allreduce,
        }
    }

    /// FLOP/s of the MLP step of `layers` over `batch` examples: a measured shape's
    /// own rate at the measured batch nearest `batch` (in log scale); another shape's
    /// interpolated linearly in the log of the flops per example between the measured
    /// shapes around it (each at its batch nearest `batch`), the nearest one's beyond
    /// them; the overall rate ([`Fit::mlp_flops`](super::Fit::mlp_flops)) without points.
    pub fn mlp_rate(&self, layers: &[usize], batch: usize) -> f64 {
        struct Shape<'a> {
            layers: &'a [usize],
            /// ln of the flops per example.
            x: f64,
            /// |ln batch - ln `batch`| of the point kept, and its rate.
            dist: f64,
            rate: f64,
        }
        let lb = (batch.max(1) as f64).ln();
        let mut shapes: Vec<Shape> = Vec::new();
        for q in &self.mlp {
            let rate = mlp_flops(&q.layers, q.batch) / q.seconds;
            let dist = ((q.batch.max(1) as f64).ln() - lb).abs();
            match shapes.iter_mut().find(|s| s.layers == q.layers.as_slice()) {
                Some(s) if dist < s.dist => {
                    s.dist = dist;
                    s.rate = rate;
                }
                Some(_) => {}
                None => shapes.push(Shape {
                    layers: &q.layers,
                    x: mlp_flops(&q.layers, 1).max(1.0).ln(),
                    dist,
                    rate,
                }),
            }
        }
        if let Some(s) = shapes.iter().find(|s| s.layers == layers) {
            return s.rate;
        }
        shapes.sort_by(|a, b| a.x.total_cmp(&b.x));
        let (Some(first), Some(last)) = (shapes.first(), shapes.last()) else {
            return self.fit.mlp_flops;
        };
        let x = mlp_flops(layers, 1).max(1.0).ln();
        if x <= first.x {
            return first.rate;
        }
        for w in shapes.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            if x <= b.x {
                let t = if b.x > a.x {
                    (x - a.x) / (b.x - a.x)
                } else {
                    1.0
                };
                return a.rate + t * (b.rate - a.rate);
            }
        }
        last.rate
    }
}
