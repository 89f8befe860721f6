//! `embed`'s and `plan`'s flags to validated configs: the trainer's
//! ([`EmbedConfig`], checked by `EmbedArgs::local_setup`), the planner's options,
//! memory limit and cost model, and the measured costs (`--costs`). Every rank
//! validates the same flags the same way before the first collective.

use std::path::Path;

use super::model::model_and_source;
use crate::ckpt::CheckpointConfig;
use crate::cli::{
    DenseGemmArg, DenseOptKind, EmbedArgs, LrDecayArg, OptimArgs, PlannerArgs, TableOptKind,
};
use crate::data::clicks::source::Source;
use crate::embed::calibrate::Costs;
use crate::embed::dense::gemm::Gemm;
use crate::embed::dense::mlp::DenseOpt;
use crate::embed::planner::{CostModel, PlanOptions};
use crate::embed::tables::keys::hash_tables;
use crate::embed::tables::store::TableOpt;
use crate::embed::train::footprint;
use crate::embed::train::schedule::{Decay, LrSchedule};
use crate::embed::train::trainer::EmbedConfig;
use crate::metrics::parse_bytes;
use crate::spec::ModelSpec;
use crate::{Error, Result};

/// Optimizer floats per table row under `kind` for the planner: exact for the
/// row-wise optimizers, a bound (at the widest table's `dim`) for the per-element ones
/// (`Store` checks the exact bytes against --mem-per-rank).
pub fn table_state_per_row(kind: TableOptKind, spec: &ModelSpec) -> u64 {
    planner_state_per_row(table_opt(kind, 0.01), spec)
}

/// [`table_state_per_row`] of an optimizer.
pub fn planner_state_per_row(opt: TableOpt, spec: &ModelSpec) -> u64 {
    let dim = spec.tables.iter().map(|t| t.dim).max().unwrap_or(0);
    opt.state_per_row(dim) as u64
}

pub(super) fn table_opt(kind: TableOptKind, lr: f32) -> TableOpt {
    match kind {
        TableOptKind::Sgd => TableOpt::Sgd { lr, wd: 0.0 },
        TableOptKind::RowwiseAdagrad => TableOpt::RowWiseAdagrad {
            lr,
            eps: 1e-8,
            wd: 0.0,
        },
        TableOptKind::Adagrad => TableOpt::Adagrad {
            lr,
            eps: 1e-8,
            wd: 0.0,
        },
        TableOptKind::Adam => TableOpt::adam(lr, 0.0),
        TableOptKind::RowwiseAdam => TableOpt::rowwise_adam(lr, 0.0),
        TableOptKind::Ftrl => TableOpt::Ftrl {
            alpha: lr,
            beta: 1.0,
            l1: 0.0,
            l2: 0.0,
        },
    }
}

/// `--table-opt` with --table-lr and the --optim flags; a flag of an optimizer not
/// chosen, or a value out of range, is refused (exit 2).
pub(super) fn table_opt_of(kind: TableOptKind, lr: f32, o: &OptimArgs) -> Result<TableOpt> {
    let bad = |m: String| Err(Error::Config(m));
    let name = table_opt(kind, lr).name();
    let adam = matches!(kind, TableOptKind::Adam | TableOptKind::RowwiseAdam);
    let ftrl = kind == TableOptKind::Ftrl;
    for (flag, set, ok, who) in [
        (
            "--table-beta1",
            o.table_beta1.is_some(),
            adam,
            "adam or rowwise-adam",
        ),
        (
            "--table-beta2",
            o.table_beta2.is_some(),
            adam,
            "adam or rowwise-adam",
        ),
        ("--ftrl-beta", o.ftrl_beta.is_some(), ftrl, "ftrl"),
        ("--ftrl-l1", o.ftrl_l1.is_some(), ftrl, "ftrl"),
        ("--ftrl-l2", o.ftrl_l2.is_some(), ftrl, "ftrl"),
    ] {
        if set && !ok {
            return bad(format!(
                "{flag} is a setting of --table-opt {who}, not of --table-opt {name}"
            ));
        }
    }
    let wd = o.table_weight_decay;
    if !(wd.is_finite() && wd >= 0.0) {
        return bad(format!(
            "--table-weight-decay {wd}: must be a finite number >= 0"
        ));
    }
    if ftrl && wd != 0.0 {
        return bad(
            "--table-weight-decay does not apply to --table-opt ftrl: use --ftrl-l2".into(),
        );
    }
    let unit = |flag: &str, v: Option<f32>, d: f32| -> Result<f32> {
        let v = v.unwrap_or(d);
        if !(0.0..1.0).contains(&v) {
            return Err(Error::Config(format!("{flag} {v}: must be in [0, 1)")));
        }
        Ok(v)
    };
    let nonneg = |flag: &str, v: Option<f32>, d: f32| -> Result<f32> {
        let v = v.unwrap_or(d);
        if !(v.is_finite() && v >= 0.0) {
            return Err(Error::Config(format!(
                "{flag} {v}: must be a finite number >= 0"
            )));
        }
        Ok(v)
    };
    Ok(match table_opt(kind, lr) {
        TableOpt::Sgd { lr, .. } => TableOpt::Sgd { lr, wd },
        TableOpt::RowWiseAdagrad { lr, eps, .. } => TableOpt::RowWiseAdagrad { lr, eps, wd },
        TableOpt::Adagrad { lr, eps, .. } => TableOpt::Adagrad { lr, eps, wd },
        TableOpt::Adam { .. } | TableOpt::RowWiseAdam { .. } => {
            let (b1, b2) = (
                unit("--table-beta1", o.table_beta1, 0.9)?,
                unit("--table-beta2", o.table_beta2, 0.999)?,
            );
            let base = TableOpt::adam(lr, wd);
            let with = |o: TableOpt| match o {
                TableOpt::Adam {
                    lr,
                    eps,
                    wd,
                    bc1,
                    bc2,
                    ..
                } => TableOpt::Adam {
                    lr,
                    beta1: b1,
                    beta2: b2,
                    eps,
                    wd,
                    bc1,
                    bc2,
                },
                TableOpt::RowWiseAdam {
                    lr,
                    eps,
                    wd,
                    bc1,
                    bc2,
                    ..
                } => TableOpt::RowWiseAdam {
                    lr,
                    beta1: b1,
                    beta2: b2,
                    eps,
                    wd,
                    bc1,
                    bc2,
                },
                o => o,
            };
            if kind == TableOptKind::Adam {
                with(base)
            } else {
                with(TableOpt::rowwise_adam(lr, wd))
            }
        }
        TableOpt::Ftrl { alpha, .. } => TableOpt::Ftrl {
            alpha,
            beta: nonneg("--ftrl-beta", o.ftrl_beta, 1.0)?,
            l1: nonneg("--ftrl-l1", o.ftrl_l1, 0.0)?,
            l2: nonneg("--ftrl-l2", o.ftrl_l2, 0.0)?,
        },
    })
}

/// The --lr-* flags as a schedule; a flag of a decay not chosen, or a value out of
/// range, is refused (exit 2). `ftrl`: the rate must stay > 0 (FTRL divides by it).
pub(super) fn lr_schedule_of(o: &OptimArgs, ftrl: bool) -> Result<LrSchedule> {
    let bad = |m: String| Err(Error::Config(m));
    let (poly, step) = (
        o.lr_decay == LrDecayArg::Poly,
        o.lr_decay == LrDecayArg::Step,
    );
    for (flag, set, ok, who) in [
        ("--lr-decay-steps", o.lr_decay_steps.is_some(), poly, "poly"),
        ("--lr-decay-power", o.lr_decay_power.is_some(), poly, "poly"),
        ("--lr-decay-end", o.lr_decay_end.is_some(), poly, "poly"),
        ("--lr-decay-every", o.lr_decay_every.is_some(), step, "step"),
        (
            "--lr-decay-factor",
            o.lr_decay_factor.is_some(),
            step,
            "step",
        ),
    ] {
        if set && !ok {
            return bad(format!("{flag} is a setting of --lr-decay {who}"));
        }
    }
    let decay = match o.lr_decay {
        LrDecayArg::None => Decay::None,
        LrDecayArg::Poly => {
            let Some(steps) = o.lr_decay_steps.filter(|&t| t > 0) else {
                return bad("--lr-decay poly needs --lr-decay-steps T > 0".into());
            };
            let power = o.lr_decay_power.unwrap_or(1.0);
            let end = o.lr_decay_end.unwrap_or(0.0);
            if !(power.is_finite() && power > 0.0) {
                return bad(format!(
                    "--lr-decay-power {power}: must be a finite number > 0"
                ));
            }
            if !(0.0..=1.0).contains(&end) || (ftrl && end == 0.0) {
                return bad(format!(
                    "--lr-decay-end {end}: must be in [0, 1]{}",
                    if ftrl {
                        " and > 0 under --table-opt ftrl (alpha must stay > 0)"
                    } else {
                        ""
                    }
                ));
            }
            Decay::Poly { steps, power, end }
        }
        LrDecayArg::Step => {
            let Some(every) = o.lr_decay_every.filter(|&k| k > 0) else {
                return bad("--lr-decay step needs --lr-decay-every K > 0".into());
            };
            let factor = o.lr_decay_factor.unwrap_or(0.1);
            if !(factor > 0.0 && factor <= 1.0) {
                return bad(format!("--lr-decay-factor {factor}: must be in (0, 1]"));
            }
            Decay::Step { every, factor }
        }
    };
    Ok(LrSchedule {
        warmup: o.lr_warmup,
        decay,
    })
}

pub(super) fn plan_options(
    world: usize,
    mem: Option<u64>,
    (opt, spec): (TableOpt, &ModelSpec),
    seed: u64,
    model: &CostModel,
) -> PlanOptions {
    let mut o = PlanOptions::new(world, mem.unwrap_or(u64::MAX));
    o.state_per_row = planner_state_per_row(opt, spec);
    o.seed = seed;
    o.model = model.clone();
    o
}

/// `--mem-per-rank` in bytes (`None`: no limit); a bad size is refused (exit 2).
pub(super) fn mem_per_rank(p: &PlannerArgs) -> Result<Option<u64>> {
    p.mem_per_rank.as_deref().map(parse_bytes).transpose()
}

/// `--cost-model`'s constants, or the defaults; printed when read from a file.
fn cost_model_of(path: Option<&Path>, print: bool) -> Result<CostModel> {
    let Some(p) = path else {
        return Ok(CostModel::default());
    };
    let m = CostModel::from_file(p)?;
    if print {
        println!(
            "cost model: {} (network {:.2} GB/s, all-reduce {:.2} GB/s, memory {:.2} GB/s, {:.1} ns per lookup, {:.1} us per shard, {} B lines)",
            p.display(),
            m.net_bw / 1e9,
            m.allreduce_bw / 1e9,
            m.mem_bw / 1e9,
            m.lookup_s * 1e9,
            m.shard_s * 1e6,
            m.line_bytes
        );
    }
    Ok(m)
}

/// `--costs`' calibration, read and checked on every rank; rank 0 prints where it
/// was measured (and a note when that was another rank count than `world`).
fn costs_of(path: Option<&Path>, print: bool, world: usize) -> Result<Option<Costs>> {
    let Some(p) = path else {
        return Ok(None);
    };
    let c = Costs::from_file(p)?;
    if print {
        let k = &c.conditions;
        println!(
            "costs: {} (measured at {} rank(s) x {} thread(s) on {}, commit {}{}){}",
            p.display(),
            k.ranks,
            k.threads,
            k.cpu,
            k.commit,
            if k.quick { ", quick" } else { "" },
            if k.ranks != world {
                format!(
                    "; planning for {world} rank(s): the collective rates are those of {}",
                    k.ranks
                )
            } else {
                String::new()
            }
        );
    }
    Ok(Some(c))
}

/// `--costs` ([`costs_of`]) and the cost model the planner plans with: the
/// calibration's fit, else `--cost-model`'s constants or the defaults
/// ([`cost_model_of`]); `print` on rank 0.
pub(super) fn costs_and_model(
    p: &PlannerArgs,
    print: bool,
    world: usize,
) -> Result<(Option<Costs>, CostModel)> {
    let costs = costs_of(p.costs.as_deref(), print, world)?;
    let model = match &costs {
        Some(c) => c.model(),
        None => cost_model_of(p.cost_model.as_deref(), print)?,
    };
    Ok((costs, model))
}

/// The examples one rank holds with `--preload`: its share of every step's (an
/// over-count on a resume, which preloads from its step on).
pub(super) fn preloaded_per_rank(
    preload: bool,
    steps: u64,
    step_examples: f64,
    ranks: usize,
) -> u64 {
    if preload {
        (steps as f64 * step_examples / ranks.max(1) as f64).ceil() as u64
    } else {
        0
    }
}

/// The checkpoint settings of `embed` (no `--wait-for-data`).
pub(super) fn checkpoint_config(a: &EmbedArgs) -> CheckpointConfig {
    a.checkpoint.config(a.checkpoint_every, 0.0)
}

/// What `embed` trains with, from its flags: the configuration, the examples' source,
/// the planner's cost model and the measured costs (`--costs`).
pub(super) type Setup = (EmbedConfig, Source, CostModel, Option<Costs>);

impl EmbedArgs {
    /// The files `embed` reads, each with its flag: its outputs must be none of them.
    fn inputs(&self) -> Vec<(&'static str, &Path)> {
        let p = &self.planner;
        [
            ("--data", &self.data),
            ("--tables", &self.model.tables),
            ("--init-from", &self.init_from),
            ("--stats", &p.stats),
            ("--cost-model", &p.cost_model),
            ("--costs", &p.costs),
        ]
        .into_iter()
        .filter_map(|(flag, v)| v.as_deref().map(|v| (flag, v)))
        .collect()
    }

    /// Validate `embed`'s flags (exit 2 on a bad one) and read what they name (the model,
    /// the click log, the cost files), for `ranks` ranks with `threads` threads each
    /// (building the global thread pool); `root` also checks that `--out` is writable.
    /// Rank-local: every rank calls it before the first collective and the caller
    /// agrees on the outcome.
    pub(super) fn local_setup(&self, threads: usize, root: bool, ranks: usize) -> Result<Setup> {
        let a = self;
        for (flag, given) in [
            ("--cost-model", a.planner.cost_model.is_some()),
            ("--stats", a.planner.stats.is_some()),
        ] {
            if given && a.plan != "auto" {
                return Err(Error::Config(format!(
                    "{flag} acts on --plan auto only (the planner), not --plan {}",
                    a.plan
                )));
            }
        }
        if a.log_every == 0 {
            return Err(Error::Config("--log-every 0: need at least 1".into()));
        }
        if !a.eval_every.is_multiple_of(a.log_every) {
            return Err(Error::Config(format!(
                "--eval-every {} must be a multiple of --log-every {} (evaluations are reported on the log lines)",
                a.eval_every, a.log_every
            )));
        }
        let (costs, cost) = costs_and_model(&a.planner, root, ranks)?;
        crate::node::install_threads(threads)?;
        let (spec, source, ids) = model_and_source(a)?;
        if a.pipeline && !hash_tables(&spec).is_empty() {
            return Err(Error::Config(
                "--pipeline with hash tables: the next step's keys would be admitted and evicted before this step's gradients are applied; train them without --pipeline".into(),
            ));
        }
        let micro = match a.global_batch {
            Some(m) => m,
            None => a.batch.checked_mul(ranks).ok_or_else(|| {
                Error::Config(format!("--batch {} x {} ranks overflows", a.batch, ranks))
            })?,
        };
        if micro == 0 {
            return Err(Error::Config(
                "--batch/--global-batch must be at least 1".into(),
            ));
        }
        if a.accumulate == 0 {
            return Err(Error::Config("--accumulate must be at least 1".into()));
        }
        for (flag, lr) in [("--table-lr", a.table_lr), ("--dense-lr", a.dense_lr)] {
            if !(lr.is_finite() && lr > 0.0) {
                return Err(Error::Config(format!(
                    "{flag} {lr}: a learning rate must be a finite number > 0"
                )));
            }
        }
        let mem = mem_per_rank(&a.planner)?;
        // A resumed run may overwrite the model and plan its first attempt wrote.
        let resumed = checkpoint_config(a).continues_a_run();
        let inputs = a.inputs();
        for out in [&a.plan_out, &a.out].into_iter().flatten() {
            crate::io::outfile::check_output(out, a.force || resumed)?;
            crate::io::outfile::check_apart(out, &inputs)?;
            if root {
                crate::io::outfile::probe_writable(out)?;
            }
        }
        // A rank's ids of one table in one step travel with u32 offsets.
        let max_val = spec.tables.iter().map(|t| t.valency).fold(1.0, f64::max);
        let step = micro as f64 * a.accumulate as f64;
        if step * max_val * 2.0 > u32::MAX as f64 {
            return Err(Error::Config(format!(
                "a step of {step} examples with up to {max_val} ids per example is too large \
                 (more than 2^31 ids per table); use a smaller --batch or --accumulate"
            )));
        }
        // What does not depend on the placement, before the plan samples batches.
        let dense_opt = match a.dense_opt {
            DenseOptKind::Sgd => DenseOpt::Sgd { lr: a.dense_lr },
            DenseOptKind::Adagrad => DenseOpt::adagrad(a.dense_lr),
            DenseOptKind::Adam => DenseOpt::adam(a.dense_lr),
        };
        let preloaded = preloaded_per_rank(a.preload, a.steps, step, ranks);
        footprint::check(&spec, micro, a.accumulate, ranks, &dense_opt, 0, preloaded)?;
        let dense_gemm = match a.dense_gemm {
            DenseGemmArg::Auto => Gemm::auto(),
            DenseGemmArg::Openblas => Gemm::Blas,
            DenseGemmArg::Avx512 => Gemm::Avx512.available().map_err(|e| {
                Error::Config(format!("--dense-gemm avx512: {e} (use auto or openblas)"))
            })?,
        };
        let table_opt = table_opt_of(a.planner.table_opt, a.table_lr, &a.optim)?;
        let ftrl = matches!(table_opt, TableOpt::Ftrl { .. });
        let lr_schedule = lr_schedule_of(&a.optim, ftrl)?;
        let dense_wd = a.optim.dense_weight_decay;
        if !(dense_wd.is_finite() && dense_wd >= 0.0) {
            return Err(Error::Config(format!(
                "--dense-weight-decay {dense_wd}: must be a finite number >= 0"
            )));
        }
        let eval_examples = source.eval_examples().unwrap_or(a.eval_examples);
        let cfg = EmbedConfig {
            accumulate: a.accumulate,
            dense_opt,
            dense_wd,
            lr_schedule,
            dense_gemm,
            dedup: !a.no_dedup,
            pipeline: a.pipeline,
            eval_examples,
            eval_every: a.eval_every,
            log_every: a.log_every,
            mem_per_rank: mem,
            ids,
            ..EmbedConfig::new(spec, a.seed, micro, a.steps, table_opt)
        };
        Ok((cfg, source, cost, costs))
    }
}
