//! The flags of `embed` and `plan`, and the checkpoint flags every training run shares.

use super::{parse_threads, DenseGemmArg, ModelArgs, OutputModeArg};
use crate::embed::io::delta::DeltaDtype;
use clap::{Args, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VocabArg {
    Fixed,
    Modulo,
    Hash,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TableOptKind {
    Sgd,
    RowwiseAdagrad,
    Adagrad,
    Adam,
    RowwiseAdam,
    Ftrl,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DenseOptKind {
    Sgd,
    Adagrad,
    Adam,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LrDecayArg {
    None,
    Poly,
    Step,
}

/// The optimizers' other settings and the learning-rate schedule (docs/embed.md,
/// "Optimizers"). A setting of an optimizer not chosen is refused.
#[derive(Debug, Clone, Args)]
pub struct OptimArgs {
    /// Weight decay of the tables: L2 (`g += wd * w`) under sgd and adagrad; decoupled
    /// (`w *= 1 - lr * wd`) under rowwise-adagrad, adam and rowwise-adam; not with ftrl
    /// (use --ftrl-l2). Only rows a step touches decay.
    #[arg(long, value_name = "WD", default_value_t = 0.0)]
    pub table_weight_decay: f32,
    /// Weight decay of the MLP: L2 under sgd and adagrad, decoupled (AdamW) under adam.
    #[arg(long, value_name = "WD", default_value_t = 0.0)]
    pub dense_weight_decay: f32,
    /// Adam's beta1 for the tables (adam, rowwise-adam; default 0.9).
    #[arg(long, value_name = "B")]
    pub table_beta1: Option<f32>,
    /// Adam's beta2 for the tables (adam, rowwise-adam; default 0.999).
    #[arg(long, value_name = "B")]
    pub table_beta2: Option<f32>,
    /// FTRL-proximal's beta (--table-opt ftrl, whose alpha is --table-lr; default 1).
    #[arg(long, value_name = "B")]
    pub ftrl_beta: Option<f32>,
    /// FTRL-proximal's L1 strength: coordinates with `|z| <= l1` are exactly 0
    /// (--table-opt ftrl; default 0).
    #[arg(long, value_name = "L1")]
    pub ftrl_l1: Option<f32>,
    /// FTRL-proximal's L2 strength (--table-opt ftrl; default 0).
    #[arg(long, value_name = "L2")]
    pub ftrl_l2: Option<f32>,
    /// Linear learning-rate warm-up over the first N steps (step s at (s+1)/N of the
    /// rate), for the tables and the MLP alike.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub lr_warmup: u64,
    /// Decay of the rate after the warm-up: none, poly (to --lr-decay-end times the
    /// rate over --lr-decay-steps steps, power --lr-decay-power) or step (times
    /// --lr-decay-factor every --lr-decay-every steps).
    #[arg(long, value_enum, default_value_t = LrDecayArg::None)]
    pub lr_decay: LrDecayArg,
    /// Steps of the poly decay (required by --lr-decay poly).
    #[arg(long, value_name = "T")]
    pub lr_decay_steps: Option<u64>,
    /// Power of the poly decay (default 1: linear).
    #[arg(long, value_name = "P")]
    pub lr_decay_power: Option<f64>,
    /// The poly decay's final rate as a fraction of the base rate (default 0).
    #[arg(long, value_name = "F")]
    pub lr_decay_end: Option<f64>,
    /// Steps between the step decay's cuts (required by --lr-decay step).
    #[arg(long, value_name = "K")]
    pub lr_decay_every: Option<u64>,
    /// The step decay's factor (default 0.1).
    #[arg(long, value_name = "F")]
    pub lr_decay_factor: Option<f64>,
}

/// `embed --arch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ArchArg {
    /// One MLP over [pooled embeddings | dense features] (TOML `hidden`).
    Mlp,
    /// DLRM: bottom MLP on the dense features to D, pairwise dot interaction of the
    /// F + 1 vectors, top MLP.
    Dlrm,
    /// DCN-v2: cross layers on x0 = [pooled embeddings | dense features] and a deep MLP
    /// (TOML `hidden`), stacked or parallel.
    Dcnv2,
}

/// `embed --dcn-structure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DcnStructureArg {
    /// Cross layers, then the deep MLP to the logit.
    Stacked,
    /// Cross layers and a deep ReLU tower both on x0, concatenated, one linear logit.
    Parallel,
}

/// The dense architecture's flags (each overrides the tables TOML's `arch`).
#[derive(Debug, Args)]
pub struct ArchArgs {
    /// The dense model: mlp (default), dlrm or dcnv2 (docs/embed.md, "Architectures").
    #[arg(long, value_enum, value_name = "ARCH")]
    pub arch: Option<ArchArg>,
    /// DLRM: the bottom MLP's widths after the dense input, ending in D, every table's
    /// width (default 512,256,D; MLPerf: 512,256,128).
    #[arg(long, value_name = "W,...")]
    pub bottom_mlp: Option<String>,
    /// DLRM: the top MLP's hidden widths, the logit implied (default and MLPerf's
    /// 1024,1024,512,256; "" for a single linear layer).
    #[arg(long, value_name = "W,...")]
    pub top_mlp: Option<String>,
    /// DCN-v2: the number of cross layers L (default 3).
    #[arg(long, value_name = "L")]
    pub cross_layers: Option<usize>,
    /// DCN-v2: low-rank cross layers W = U V^T of rank r (default: full rank).
    #[arg(long, value_name = "R")]
    pub cross_rank: Option<usize>,
    /// DCN-v2: stacked (default) or parallel.
    #[arg(long, value_enum, value_name = "S")]
    pub dcn_structure: Option<DcnStructureArg>,
}

#[derive(Debug, Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub arch: ArchArgs,
    /// Train on a click log from `generate clicks` or `prepare clicks` instead of
    /// examples generated on the fly. The model is the log's (one table per
    /// categorical column, hash tables for a `prepare clicks` log) unless --tables
    /// gives one with the same tables and dense features; the options below
    /// override every table.
    #[arg(long, value_name = "F.h5", conflicts_with_all = ["preset", "scale"])]
    pub data: Option<PathBuf>,
    /// Every table's vocabulary: fixed (ids are rows below the table's vocab), modulo
    /// (row = id mod --capacity: the hashing trick) or hash (a hash table of
    /// --capacity rows keyed by the raw 64-bit id, with admission and eviction).
    /// Default: the model's (hash for a `prepare clicks` log, fixed otherwise).
    #[arg(long, value_enum, value_name = "KIND")]
    pub vocab: Option<VocabArg>,
    /// Rows of every modulo or hash table (total over ranks), or `Fx`: F times each
    /// table's vocab (e.g. 1.1x: room for keys that spread unevenly over owners).
    /// Default: the model's vocab (for a `prepare clicks` log, the distinct ids of
    /// each column it counted).
    #[arg(long, value_name = "ROWS|Fx")]
    pub capacity: Option<String>,
    /// Hash tables: an id gets a trained row once seen N times (until then it looks
    /// up nothing and only its count is kept). Default: the model's (1).
    #[arg(long, value_name = "N")]
    pub admit_after: Option<u32>,
    /// Hash tables, when full: lfu (evict the least frequently seen ids, a sixteenth
    /// of the table at a time) or ttl:STEPS (ids unseen for STEPS steps expire; when
    /// full, the least recently seen go). An id seen in the current step is never
    /// evicted; if every one was, a new id looks up nothing. Default: the model's (lfu).
    #[arg(long, value_name = "lfu|ttl:STEPS")]
    pub evict: Option<String>,
    /// Width of every table (default: the model's; 16 for a `prepare clicks` log).
    #[arg(long, value_name = "D")]
    pub dim: Option<usize>,
    /// Element type of every embedding table's rows: f32, bf16 or f16 (default: the
    /// model's `table_dtype`, f32). At bf16/f16 rows are stored and sent at 2 bytes a
    /// value and computed on in f32; an updated row is rounded to nearest, ties to
    /// even. Optimizer state and gradients stay f32. Fixed and modulo tables only.
    #[arg(long, value_enum, value_name = "DTYPE")]
    pub table_dtype: Option<crate::bf16::EmbDtype>,
    /// Hold out day K of a click log of several days (input file K of `prepare
    /// clicks`, from 0) for AUC and log loss, and train on the other days.
    #[arg(
        long,
        value_name = "K",
        requires = "data",
        conflicts_with = "eval_examples"
    )]
    pub eval_day: Option<usize>,
    /// Warm start: the tables (with their optimizer state and counts), the MLP and its
    /// optimizer state from a checkpoint of another run (a file, or the newest in a
    /// directory), on any rank count, then train on this run's data from step 0.
    /// The model must be the same (tables, widths, vocabularies, MLP).
    #[arg(long, value_name = "CKPT|DIR")]
    pub init_from: Option<PathBuf>,
    /// Examples per rank per micro-batch.
    #[arg(long, default_value_t = 2048)]
    pub batch: usize,
    /// Examples per micro-batch over all ranks (default: --batch x ranks); cut into
    /// contiguous blocks per rank, which may be uneven or empty.
    #[arg(long, value_name = "M", conflicts_with = "batch")]
    pub global_batch: Option<usize>,
    /// Micro-batches per optimizer step: dense gradients are summed locally and
    /// all-reduced once per step; tables are updated once per step per id.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub accumulate: usize,
    /// Optimizer steps.
    #[arg(long, default_value_t = 100)]
    pub steps: u64,
    /// auto (the cost-based planner), a plan JSON file, or one placement for every
    /// table: table, row_block, row_cyclic, column, data_parallel.
    #[arg(long, value_name = "auto|PLAN.json|KIND", default_value = "auto")]
    pub plan: String,
    // What `--plan auto` plans with (--mem-per-rank and --table-opt act on every plan).
    #[command(flatten)]
    pub planner: PlannerArgs,
    /// Write the plan this run trains with (after --output-mode) as JSON before the
    /// first step; `--plan PLAN.json` trains with it again. An existing file is kept
    /// unless --force.
    #[arg(long, value_name = "PLAN.json")]
    pub plan_out: Option<PathBuf>,
    /// Learning rate of every table's optimizer (--table-opt), FTRL's alpha: sgd
    /// updates a row by `row -= lr * g`, rowwise-adagrad by `row -= lr * g / (sqrt(G) +
    /// 1e-8)` with G the row's running sum of mean squared gradients; the others as in
    /// docs/embed.md, "Optimizers". Times the --lr-warmup/--lr-decay multiplier. Must be
    /// > 0.
    #[arg(long, default_value_t = 0.02)]
    pub table_lr: f32,
    /// The MLP's optimizer, applied once per step to the all-reduced dense gradients:
    /// sgd (no momentum, no state), adagrad (eps 1e-10, accumulators from 0) or adam (PyTorch's defaults: betas 0.9
    /// and 0.999, eps 1e-8; twice adagrad's state).
    #[arg(long, value_enum, default_value_t = DenseOptKind::Adagrad)]
    pub dense_opt: DenseOptKind,
    /// Learning rate of the MLP's optimizer (--dense-opt). Must be > 0.
    #[arg(long, default_value_t = 0.002)]
    pub dense_lr: f32,
    #[command(flatten)]
    pub optim: OptimArgs,
    /// The kernel of the MLP's matrix products, most of a step: auto (torusrec's
    /// AVX-512 kernel where the CPU has AVX-512F, else OpenBLAS), openblas, or avx512.
    /// They differ in rounding only; each gives the same bits run after run.
    #[arg(long, value_enum, default_value_t = DenseGemmArg::Auto)]
    pub dense_gemm: DenseGemmArg,
    /// How sharded tables' lookups come back: auto (the plan's choice per table: the
    /// planner's cost model for `--plan auto`, `rows` for a placement kind, the file's
    /// for a plan file), rows (distinct rows come back and are pooled here), or pooled
    /// (the owners pool each example's rows and return one vector per example).
    #[arg(long, value_enum, default_value_t = OutputModeArg::Auto)]
    pub output_mode: OutputModeArg,
    /// Send every id occurrence instead of each distinct id once (for comparison).
    #[arg(long)]
    pub no_dedup: bool,
    /// Overlap the next step's lookup with this step's dense phase (the next step then
    /// sees tables one step stale). A checkpoint ends the overlap at its step (the next
    /// lookup is redone on the updated tables), so a run resumed from a periodic
    /// checkpoint has the bits of the uninterrupted one; one resumed from a preemption
    /// checkpoint continues as if a periodic checkpoint had been due at that step.
    #[arg(long)]
    pub pipeline: bool,
    /// Held-out examples for AUC and log loss.
    #[arg(long, value_name = "N", default_value_t = 16384)]
    pub eval_examples: u64,
    /// Generate or read every rank's training examples before the first step (as
    /// benchmark peers do), so that steps are timed without data generation.
    #[arg(long)]
    pub preload: bool,
    /// Evaluate every S steps (0: only at the end).
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub eval_every: u64,
    /// A progress line every S steps.
    #[arg(long, value_name = "S", default_value_t = 10)]
    pub log_every: u64,
    /// Seed of the initial table rows and MLP weights (drawn per table and id, and per
    /// layer: the same at any rank count and plan) and, without --data, of the
    /// generated examples (training and held-out, and the planted model behind their
    /// labels). A --stats file is reused only for the same seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The planted model behind generated examples' labels: linear or
    /// fm[:RANK[:SCALE]] (as `generate clicks --planted`). Not with --data.
    #[arg(long, value_name = "MODEL", default_value = "linear",
          value_parser = super::parse_planted, conflicts_with = "data")]
    pub planted: crate::data::clicks::gen::Planted,
    /// Rayon threads per rank (default: cores divided by the ranks on this node; at
    /// most 8 per core).
    #[arg(long, value_parser = parse_threads)]
    pub threads: Option<usize>,
    /// Append one JSON object per interval (and a final one) to this file.
    #[arg(long, value_name = "run.jsonl")]
    pub metrics: Option<PathBuf>,
    /// Write the trained tables and MLP here (HDF5).
    #[arg(long, value_name = "model.h5")]
    pub out: Option<PathBuf>,
    /// Overwrite an existing --out or --plan-out.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub checkpoint: CheckpointArgs,
    /// Checkpoint every N steps (0: only on preemption and at the end).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        requires = "checkpoint_dir"
    )]
    pub checkpoint_every: u64,
    /// Every N-th checkpoint is full, the others incremental: only the rows changed
    /// since the previous checkpoint (with their optimizer state) and the whole MLP,
    /// on a chain that restores exactly (docs/embed.md, "Incremental checkpoints").
    /// 1: every checkpoint full. Not with hash tables.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        requires = "checkpoint_dir"
    )]
    pub checkpoint_full_every: u64,
    /// The rows' dtype in incremental checkpoints: f32 (exact), bf16 or int8 (both
    /// LOSSY: rows rounded to bfloat16, or quantised to 8 bits between each row's
    /// minimum and maximum as in Check-N-Run; a resume from such a chain is not bit
    /// for bit). The optimizer state stays f32.
    #[arg(long, value_enum, default_value_t = DeltaDtype::F32, requires = "checkpoint_dir")]
    pub ckpt_delta_dtype: DeltaDtype,
}

/// The checkpoint flags of a training run, one set for every workload. Each workload
/// keeps its own `--checkpoint-every`, whose unit and default differ (ALS: half-epochs,
/// 2; embed: steps, 0). (Not a const generic default: clap keeps a derived default in
/// one static per function, shared by every instantiation.)
#[derive(Debug, Clone, Args)]
pub struct CheckpointArgs {
    /// Write checkpoints (and the training hold) into this directory.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Keep the newest K checkpoints.
    #[arg(
        long,
        value_name = "K",
        default_value_t = 3,
        requires = "checkpoint_dir"
    )]
    pub keep: usize,
    /// `auto`: continue from the newest checkpoint in --checkpoint-dir (fresh if none);
    /// or a checkpoint file.
    #[arg(long, value_name = "auto|PATH")]
    pub resume: Option<String>,
    /// Start even though HOLD.json is in the checkpoint directory (it is kept, renamed).
    #[arg(long, requires = "checkpoint_dir")]
    pub release_hold: bool,
}

impl CheckpointArgs {
    /// The checkpoint settings these flags give, with the workload's own
    /// `--checkpoint-every` and `--wait-for-data` (or 0).
    pub fn config(&self, every: u64, wait_for_data: f64) -> crate::ckpt::CheckpointConfig {
        use crate::ckpt::Resume;
        crate::ckpt::CheckpointConfig {
            dir: self.checkpoint_dir.clone(),
            every,
            keep: self.keep,
            resume: match self.resume.as_deref() {
                None => Resume::No,
                Some("auto") => Resume::Auto,
                Some(p) => Resume::Path(PathBuf::from(p)),
            },
            release_hold: self.release_hold,
            wait_for_data,
        }
    }
}

/// What the cost-based planner plans with: one set of flags for `embed` and `plan`.
#[derive(Debug, Clone, Args)]
pub struct PlannerArgs {
    /// Memory for tables and optimizer state per rank (e.g. 8G, 512M): a plan must
    /// fit it, and `embed` refuses to start a plan that does not.
    #[arg(long, value_name = "BYTES")]
    pub mem_per_rank: Option<String>,
    /// The tables' optimizer (its state per row counts against --mem-per-rank):
    /// sgd (no state), rowwise-adagrad (FBGEMM's: 1 float per row), adagrad (per
    /// element: dim floats per row), adam (per element: 2 dim), rowwise-adam (FBGEMM's
    /// partial row-wise Adam: dim + 1), ftrl (FTRL-proximal: 2 dim). Per-element
    /// optimizers refuse column-wise placement. See docs/embed.md, "Optimizers".
    #[arg(long, value_enum, default_value_t = TableOptKind::RowwiseAdagrad)]
    pub table_opt: TableOptKind,
    /// Batch statistics for the planner: reused when they match the model, seed,
    /// batch and ranks; otherwise measured on sampled batches and written here.
    #[arg(long, value_name = "stats.json")]
    pub stats: Option<PathBuf>,
    /// The planner's machine constants (JSON object with any of net_bw,
    /// allreduce_bw, mem_bw in bytes/s, lookup_s, shard_s in seconds, line_bytes; a
    /// missing one keeps its default).
    #[arg(long, value_name = "COST.json")]
    pub cost_model: Option<PathBuf>,
    /// Measured costs from `torusrec calibrate`: the planner plans with their fit and
    /// each plan's seconds per step are predicted. `embed` prints `plan: ... predicted
    /// step S s` at the start and, at the end, the measured seconds per step and each
    /// rank's busy seconds in the embedding phases (both also in --metrics).
    #[arg(long, value_name = "costs.json", conflicts_with = "cost_model")]
    pub costs: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Ranks to plan for.
    #[arg(long, value_name = "P")]
    pub ranks: usize,
    /// Examples per rank per batch.
    #[arg(long, default_value_t = 2048)]
    pub batch: usize,
    #[command(flatten)]
    pub planner: PlannerArgs,
    /// The plan --out writes: auto (the planner) or a heuristic (random,
    /// size-greedy, dim-greedy, lookup-greedy), for comparing them in `embed`.
    #[arg(long, value_name = "NAME", requires = "out")]
    pub method: Option<String>,
    /// Batches sampled to measure the statistics.
    #[arg(long, default_value_t = 4)]
    pub sample_batches: usize,
    /// Estimate the statistics from the Zipf law instead of sampling batches (no
    /// measurement, so not with --stats).
    #[arg(long, conflicts_with = "stats")]
    pub estimate: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the plan (JSON) here.
    #[arg(long, value_name = "PLAN.json")]
    pub out: Option<PathBuf>,
    /// Overwrite an existing --out.
    #[arg(long)]
    pub force: bool,
    /// Instead of planning the model, compare the planner with the heuristics on N
    /// table tasks sampled from it (10 to 30 tables each, as in AutoShard/DreamShard).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub tasks: usize,
}
