//! The lines `embed` and `plan` print: a plan's summary, seconds, the predicted and
//! the measured step, an interval's progress line.

use std::path::Path;

use crate::app::group;
use crate::embed::calibrate::measured::MeasuredStep;
use crate::embed::calibrate::StepPrediction;
use crate::embed::tables::placement::{OutputMode, Plan};
use crate::embed::train::trainer::IntervalReport;
use crate::metrics::human_bytes;
use crate::spec::ModelSpec;

pub(super) fn plan_summary(spec: &ModelSpec, plan: &Plan, state: u64) -> String {
    let bytes = plan.bytes_per_rank(spec, state);
    format!(
        "{}; memory per rank {}",
        plan_kinds(plan),
        bytes
            .iter()
            .map(|&b| human_bytes(b))
            .collect::<Vec<_>>()
            .join(" / ")
    )
}

/// How many tables of each placement kind, and in each output mode.
pub(crate) fn plan_kinds(plan: &Plan) -> String {
    let mut kinds: Vec<(&str, usize)> = Vec::new();
    for p in &plan.tables {
        match kinds.iter_mut().find(|(k, _)| *k == p.kind()) {
            Some(e) => e.1 += 1,
            None => kinds.push((p.kind(), 1)),
        }
    }
    let pooled = (0..plan.tables.len())
        .filter(|&t| plan.mode(t) == OutputMode::Pooled)
        .count();
    format!(
        "{}; output {pooled} pooled, {} rows",
        kinds
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", "),
        plan.tables.len() - pooled,
    )
}

/// Seconds with four significant digits, in plain notation.
pub fn secs(x: f64) -> String {
    if !(x.is_finite() && x > 0.0) {
        return format!("{x}");
    }
    let decimals = (3 - x.log10().floor() as i64).clamp(0, 15) as usize;
    format!("{x:.decimals$}")
}

/// The `plan: predicted step` line.
pub(super) fn prediction_line(p: &StepPrediction, path: &Path) -> String {
    format!(
        "plan: predicted step {} s (embedding: max {} s, per rank [{}]; dense {} s; all-reduce {} s; measured costs {})",
        secs(p.step),
        secs(p.embedding_max),
        p.embedding_per_rank
            .iter()
            .map(|&x| secs(x))
            .collect::<Vec<_>>()
            .join(", "),
        secs(p.dense),
        secs(p.allreduce),
        path.display()
    )
}

pub(super) fn interval_line(r: &IntervalReport, steps: u64) -> String {
    let mut s = format!(
        "step {:>6}/{steps}  loss {:.5}  {:>9.0} ex/s  {:.3} s/step  exchanged {}/step (lookup {}, backward {}, all-reduce {})  dedup {:.2}x  owner imbalance {:.3}",
        r.step,
        r.loss,
        r.examples_per_s,
        r.seconds / r.steps.max(1) as f64,
        human_bytes(r.bytes_per_step as u64),
        human_bytes(r.lookup_bytes_per_step as u64),
        human_bytes(r.backward_bytes_per_step as u64),
        human_bytes(r.allreduce_bytes_per_step as u64),
        r.dedup_ratio,
        r.owner_imbalance
    );
    if let Some(h) = &r.hash {
        s.push_str(&format!(
            "  hash: resolve {}/step, {} of {} rows held ({} trained), evicted {}, expired {}, refused {}, {:.1}% of keys without a row",
            human_bytes(r.resolve_bytes_per_step as u64),
            group(h.entries),
            group(h.capacity),
            group(h.admitted),
            group(h.evicted),
            group(h.expired),
            group(h.refused),
            100.0 * h.keys_without_row as f64 / h.keys_sent.max(1) as f64
        ));
    }
    if let (Some(a), Some(l)) = (r.eval_auc, r.eval_logloss) {
        s.push_str(&format!("  eval AUC {a:.4} logloss {l:.5}"));
    }
    s
}

pub(super) fn measured_line(m: &MeasuredStep, p: &StepPrediction) -> String {
    format!(
        "measured: {} s/step over the last {} steps (predicted {} s, {:+.1}%); busy seconds per step in the embedding phases per rank [{}] (max/min {:.3}){}",
        secs(m.seconds_per_step),
        m.steps,
        secs(p.step),
        100.0 * (p.step - m.seconds_per_step) / m.seconds_per_step.max(1e-12),
        m.busy_per_rank
            .iter()
            .map(|&x| secs(x))
            .collect::<Vec<_>>()
            .join(", "),
        m.busy_max_over_min,
        match m.busy_cpu_max_over_min {
            Some(r) => format!(
                "; in CPU seconds [{}] (max/min {r:.3})",
                m.busy_cpu_per_rank
                    .iter()
                    .map(|&x| secs(x))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => String::new(),
        }
    )
}
