//! The flags of `recommend` (validated by `app::recommend`).

use crate::als::recommend::DEFAULT_BLOCK_ROWS;
use std::path::PathBuf;

/// `torusrec recommend`.
#[derive(Debug, clap::Args)]
#[command(group(
    clap::ArgGroup::new("rows")
        .required(true)
        .args(["nodes", "nodes_file", "user", "user_file", "test", "all", "history", "similar"])
))]
pub struct RecommendArgs {
    /// The trained model (`als --out`).
    #[arg(long, value_name = "model.h5")]
    pub model: PathBuf,
    /// The prepared dataset the model was trained on (another is refused).
    #[arg(long, value_name = "D.h5")]
    pub data: PathBuf,
    /// Rows to recommend for: original node ids, comma-separated.
    #[arg(long, value_name = "ID,ID,...")]
    pub nodes: Option<String>,
    /// Rows to recommend for: a file of original node ids, one per line (`#` starts a
    /// comment).
    #[arg(long, value_name = "FILE")]
    pub nodes_file: Option<PathBuf>,
    /// User x item datasets: users to recommend for, original user ids, comma-separated.
    #[arg(long, value_name = "ID,ID,...")]
    pub user: Option<String>,
    /// User x item datasets: a file of original user ids, one per line (`#` starts a
    /// comment).
    #[arg(long, value_name = "FILE")]
    pub user_file: Option<PathBuf>,
    /// A new row folded in from these columns (original item or node ids, each
    /// optionally `ID:WEIGHT`, the raw weight a weighted model's confidence reads;
    /// default 1), as evaluation folds in a test row.
    #[arg(long, value_name = "ID[:W],...")]
    pub history: Option<String>,
    /// The most similar columns (cosine of their rows of H) of each of these columns
    /// (original item or node ids, comma-separated); the column itself is left out.
    #[arg(long, value_name = "ID,ID,...")]
    pub similar: Option<String>,
    /// Never recommend the columns (original ids) in this file: one per line, `#`
    /// starts a comment.
    #[arg(long, value_name = "FILE")]
    pub exclude: Option<PathBuf>,
    /// Recommend only the columns (original ids) in this file: one per line, `#`
    /// starts a comment.
    #[arg(long, value_name = "FILE")]
    pub allow: Option<PathBuf>,
    /// Every test row (folded in from its visible arcs, as evaluation does).
    #[arg(long)]
    pub test: bool,
    /// Every row with training arcs or visible test arcs (TSV streams in row order).
    #[arg(long)]
    pub all: bool,
    /// Columns per row.
    #[arg(short = 'k', long = "k", value_name = "K", default_value_t = 20)]
    pub k: usize,
    /// Output: .tsv or .h5 (default: TSV on stdout).
    #[arg(long, value_name = "F.tsv|F.h5")]
    pub out: Option<PathBuf>,
    /// Overwrite an existing --out.
    #[arg(long)]
    pub force: bool,
    /// Rayon threads per rank (default: cores divided by the ranks on this node).
    #[arg(long, value_parser = crate::cli::parse_threads)]
    pub threads: Option<usize>,
    /// Rows per block (memory is bounded by a block).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BLOCK_ROWS, hide = true)]
    pub block_rows: usize,
}
