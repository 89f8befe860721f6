//! The command line: raw flags, parsed identically on every rank before any
//! collective, then turned into validated configs by each subcommand.

use crate::data::clicks::gen::Planted;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

mod als;
mod embed;
mod predict;
mod recommend;
mod tune;

pub use als::AlsArgs;
pub use embed::{
    ArchArg, ArchArgs, CheckpointArgs, DcnStructureArg, DenseOptKind, EmbedArgs, LrDecayArg,
    OptimArgs, PlanArgs, PlannerArgs, TableOptKind, VocabArg,
};
pub use predict::PredictArgs;
pub use recommend::RecommendArgs;
pub use tune::TuneArgs;

/// torusrec: ALX-style iALS and sharded embedding training on a simulated TPU torus.
///
/// One SPMD binary: launch it with `mpirun -np P torusrec ...` (or `srun` in an sbatch
/// script). Every rank plays one chip of a periodic torus. Exit codes: 0 finished,
/// 2 bad command line or input, 75 preempted with a checkpoint, 76 training hold,
/// 77 a peer rank or host lost (--comm-timeout), 1 other failure.
#[derive(Debug, Parser)]
#[command(name = "torusrec", version, about, long_about)]
pub struct Cli {
    /// Torus shape, e.g. 4x2 or 4x2x2; must multiply to the number of ranks.
    /// Default: MPI_Dims_create in two dimensions.
    #[arg(long, global = true, value_name = "AxB[xC]")]
    pub torus: Option<String>,

    /// Collective algorithms: torus (neighbour exchanges only: bidirectional rings per
    /// dimension for all-reduce and all-gather, dimension-ordered routing for
    /// all-to-all-v, as a TPU's interconnect runs them) or mpi (the MPI library's;
    /// per-link traffic then computed under dimension-ordered routing). Default: torus
    /// when a dimension has 3 or more ranks, else mpi.
    #[arg(long, global = true, value_name = "torus|mpi")]
    pub collectives: Option<String>,

    /// Seconds one MPI call may stay in flight before this rank decides a peer or its
    /// link is lost: it then names the ranks and hosts that do not answer a liveness
    /// probe and exits 77 (docs/cluster.md). 0 turns the timeout off (a rank the MPI
    /// library ends mid-call still names the lost ranks). Default 600.
    #[arg(long, global = true, value_name = "SECONDS")]
    pub comm_timeout: Option<f64>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build a WebGraph variant (ALX protocol) from a graph file and write the
    /// prepared HDF5 dataset with its strong-generalization split; `prepare clicks`
    /// turns Criteo-format text files into a click log.
    Prepare(PrepareCmd),
    /// Generate synthetic data straight into a prepared dataset.
    #[command(subcommand)]
    Generate(GenerateCommand),
    /// Print a prepared dataset's sizes, degree statistics and split, and validate it
    /// against the layout (exit 2 if it does not match).
    Inspect(InspectArgs),
    /// Train iALS (ALX objective) on a prepared dataset.
    Als(AlsArgs),
    /// Search iALS's --reg and --unobserved-weight by Recall@20 on a validation split
    /// of the training rows (grid or successive halving within an epoch budget); print
    /// the table and the `als` command of the best; --train-final trains it and reports
    /// its test recall. A preempted tune saves nothing and exits 1 (not 75); a rerun
    /// starts over.
    Tune(TuneArgs),
    /// Train the sharded embedding (click-through) model: tables placed by table, row
    /// or column across ranks, deduplicated all-to-all lookups, data-parallel MLP
    /// with gradient accumulation.
    Embed(Box<EmbedArgs>),
    /// Place a model's tables on P ranks with the cost model (greedy + local search)
    /// and compare with the random, size-, dim- and lookup-greedy heuristics.
    Plan(PlanArgs),
    /// Measure, under mpirun at the rank count to plan for, the kernels and
    /// collectives the planner prices (gather-pool and scatter-update per width,
    /// pooling and id distribution, alone and several tables together; the MLP step
    /// per shape; all-to-all and all-reduce per message size) and write them with
    /// their conditions and fit as JSON, for `plan --costs` and `embed --costs`.
    Calibrate(CalibrateArgs),
    /// Check the communicator: collectives with answers known from rank and size,
    /// and each rank's torus coordinates and neighbours.
    Selftest(SelftestArgs),
    /// Draw SVG charts of training runs or of a benchmark table (one process, no MPI).
    ///
    /// Runs: `torusrec plot a.jsonl b.jsonl --out run.svg` reads metrics files written by
    /// `als --metrics` (lines with "epoch") or `embed --metrics` (lines with "step"; all
    /// files of one kind) and draws one panel each for the loss, the quality (Recall@20
    /// for als, eval AUC for embed, when present) and the throughput (edges/s, examples/s)
    /// against the epoch or step, one series per file (legend: the file's stem, or
    /// --label).
    ///
    /// Table: `torusrec plot --table t.tsv --x P --y seconds --series variant --out t.svg`
    /// reads a table with a header row (tab-separated, or comma-separated for .csv; lines
    /// starting with # are skipped) and draws --y against --x, one series per distinct
    /// value of --series: lines when x is numeric, else grouped bars (--kind). Cells that
    /// are empty, "-" or "n/a" are left out; --where COL=VALUE keeps matching rows only.
    ///
    /// Output: SVG only (no fonts embedded; text is drawn by the viewer). An existing
    /// --out is refused without --force.
    #[command(verbatim_doc_comment)]
    Plot(PlotArgs),
    /// Project iALS onto TPU-like tori: per-link bytes of every phase (exact from a
    /// prepared dataset, or expected under the WebGraph generator's degree model),
    /// time per epoch split into compute and communication, and memory per chip, for
    /// a range of torus shapes of a chip preset (v3, v4, v5e) or of this machine.
    /// `project measure` (under mpirun) calibrates this machine and checks the
    /// projection against a measured run.
    #[command(subcommand)]
    Project(ProjectCommand),
    /// The top-K columns (neighbours) of rows of a trained model (`als --out`): rows
    /// given by original node id (--nodes, --nodes-file), every test row (--test) or
    /// every row (--all); seen arcs excluded, test rows folded in as evaluation does.
    /// Output: TSV `node rank neighbour score` (stdout or --out F.tsv) or HDF5
    /// (--out F.h5: /rows, /topk, /scores).
    Recommend(RecommendArgs),
    /// Score examples with a trained embedding model (`embed --out M.h5`): one line per
    /// example in input order, its click probability and label, to --out; AUC and log
    /// loss on stdout. Any rank count (each scores a contiguous block); an id a hash
    /// table does not hold looks up zeros. See docs/predict.md.
    Predict(PredictArgs),
}

/// `torusrec project ...`.
#[derive(Debug, Subcommand)]
pub enum ProjectCommand {
    /// Project iALS epochs onto torus shapes (one process does the work).
    Als(ProjectAlsArgs),
    /// Project steps of the sharded embedding model onto torus shapes: the planner's
    /// placement at each chip count, the expected per-link bytes of its lookups,
    /// backward and dense all-reduce, compute and memory per chip.
    Embed(ProjectEmbedArgs),
    /// Under mpirun at the shape to measure: fit this machine's link latency and
    /// bandwidth, its matrix-multiply peak and iALS solve rate; train a few epochs with
    /// the torus collectives and compare every rank's per-link bytes and messages, and
    /// the communication seconds, with the projection of the same run. Writes the
    /// calibration (JSON) that `project als --calibration` reads. Exit 1 if the
    /// projected link bytes differ from the measured ones.
    Measure(ProjectMeasureArgs),
}

/// The chip, its torus shapes and the table output, shared by `project als|embed`.
#[derive(Debug, Args, Clone)]
pub struct ChipArgs {
    /// Chip preset (v3, v4, v5e) or `here` (this machine, from --calibration).
    #[arg(long, default_value = "v3")]
    pub chip: String,
    /// Calibration from `project measure`: the iALS solve rate (scaled by the chip's
    /// peak) and, for --chip here, the link parameters. Without it, `als` prints no
    /// compute time.
    #[arg(long, value_name = "C.json")]
    pub calibration: Option<PathBuf>,
    /// Torus shapes, comma-separated (e.g. 4x4,8x8,8x16). Default: from 2x2 (2x2x1)
    /// doubling up to the chip's pod.
    #[arg(long, value_name = "AxB,...")]
    pub shapes: Option<String>,
    /// Override the chip's peak (TFLOP/s).
    #[arg(long, value_name = "X")]
    pub peak_tflops: Option<f64>,
    /// Override the chip's memory (GiB).
    #[arg(long, value_name = "X")]
    pub memory_gib: Option<f64>,
    /// Override the chip's memory bandwidth (GB/s), which bounds the row gathers.
    #[arg(long, value_name = "X")]
    pub memory_gbs: Option<f64>,
    /// Override the one-way bandwidth of a link (GB/s).
    #[arg(long, value_name = "X")]
    pub link_gbs: Option<f64>,
    /// Override the latency of a message on a link (microseconds).
    #[arg(long, value_name = "X")]
    pub link_latency_us: Option<f64>,
    /// Also write the table as TSV (for `torusrec plot --table`).
    #[arg(long, value_name = "T.tsv")]
    pub tsv: Option<PathBuf>,
    /// Overwrite an existing --tsv.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args, Clone)]
#[command(group(clap::ArgGroup::new("workload").required(true).args(["data", "webgraph"])))]
pub struct ProjectAlsArgs {
    /// A prepared dataset: exact per-link bytes from its training arcs.
    #[arg(long, value_name = "D.h5")]
    pub data: Option<PathBuf>,
    /// A WebGraph preset (in-dense, in-sparse, de-dense, de-sparse, dense, sparse):
    /// expected bytes under the generator's degree model.
    #[arg(long, value_name = "PRESET")]
    pub webgraph: Option<String>,
    /// Scale of the preset's sizes (--webgraph only).
    // Not `requires = "webgraph"`: clap 4 lets that through beside the required
    // `workload` group, and --data then ignored the flag.
    #[arg(long, default_value_t = 1.0, conflicts_with = "data")]
    pub scale: f64,
    /// The generator's seed (as `generate webgraph --seed`; --webgraph only).
    #[arg(long, default_value_t = 42, conflicts_with = "data")]
    pub seed: u64,
    #[arg(long, default_value_t = 128)]
    pub dim: usize,
    #[arg(long, value_enum, default_value_t = crate::bf16::TableDtype::F32)]
    pub table_dtype: crate::bf16::TableDtype,
    /// Exchange schemes to project (dedup: ours; allgather: ALX's).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "dedup,allgather"
    )]
    pub exchange: Vec<crate::als::ExchangeKind>,
    #[arg(long, default_value_t = 3)]
    pub cg_steps: usize,
    /// As `als --step-nnz` (one agreement per step).
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub step_nnz: u64,
    /// Measured costs from `torusrec calibrate`: with --webgraph sparse or dense,
    /// also project ALX's scheme at the collective and row-gather rates measured
    /// here, beside the published point.
    #[arg(long, value_name = "costs.json", requires = "webgraph")]
    pub costs: Option<PathBuf>,
    #[command(flatten)]
    pub chip: ChipArgs,
}

#[derive(Debug, Args)]
pub struct ProjectEmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Examples per chip and step.
    #[arg(long, default_value_t = 2048)]
    pub batch: usize,
    /// The tables' optimizer (its state per row counts in memory).
    #[arg(long, value_enum, default_value_t = TableOptKind::RowwiseAdagrad)]
    pub table_opt: TableOptKind,
    /// Batch statistics from the model's analytic estimate instead of sampling the
    /// click generator.
    #[arg(long)]
    pub estimate: bool,
    /// Seed of the click generator sampled for the statistics (not with --estimate,
    /// which samples nothing).
    #[arg(long, default_value_t = 1, conflicts_with = "estimate")]
    pub seed: u64,
    #[command(flatten)]
    pub chip: ChipArgs,
}

#[derive(Debug, Args, Clone)]
pub struct ProjectMeasureArgs {
    /// A prepared dataset to train on.
    #[arg(long, value_name = "D.h5")]
    pub data: PathBuf,
    #[arg(long, default_value_t = 64)]
    pub dim: usize,
    /// Epochs measured (after the set-up).
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    #[arg(long, default_value_t = 3)]
    pub cg_steps: usize,
    #[arg(long, value_enum, default_value_t = crate::als::ExchangeKind::Dedup)]
    pub exchange: crate::als::ExchangeKind,
    /// Rayon threads per rank (default: the cores divided by the ranks on the node).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write the calibration here (JSON).
    #[arg(long, value_name = "C.json")]
    pub out: PathBuf,
    /// Overwrite an existing --out.
    #[arg(long)]
    pub force: bool,
}

/// `torusrec calibrate`.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Write the measurements here (JSON, schema torusrec-costs-v1).
    #[arg(long, value_name = "costs.json")]
    pub out: PathBuf,
    /// Overwrite an existing --out.
    #[arg(long)]
    pub force: bool,
    /// A few small points only (seconds; for tests, not for planning).
    #[arg(long)]
    pub quick: bool,
    /// Timed calls per point (default: 5, 3 with --quick).
    #[arg(long, value_name = "N")]
    pub reps: Option<usize>,
    /// Rayon threads per rank, recorded with the measurements (default: cores
    /// divided by the ranks on this node).
    #[arg(long, value_parser = parse_threads)]
    pub threads: Option<usize>,
}

/// `torusrec selftest`.
#[derive(Debug, Args)]
pub struct SelftestArgs {
    /// Also time all-reduce and all-to-all-v of 64 kB to 64 MB per rank with the MPI
    /// and the torus algorithms (mean of --reps calls, the slowest rank's).
    #[arg(long)]
    pub bench: bool,
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
}

/// `embed --dense-gemm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DenseGemmArg {
    /// torusrec's AVX-512 kernel where the CPU has AVX-512F, else OpenBLAS.
    Auto,
    /// OpenBLAS's sgemm (with the kernels it picks, or `OPENBLAS_CORETYPE`'s).
    Openblas,
    /// torusrec's AVX-512 kernel (refused on a CPU without AVX-512F).
    Avx512,
}

/// `embed --output-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputModeArg {
    Auto,
    Rows,
    Pooled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InputFormat {
    /// WebGraph BV: PATH is the basename (PATH.graph + PATH.properties).
    Bv,
    /// SNAP-style edge list, `src dst` per line, `#`/`%` comments, optional .gz.
    Tsv,
    /// Matrix Market coordinate file (1-based ids).
    Mtx,
    /// The synthetic web-graph generator: PATH is a preset name (see `generate webgraph`).
    Synthetic,
    /// Comma-separated values (only with --matrix user-item).
    Csv,
}

/// `prepare --matrix`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum MatrixKind {
    /// A square link graph (rows and columns the same nodes).
    #[default]
    Graph,
    /// Users x items: separate id spaces, optional weights and times.
    UserItem,
}

/// `prepare --header`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum HeaderArg {
    /// The first line is a header when a weight or time field of it is not a number.
    #[default]
    Auto,
    Yes,
    No,
}

/// `prepare --split` (user-item matrices).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum SplitArg {
    /// ALX's strong generalization: a tenth of the users are test users, a quarter of
    /// each one's items held out, the rest folded in; test users are not trained on.
    #[default]
    Strong,
    /// Leave-last-out by the time column: every user with 2+ interactions holds out its latest.
    Last,
    /// Per interaction: a seeded quarter of the interactions of users with 2+ are held out.
    Random,
}

/// `prepare`: a graph (the flags of [`PrepareArgs`]) or a subcommand.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct PrepareCmd {
    #[command(flatten)]
    pub graph: Option<PrepareArgs>,
    #[command(subcommand)]
    pub command: Option<PrepareCommand>,
}

#[derive(Debug, Subcommand)]
pub enum PrepareCommand {
    /// Turn Criteo-format text files (one per day, plain or .gz) into a keyed click
    /// log for `embed --data`.
    ///
    /// Criteo's format: label (0/1), I1..I13 (integers), C1..C26 (hex), tab-separated,
    /// an empty field is missing. The log (HDF5, schema torusrec-clicks-v2) holds the
    /// dense values as ln(1 + max(x, 0)) (missing: 0) and the categorical values as
    /// 64-bit keys of hash-table vocabularies sized by a HyperLogLog estimate of their
    /// distinct keys.
    ///
    /// Streams in two passes (count, then write), in parallel over ranks: a plain file
    /// is split among the ranks by byte ranges (a line belongs to the rank whose range
    /// holds its first byte); a .gz file cannot be split, so whole .gz files go to the
    /// ranks round-robin. Memory per rank is bounded whatever the input size: about
    /// 8 MiB of text at a time and its parsed columns (~30 MiB), 16 KiB per table for
    /// the estimate, and the gathered per-file counts. Nothing is written unless every
    /// line parses (or --skip-bad-lines allows it); errors name the file and line.
    Clicks(PrepareClicksArgs),
}

/// `prepare clicks --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClicksFormat {
    /// Criteo: label, 13 integer columns, 26 hex categorical columns.
    Criteo,
    /// Tab-separated columns in the order of --columns.
    Tsv,
    /// Comma-separated columns in the order of --columns (RFC 4180 quoting, no line
    /// breaks inside quotes).
    Csv,
}

#[derive(Debug, Args)]
pub struct PrepareClicksArgs {
    /// Input format.
    #[arg(long, value_enum, default_value_t = ClicksFormat::Criteo)]
    pub format: ClicksFormat,
    /// With --format csv|tsv: the columns, comma-separated, positional ROLE[:OPT][*N]
    /// or by header name NAME=ROLE[:OPT] (`*=ROLE` for the rest). Roles: label (0/1),
    /// dense (a number), log (ln(1+max(x,0)) of a number), cat or text (any text,
    /// hashed to a 64-bit key), hex (1-16 hex digits), skip; option list=C: a
    /// multi-hot field of items separated by C. E.g. 'label,log*2,cat:list=|,skip' or
    /// 'click=label,id=skip,*=cat'. A tsv SPEC of only label, dense, cat and skip keeps
    /// its Criteo meaning (dense = integer through ln(1+x), cat = hex) and has no
    /// header. See docs/prepare.md.
    #[arg(long, value_name = "SPEC")]
    pub columns: Option<String>,
    /// With --format csv|tsv: whether each file's first line is a header row (auto:
    /// with NAME=ROLE entries yes, else when the label field of the first file's first
    /// line is not 0 or 1). Every file must then start with the same header.
    #[arg(long, value_enum)]
    pub header: Option<HeaderArg>,
    /// Input files, one per day in the order given (plain text or .gz).
    #[arg(long, value_name = "F", num_args = 1.., required = true)]
    pub input: Vec<PathBuf>,
    /// Output click log (.h5).
    #[arg(long, value_name = "clicks.h5")]
    pub out: PathBuf,
    /// Overwrite an existing output.
    #[arg(long)]
    pub force: bool,
    /// Skip up to N bad lines over all files and ranks (each counted and the first
    /// few reported); more is an error (exit 2).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub skip_bad_lines: u64,
    /// Embedding width of every table in the log's model.
    #[arg(long, value_name = "D", default_value_t = 16)]
    pub dim: usize,
}

#[derive(Debug, Args)]
pub struct PrepareArgs {
    /// Input graph (a basename for bv, a preset name for synthetic).
    #[arg(long, value_name = "PATH")]
    pub input: PathBuf,
    /// Input format.
    #[arg(long, value_enum)]
    pub format: InputFormat,
    /// Keep nodes with at least K in-links and K out-links (ALX: 10 sparse, 50 dense).
    /// Default: 1 for files, 0 (no filter) for synthetic graphs.
    #[arg(long, value_name = "K")]
    pub min_links: Option<u64>,
    /// Seed of the split (and of the generator for synthetic input).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Shrink a synthetic preset: nodes and arcs times F.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub scale: f64,
    /// Output dataset (.h5).
    #[arg(long, value_name = "D.h5")]
    pub out: PathBuf,
    /// Overwrite an existing output.
    #[arg(long)]
    pub force: bool,
    /// What the input is: a square link graph, or a users x items interaction list
    /// (--format tsv|csv|mtx; see docs/prepare.md).
    #[arg(long, value_enum, default_value_t = MatrixKind::Graph)]
    pub matrix: MatrixKind,
    /// User-item: the columns, comma-separated user, item, weight, time or skip
    /// (default: user,item then an optional weight and time, by the field count).
    #[arg(long, value_name = "SPEC")]
    pub columns: Option<String>,
    /// User-item: whether the first line is a header.
    #[arg(long, value_enum, default_value_t = HeaderArg::Auto)]
    pub header: HeaderArg,
    /// User-item: keep users with at least N distinct items (iterated to a fixed
    /// point together with --min-item-interactions).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub min_user_interactions: u64,
    /// User-item: keep items with at least N distinct users (iterated to a fixed point).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub min_item_interactions: u64,
    /// User-item: the test split.
    #[arg(long, value_enum, default_value_t = SplitArg::Strong)]
    pub split: SplitArg,
}

#[derive(Debug, Subcommand)]
pub enum GenerateCommand {
    /// A WebGraph-like link graph from the copying model (hosts as runs of ids,
    /// template and copied link lists, preferential attachment out of the host), its
    /// shape fitted to a real crawl: `--like G` fits it to G and makes G's twin;
    /// presets use the parameters fitted to cnr-2000, at the sizes of ALX's variants:
    /// in-dense (0.5M nodes, 122M arcs), in-sparse (1.5M, 149M), de-dense (5.7M, 824M),
    /// de-sparse (19.7M, 1.19B), dense (136.5M, 22.2B), sparse (365.4M, 29.9B).
    /// `--model independent` is the model before it, with its bits.
    Webgraph(GenerateWebgraphArgs),
    /// A synthetic click log (HDF5) for `embed --data`: examples deterministic from
    /// (seed, example index), Zipf ids per table, labels from a planted model. With
    /// --format criteo: Criteo-format text files DIR/day_0.tsv ... (or, with an .h5
    /// --out, the keyed click log `prepare clicks` makes of them), from the preset's
    /// vocabularies (growing by a tenth a day) and Zipf exponent.
    Clicks(GenerateClicksArgs),
}

/// Which model: a preset, a TOML table file, or (for `embed`) the model of a click log.
#[derive(Debug, Args, Clone)]
pub struct ModelArgs {
    /// A named model: torchrec-peer, dlrm-synthetic, google-ads, small, tiny.
    #[arg(long, value_name = "NAME", conflicts_with = "tables")]
    pub preset: Option<String>,
    /// Vocabularies (and, for the big pools, table counts) of --preset times F.
    #[arg(
        long,
        value_name = "F",
        default_value_t = 1.0,
        requires = "preset",
        conflicts_with = "tables"
    )]
    pub scale: f64,
    /// A TOML model file ([[table]] name, vocab, dim, pooling, valency, valency_dist;
    /// n_dense, hidden, zipf).
    #[arg(long, value_name = "T.toml")]
    pub tables: Option<PathBuf>,
}

/// `generate clicks --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GenerateClicksFormat {
    /// The click log of the model (HDF5, schema torusrec-clicks-v1).
    Log,
    /// Criteo-format text, one file per day (or the keyed log of an .h5 --out).
    Criteo,
}

#[derive(Debug, Args)]
pub struct GenerateClicksArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Examples to write (per day with --format criteo).
    #[arg(long, value_name = "N")]
    pub examples: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output click log (.h5); with --format criteo, a directory for the day files
    /// unless it ends in .h5.
    #[arg(long, value_name = "F.h5|DIR")]
    pub out: PathBuf,
    /// Overwrite an existing output.
    #[arg(long)]
    pub force: bool,
    /// What to write.
    #[arg(long, value_enum, default_value_t = GenerateClicksFormat::Log)]
    pub format: GenerateClicksFormat,
    /// --format criteo: days (files) to write (default 1).
    #[arg(long, value_name = "D")]
    pub days: Option<u64>,
    /// --format criteo with a directory: write day_D.tsv.gz (gzip) files.
    #[arg(long)]
    pub gzip: bool,
    /// --format criteo with an .h5 --out: the tables' width (as `prepare clicks
    /// --dim`; default 16).
    #[arg(long, value_name = "D")]
    pub dim: Option<usize>,
    /// The planted model behind the labels: linear (dense features and per-id
    /// weights), or fm[:RANK[:SCALE]], the linear model plus a factorization machine of
    /// the tables' planted factors (rank 8, scale sqrt(tables) by default), whose labels
    /// need pairwise interactions (docs/generate.md). --format log only.
    #[arg(long, value_name = "MODEL", default_value = "linear", value_parser = parse_planted)]
    pub planted: Planted,
}

/// `--planted`.
pub(crate) fn parse_planted(s: &str) -> std::result::Result<Planted, String> {
    Planted::parse(s).map_err(|e| e.to_string())
}

/// `generate webgraph --model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WebgraphModel {
    /// Hosts as runs of consecutive ids; template links shared by a host's pages,
    /// link lists copied from a prototype page, fresh local links, and links out of
    /// the host by preferential attachment (docs/generate.md).
    Copying,
    /// The model before the copying one (independent Zipf draws inside a host and
    /// globally), with its bits: for old checksums.
    Independent,
}

/// `inspect --format` and `generate webgraph --like G --format`: how G is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// WebGraph BV: G is the basename (G.graph + G.properties).
    Bv,
    /// SNAP-style edge list, `src dst` per line, `#`/`%` comments, optional .gz.
    Tsv,
    /// Matrix Market coordinate file (1-based ids).
    Mtx,
    /// A prepared dataset: the variant's graph (training rows and test rows whole).
    H5,
}

#[derive(Debug, Args)]
pub struct GenerateWebgraphArgs {
    /// Preset name (sizes of ALX's variants; with the copying model, its shape is the
    /// one fitted to cnr-2000 unless --params gives another).
    #[arg(long, conflicts_with_all = ["like", "nodes"])]
    pub preset: Option<String>,
    /// Nodes and arcs times F (with --preset).
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub scale: f64,
    /// Fit the copying model to the real graph G (named as `prepare --input` names it)
    /// from its statistics, and make a twin with G's numbers of nodes and arcs.
    #[arg(long, value_name = "G", conflicts_with_all = ["params", "nodes", "arcs"])]
    pub like: Option<PathBuf>,
    /// How --like's G is stored (default: bv when G.graph exists, mtx for .mtx, h5
    /// for .h5, else tsv).
    #[arg(long, value_enum, requires = "like")]
    pub format: Option<GraphFormat>,
    /// The copying model's parameters (TOML or JSON, as --params-out writes them),
    /// for a graph of another size with the fitted shape.
    #[arg(long, value_name = "F")]
    pub params: Option<PathBuf>,
    /// Write the fitted (or used) parameters to F (.toml or .json).
    #[arg(long, value_name = "F")]
    pub params_out: Option<PathBuf>,
    /// Number of nodes (with --arcs; instead of --preset).
    #[arg(long, value_name = "N", requires = "arcs")]
    pub nodes: Option<u64>,
    /// Number of arcs (with --nodes).
    #[arg(long, value_name = "M", requires = "nodes")]
    pub arcs: Option<u64>,
    /// The generator's model.
    #[arg(long, value_enum, default_value_t = WebgraphModel::Copying)]
    pub model: WebgraphModel,
    /// Seed of the generator and of the split.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Variant filter applied to the generated graph (0: none).
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub min_links: u64,
    /// Output dataset (.h5).
    #[arg(long, value_name = "D.h5")]
    pub out: PathBuf,
    /// Overwrite an existing output (and --params-out).
    #[arg(long)]
    pub force: bool,
}

/// `plot --kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ChartKind {
    /// Lines when every x value is a number, else bars.
    Auto,
    Line,
    Bar,
}

/// `torusrec plot` (the help text is on `Command::Plot`).
#[derive(Debug, Args, Clone)]
pub struct PlotArgs {
    /// Metrics files (JSON lines) of `als --metrics` or `embed --metrics`.
    #[arg(value_name = "RUN.jsonl", conflicts_with = "table")]
    pub runs: Vec<PathBuf>,
    /// A series label per run file, in order (default: the file's stem).
    #[arg(long, value_name = "NAME")]
    pub label: Vec<String>,
    /// Plot a table (TSV, or CSV for .csv) instead of runs.
    #[arg(long, value_name = "T.tsv")]
    pub table: Option<PathBuf>,
    /// Table mode: the column on the x axis.
    #[arg(long, value_name = "COL", requires = "table")]
    pub x: Option<String>,
    /// Table mode: the column on the y axis (numbers).
    #[arg(long, value_name = "COL", requires = "table")]
    pub y: Option<String>,
    /// Table mode: one series (colour) per distinct value of this column.
    #[arg(long, value_name = "COL", requires = "table")]
    pub series: Option<String>,
    /// Table mode: keep only rows whose COL equals VALUE (repeatable; all must hold).
    #[arg(long = "where", value_name = "COL=VALUE", requires = "table")]
    pub filter: Vec<String>,
    /// Table mode: line or bar chart.
    #[arg(long, value_enum, default_value_t = ChartKind::Auto, requires = "table")]
    pub kind: ChartKind,
    /// Logarithmic y axis (values <= 0 are left out).
    #[arg(long)]
    pub log_y: bool,
    /// Chart title (runs: above the first panel).
    #[arg(long)]
    pub title: Option<String>,
    /// Table mode: the y axis title (default: the --y column).
    #[arg(long, value_name = "TEXT", requires = "table")]
    pub ylabel: Option<String>,
    /// Width of the picture in pixels.
    #[arg(long, default_value_t = 800)]
    pub width: u32,
    /// Height of one panel (runs) or of the chart (table) in pixels.
    #[arg(long, default_value_t = 300)]
    pub height: u32,
    /// Output picture (.svg).
    #[arg(long, value_name = "FILE.svg")]
    pub out: PathBuf,
    /// Overwrite an existing --out.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A prepared dataset (.h5) to validate and summarize.
    #[arg(required_unless_present = "stats", conflicts_with = "stats")]
    pub path: Option<PathBuf>,
    /// Structural statistics of the graph G (docs/inspect.md#graph-statistics):
    /// sizes, degree quantiles and tail exponents, locality, reciprocity, adjacent
    /// Jaccard, top-1 % in-link share. Streamed, parallel over ranks.
    #[arg(long, value_name = "G")]
    pub stats: Option<PathBuf>,
    /// How --stats's G is stored (default: bv when G.graph exists, mtx for .mtx, h5
    /// for .h5, else tsv).
    #[arg(long, value_enum, requires = "stats")]
    pub format: Option<GraphFormat>,
    /// Print the statistics as one JSON object instead of a table.
    #[arg(long, requires = "stats")]
    pub json: bool,
}

/// Threads per rank: at least 1, at most 8 per core of this machine (more only
/// thrash; a typo like 100000 would spawn them all).
pub(crate) fn parse_threads(s: &str) -> std::result::Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("not a thread count: {}", crate::error::quote(s)))?;
    let cores = crate::node::cores();
    if n == 0 || n > 8 * cores {
        return Err(format!(
            "{n} threads per rank; expected 1..={} (8 per core, {cores} cores)",
            8 * cores
        ));
    }
    Ok(n)
}

fn parse_mem(s: &str) -> std::result::Result<u64, String> {
    crate::metrics::parse_bytes(s).map_err(|e| e.to_string())
}
