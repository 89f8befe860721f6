//! What a run reports: the seconds per phase of an epoch, the epoch's report (loss,
//! recall, rates, traffic, memory) and the end-of-run report (the types only; an epoch's
//! report is measured in `epoch.rs`).

use crate::als::checkpoint::Position;
use crate::als::eval::{AutoChoice, Recall};
use serde::{Deserialize, Serialize};

/// Seconds per phase of one epoch (this rank's wall time; rank 0 reports its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseTimes {
    pub gramian: f64,
    pub exchange: f64,
    pub solve: f64,
    pub loss: f64,
    pub eval: f64,
    pub checkpoint: f64,
    /// `--basis eigen`: the eigendecompositions and the rotations of both tables (and,
    /// after the last epoch, the rotation back).
    #[serde(default)]
    pub basis: f64,
    /// Of `solve`: the seconds the solver waited for the spill's chunk reader (0 when
    /// the CSR is in memory). Near 0 means the disk keeps up.
    #[serde(default)]
    pub spill_wait: f64,
}

/// What one epoch did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochReport {
    pub epoch: usize,
    /// The loss after the row half-epoch and after the column half-epoch.
    /// `None` unless `--loss-every-half`.
    pub loss_rows: Option<f64>,
    pub loss: f64,
    pub recall: Option<Recall>,
    /// Training seconds: evaluation and checkpoints excluded.
    pub seconds: f64,
    pub edges_per_second: f64,
    /// Seconds of this epoch's evaluation (0 when it did not evaluate).
    #[serde(default)]
    pub eval_seconds: f64,
    /// Test rows the evaluation scored (0 when it did not evaluate).
    #[serde(default)]
    pub eval_rows: u64,
    /// The evaluation's scoring rate over all ranks, flop/s (0 when it did not
    /// evaluate).
    #[serde(default)]
    pub eval_flops_per_second: f64,
    /// `--eval-rows auto`: how the evaluated rows were chosen.
    #[serde(default)]
    pub eval_auto: Option<AutoChoice>,
    /// Bytes sent to other ranks by the embedding exchange this epoch, all ranks.
    pub exchange_bytes: u64,
    pub phases: PhaseTimes,
    /// The largest rank's peak resident memory so far (bytes).
    #[serde(default)]
    pub peak_rss_bytes: u64,
    /// Bytes this epoch read by system calls (the spilled CSR: all ranks), and the part
    /// of them fetched from storage rather than the page cache.
    #[serde(default)]
    pub read_bytes: u64,
    #[serde(default)]
    pub storage_read_bytes: u64,
    /// Per communication phase, the link traffic since the run started (busiest
    /// outgoing link, mean over links, all-to-all hops).
    #[serde(default)]
    pub links: Vec<(String, crate::comm::LinkSummary)>,
}

/// The end of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainReport {
    pub epochs: Vec<EpochReport>,
    pub recall: Option<Recall>,
    pub loss: f64,
    pub checksum: u64,
    pub row_imbalance: f64,
    pub col_imbalance: f64,
    /// The epoch the run started from (0 when fresh).
    pub resumed_from: Option<Position>,
}
