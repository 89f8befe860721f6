//! The flags of `predict` (validated by `app::predict`).

use std::path::PathBuf;

/// `torusrec predict`.
#[derive(Debug, clap::Args)]
#[command(group(
    clap::ArgGroup::new("examples")
        .required(true)
        .args(["data", "input"])
))]
pub struct PredictArgs {
    /// The trained model (`embed --out M.h5`).
    #[arg(long, value_name = "M.h5")]
    pub model: PathBuf,
    /// The examples: a click log (`prepare clicks`, `generate clicks`) with the
    /// model's tables (names, order) and dense features.
    #[arg(long, value_name = "clicks.h5")]
    pub data: Option<PathBuf>,
    /// The examples as text files (one per day, in order), converted by the parser of
    /// `prepare clicks` (with its --format and --columns) to a temporary click log
    /// next to --out, removed afterwards.
    #[arg(long, value_name = "F", num_args = 1.., conflicts_with = "data")]
    pub input: Vec<PathBuf>,
    /// With --input: the text format, as `prepare clicks --format` takes it.
    #[arg(long, value_name = "FORMAT", requires = "input")]
    pub format: Option<String>,
    /// With --input: the columns, as `prepare clicks --columns` takes them.
    #[arg(long, value_name = "SPEC", requires = "input")]
    pub columns: Option<String>,
    /// Score only the last K examples (those `embed --eval-examples K` held out of the
    /// same log); 0: every example.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub eval_examples: u64,
    /// Output: one line per example in input order, `probability<TAB>label`.
    #[arg(long, value_name = "S.tsv")]
    pub out: PathBuf,
    /// Overwrite an existing --out.
    #[arg(long)]
    pub force: bool,
    /// Examples each rank scores at a time (memory is bounded by a chunk).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub chunk: usize,
    /// Rayon threads per rank (default: cores divided by the ranks on this node).
    #[arg(long, value_parser = crate::cli::parse_threads)]
    pub threads: Option<usize>,
}
