//! `torusrec embed`: the plan (made, read or named, the same on every rank), the
//! run through the training driver with its progress lines, and the final lines
//! (with `--costs`, the predicted step beside the measured one).

use std::path::{Path, PathBuf};

use super::config::{checkpoint_config, plan_options, preloaded_per_rank};
use super::report::{interval_line, measured_line, plan_summary, prediction_line};
use crate::app::group;
use crate::app::output::RunOutput;
use crate::ckpt::signals::Preemption;
use crate::cli::{EmbedArgs, OutputModeArg};
use crate::comm::Comm;
use crate::data::clicks::source::Source;
use crate::embed::calibrate::measured::{measured_step, MeasuredStep, Timed};
use crate::embed::calibrate::{Costs, StepPrediction};
use crate::embed::driver::{global_train, Event, RunConfig, Summary};
use crate::embed::planner::{self, CostModel};
use crate::embed::tables::keys::{hash_tables, IdMap};
use crate::embed::tables::placement::{OutputMode, Placement, Plan};
use crate::embed::tables::store::TableOpt;
use crate::embed::train::batch_stats::{load_or_measure_stats, BatchStats};
use crate::embed::train::footprint;
use crate::embed::train::trainer::EmbedConfig;
use crate::metrics::human_bytes;
use crate::node::resolve_threads;
use crate::spec::ModelSpec;
use crate::{Error, Result};

/// Collective: every rank must call. `torusrec embed`: the configs from the flags,
/// the plan, the memory check, the run, the final lines.
pub fn global_run<C: Comm>(comm: &C, a: &EmbedArgs, preempt: Preemption) -> Result<Summary> {
    let threads = resolve_threads(a.threads);
    let root = comm.rank() == 0;
    let setup = a.local_setup(threads, root, comm.size());
    let (cfg, source, cost, costs) = comm.agree(setup)?;
    let mut out = RunOutput::global_open(comm, a.metrics.as_deref())?;

    // A step looks up its K micro-batches at once: plan for the step's batch.
    let per_rank = cfg.micro.div_ceil(comm.size()) * cfg.accumulate;
    let step = cfg.micro as f64 * cfg.accumulate as f64;
    let preloaded = preloaded_per_rank(a.preload, cfg.steps, step, comm.size());
    let plan_mem = plan_budget(comm, a, &cfg, preloaded);
    let (plan, plan_stats) =
        global_run_plan(comm, a, (&cfg, &source, &cost, &costs), per_rank, plan_mem)?;
    // Optimizer floats per table row, counted in every rank's table bytes.
    let state = super::config::planner_state_per_row(cfg.table_opt, &cfg.spec);
    if root {
        print_header(comm, &cfg, &plan, threads, state);
    }
    // Rank 0: the step the measured costs predict for this plan (in its final modes).
    let predicted = match (&costs, &plan_stats, a.planner.costs.as_deref()) {
        (Some(c), Some(st), Some(path)) => Some(predict(comm, &cfg, (c, path), st, &plan, &cost)),
        _ => None,
    };
    // Interval seconds, steps and busy seconds per rank (wall, CPU), for the
    // measured step.
    let mut timed: Vec<Timed> = Vec::new();
    let tables = plan
        .bytes_per_rank(&cfg.spec, state)
        .into_iter()
        .max()
        .unwrap_or(0);
    comm.agree(footprint::check(
        &cfg.spec,
        cfg.micro,
        cfg.accumulate,
        comm.size(),
        &cfg.dense_opt,
        tables,
        preloaded,
    ))?;
    let steps = cfg.steps;
    let run = RunConfig {
        checkpoint: checkpoint_config(a),
        preload: a.preload,
        out: a.out.clone(),
        init_from: a.init_from.clone(),
        delta: crate::embed::io::delta::DeltaPolicy {
            full_every: a.checkpoint_full_every,
            dtype: a.ckpt_delta_dtype,
        },
    };
    let eval_examples = cfg.eval_examples;
    let gemm = cfg.dense_gemm.name();
    let on_event = |e: Event| {
        if root {
            warn_if_other_gemm(&e, gemm);
        }
        match e {
            Event::Step { done, steps } => out.progress(done, steps),
            Event::Interval(r) => {
                out.line(&interval_line(r, steps));
                out.record(r);
                timed.push(Timed::of(r));
            }
            other => {
                if root {
                    print_restart(&other, comm.size());
                }
            }
        }
    };
    let s = global_train(comm, cfg, source, &plan, &run, preempt, on_event)?;
    if root {
        let m = predicted.as_ref().map(|_| measured_step(&timed));
        final_lines(
            &s,
            a,
            (comm.size(), threads),
            eval_examples,
            predicted.as_ref().zip(m.as_ref()),
            &mut out,
        );
    }
    Ok(s)
}

/// The planner's memory per rank: `--mem-per-rank`, else what the memory check
/// admits (the node's share less the rest of the estimate), printed by rank 0 for
/// `--plan auto`.
fn plan_budget<C: Comm>(comm: &C, a: &EmbedArgs, cfg: &EmbedConfig, preloaded: u64) -> Option<u64> {
    let root = comm.rank() == 0;
    // Without --mem-per-rank the planner places at most what the memory check below
    // admits: the node's share less the rest of the estimate.
    cfg.mem_per_rank.or_else(|| {
        let budget = footprint::table_budget(
            &cfg.spec,
            cfg.micro,
            cfg.accumulate,
            comm.size(),
            &cfg.dense_opt,
            preloaded,
        );
        if let (true, "auto", Some(b)) = (root, a.plan.as_str(), budget) {
            println!(
                "planner: at most {} of tables a rank (the node's memory over its ranks, less the rest of the estimate; --mem-per-rank sets it)",
                human_bytes(b)
            );
        }
        budget
    })
}

/// Collective: every rank must call. The run's plan (`--plan`, then `--output-mode`),
/// written to `--plan-out` by rank 0, and the batch statistics the planner sampled
/// (measured when `--costs` needs them for the prediction).
fn global_run_plan<C: Comm>(
    comm: &C,
    a: &EmbedArgs,
    (cfg, source, cost, costs): (&EmbedConfig, &Source, &CostModel, &Option<Costs>),
    per_rank: usize,
    plan_mem: Option<u64>,
) -> Result<(Plan, Option<BatchStats>)> {
    let root = comm.rank() == 0;
    let (plan, plan_stats) = global_resolve_plan(
        comm,
        &a.plan,
        &cfg.spec,
        source,
        &cfg.ids,
        cfg.seed,
        per_rank,
        plan_mem,
        cfg.table_opt,
        a.planner.stats.as_deref(),
        cost,
        costs.is_some(),
    )?;
    let plan = match a.output_mode {
        OutputModeArg::Auto => plan,
        OutputModeArg::Rows => plan.with_modes(OutputMode::Rows),
        OutputModeArg::Pooled => plan.with_modes(OutputMode::Pooled),
    };
    if let Some(p) = &a.plan_out {
        let written = if root {
            serde_json::to_vec_pretty(&plan)
                .map_err(|e| Error::Config(format!("plan: {e}")))
                .and_then(|bytes| crate::io::outfile::write(p, &bytes))
        } else {
            Ok(())
        };
        comm.agree(written)?;
    }
    Ok((plan, plan_stats))
}

/// Rank 0: the model, the run's shape and the plan.
fn print_header<C: Comm>(comm: &C, cfg: &EmbedConfig, plan: &Plan, threads: usize, state: u64) {
    let s = &cfg.spec;
    println!(
        "embed: {} tables ({} rows, {} of {}), {} ({} GEMM), micro-batch {} x {} per step on {} rank(s) (torus {}) x {threads} thread(s); tables {:?}, dense {:?}; dedup {}, pipeline {}",
        s.tables.len(),
        group(s.total_rows()),
        human_bytes(s.total_bytes()),
        s.table_dtype,
        s.arch_summary(),
        cfg.dense_gemm.name(),
        cfg.micro,
        cfg.accumulate,
        comm.size(),
        comm.torus().shape(),
        cfg.table_opt,
        cfg.dense_opt,
        cfg.dedup,
        cfg.pipeline
    );
    if !cfg.lr_schedule.is_constant() || cfg.dense_wd != 0.0 {
        println!(
            "optimizers: lr schedule {:?} (multiplier at step 1: {}); dense weight decay {}",
            cfg.lr_schedule,
            cfg.lr_schedule.mult(0),
            cfg.dense_wd
        );
    }
    println!("plan: {}", plan_summary(s, plan, state));
}

/// Rank 0: the step the measured costs `c` (from file `path`) predict for `plan`
/// under the batch statistics `st`, printed.
fn predict<C: Comm>(
    comm: &C,
    cfg: &EmbedConfig,
    (c, path): (&Costs, &Path),
    st: &BatchStats,
    plan: &Plan,
    cost: &CostModel,
) -> StepPrediction {
    let state = super::config::planner_state_per_row(cfg.table_opt, &cfg.spec);
    let per_rank = cfg.micro.div_ceil(comm.size()) * cfg.accumulate;
    let rep = planner::evaluate(&cfg.spec, st, plan, cost, state);
    let p = c.predict(
        rep.cost_per_rank,
        &cfg.spec.mlp_layers(),
        per_rank,
        comm.size(),
    );
    println!("{}", prediction_line(&p, path));
    p
}

/// A warning when the run resumes (event `e`) from a checkpoint written with
/// another GEMM than this run's `gemm`.
fn warn_if_other_gemm(e: &Event, gemm: &str) {
    if let Event::Resumed { manifest: m, .. } = &e {
        if !m.dense_gemm.is_empty() && m.dense_gemm != gemm {
            log::warn!(
                "the checkpoint was written with the {} GEMM, this run uses {gemm}: its bits will differ from an uninterrupted run's (within rounding)",
                m.dense_gemm
            );
        }
    }
}

/// Rank 0: the line of a resume, a warm start or a preload (event `e`) on `ranks`
/// ranks.
fn print_restart(e: &Event, ranks: usize) {
    match e {
        Event::Resumed {
            path,
            manifest,
            seconds,
        } => {
            println!(
                "resumed from {} (written by {} rank(s)) at step {} in {seconds:.2} s",
                path.display(),
                manifest.world_size,
                manifest.step,
            );
        }
        Event::WarmStarted { start, seconds } => {
            let m = &start.manifest;
            println!(
                "warm start from {} (step {} of a run on {} rank(s)) in {seconds:.2} s{}",
                start.path.display(),
                m.step,
                m.world_size,
                if start.entries + start.dropped > 0 {
                    format!(
                        "; hash tables: {} entries placed on {} rank(s), {} did not fit",
                        group(start.entries),
                        ranks,
                        group(start.dropped)
                    )
                } else {
                    String::new()
                }
            );
        }
        Event::Preloaded { from, to, seconds } => {
            println!("preloaded the examples of steps {from}..{to} in {seconds:.1} s");
        }
        Event::Step { .. } | Event::Interval(_) => {}
    }
}

/// Rank 0: the final lines (the model written, AUC, log loss, checksum; with a
/// prediction, the measured step beside it) and the final record of the metrics
/// file, for a run on `ranks` ranks of `threads` threads.
fn final_lines(
    s: &Summary,
    a: &EmbedArgs,
    (ranks, threads): (usize, usize),
    eval_examples: u64,
    step: Option<(&StepPrediction, &MeasuredStep)>,
    out: &mut RunOutput,
) {
    if let Some(out) = &a.out {
        println!("wrote the model to {}", out.display());
    }
    println!(
        "final: eval AUC {}  logloss {}  over {} held-out examples  after {} steps  checksum {}  peak RSS {} per rank",
        s.auc.map_or("n/a".into(), |v| format!("{v:.4}")),
        s.logloss.map_or("n/a".into(), |v| format!("{v:.5}")),
        group(eval_examples),
        s.steps,
        s.checksum,
        human_bytes(s.peak_rss_bytes)
    );
    let mut v = serde_json::json!({"final": true, "auc": s.auc, "logloss": s.logloss, "steps": s.steps,
        "checksum": s.checksum, "peak_rss_bytes": s.peak_rss_bytes, "ranks": ranks, "threads": threads});
    if let Some((p, m)) = step {
        println!("{}", measured_line(m, p));
        v["predicted"] = serde_json::json!(p);
        v["measured"] = serde_json::json!(m);
    }
    out.record(&v);
}

/// `plan` with every hash table row-cyclic over every rank (the placements a hash
/// table can have are table-wise and row-cyclic).
fn with_hash_tables_cyclic(mut plan: Plan, spec: &ModelSpec) -> Plan {
    let all: Vec<usize> = (0..plan.world).collect();
    for t in hash_tables(spec) {
        plan.tables[t] = Placement::RowCyclic { ranks: all.clone() };
    }
    plan
}

/// Collective: every rank must call. The plan named by `--plan`, the same on every
/// rank (rank 0 makes or reads it and broadcasts it).
#[allow(clippy::too_many_arguments)]
fn global_resolve_plan<C: Comm>(
    comm: &C,
    choice: &str,
    spec: &ModelSpec,
    source: &Source,
    ids: &IdMap,
    seed: u64,
    batch_per_rank: usize,
    mem: Option<u64>,
    opt: TableOpt,
    stats: Option<&Path>,
    model: &CostModel,
    want_stats: bool,
) -> Result<(Plan, Option<BatchStats>)> {
    let world = comm.size();
    let mut kept = None;
    let made = if comm.rank() == 0 {
        (|| -> Result<Vec<u8>> {
            let measure =
                || load_or_measure_stats(spec, source, ids, seed, world, batch_per_rank, 4, stats);
            let plan = match choice {
                "auto" => {
                    let (st, how) = measure()?;
                    let (plan, rep) = planner::plan_auto(
                        spec,
                        &st,
                        &plan_options(world, mem, (opt, spec), seed, model),
                    )?;
                    println!(
                        "plan: auto (batch statistics {how}); predicted imbalance {:.3}, balance {:.3}",
                        rep.imbalance, rep.balance
                    );
                    kept = Some(st);
                    plan
                }
                "table" | "row_block" | "row_cyclic" | "column" | "data_parallel" => {
                    let plan = Plan::uniform(spec, world, choice)?;
                    if choice == "table" || choice == "row_cyclic" || hash_tables(spec).is_empty() {
                        plan
                    } else {
                        println!("plan: {choice} for every table but the hash tables, which are row-cyclic over every rank");
                        with_hash_tables_cyclic(plan, spec)
                    }
                }
                path => {
                    let p = PathBuf::from(path);
                    let text = crate::error::read_text(&p)?;
                    serde_json::from_str(&text)
                        .map_err(|e| Error::input(&p, format!("not a plan: {e}")))?
                }
            };
            if want_stats && kept.is_none() {
                kept = Some(measure()?.0);
            }
            serde_json::to_vec(&plan).map_err(|e| Error::Config(format!("plan: {e}")))
        })()
    } else {
        Ok(Vec::new())
    };
    let mut bytes = comm.agree(made)?;
    comm.broadcast_vec(0, &mut bytes)?;
    let plan: Plan =
        serde_json::from_slice(&bytes).map_err(|e| Error::Comm(format!("plan broadcast: {e}")))?;
    let plan = comm.agree(plan.validate(spec, world, choice).map(|_| plan))?;
    Ok((plan, kept))
}
