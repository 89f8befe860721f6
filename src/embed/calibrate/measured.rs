//! The measured step of a training run, which `embed --costs` reports beside the
//! predicted one ([`super::StepPrediction`]): seconds per step and each rank's busy
//! seconds in the embedding phases, over the intervals after the warm-up.

use crate::embed::train::trainer::IntervalReport;

/// One interval's seconds, steps and busy seconds per rank (wall and CPU; see
/// [`crate::embed::train::trainer::IntervalReport`]).
pub struct Timed {
    pub seconds: f64,
    pub steps: u64,
    pub busy: Vec<f64>,
    pub busy_cpu: Vec<f64>,
}

impl Timed {
    /// The interval of report `r`.
    pub fn of(r: &IntervalReport) -> Timed {
        Timed {
            seconds: r.seconds,
            steps: r.steps,
            busy: r.busy_per_rank.clone(),
            busy_cpu: r.busy_cpu_per_rank.clone(),
        }
    }
}

/// The measured seconds per step and busy seconds per step of each rank in the
/// embedding phases, over the intervals after the first (the first holds the
/// warm-up) when there are several.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MeasuredStep {
    pub steps: u64,
    pub seconds_per_step: f64,
    /// Wall seconds per step (the phases' less their collectives').
    pub busy_per_rank: Vec<f64>,
    /// Max over min of `busy_per_rank` (1 is perfect balance).
    pub busy_max_over_min: f64,
    /// CPU seconds per step of each rank's process, the same way; empty with
    /// `--pipeline`.
    pub busy_cpu_per_rank: Vec<f64>,
    /// Max over min of `busy_cpu_per_rank`; none when it is empty.
    pub busy_cpu_max_over_min: Option<f64>,
}

/// Per rank, the sum of `per(interval)` over `used` divided by `steps`, and its
/// max over min; empty if an interval has none.
fn per_step(used: &[Timed], steps: f64, per: impl Fn(&Timed) -> &[f64]) -> (Vec<f64>, f64) {
    let ranks = used.iter().map(|t| per(t).len()).max().unwrap_or(0);
    if used.iter().any(|t| per(t).len() != ranks) {
        return (Vec::new(), f64::INFINITY);
    }
    let mut busy = vec![0.0; ranks];
    for t in used {
        for (x, y) in busy.iter_mut().zip(per(t)) {
            *x += y;
        }
    }
    busy.iter_mut().for_each(|x| *x /= steps);
    let max = busy.iter().copied().fold(0.0, f64::max);
    let min = busy.iter().copied().fold(f64::INFINITY, f64::min);
    (busy, if min > 0.0 { max / min } else { f64::INFINITY })
}

/// The measured step over the intervals `timed` (see [`MeasuredStep`]).
pub fn measured_step(timed: &[Timed]) -> MeasuredStep {
    let used = if timed.len() > 1 { &timed[1..] } else { timed };
    let steps: u64 = used.iter().map(|t| t.steps).sum();
    let secs: f64 = used.iter().map(|t| t.seconds).sum();
    let n = steps.max(1) as f64;
    let (busy, ratio) = per_step(used, n, |t| &t.busy);
    let (busy_cpu, cpu_ratio) = per_step(used, n, |t| &t.busy_cpu);
    MeasuredStep {
        steps,
        seconds_per_step: secs / n,
        busy_max_over_min: ratio,
        busy_per_rank: busy,
        busy_cpu_max_over_min: (!busy_cpu.is_empty()).then_some(cpu_ratio),
        busy_cpu_per_rank: busy_cpu,
    }
}
