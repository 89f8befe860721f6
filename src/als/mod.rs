//! ALX-style distributed iALS: rows and columns sharded by non-zeros, Gramians
//! all-reduced once per half-epoch, the fixed table's needed rows moved by a
//! deduplicating all-to-all (or ALX's all-gather, as the baseline), rows solved by
//! batched CG or exact Cholesky, and exact Recall@K over all test rows or a seeded sample of them.

pub mod checkpoint;
pub mod eval;
pub mod model;
pub mod recommend;
pub mod shard;
pub mod solve;
pub mod train;
pub mod tune;

use serde::{Deserialize, Serialize};
pub use shard::exchange::ExchangeKind;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum SolverKind {
    /// Conjugate gradient warm-started from the current embedding (implicit matrix).
    Cg,
    /// Form A_u and solve it exactly (the reference).
    Cholesky,
}

/// The basis the tables are trained in (`--basis`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BasisKind {
    /// `eigen` where it applies (CG with f32 tables and at least 2 steps), else `fixed`.
    #[default]
    Auto,
    /// Before each half-epoch rotate both tables into the eigenbasis of the fixed
    /// side's Gramian, so CG's Gramian term is diagonal (the same model and objective;
    /// the tables are turned back into the starting basis when training ends).
    Eigen,
    /// Keep the starting basis; every CG matvec multiplies by the dense Gramian.
    Fixed,
}

/// How an observed cell's stored weight `r` becomes its confidence `c` in the observed
/// term of the objective (`--confidence`, Hu, Koren and Volinsky 2008; see
/// `docs/als.md`). `Binary` ignores the weights (`c = 1`, the code path of every run
/// before weights existed, bit for bit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Confidence {
    /// `c = 1` for every observed cell.
    #[default]
    Binary,
    /// `c = 1 + alpha * r`.
    Linear { alpha: f32 },
    /// `c = 1 + alpha * ln(1 + r / eps)`.
    Log { alpha: f32, eps: f32 },
}

impl Confidence {
    /// The confidence of a stored weight `r` (computed in f64, rounded once to f32).
    pub fn of(self, r: f32) -> f32 {
        let r = f64::from(r);
        match self {
            Confidence::Binary => 1.0,
            Confidence::Linear { alpha } => (1.0 + f64::from(alpha) * r) as f32,
            Confidence::Log { alpha, eps } => {
                (1.0 + f64::from(alpha) * (r / f64::from(eps)).ln_1p()) as f32
            }
        }
    }

    /// Whether the stored weights are read (every setting but `binary`).
    pub fn weighted(self) -> bool {
        self != Confidence::Binary
    }
}

impl std::fmt::Display for Confidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Confidence::Binary => write!(f, "binary"),
            Confidence::Linear { alpha } => write!(f, "linear:{alpha}"),
            Confidence::Log { alpha, eps } => write!(f, "log:{alpha},{eps}"),
        }
    }
}

impl std::str::FromStr for Confidence {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let num = |what: &str, v: &str| -> Result<f32, String> {
            match v.trim().parse::<f32>() {
                Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
                Ok(_) => Err(format!("{what} in {s:?} must be a finite number > 0")),
                Err(_) => Err(format!("{what} in {s:?} is not a number")),
            }
        };
        let bad =
            || format!("{s:?}: expected binary, linear:ALPHA or log:ALPHA,EPS (ALPHA, EPS > 0)");
        if s == "binary" {
            return Ok(Confidence::Binary);
        }
        if let Some(a) = s.strip_prefix("linear:") {
            return Ok(Confidence::Linear {
                alpha: num("ALPHA", a)?,
            });
        }
        if let Some(rest) = s.strip_prefix("log:") {
            let (a, e) = rest.split_once(',').ok_or_else(bad)?;
            return Ok(Confidence::Log {
                alpha: num("ALPHA", a)?,
                eps: num("EPS", e)?,
            });
        }
        Err(bad())
    }
}

impl From<Confidence> for String {
    fn from(c: Confidence) -> String {
        c.to_string()
    }
}

impl TryFrom<String> for Confidence {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// The defaults of `als`'s flags, shared by the command line (`cli::AlsArgs`), by
/// [`AlsConfig::new`] and by the `tune` flags that mean the same.
pub mod defaults {
    use super::{BasisKind, ExchangeKind, SolverKind};
    use crate::bf16::TableDtype;

    pub const DIM: usize = 128;
    pub const EPOCHS: usize = 16;
    /// `--reg` and `--unobserved-weight` when neither the command line nor the caller
    /// sets them depend on the matrix ([`for_matrix`]); these are a link graph's, the
    /// data `als` is most often given (evidence in docs/als.md, "Defaults").
    pub const REG: f32 = 0.001;
    pub const UNOBSERVED_WEIGHT: f32 = 0.001;
    /// A users x items matrix's `--reg` and `--unobserved-weight` (docs/als.md).
    pub const USER_ITEM_REG: f32 = 0.01;
    pub const USER_ITEM_UNOBSERVED_WEIGHT: f32 = 0.1;
    pub const SOLVER: SolverKind = SolverKind::Cg;
    pub const CG_STEPS: usize = 3;
    pub const EXCHANGE: ExchangeKind = ExchangeKind::Dedup;
    pub const EVAL_EVERY: usize = 0;
    pub const SEED: u64 = 42;
    pub const INIT_STD: f32 = 0.1;
    pub const HUB_CHUNK: usize = 8192;
    pub const STEP_NNZ: u64 = 1_000_000;
    /// Half-epochs between checkpoints.
    pub const CHECKPOINT_EVERY: u64 = 2;

    /// The kind of matrix a prepared dataset holds, which picks the defaults of
    /// `--reg` and `--unobserved-weight`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum MatrixKind {
        /// A square link graph (`prepare`, `generate webgraph`).
        LinkGraph,
        /// Users x items (`prepare --matrix user-item`).
        UserItem,
    }

    impl MatrixKind {
        /// Its name in the first line of `als`.
        pub fn name(self) -> &'static str {
            match self {
                MatrixKind::LinkGraph => "link graph",
                MatrixKind::UserItem => "user-item",
            }
        }
    }

    /// `(reg, unobserved_weight)` by default on a matrix of this kind.
    pub fn for_matrix(kind: MatrixKind) -> (f32, f32) {
        match kind {
            MatrixKind::LinkGraph => (REG, UNOBSERVED_WEIGHT),
            MatrixKind::UserItem => (USER_ITEM_REG, USER_ITEM_UNOBSERVED_WEIGHT),
        }
    }
    pub const TABLE_DTYPE: TableDtype = TableDtype::F32;
    pub const BASIS: BasisKind = BasisKind::Auto;
}

/// A validated training configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlsConfig {
    pub data: PathBuf,
    pub dim: usize,
    pub epochs: usize,
    pub reg: f32,
    pub unobserved_weight: f32,
    /// How the stored weights become confidences (`--confidence`).
    #[serde(default)]
    pub confidence: Confidence,
    pub solver: SolverKind,
    pub cg_steps: usize,
    pub exchange: ExchangeKind,
    pub eval_every: usize,
    /// Which test rows an evaluation scores (`--eval-rows`).
    #[serde(default)]
    pub eval_rows: eval::EvalRows,
    pub seed: u64,
    pub init_std: f32,
    /// Rows longer than this have their observed term computed in parallel chunks.
    pub hub_chunk: usize,
    pub out: Option<PathBuf>,
    pub metrics: Option<PathBuf>,
    pub force: bool,
    /// A step (the unit between preemption checks) covers about this many non-zeros
    /// of a half-epoch; the count of steps depends only on the data.
    pub step_nnz: u64,
    /// Also compute the exact loss after each row half-epoch (costs one more pass
    /// over the observed cells).
    pub loss_every_half: bool,
    pub checkpoint: CheckpointConfig,
    /// The element type tables are stored, exchanged and checkpointed in.
    #[serde(default)]
    pub table_dtype: crate::bf16::TableDtype,
    /// Refuse, before allocating, a run whose estimated memory per rank exceeds this
    /// many bytes (`None`: the node's memory divided by the ranks on it).
    #[serde(default)]
    pub mem_per_rank: Option<u64>,
    /// The basis the tables are trained in.
    #[serde(default)]
    pub basis: BasisKind,
    /// Where the training CSR lives and how much of the fixed table is gathered at once.
    #[serde(default)]
    pub memory: MemoryConfig,
}

/// Out-of-core settings (`--csr-buffer`, `--gather-buffer`, `--spill-dir`); they change
/// memory and I/O, never the numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryConfig {
    /// Bytes of training CSR indices a rank holds: every rank's CSR in memory when it
    /// fits, else spilled and read back in chunks of at most half of it.
    pub csr_buffer: u64,
    pub gather_buffer: shard::memory::GatherBuffer,
    /// Directory of the per-rank spill files (`None`: the system's temporary directory).
    pub spill_dir: Option<PathBuf>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            csr_buffer: shard::spill::DEFAULT_CSR_BUFFER,
            gather_buffer: shard::memory::GatherBuffer::Auto,
            spill_dir: None,
        }
    }
}

pub use crate::ckpt::{CheckpointConfig, Resume, MAX_WAIT_SECS};

impl AlsConfig {
    /// `als --data <data>` with every other flag at its default ([`defaults`]).
    pub fn new(data: impl Into<PathBuf>) -> Self {
        Self {
            data: data.into(),
            dim: defaults::DIM,
            epochs: defaults::EPOCHS,
            reg: defaults::REG,
            unobserved_weight: defaults::UNOBSERVED_WEIGHT,
            confidence: Confidence::Binary,
            solver: defaults::SOLVER,
            cg_steps: defaults::CG_STEPS,
            exchange: defaults::EXCHANGE,
            eval_every: defaults::EVAL_EVERY,
            eval_rows: eval::EvalRows::Sample(eval::DEFAULT_EVAL_ROWS),
            seed: defaults::SEED,
            init_std: defaults::INIT_STD,
            hub_chunk: defaults::HUB_CHUNK,
            out: None,
            metrics: None,
            force: false,
            step_nnz: defaults::STEP_NNZ,
            loss_every_half: false,
            checkpoint: CheckpointConfig {
                every: defaults::CHECKPOINT_EVERY,
                ..CheckpointConfig::default()
            },
            table_dtype: defaults::TABLE_DTYPE,
            mem_per_rank: None,
            basis: defaults::BASIS,
            memory: MemoryConfig::default(),
        }
    }

    /// Check values that do not depend on the data (rank-local, identical everywhere).
    pub fn validate(&self) -> crate::Result<()> {
        use crate::Error::Config;
        if self.dim == 0 || self.dim > 4096 {
            return Err(Config(format!(
                "--dim {}: must be between 1 and 4096",
                self.dim
            )));
        }
        if self.epochs == 0 {
            return Err(Config("--epochs 0: train at least one epoch".into()));
        }
        if !(self.reg.is_finite() && self.reg >= 0.0) {
            return Err(Config(format!(
                "--reg {}: must be a finite number >= 0",
                self.reg
            )));
        }
        if !(self.unobserved_weight.is_finite() && self.unobserved_weight >= 0.0) {
            return Err(Config(format!(
                "--unobserved-weight {}: must be a finite number >= 0",
                self.unobserved_weight
            )));
        }
        if self.reg == 0.0 && self.unobserved_weight == 0.0 {
            return Err(Config(
                "--reg 0 with --unobserved-weight 0 leaves the systems singular; make one positive"
                    .into(),
            ));
        }
        if self.solver == SolverKind::Cg && self.cg_steps == 0 {
            return Err(Config("--cg-steps 0: CG needs at least one step".into()));
        }
        if !(self.init_std.is_finite() && self.init_std > 0.0) {
            return Err(Config(format!(
                "--init-std {}: must be positive",
                self.init_std
            )));
        }
        if self.basis == BasisKind::Eigen {
            if self.solver != SolverKind::Cg {
                return Err(Config(
                    "--basis eigen: only the CG solver uses it (Cholesky forms each A_u in full); use --basis fixed or auto".into(),
                ));
            }
            if self.table_dtype != crate::bf16::TableDtype::F32 {
                return Err(Config(format!(
                    "--basis eigen with --table-dtype {}: rotating the stored tables would round them again every half-epoch; use --basis fixed or auto",
                    self.table_dtype
                )));
            }
        }
        if self.step_nnz == 0 {
            return Err(Config("--step-nnz 0: must be positive".into()));
        }
        self.checkpoint.validate()?;
        if self.eval_rows == eval::EvalRows::Sample(0) {
            return Err(Config(
                "--eval-rows 0: evaluate at least one row (or `all`)".into(),
            ));
        }
        if self.memory.csr_buffer < 1 << 10 {
            return Err(Config(format!(
                "--csr-buffer {}: must be at least 1 KiB",
                self.memory.csr_buffer
            )));
        }
        if let Some(dir) = &self.memory.spill_dir {
            if !dir.is_dir() {
                return Err(Config(format!(
                    "--spill-dir {}: not a directory",
                    dir.display()
                )));
            }
            crate::io::outfile::probe_writable(&dir.join("torusrec-spill")).map_err(|e| {
                Config(format!("--spill-dir {}: not writable ({e})", dir.display()))
            })?;
        }
        if self.hub_chunk == 0 {
            return Err(Config("--hub-chunk 0: must be positive".into()));
        }
        // A resumed run may overwrite the model its first attempt wrote.
        if let Some(out) = &self.out {
            if !self.checkpoint.continues_a_run() {
                crate::io::outfile::check_output(out, self.force)?;
            }
            crate::io::outfile::check_apart(out, &[("--data", &self.data)])?;
        }
        Ok(())
    }
}

impl AlsConfig {
    /// Whether the tables are trained in the eigenbasis of the fixed side's Gramian
    /// (`--basis`; `auto`: CG with f32 tables and at least 2 steps, where one rotation
    /// per row replaces `cg_steps + 1` dense Gramian products).
    pub fn eigenbasis(&self) -> bool {
        match self.basis {
            BasisKind::Eigen => true,
            BasisKind::Fixed => false,
            BasisKind::Auto => {
                self.solver == SolverKind::Cg
                    && self.cg_steps >= 2
                    && self.table_dtype == crate::bf16::TableDtype::F32
            }
        }
    }

    /// A hash of the settings that change the numbers: resuming under another value
    /// of any of them would not continue the same run.
    pub fn result_hash(&self) -> String {
        let mut key = serde_json::json!({
            "dim": self.dim, "reg": self.reg, "unobserved_weight": self.unobserved_weight,
            "solver": self.solver, "cg_steps": self.cg_steps, "seed": self.seed,
            "init_std": self.init_std, "hub_chunk": self.hub_chunk, "step_nnz": self.step_nnz,
        });
        // Binary runs keep the hashes they had before confidences existed.
        if self.confidence.weighted() {
            key["confidence"] = serde_json::json!(self.confidence.to_string());
        }
        // f32 runs keep the hashes they had before bf16 tables existed.
        if self.table_dtype != crate::bf16::TableDtype::F32 {
            key["table_dtype"] = serde_json::json!(self.table_dtype);
        }
        if self.eigenbasis() {
            key["basis"] = serde_json::json!("eigen");
        }
        format!("{:016x}", crate::ckpt::hash_str(&key.to_string()))
    }
}
