//! `torusrec embed`, `torusrec plan` and `torusrec generate clicks`.

use super::output::RunOutput;
use std::path::{Path, PathBuf};

use crate::app::group;
use crate::ckpt::signals::Preemption;
use crate::ckpt::CheckpointConfig;
use crate::cli::{
    DenseGemmArg, DenseOptKind, EmbedArgs, GenerateClicksArgs, ModelArgs, OutputModeArg, PlanArgs,
    PlannerArgs, TableOptKind, VocabArg,
};
use crate::clicks::gen::ClickGen;
use crate::clicks::log_file::{write_click_log, ClickLog};
use crate::clicks::source::Source;
use crate::comm::Comm;
use crate::embed::calibrate::{Costs, StepPrediction};
use crate::embed::driver::{global_train, Event, RunConfig, Summary};
use crate::embed::gemm::Gemm;
use crate::embed::keys::{hash_tables, IdMap};
use crate::embed::memory;
use crate::embed::mlp::DenseOpt;
use crate::embed::placement::{OutputMode, Placement, Plan};
use crate::embed::planner;
use crate::embed::planner::{CostModel, Heuristic, PlanOptions};
use crate::embed::stats::{load_or_measure_stats, BatchStats};
use crate::embed::tables::TableOpt;
use crate::embed::train::{EmbedConfig, IntervalReport};
use crate::metrics::human_bytes;
use crate::node::resolve_threads;
use crate::spec::{preset, Evict, ModelSpec, VocabKind};
use crate::{Error, Result};

pub use crate::metrics::parse_bytes;

/// The model named by `--preset` or `--tables`.
pub fn resolve_model(m: &ModelArgs) -> Result<ModelSpec> {
    match (&m.preset, &m.tables) {
        (Some(p), None) => preset(p, m.scale),
        (None, Some(t)) => ModelSpec::from_toml_file(t),
        _ => Err(Error::Config(
            "give the model with --preset NAME or --tables T.toml".into(),
        )),
    }
}

/// Optimizer floats per table row under `kind`.
pub fn table_state_per_row(kind: TableOptKind) -> u64 {
    table_opt(kind, 0.01).state_per_row() as u64
}

fn table_opt(kind: TableOptKind, lr: f32) -> TableOpt {
    match kind {
        TableOptKind::Sgd => TableOpt::Sgd { lr },
        TableOptKind::RowwiseAdagrad => TableOpt::RowWiseAdagrad { lr, eps: 1e-8 },
    }
}

/// Collective: every rank must call. `generate clicks`: rank 0 writes the log.
pub fn global_generate_clicks<C: Comm>(comm: &C, a: &GenerateClicksArgs) -> Result<()> {
    let res = (|| {
        let spec = resolve_model(&a.model)?;
        if a.examples == 0 {
            return Err(Error::Config("--examples must be at least 1".into()));
        }
        if comm.rank() != 0 {
            return Ok(());
        }
        let t = std::time::Instant::now();
        let s = write_click_log(&a.out, &spec, a.seed, a.examples, a.force, 65536)?;
        println!(
            "clicks: {} examples, {} tables, {} ids, positive rate {:.4}, {} in {:.1} s -> {}",
            group(s.examples),
            spec.tables.len(),
            group(s.ids_per_table.iter().sum()),
            s.positive_rate,
            human_bytes(s.bytes),
            t.elapsed().as_secs_f64(),
            a.out.display()
        );
        Ok(())
    })();
    comm.agree(res)
}

fn plan_summary(spec: &ModelSpec, plan: &Plan, state: u64) -> String {
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
pub(super) fn plan_kinds(plan: &Plan) -> String {
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

fn plan_options(
    world: usize,
    mem: Option<u64>,
    opt: TableOpt,
    seed: u64,
    model: &CostModel,
) -> PlanOptions {
    let mut o = PlanOptions::new(world, mem.unwrap_or(u64::MAX));
    o.state_per_row = opt.state_per_row() as u64;
    o.seed = seed;
    o.model = model.clone();
    o
}

/// `--mem-per-rank` in bytes (`None`: no limit); a bad size is refused (exit 2).
fn mem_per_rank(p: &PlannerArgs) -> Result<Option<u64>> {
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
fn costs_and_model(
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

/// Seconds with four significant digits, in plain notation.
pub fn secs(x: f64) -> String {
    if !(x.is_finite() && x > 0.0) {
        return format!("{x}");
    }
    let decimals = (3 - x.log10().floor() as i64).clamp(0, 15) as usize;
    format!("{x:.decimals$}")
}

/// The `plan: predicted step` line.
fn prediction_line(p: &StepPrediction, path: &Path) -> String {
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
                    let (plan, rep) =
                        planner::plan_auto(spec, &st, &plan_options(world, mem, opt, seed, model))?;
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

fn interval_line(r: &IntervalReport, steps: u64) -> String {
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

/// The examples one rank holds with `--preload`: its share of every step's (an
/// over-count on a resume, which preloads from its step on).
fn preloaded_per_rank(preload: bool, steps: u64, step_examples: f64, ranks: usize) -> u64 {
    if preload {
        (steps as f64 * step_examples / ranks.max(1) as f64).ceil() as u64
    } else {
        0
    }
}

/// The checkpoint settings of `embed` (no `--wait-for-data`).
fn checkpoint_config(a: &EmbedArgs) -> CheckpointConfig {
    a.checkpoint.config(a.checkpoint_every, 0.0)
}

/// The model to train, where its examples come from, and how their ids become the
/// model's rows: the click log's model (or `--tables`, which must match its tables
/// and dense features) or `--preset`/`--tables` for generated examples, with
/// `--vocab`, `--capacity`, `--admit-after`, `--evict` and `--dim` applied to every
/// table.
fn model_and_source(a: &EmbedArgs) -> Result<(ModelSpec, Source, IdMap)> {
    let (data, mut model, source, keyed) = match &a.data {
        Some(p) => {
            let log = ClickLog::open(p)?;
            let data = log.spec().clone();
            let model = match &a.model.tables {
                Some(t) => ModelSpec::from_toml_file(t)?,
                None => data.clone(),
            };
            let n = log.examples();
            let eval = match a.eval_day {
                Some(k) => {
                    let days = log.days();
                    let d = days.len().saturating_sub(1);
                    if k >= d {
                        return Err(Error::Config(format!(
                            "--eval-day {k}: {} has {d} day(s), numbered from 0",
                            p.display()
                        )));
                    }
                    let eval = days[k]..days[k + 1];
                    if eval.is_empty() {
                        return Err(Error::Config(format!(
                            "--eval-day {k}: day {k} of {} has no examples",
                            p.display()
                        )));
                    }
                    if eval.end - eval.start == n {
                        return Err(Error::Config(format!(
                            "--eval-day {k}: {} has no other day to train on",
                            p.display()
                        )));
                    }
                    eval
                }
                None => {
                    if a.eval_examples >= n {
                        return Err(Error::Config(format!(
                            "{}: {n} examples, cannot hold out --eval-examples {}",
                            p.display(),
                            a.eval_examples
                        )));
                    }
                    n - a.eval_examples..n
                }
            };
            let keyed = log.keyed();
            let source = Source::Log {
                log,
                eval,
                eval_day: a.eval_day,
            };
            (data, model, source, keyed)
        }
        None => {
            let spec = resolve_model(&a.model)?;
            let g = ClickGen::new(&spec, a.seed);
            (spec.clone(), spec, Source::Generated(g), false)
        }
    };
    if let (Some(from), None) = (&a.init_from, &a.capacity) {
        inherit_capacities(&mut model, from)?;
    }
    override_tables(&mut model, a)?;
    model.validate("the model")?;
    let ids = IdMap::new(&data, &model, keyed)?;
    Ok((model, source, ids))
}

/// A warm start without `--capacity`: each hash table keeps the capacity it had in
/// the checkpoint (a log's own default, its distinct keys, would otherwise shrink a
/// table trained on a longer history).
fn inherit_capacities(model: &mut ModelSpec, from: &Path) -> Result<()> {
    let path = crate::embed::checkpoint::init_from_path(from)?;
    let Some(theirs) = crate::embed::checkpoint::local_read_spec(&path)? else {
        return Ok(());
    };
    for (m, t) in model.tables.iter_mut().zip(&theirs.tables) {
        if m.vocab_kind == VocabKind::Hash && t.vocab_kind == VocabKind::Hash && m.name == t.name {
            m.vocab = t.vocab;
        }
    }
    Ok(())
}

/// `--vocab`, `--capacity`, `--admit-after`, `--evict` and `--dim` on every table;
/// each refused where it would not act.
fn override_tables(model: &mut ModelSpec, a: &EmbedArgs) -> Result<()> {
    if let Some(v) = a.vocab {
        let kind = match v {
            VocabArg::Fixed => VocabKind::Fixed,
            VocabArg::Modulo => VocabKind::Modulo,
            VocabArg::Hash => VocabKind::Hash,
        };
        for t in &mut model.tables {
            if kind != VocabKind::Hash {
                t.admit_after = 1;
                t.evict = Evict::Lfu;
            }
            t.vocab_kind = kind;
        }
    }
    let kinds = |k: VocabKind| model.tables.iter().filter(|t| t.vocab_kind == k).count();
    let (hashed, modulo) = (kinds(VocabKind::Hash), kinds(VocabKind::Modulo));
    if let Some(c) = &a.capacity {
        if hashed + modulo == 0 {
            return Err(Error::Config(
                "--capacity sets the rows of modulo and hash tables; the model has none (give --vocab hash or modulo)".into(),
            ));
        }
        let bad = || {
            Error::Config(format!(
                "--capacity {}: give rows (e.g. 1000000) or a factor of each table's vocab (e.g. 1.1x)",
                crate::error::quote(c)
            ))
        };
        let rows = |vocab: u64| -> Result<u64> {
            match c.strip_suffix('x') {
                Some(f) => {
                    let f: f64 = f.parse().map_err(|_| bad())?;
                    if !(f.is_finite() && f > 0.0) {
                        return Err(bad());
                    }
                    Ok((vocab as f64 * f).ceil() as u64)
                }
                None => c.parse().map_err(|_| bad()),
            }
        };
        for t in &mut model.tables {
            if t.vocab_kind != VocabKind::Fixed {
                t.vocab = rows(t.vocab)?;
            }
        }
    }
    if hashed == 0 && (a.admit_after.is_some() || a.evict.is_some()) {
        return Err(Error::Config(
            "--admit-after and --evict act on hash tables; the model has none (give --vocab hash)"
                .into(),
        ));
    }
    let evict = a
        .evict
        .as_deref()
        .map(Evict::parse)
        .transpose()
        .map_err(|e| Error::Config(format!("--evict: {e}")))?;
    for t in &mut model.tables {
        if t.vocab_kind == VocabKind::Hash {
            if let Some(n) = a.admit_after {
                t.admit_after = n;
            }
            if let Some(e) = evict {
                t.evict = e;
            }
        }
        if let Some(d) = a.dim {
            t.dim = d;
        }
    }
    Ok(())
}

/// What `embed` trains with, from its flags: the configuration, the examples' source,
/// the planner's cost model and the measured costs (`--costs`).
type Setup = (EmbedConfig, Source, CostModel, Option<Costs>);

impl EmbedArgs {
    /// Validate `embed`'s flags (exit 2 on a bad one) and read what they name (the model,
    /// the click log, the cost files), for `ranks` ranks with `threads` threads each
    /// (building the global thread pool); `root` also checks that `--out` is writable.
    /// Rank-local: every rank calls it before the first collective and the caller
    /// agrees on the outcome.
    fn local_setup(&self, threads: usize, root: bool, ranks: usize) -> Result<Setup> {
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
        if let Some(p) = &a.plan_out {
            crate::outfile::check_output(p, a.force || resumed)?;
            if root {
                crate::outfile::probe_writable(p)?;
            }
        }
        if let Some(out) = &a.out {
            crate::outfile::check_output(out, a.force || resumed)?;
            if root {
                crate::outfile::probe_writable(out)?;
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
            DenseOptKind::Adagrad => DenseOpt::adagrad(a.dense_lr),
            DenseOptKind::Adam => DenseOpt::adam(a.dense_lr),
        };
        let preloaded = preloaded_per_rank(a.preload, a.steps, step, ranks);
        memory::check(&spec, micro, a.accumulate, ranks, &dense_opt, 0, preloaded)?;
        let dense_gemm = match a.dense_gemm {
            DenseGemmArg::Auto => Gemm::auto(),
            DenseGemmArg::Openblas => Gemm::Blas,
            DenseGemmArg::Avx512 => Gemm::Avx512.available().map_err(|e| {
                Error::Config(format!("--dense-gemm avx512: {e} (use auto or openblas)"))
            })?,
        };
        let cfg = EmbedConfig {
            spec,
            seed: a.seed,
            micro,
            accumulate: a.accumulate,
            steps: a.steps,
            table_opt: table_opt(a.planner.table_opt, a.table_lr),
            dense_opt,
            dense_gemm,
            dedup: !a.no_dedup,
            pipeline: a.pipeline,
            eval_examples: source.eval_examples().unwrap_or(a.eval_examples),
            eval_every: a.eval_every,
            log_every: a.log_every,
            mem_per_rank: mem,
            ids,
        };
        Ok((cfg, source, cost, costs))
    }
}

/// Collective: every rank must call. `torusrec embed`.
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
    // Without --mem-per-rank the planner places at most what the memory check below
    // admits: the node's share less the rest of the estimate.
    let plan_mem = cfg.mem_per_rank.or_else(|| {
        let budget = memory::table_budget(
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
    });
    let (plan, plan_stats) = global_resolve_plan(
        comm,
        &a.plan,
        &cfg.spec,
        &source,
        &cfg.ids,
        cfg.seed,
        per_rank,
        plan_mem,
        cfg.table_opt,
        a.planner.stats.as_deref(),
        &cost,
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
                .and_then(|bytes| crate::outfile::write(p, &bytes))
        } else {
            Ok(())
        };
        comm.agree(written)?;
    }
    // Optimizer floats per table row, counted in every rank's table bytes.
    let state = cfg.table_opt.state_per_row() as u64;
    if root {
        let s = &cfg.spec;
        println!(
            "embed: {} tables ({} rows, {} of f32), MLP {:?} ({} GEMM), micro-batch {} x {} per step on {} rank(s) (torus {}) x {threads} thread(s); tables {:?}, dense {:?}; dedup {}, pipeline {}",
            s.tables.len(),
            group(s.total_rows()),
            human_bytes(s.total_bytes()),
            s.mlp_layers(),
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
        println!("plan: {}", plan_summary(s, &plan, state));
    }
    // Rank 0: the step the measured costs predict for this plan (in its final modes).
    let predicted = match (&costs, &plan_stats, a.planner.costs.as_deref()) {
        (Some(c), Some(st), Some(path)) => {
            let rep = planner::evaluate(&cfg.spec, st, &plan, &cost, state);
            let p = c.predict(
                rep.cost_per_rank,
                &cfg.spec.mlp_layers(),
                per_rank,
                comm.size(),
            );
            println!("{}", prediction_line(&p, path));
            Some(p)
        }
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
    comm.agree(memory::check(
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
    };
    let on_event = |e: Event| match e {
        Event::Resumed {
            path,
            manifest,
            seconds,
        } => {
            if root {
                println!(
                    "resumed from {} (written by {} rank(s)) at step {} in {seconds:.2} s",
                    path.display(),
                    manifest.world_size,
                    manifest.step,
                );
            }
        }
        Event::WarmStarted { start, seconds } => {
            if root {
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
                            comm.size(),
                            group(start.dropped)
                        )
                    } else {
                        String::new()
                    }
                );
            }
        }
        Event::Preloaded { from, to, seconds } => {
            if root {
                println!("preloaded the examples of steps {from}..{to} in {seconds:.1} s");
            }
        }
        Event::Step { done, steps } => out.progress(done, steps),
        Event::Interval(r) => {
            out.line(&interval_line(r, steps));
            out.record(r);
            timed.push(Timed {
                seconds: r.seconds,
                steps: r.steps,
                busy: r.busy_per_rank.clone(),
                busy_cpu: r.busy_cpu_per_rank.clone(),
            });
        }
    };
    let eval_examples = cfg.eval_examples;
    let gemm = cfg.dense_gemm.name();
    let mut inner = on_event;
    let on_event = move |e: Event<'_>| {
        if let Event::Resumed { manifest: m, .. } = &e {
            if root && !m.dense_gemm.is_empty() && m.dense_gemm != gemm {
                log::warn!(
                    "the checkpoint was written with the {} GEMM, this run uses {gemm}: its bits will differ from an uninterrupted run's (within rounding)",
                    m.dense_gemm
                );
            }
        }
        inner(e)
    };
    let s = global_train(comm, cfg, source, &plan, &run, preempt, on_event)?;
    if root {
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
            "checksum": s.checksum, "peak_rss_bytes": s.peak_rss_bytes, "ranks": comm.size(), "threads": threads});
        if let Some(p) = &predicted {
            let m = measured_step(&timed);
            println!("{}", measured_line(&m, p));
            v["predicted"] = serde_json::json!(p);
            v["measured"] = serde_json::json!(m);
        }
        out.record(&v);
    }
    Ok(s)
}

/// One interval's seconds, steps and busy seconds per rank (wall and CPU; see
/// [`crate::embed::train::IntervalReport`]).
struct Timed {
    seconds: f64,
    steps: u64,
    busy: Vec<f64>,
    busy_cpu: Vec<f64>,
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

fn measured_step(timed: &[Timed]) -> MeasuredStep {
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

fn measured_line(m: &MeasuredStep, p: &StepPrediction) -> String {
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

/// Largest `plan --ranks` (a torus of 2^16 chips is beyond any this project models).
pub const MAX_PLAN_RANKS: usize = 1 << 16;
/// Largest `plan --tasks`.
pub const MAX_PLAN_TASKS: usize = 10_000;
/// Most ids one sampled global batch may hold for `plan` (about 4 GB as u32 ids).
pub const MAX_SAMPLED_IDS: u64 = 1 << 30;

/// Collective: every rank must call (rank 0 does the work). `torusrec plan`.
pub fn global_plan<C: Comm>(comm: &C, a: &PlanArgs) -> Result<()> {
    let res = (|| -> Result<()> {
        let spec = resolve_model(&a.model)?;
        if a.ranks == 0 || a.batch == 0 {
            return Err(Error::Config(
                "--ranks and --batch must be at least 1".into(),
            ));
        }
        // The planner keeps costs per rank and table, and the batch statistics
        // sample global batches of --batch x --ranks examples.
        if a.ranks > MAX_PLAN_RANKS {
            return Err(Error::Config(format!(
                "--ranks {}: at most {MAX_PLAN_RANKS}",
                a.ranks
            )));
        }
        if a.tasks > MAX_PLAN_TASKS {
            return Err(Error::Config(format!(
                "--tasks {}: at most {MAX_PLAN_TASKS}",
                a.tasks
            )));
        }
        let ids: f64 = spec.tables.iter().map(|t| t.valency).sum();
        let sampled = a.batch as f64 * a.ranks as f64 * ids;
        if !a.estimate && sampled > MAX_SAMPLED_IDS as f64 {
            return Err(Error::Config(format!(
                    "a global batch of --batch {} x --ranks {} has about {sampled:.3e} ids, more than the {MAX_SAMPLED_IDS} the statistics sample; use --estimate or a smaller --batch",
                    a.batch, a.ranks
                )));
        }
        let mem = mem_per_rank(&a.planner)?;
        if let Some(out) = &a.out {
            crate::outfile::check_output(out, a.force)?;
        }
        let method = match a.method.as_deref() {
            None | Some("auto") => None,
            Some(m) => Some(
                Heuristic::ALL
                    .into_iter()
                    .find(|h| h.name() == m)
                    .ok_or_else(|| {
                        Error::Config(format!(
                            "--method {}: auto, {}",
                            crate::error::quote(m),
                            Heuristic::ALL.map(|h| h.name()).join(", ")
                        ))
                    })?,
            ),
        };
        if a.tasks > 0 && (a.method.is_some() || a.planner.costs.is_some()) {
            return Err(Error::Config(
                "--tasks compares the planners on sampled tasks; --method and --costs act on the model's plan".into(),
            ));
        }
        let (costs, cost) = costs_and_model(&a.planner, comm.rank() == 0, a.ranks)?;
        if comm.rank() != 0 {
            return Ok(());
        }
        if a.tasks > 0 {
            return plan_tasks(&spec, a, mem, &cost);
        }
        let state = table_state_per_row(a.planner.table_opt);
        let (stats, how) = if a.estimate {
            (
                crate::embed::stats::synthetic_stats(&spec, a.ranks, a.batch),
                "estimated",
            )
        } else {
            let src = Source::Generated(ClickGen::new(&spec, a.seed));
            load_or_measure_stats(
                &spec,
                &src,
                &IdMap::default(),
                a.seed,
                a.ranks,
                a.batch,
                a.sample_batches,
                a.planner.stats.as_deref(),
            )?
        };
        let mem = mem.unwrap_or(u64::MAX);
        println!(
            "plan: {} tables, {} of rows and state, {} ranks x {} per rank; batch statistics {how}",
            spec.tables.len(),
            human_bytes(spec.total_bytes() + spec.total_rows() * state * 4),
            a.ranks,
            if mem == u64::MAX {
                "unlimited".to_string()
            } else {
                human_bytes(mem)
            }
        );
        let opts = plan_options(
            a.ranks,
            Some(mem),
            table_opt(a.planner.table_opt, 0.01),
            a.seed,
            &cost,
        );
        let (plan, rep) = planner::plan_auto(&spec, &stats, &opts)?;
        println!(
            "{:<14} {:>10} {:>9} {:>12} {:>12}",
            "method", "imbalance", "balance", "max cost s", "max memory"
        );
        let row = |name: &str, r: &planner::PlanReport| {
            println!(
                "{name:<14} {:>10.3} {:>9.3} {:>12.6} {:>12}",
                r.imbalance,
                r.balance,
                r.max_cost,
                human_bytes(r.bytes_per_rank.iter().copied().max().unwrap_or(0))
            )
        };
        row("planner", &rep);
        for h in Heuristic::ALL {
            match planner::plan_heuristic(h, &spec, &stats, &opts) {
                Ok((_, r)) => row(h.name(), &r),
                Err(e) => println!("{:<14} does not fit: {e}", h.name()),
            }
        }
        println!("plan: {}", plan_summary(&spec, &plan, state));
        // Output modes: the cost model's choice per table, with both modes' bytes.
        let mc = planner::mode_costs(&spec, &stats, &plan, &opts.model, state);
        println!(
            "{:<4} {:<16} {:<13} {:<7} {:>14} {:>14} {:>12} {:>12}",
            "t",
            "table",
            "placement",
            "output",
            "rows MB/step",
            "pooled MB/step",
            "rows ms",
            "pooled ms"
        );
        for (t, c) in mc.iter().enumerate() {
            println!(
                "{:<4} {:<16} {:<13} {:<7} {:>14.2} {:>14.2} {:>12.3} {:>12.3}",
                t,
                crate::error::quote(&spec.tables[t].name),
                plan.tables[t].kind(),
                plan.mode(t).name(),
                c.rows_bytes / 1e6,
                c.pooled_bytes / 1e6,
                c.rows_seconds * 1e3,
                c.pooled_seconds * 1e3
            );
        }
        println!("plan: {}", plan_summary(&spec, &plan, state));
        if let (Some(c), Some(path)) = (&costs, a.planner.costs.as_deref()) {
            let layers = spec.mlp_layers();
            let mut rows = vec![("planner", rep.cost_per_rank.clone())];
            for h in Heuristic::ALL {
                if let Ok((_, r)) = planner::plan_heuristic(h, &spec, &stats, &opts) {
                    rows.push((h.name(), r.cost_per_rank));
                }
            }
            for (name, per_rank) in rows {
                let p = c.predict(per_rank, &layers, a.batch, a.ranks);
                println!(
                    "predicted {name:<14} step {} s (embedding max {} s, dense {} s, all-reduce {} s; measured costs {})",
                    secs(p.step),
                    secs(p.embedding_max),
                    secs(p.dense),
                    secs(p.allreduce),
                    path.display()
                );
            }
        }
        let plan = match method {
            None => plan,
            Some(h) => {
                let (p, _) = planner::plan_heuristic(h, &spec, &stats, &opts)?;
                println!(
                    "plan: --out gets the {} plan: {}",
                    h.name(),
                    plan_summary(&spec, &p, state)
                );
                p
            }
        };
        if let Some(out) = &a.out {
            let text = serde_json::to_string_pretty(&plan)
                .map_err(|e| Error::Config(format!("plan: {e}")))?;
            crate::outfile::write(out, text.as_bytes())?;
            println!("wrote {}", out.display());
        }
        Ok(())
    })();
    comm.agree(res)
}

/// `plan --tasks N`: the planner against the four heuristics on sampled table tasks,
/// as a Markdown table (imbalance `N max / sum` under the cost model; "-" where a
/// heuristic cannot fit the memory).
fn plan_tasks(pool: &ModelSpec, a: &PlanArgs, mem: Option<u64>, cost: &CostModel) -> Result<()> {
    let opt = table_opt(a.planner.table_opt, 0.01);
    let tasks = planner::sample_tasks(pool, a.tasks, 10..31, a.seed);
    println!(
        "| task | tables | planner | {} | planner <= lookup-greedy |",
        Heuristic::ALL.map(|h| h.name()).join(" | ")
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut sums = [0.0f64; 5];
    let mut all_ok = true;
    for (i, task) in tasks.iter().enumerate() {
        let stats = crate::embed::stats::synthetic_stats(task, a.ranks, a.batch);
        // Memory: twice an even share or the largest table, whichever is more (the
        // heuristics place tables whole), unless --mem-per-rank says otherwise.
        let state = opt.state_per_row() as u64;
        let bytes = |t: &crate::spec::TableSpec| t.vocab * (t.dim as u64 + state) * 4;
        let total: u64 = task.tables.iter().map(bytes).sum();
        let largest = task.tables.iter().map(bytes).max().unwrap_or(0);
        let m = mem.unwrap_or((2 * total / a.ranks as u64).max(2 * largest));
        let opts = plan_options(a.ranks, Some(m), opt, a.seed, cost);
        let (_, auto) = planner::plan_auto(task, &stats, &opts)?;
        let mut cells = vec![format!("{:.3}", auto.imbalance)];
        sums[0] += auto.imbalance;
        let mut lookup = f64::INFINITY;
        for (k, h) in Heuristic::ALL.iter().enumerate() {
            match planner::plan_heuristic(*h, task, &stats, &opts) {
                Ok((_, r)) => {
                    sums[k + 1] += r.imbalance;
                    if *h == Heuristic::Lookup {
                        lookup = r.imbalance;
                    }
                    cells.push(format!("{:.3}", r.imbalance));
                }
                Err(_) => cells.push("-".into()),
            }
        }
        let ok = auto.imbalance <= lookup + 1e-12;
        all_ok &= ok;
        println!(
            "| {} | {} | {} | {} |",
            i + 1,
            task.tables.len(),
            cells.join(" | "),
            if ok { "yes" } else { "NO" }
        );
    }
    let n = tasks.len() as f64;
    println!(
        "| mean | | {} | {} |",
        sums.map(|v| format!("{:.3}", v / n)).join(" | "),
        if all_ok { "yes, on every task" } else { "NO" }
    );
    Ok(())
}
