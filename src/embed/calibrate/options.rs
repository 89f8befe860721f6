//! How much `torusrec calibrate` measures: the points of the full setting and of the
//! quick one.

/// How much to measure.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibOptions {
    pub quick: bool,
    pub reps: usize,
    pub table_bytes: u64,
    /// Ids per table per call.
    pub ids: usize,
    pub dims: Vec<usize>,
    pub poolings: Vec<usize>,
    /// Table counts of the interference points.
    pub together: Vec<usize>,
    /// Bytes of the table-size points (single tables of every width in `dims`,
    /// uniform ids, pooling `size_pooling`), besides `table_bytes` itself.
    pub sizes: Vec<u64>,
    pub size_pooling: usize,
    /// Widths and pooling of the interference points.
    pub together_dims: Vec<usize>,
    pub together_pooling: usize,
    pub mlp_shapes: Vec<Vec<usize>>,
    pub mlp_batches: Vec<usize>,
    /// Interleaved rounds of the MLP points (`global_mlp_points`), over all passes.
    pub mlp_rounds: usize,
    /// Passes of the MLP and collective points, spread over the calibration (one
    /// after the kernel points, the others between the pooled rounds; `calibrate`):
    /// each point keeps the median of its passes ([`median_over_passes`](super::median_over_passes)), so that
    /// one slow or fast minute of a shared machine is not the whole snapshot.
    pub spread: usize,
    /// Rounds of the gather and scatter points: every point is timed once per round
    /// (`reps` calls, their median), in order, and keeps the median of its rounds.
    pub kernel_rounds: usize,
    /// Bytes per rank of the collectives.
    pub coll_bytes: Vec<u64>,
    /// Pooled training steps ([`PooledPoint`](super::PooledPoint)): widths, ids per example, examples
    /// per rank, untimed and timed steps per run, runs per placement (interleaved;
    /// the median is kept).
    pub pooled_dims: Vec<usize>,
    pub pooled_poolings: Vec<usize>,
    pub pooled_batch: usize,
    pub pooled_warmup: u64,
    pub pooled_steps: u64,
    pub pooled_reps: usize,
    /// Least seconds of timed steps of a pooled run (more steps than
    /// `pooled_steps` when its steps are short).
    pub pooled_min_seconds: f64,
    /// Table sizes (bytes) of whole-table pooled points at width `pooled_size_dim`
    /// and pooling `pooled_size_pooling`, besides `table_bytes`.
    pub pooled_sizes: Vec<u64>,
    pub pooled_size_dim: usize,
    pub pooled_size_pooling: usize,
    /// Tables per rank of the together points: that many whole tables of
    /// `table_bytes` on every rank, width `pooled_size_dim`, pooling
    /// `pooled_together_pooling`, in both output modes (what
    /// [`CostModel::interference`](crate::embed::planner::CostModel::interference) is fitted to when measured; 0: none).
    pub pooled_together: usize,
    pub pooled_together_pooling: usize,
    pub seed: u64,
}

impl CalibOptions {
    /// The full setting (about a minute on 2 cores) or the quick one (seconds).
    pub fn new(quick: bool) -> Self {
        let mut shapes: Vec<Vec<usize>> = ["torchrec-peer", "dlrm-synthetic", "tiny"]
            .iter()
            .filter_map(|p| crate::spec::preset(p, 0.1).ok())
            .map(|s| s.mlp_layers())
            .collect();
        // A mid-sized MLP between tiny's and the peers': the rate of a shape not
        // measured is interpolated between measured ones (`Costs::mlp_rate`).
        shapes.push(vec![512, 256, 128, 1]);
        if quick {
            CalibOptions {
                quick,
                reps: 3,
                table_bytes: 1 << 20,
                ids: 1 << 13,
                dims: vec![8, 32],
                poolings: vec![1, 8],
                together: vec![2],
                sizes: vec![1 << 18, 1 << 22],
                size_pooling: 8,
                together_dims: vec![32],
                together_pooling: 8,
                mlp_shapes: vec![vec![32, 16, 1]],
                mlp_batches: vec![64],
                mlp_rounds: 3,
                spread: 1,
                kernel_rounds: 1,
                coll_bytes: vec![4 << 10, 64 << 10],
                pooled_dims: vec![8],
                pooled_poolings: vec![1, 8],
                pooled_batch: 64,
                pooled_warmup: 1,
                pooled_steps: 2,
                pooled_reps: 1,
                pooled_min_seconds: 0.0,
                pooled_sizes: vec![1 << 18],
                pooled_size_dim: 8,
                pooled_size_pooling: 8,
                pooled_together: 2,
                pooled_together_pooling: 8,
                seed: 1,
            }
        } else {
            CalibOptions {
                quick,
                reps: 5,
                table_bytes: 64 << 20,
                ids: 1 << 18,
                dims: vec![8, 16, 32, 64, 128],
                poolings: vec![1, 8, 32],
                together: vec![2, 4, 8],
                sizes: vec![1 << 20, 8 << 20, 256 << 20],
                size_pooling: 8,
                together_dims: vec![16, 64],
                together_pooling: 8,
                mlp_shapes: shapes,
                mlp_batches: vec![512, 2048],
                mlp_rounds: 15,
                // The MLP point of torchrec-peer's shape measured 0.1891, 0.1857 and
                // 0.2260 s, and the 8 MiB all-to-all 4.50, 2.90 and 4.55 ms, in three
                // calibrations (each in one burst) at 2 ranks on one evening
                // (2026-12-01).
                spread: 3,
                kernel_rounds: 3,
                coll_bytes: vec![4 << 10, 64 << 10, 1 << 20, 8 << 20],
                pooled_dims: vec![16, 64],
                pooled_poolings: vec![1, 32],
                pooled_batch: 2048,
                pooled_warmup: 3,
                pooled_steps: 10,
                pooled_reps: 3,
                pooled_min_seconds: 0.5,
                // 1 MiB: torchrec-peer has 10 tables below 4 MiB with 154 of its 392
                // ids per example, and below the smallest size point the factor is
                // clamped to that point's (1 MiB measured 0.14-0.15, 4 MiB 0.32-0.42).
                // 256 KiB: three of them (310, 646 and 693 kB, 48 ids per example)
                // are below 1 MiB, within a core's L2 (512 kB here) or near it, where
                // 1 MiB's factor, from a table in L3, is not theirs. (2026-12-01, at 2
                // and 4 ranks: its step measured below the model's floor, the terms
                // not scaled by size, so its factor sits at the 0.05 clamp.)
                pooled_sizes: vec![256 << 10, 1 << 20, 4 << 20, 256 << 20],
                pooled_size_dim: 64,
                pooled_size_pooling: 32,
                pooled_together: 8,
                pooled_together_pooling: 8,
                seed: 1,
            }
        }
    }
}
