//! Fault injection for tests, driven by environment variables:
//! - `TORUSREC_FAULT=POINT[@RANK][#N]` aborts the process (like `kill -9`: no
//!   unwinding, no cleanup) the N-th time (default 1st) that rank RANK (default any)
//!   reaches POINT: `after-shard-write`, `before-commit`, `mid-alltoall`,
//!   `before-rename` (every output file, [`crate::io::outfile::commit`]).
//! - `TORUSREC_INJECT_NAN=EPOCH@RANK` puts a NaN into the solved table of rank RANK
//!   during epoch EPOCH (1-based), to exercise the training hold.
//! - `TORUSREC_INJECT_NAN_GRAD=STEP@RANK` puts a NaN into rank RANK's embedding
//!   gradient of step STEP (1-based) of the embedding trainer, after the backward
//!   expanded it (the loss and the MLP's gradients stay finite).
//! - `TORUSREC_PREEMPT_AT=STEP` raises the preemption flag on rank 0 when the global
//!   step counter reaches STEP (a signal delivered at an exact step boundary).
//! - `TORUSREC_PREEMPT_IN=PASS` acts as a signal during that pass of `prepare`
//!   (`degrees`, `filter`, `split+write`, `transpose`), `prepare clicks` (`count`,
//!   `write`) or `inspect --stats` (`stats`).

use std::sync::atomic::{AtomicU64, Ordering};

static HITS: AtomicU64 = AtomicU64::new(0);

/// Abort here if `TORUSREC_FAULT` names this point (and rank).
pub fn point(name: &str, rank: usize) {
    let Ok(spec) = std::env::var("TORUSREC_FAULT") else {
        return;
    };
    let (rest, nth) = match spec.split_once('#') {
        Some((a, n)) => (a.to_string(), n.parse::<u64>().unwrap_or(1)),
        None => (spec.clone(), 1),
    };
    let (p, r) = match rest.split_once('@') {
        Some((p, r)) => (p.to_string(), r.parse::<usize>().ok()),
        None => (rest, None),
    };
    if p != name || r.is_some_and(|r| r != rank) {
        return;
    }
    if HITS.fetch_add(1, Ordering::SeqCst) + 1 == nth {
        eprintln!("[fault] rank {rank}: aborting at {name} (TORUSREC_FAULT={spec})");
        std::process::abort();
    }
}

/// Whether to inject a NaN on `rank` in `epoch`.
pub fn inject_nan(epoch: usize, rank: usize) -> bool {
    std::env::var("TORUSREC_INJECT_NAN")
        .ok()
        .and_then(|s| {
            let (e, r) = s.split_once('@')?;
            Some(e.parse::<usize>().ok()? == epoch && r.parse::<usize>().ok()? == rank)
        })
        .unwrap_or(false)
}

/// Whether to put a NaN into the embedding gradient on `rank` in `step`.
pub fn inject_nan_grad(step: usize, rank: usize) -> bool {
    std::env::var("TORUSREC_INJECT_NAN_GRAD")
        .ok()
        .and_then(|s| {
            let (e, r) = s.split_once('@')?;
            Some(e.parse::<usize>().ok()? == step && r.parse::<usize>().ok()? == rank)
        })
        .unwrap_or(false)
}

/// The global step at which to simulate a preemption signal on rank 0.
pub fn preempt_at() -> Option<u64> {
    std::env::var("TORUSREC_PREEMPT_AT").ok()?.parse().ok()
}

/// Whether `TORUSREC_PREEMPT_IN` names this phase (a pass of `prepare`): a signal
/// delivered while it runs.
pub fn preempt_in(phase: &str) -> bool {
    std::env::var("TORUSREC_PREEMPT_IN").is_ok_and(|p| p == phase)
}
