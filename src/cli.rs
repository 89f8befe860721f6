//! The command line: raw flags, parsed identically on every rank before any
//! collective, then turned into validated configs by each subcommand.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// torusrec: ALX-style iALS and sharded embedding training on a simulated TPU torus.
///
/// One SPMD binary: launch it with `mpirun -np P torusrec ...` (or `srun` in an sbatch
/// script). Every rank plays one chip of a periodic torus. Exit codes: 0 finished,
/// 2 bad command line or input, 75 preempted with a checkpoint, 76 training hold,
/// 1 other failure.
#[derive(Debug, Parser)]
#[command(name = "torusrec", version, about, long_about)]
pub struct Cli {
    /// Torus shape, e.g. 4x2 or 4x2x2; must multiply to the number of ranks.
    /// Default: MPI_Dims_create in two dimensions.
    #[arg(long, global = true, value_name = "AxB[xC]")]
    pub torus: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build a WebGraph variant (ALX protocol) from a graph file and write the
    /// prepared HDF5 dataset with its strong-generalization split.
    Prepare(PrepareArgs),
    /// Generate synthetic data straight into a prepared dataset.
    #[command(subcommand)]
    Generate(GenerateCommand),
    /// Print a prepared dataset's sizes, degree statistics and split, and validate it
    /// against the layout (exit 2 if it does not match).
    Inspect(InspectArgs),
    /// Check the communicator: collectives with answers known from rank and size,
    /// and each rank's torus coordinates and neighbours.
    Selftest,
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
}

#[derive(Debug, Subcommand)]
pub enum GenerateCommand {
    /// A WebGraph-like link graph: power-law degrees, hosts with mostly internal links,
    /// the rest to globally popular pages. Presets have the sizes of ALX's variants:
    /// in-dense (0.5M nodes, 122M arcs), in-sparse (1.5M, 149M), de-dense (5.7M, 824M),
    /// de-sparse (19.7M, 1.19B), dense (136.5M, 22.2B), sparse (365.4M, 29.9B).
    Webgraph(GenerateWebgraphArgs),
}

#[derive(Debug, Args)]
pub struct GenerateWebgraphArgs {
    /// Preset name.
    #[arg(long)]
    pub preset: String,
    /// Nodes and arcs times F.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub scale: f64,
    /// Seed of the generator and of the split.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Variant filter applied to the generated graph (0: none).
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub min_links: u64,
    /// Output dataset (.h5).
    #[arg(long, value_name = "D.h5")]
    pub out: PathBuf,
    /// Overwrite an existing output.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A prepared dataset (.h5).
    pub path: PathBuf,
}
