//! `torusrec tune`: search iALS's reg and unobserved weight on a validation split of
//! the training rows (`als::tune`), print the table and the `als` command line of the
//! best setting, and optionally train it on the full training rows and report its
//! test recall — the only time the test rows are looked at.

use crate::als::model::TableScalar;
use crate::als::shard::read::Shards;
use crate::als::train::run::{global_train_as, TrainEvent};
use crate::als::train::shards::global_read_shards_for;
use crate::als::tune::{
    global_refine, global_search, global_validation_shards, grid_points, refine_design,
    refine_trainings, schedule, Point, PointResult, SearchReport, Strategy, ValSpec, ValStats,
};
use crate::als::AlsConfig;
use crate::bf16::{Bf16, TableDtype};
use crate::ckpt::signals::Preemption;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::node::resolve_threads;

use crate::cli::TuneArgs;

/// A validated tune: the points, the schedule and the training options.
#[derive(Debug, Clone)]
pub struct TuneConfig {
    pub base: AlsConfig,
    pub points: Vec<Point>,
    pub rungs: Vec<crate::als::tune::Rung>,
    pub val: ValSpec,
    pub final_cfg: AlsConfig,
    pub threads: Option<usize>,
}

impl TuneArgs {
    /// Validate (rank-local, identical everywhere).
    pub fn to_config(&self) -> Result<TuneConfig> {
        let points = grid_points(&self.reg.0, &self.unobserved_weight.0);
        let base = AlsConfig {
            data: self.data.clone(),
            dim: self.dim,
            epochs: self.epochs,
            reg: self.reg.0.first().copied().unwrap_or(0.0),
            unobserved_weight: self.unobserved_weight.0.first().copied().unwrap_or(0.0),
            confidence: crate::als::Confidence::Binary,
            solver: self.solver,
            cg_steps: self.cg_steps,
            exchange: self.exchange,
            eval_every: 0,
            eval_rows: self.eval_rows,
            seed: self.seed,
            init_std: self.init_std,
            hub_chunk: self.hub_chunk,
            out: None,
            metrics: None,
            force: self.force,
            step_nnz: self.step_nnz,
            loss_every_half: false,
            checkpoint: Default::default(),
            table_dtype: self.table_dtype,
            mem_per_rank: None,
            basis: crate::als::BasisKind::Auto,
            memory: Default::default(),
        };
        if self.epochs == 0 {
            return Err(Error::Config("--epochs 0: train at least one epoch".into()));
        }
        for p in &points {
            AlsConfig {
                reg: p.reg,
                unobserved_weight: p.unobserved_weight,
                ..base.clone()
            }
            .validate()?;
        }
        let val = ValSpec {
            fraction: self.val_fraction,
            seed: self.val_seed,
        };
        val.validate()?;
        if self.eta.is_some() && self.strategy != Strategy::Halving {
            return Err(Error::Config(format!(
                "--eta is for --strategy halving, not {}",
                vname(&self.strategy)
            )));
        }
        // refine starts from the centres of the grid's cells, not from the grid.
        let searched = if self.strategy == Strategy::Refine {
            if self
                .reg
                .0
                .iter()
                .chain(&self.unobserved_weight.0)
                .any(|&v| v <= 0.0)
            {
                // Refiner::new below says why.
                points.len()
            } else {
                refine_design(&self.reg.0, &self.unobserved_weight.0).len()
            }
        } else {
            points.len()
        };
        let rungs = schedule(
            self.strategy,
            searched,
            self.budget,
            self.epochs,
            self.eta.unwrap_or(3),
        )?;
        if self.strategy == Strategy::Refine {
            // Refused here (exit 2), not after the data is read.
            crate::als::tune::Refiner::new(
                &self.reg.0,
                &self.unobserved_weight.0,
                refine_trainings(searched, self.budget, self.epochs)?,
            )?;
        }
        if self.eval_rows == crate::als::eval::EvalRows::Auto {
            return Err(Error::Config(
                "--eval-rows auto: tune scores every point on the same rows; give a count or `all` (--final-eval-rows may be auto)".into(),
            ));
        }
        if self.out.is_some() && !self.train_final {
            return Err(Error::Config(
                "--out writes the final model: it needs --train-final".into(),
            ));
        }
        if let Some(j) = &self.out_json {
            crate::io::outfile::check_output(j, self.force)?;
        }
        let final_epochs = self.final_epochs.unwrap_or(self.epochs);
        let final_cfg = AlsConfig {
            epochs: final_epochs,
            eval_rows: self.final_eval_rows.unwrap_or(self.eval_rows),
            out: self.out.clone(),
            ..base.clone()
        };
        final_cfg.validate()?;
        if self.threads == Some(0) {
            return Err(Error::Config("--threads 0: need at least one".into()));
        }
        Ok(TuneConfig {
            base,
            points,
            rungs,
            val,
            final_cfg,
            threads: self.threads,
        })
    }
}

/// Quote a shell word when it needs it.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The `torusrec als` command line that trains `cfg` (as the final run of a tune does).
pub fn als_command(cfg: &AlsConfig, threads: Option<usize>) -> String {
    // `als` refuses the CG-only flags with cholesky.
    let cg = cfg.solver == crate::als::SolverKind::Cg;
    let mut a: Vec<String> = vec![
        "torusrec".into(),
        "als".into(),
        "--data".into(),
        shell_word(&cfg.data.display().to_string()),
        format!("--dim {}", cfg.dim),
        format!("--epochs {}", cfg.epochs),
        format!("--reg {}", cfg.reg),
        format!("--unobserved-weight {}", cfg.unobserved_weight),
        format!("--solver {}", vname(&cfg.solver)),
    ];
    if cg {
        a.push(format!("--cg-steps {}", cfg.cg_steps));
    }
    a.extend([
        format!("--exchange {}", vname(&cfg.exchange)),
        format!("--eval-rows {}", cfg.eval_rows),
        format!("--seed {}", cfg.seed),
        format!("--init-std {}", cfg.init_std),
    ]);
    if cg {
        a.push(format!("--hub-chunk {}", cfg.hub_chunk));
    }
    a.extend([
        format!("--step-nnz {}", cfg.step_nnz),
        format!("--table-dtype {}", vname(&cfg.table_dtype)),
    ]);
    if let Some(t) = threads {
        a.push(format!("--threads {t}"));
    }
    if let Some(o) = &cfg.out {
        a.push(format!("--out {}", shell_word(&o.display().to_string())));
    }
    a.join(" ")
}

/// The value name of a clap enum, for the command line.
fn vname<T: clap::ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

fn point_line(r: &PointResult, total: usize) -> String {
    format!(
        "point {:>3}/{total}  rung {}  reg {:<10} weight {:<10} epochs {:>3}  val R@20 {:.4}  R@50 {:.4}  loss {:.6e}  {:.1} s",
        r.index + 1,
        r.rung,
        r.point.reg,
        r.point.unobserved_weight,
        r.epochs,
        r.recall.at20,
        r.recall.at50,
        r.loss,
        r.seconds
    )
}

/// The table of a search, best first (markdown).
pub fn table(report: &SearchReport) -> Vec<String> {
    let mut order: Vec<usize> = (0..report.results.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&report.results[a], &report.results[b]);
        (y.epochs, y.recall.at20, y.recall.at50)
            .partial_cmp(&(x.epochs, x.recall.at20, x.recall.at50))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(x.index.cmp(&y.index))
    });
    let mut out = vec![
        "| | reg | weight | epochs | val R@20 | val R@50 | seconds |".to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    for i in order {
        let r = &report.results[i];
        out.push(format!(
            "| {} | {} | {} | {} | {:.4} | {:.4} | {:.1} |",
            if i == report.best { "best" } else { "" },
            r.point.reg,
            r.point.unobserved_weight,
            r.epochs,
            r.recall.at20,
            r.recall.at50,
            r.seconds
        ));
    }
    out
}

/// Rank 0's first lines: the resolved search (the data, the model, the strategy) and
/// its grid or box with the epochs it costs.
fn print_plan(args: &TuneArgs, cfg: &TuneConfig, ranks: usize, threads: usize) {
    let b = &cfg.base;
    println!(
        "tune: {} d={} tables={} solver={:?} cg_steps={} eval_rows={} strategy={:?} on {} rank(s) x {threads} thread(s)",
        b.data.display(), b.dim, b.table_dtype, b.solver, b.cg_steps, b.eval_rows,
        args.strategy, ranks
    );
    let rungs: Vec<String> = cfg
        .rungs
        .iter()
        .map(|r| format!("{} x {} epochs", r.points, r.epochs))
        .collect();
    if args.strategy == Strategy::Refine {
        let t = cfg.rungs[0].points;
        let design = refine_design(&args.reg.0, &args.unobserved_weight.0).len();
        println!(
            "grid: reg {:?} x weight {:?}: its box, first the {design} centres of its cells, then {} compass-search points inside the box; {t} trainings x {} epochs = {} epochs in all",
            args.reg.0,
            args.unobserved_weight.0,
            t - design,
            cfg.rungs[0].epochs,
            t * cfg.rungs[0].epochs
        );
    } else {
        println!(
            "grid: reg {:?} x weight {:?} = {} points; rungs: {}; {} epochs in all",
            args.reg.0,
            args.unobserved_weight.0,
            cfg.points.len(),
            rungs.join(", "),
            crate::als::tune::total_epochs(&cfg.rungs)
        );
    }
}

/// Collective: every rank must call. `--train-final`: train the best point on the
/// full training rows, rank 0 printing each epoch and the final test line; returns the
/// output's `final` record.
fn global_train_final<C: Comm>(
    comm: &C,
    final_cfg: &AlsConfig,
    preempt: Preemption,
) -> Result<serde_json::Value> {
    let root = comm.rank() == 0;
    let epochs = final_cfg.epochs;
    let on_event = |e: TrainEvent| match e {
        TrainEvent::Resumed {
            path,
            manifest,
            steps_per_half,
            seconds,
        } => super::als::log_resumed(root, path, manifest, steps_per_half, seconds),
        TrainEvent::Epoch(r) => {
            if root {
                println!(
                    "final epoch {:>3}/{epochs}  loss {:.6e}  {:.2} s",
                    r.epoch, r.loss, r.seconds
                );
            }
        }
    };
    let rep = match final_cfg.table_dtype {
        TableDtype::F32 => global_train_as::<C, f32>(comm, final_cfg, preempt, on_event)?.1,
        TableDtype::Bf16 => global_train_as::<C, Bf16>(comm, final_cfg, preempt, on_event)?.1,
    };
    let r = rep.recall.expect("the last epoch evaluates");
    if root && super::als::nothing_scored(&r) {
        println!(
            "final: {} (no test Recall@20/50)  loss {:.6e}  checksum {:016x}",
            super::als::NOTHING_TO_SCORE,
            rep.loss,
            rep.checksum
        );
    } else if root {
        println!(
            "final: test Recall@20 {:.4}  Recall@50 {:.4}  over {} test rows  loss {:.6e}  checksum {:016x}",
            r.at20, r.at50, r.test_rows, rep.loss, rep.checksum
        );
    }
    Ok(
        serde_json::json!({"epochs": epochs, "test_recall_at_20": r.at20,
        "test_recall_at_50": r.at50, "test_rows": r.test_rows, "loss": rep.loss,
        "checksum": format!("{:016x}", rep.checksum)}),
    )
}

/// Collective: every rank must call.
pub fn global_run<C: Comm>(comm: &C, args: &TuneArgs, preempt: Preemption) -> Result<()> {
    let cfg = comm.agree(args.to_config())?;
    let threads = resolve_threads(cfg.threads);
    comm.agree(crate::node::install_threads(threads))?;
    let root = comm.rank() == 0;
    let b = &cfg.base;
    if root {
        print_plan(args, &cfg, comm.size(), threads);
    }
    let full = global_read_shards_for(comm, b)?;
    let (val, stats) = global_validation_shards(comm, &full, cfg.val)?;
    drop(full);
    if root {
        println!(
            "validation: {} rows (fraction {}, seed {}, digest {:016x}), {} visible and {} held-out arcs; {} training arcs left",
            stats.rows, cfg.val.fraction, cfg.val.seed, stats.digest, stats.visible_arcs,
            stats.holdout_arcs, stats.train_arcs
        );
    }
    if stats.rows == 0 {
        return Err(Error::Config(format!(
            "--val-fraction {}: no validation rows on this dataset",
            cfg.val.fraction
        )));
    }
    let total = cfg.rungs.iter().map(|r| r.points).max().unwrap_or(0);
    let on_point = |r: &PointResult| {
        if root {
            println!("{}", point_line(r, total));
        }
    };
    let report = match b.table_dtype {
        TableDtype::F32 => {
            search_as::<C, f32>(comm, b, val, args, &cfg, preempt.clone(), on_point)?
        }
        TableDtype::Bf16 => {
            search_as::<C, Bf16>(comm, b, val, args, &cfg, preempt.clone(), on_point)?
        }
    };
    let best = report.results[report.best].clone();
    let mut final_cfg = cfg.final_cfg.clone();
    final_cfg.reg = best.point.reg;
    final_cfg.unobserved_weight = best.point.unobserved_weight;
    let command = als_command(&final_cfg, cfg.threads);
    if root {
        println!(
            "searched {} point-runs, {} epochs in {:.1} s",
            report.results.len(),
            report.epochs_run,
            report.seconds
        );
        for l in table(&report) {
            println!("{l}");
        }
        println!(
            "best: reg {} unobserved weight {}  validation Recall@20 {:.4}  Recall@50 {:.4} ({} epochs)",
            best.point.reg, best.point.unobserved_weight, best.recall.at20, best.recall.at50, best.epochs
        );
        println!("train it with: {command}");
    }
    let mut json = serde_json::json!({
        "data": b.data, "strategy": args.strategy, "rungs": report.rungs,
        "epochs_run": report.epochs_run, "seconds": report.seconds,
        "validation": {"fraction": cfg.val.fraction, "seed": cfg.val.seed, "stats": stats_json(&stats)},
        "results": report.results, "best": best, "command": command,
    });
    if args.train_final {
        if root {
            println!(
                "final run: reg {} weight {} on the full training rows for {} epochs",
                final_cfg.reg, final_cfg.unobserved_weight, final_cfg.epochs
            );
        }
        json["final"] = global_train_final(comm, &final_cfg, preempt)?;
    }
    let written = match (&args.out_json, root) {
        (Some(path), true) => {
            let text =
                serde_json::to_string_pretty(&json).map_err(|e| Error::Config(e.to_string()));
            text.and_then(|t| crate::io::outfile::write(path, (t + "\n").as_bytes()))
        }
        _ => Ok(()),
    };
    comm.agree(written)
}

/// The search `args.strategy` names, on tables of `T`.
fn search_as<C: Comm, T: TableScalar>(
    comm: &C,
    base: &AlsConfig,
    val: Shards,
    args: &TuneArgs,
    cfg: &TuneConfig,
    preempt: Preemption,
    on_point: impl FnMut(&PointResult),
) -> Result<SearchReport> {
    match args.strategy {
        Strategy::Refine => global_refine::<C, T>(
            comm,
            base,
            val,
            &args.reg.0,
            &args.unobserved_weight.0,
            cfg.rungs[0].points,
            cfg.rungs[0].epochs,
            preempt,
            on_point,
        ),
        _ => global_search::<C, T>(comm, base, val, &cfg.points, &cfg.rungs, preempt, on_point),
    }
}

fn stats_json(s: &ValStats) -> serde_json::Value {
    serde_json::json!({"rows": s.rows, "visible_arcs": s.visible_arcs, "holdout_arcs": s.holdout_arcs,
        "train_arcs": s.train_arcs, "digest": format!("{:016x}", s.digest)})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_parses_back_to_the_same_config() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct W {
            #[command(subcommand)]
            c: crate::cli::Command,
        }
        let als = |words: &[String]| match W::parse_from(words).c {
            crate::cli::Command::Als(a) => a,
            _ => panic!("not als: {words:?}"),
        };
        let defaults = als(&["x", "als", "--data", "my data.h5"].map(String::from));
        let cfg = AlsConfig {
            reg: 3.1622776e-4,
            unobserved_weight: 1e-3,
            ..defaults.to_config(crate::als::defaults::MatrixKind::LinkGraph)
        };
        let line = als_command(&cfg, Some(2));
        assert!(line.contains("'my data.h5'"), "{line}");
        // Split like a shell would (the only quoted word is the path).
        let mut words: Vec<String> = Vec::new();
        let mut rest = line.as_str();
        while !rest.is_empty() {
            rest = rest.trim_start();
            if let Some(r) = rest.strip_prefix('\'') {
                let end = r.find('\'').unwrap();
                words.push(r[..end].to_string());
                rest = &r[end + 1..];
            } else {
                let end = rest.find(' ').unwrap_or(rest.len());
                words.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
        let a = als(&words);
        assert_eq!(
            a.to_config(crate::als::defaults::MatrixKind::LinkGraph),
            cfg
        );
        assert_eq!(a.threads, Some(2));
    }
}
