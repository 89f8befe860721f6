//! `torusrec plan`: the planner against the table-wise heuristics on the model's
//! batch statistics, each table's output mode with both modes' bytes and seconds,
//! with `--costs` the predicted steps, the plan written; `--tasks`, the planners
//! compared on sampled tasks.

use std::path::Path;

use super::config::{
    costs_and_model, mem_per_rank, plan_options, planner_state_per_row, table_opt,
    table_state_per_row,
};
use super::model::resolve_model;
use super::report::{plan_summary, secs};
use crate::cli::PlanArgs;
use crate::comm::Comm;
use crate::data::clicks::gen::ClickGen;
use crate::data::clicks::source::Source;
use crate::embed::calibrate::Costs;
use crate::embed::planner::{self, CostModel, Heuristic, PlanOptions, PlanReport};
use crate::embed::tables::keys::IdMap;
use crate::embed::tables::placement::Plan;
use crate::embed::train::batch_stats::{load_or_measure_stats, BatchStats};
use crate::metrics::human_bytes;
use crate::spec::ModelSpec;
use crate::{Error, Result};

/// Largest `plan --ranks` (a torus of 2^16 chips is beyond any this project models).
pub const MAX_PLAN_RANKS: usize = 1 << 16;
/// Largest `plan --tasks`.
pub const MAX_PLAN_TASKS: usize = 10_000;
/// Most ids one sampled global batch may hold for `plan` (about 4 GB as u32 ids).
pub const MAX_SAMPLED_IDS: u64 = 1 << 30;

/// Collective: every rank must call (rank 0 does the work). `torusrec plan`.
pub fn global_plan<C: Comm>(comm: &C, a: &PlanArgs) -> Result<()> {
    let res = (|| -> Result<()> {
        let (spec, mem, method) = check_args(a)?;
        let (costs, cost) = costs_and_model(&a.planner, comm.rank() == 0, a.ranks)?;
        if comm.rank() != 0 {
            return Ok(());
        }
        if a.tasks > 0 {
            return plan_tasks(&spec, a, mem, &cost);
        }
        local_plan(&spec, a, mem, method, (costs.as_ref(), &cost))
    })();
    comm.agree(res)
}

/// `plan`'s flags checked (exit 2 on a bad one): the model, `--mem-per-rank` and
/// `--method`.
fn check_args(a: &PlanArgs) -> Result<(ModelSpec, Option<u64>, Option<Heuristic>)> {
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
        crate::io::outfile::check_output(out, a.force)?;
        let p = &a.planner;
        let inputs: Vec<(&str, &Path)> = [
            ("--tables", &a.model.tables),
            ("--stats", &p.stats),
            ("--cost-model", &p.cost_model),
            ("--costs", &p.costs),
        ]
        .into_iter()
        .filter_map(|(flag, v)| v.as_deref().map(|v| (flag, v)))
        .collect();
        crate::io::outfile::check_apart(out, &inputs)?;
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
    Ok((spec, mem, method))
}

/// Rank 0: `plan` of `spec` under `cost` (and the measured `costs`, when given): the
/// tables, the methods, the output modes, the predictions, the plan written.
fn local_plan(
    spec: &ModelSpec,
    a: &PlanArgs,
    mem: Option<u64>,
    method: Option<Heuristic>,
    (costs, cost): (Option<&Costs>, &CostModel),
) -> Result<()> {
    let state = table_state_per_row(a.planner.table_opt, spec);
    let (stats, how) = plan_stats(spec, a)?;
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
        (table_opt(a.planner.table_opt, 0.01), spec),
        a.seed,
        cost,
    );
    let (plan, rep) = planner::plan_auto(spec, &stats, &opts)?;
    print_methods(spec, &stats, &opts, &rep);
    println!("plan: {}", plan_summary(spec, &plan, state));
    print_modes(spec, &stats, &plan, &opts, state);
    println!("plan: {}", plan_summary(spec, &plan, state));
    if let (Some(c), Some(path)) = (costs, a.planner.costs.as_deref()) {
        print_predictions(spec, a, (c, path), &stats, &opts, &rep);
    }
    let plan = match method {
        None => plan,
        Some(h) => {
            let (p, _) = planner::plan_heuristic(h, spec, &stats, &opts)?;
            println!(
                "plan: --out gets the {} plan: {}",
                h.name(),
                plan_summary(spec, &p, state)
            );
            p
        }
    };
    if let Some(out) = &a.out {
        let text =
            serde_json::to_string_pretty(&plan).map_err(|e| Error::Config(format!("plan: {e}")))?;
        crate::io::outfile::write(out, text.as_bytes())?;
        println!("wrote {}", out.display());
    }
    Ok(())
}

/// The batch statistics `plan` plans with (estimated with `--estimate`, else
/// sampled from generated batches or read from `--stats`) and how they were had.
fn plan_stats(spec: &ModelSpec, a: &PlanArgs) -> Result<(BatchStats, &'static str)> {
    Ok(if a.estimate {
        (
            crate::embed::train::batch_stats::synthetic_stats(spec, a.ranks, a.batch),
            "estimated",
        )
    } else {
        let src = Source::Generated(ClickGen::new(spec, a.seed));
        load_or_measure_stats(
            spec,
            &src,
            &IdMap::default(),
            a.seed,
            a.ranks,
            a.batch,
            a.sample_batches,
            a.planner.stats.as_deref(),
        )?
    })
}

/// The planner's and each heuristic's imbalance, balance, cost and memory.
fn print_methods(spec: &ModelSpec, stats: &BatchStats, opts: &PlanOptions, rep: &PlanReport) {
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
    row("planner", rep);
    for h in Heuristic::ALL {
        match planner::plan_heuristic(h, spec, stats, opts) {
            Ok((_, r)) => row(h.name(), &r),
            Err(e) => println!("{:<14} does not fit: {e}", h.name()),
        }
    }
}

/// Output modes: the cost model's choice per table, with both modes' bytes and
/// seconds.
fn print_modes(spec: &ModelSpec, stats: &BatchStats, plan: &Plan, opts: &PlanOptions, state: u64) {
    let mc = planner::mode_costs(spec, stats, plan, &opts.model, state);
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
}

/// The step the measured costs `c` (from file `path`) predict for the planner's plan
/// and each heuristic's.
fn print_predictions(
    spec: &ModelSpec,
    a: &PlanArgs,
    (c, path): (&Costs, &Path),
    stats: &BatchStats,
    opts: &PlanOptions,
    rep: &PlanReport,
) {
    let layers = spec.mlp_layers();
    let mut rows = vec![("planner", rep.cost_per_rank.clone())];
    for h in Heuristic::ALL {
        if let Ok((_, r)) = planner::plan_heuristic(h, spec, stats, opts) {
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
        let stats = crate::embed::train::batch_stats::synthetic_stats(task, a.ranks, a.batch);
        // Memory: twice an even share or the largest table, whichever is more (the
        // heuristics place tables whole), unless --mem-per-rank says otherwise.
        let state = planner_state_per_row(opt, task);
        let bytes = |t: &crate::spec::TableSpec| t.vocab * (t.dim as u64 + state) * 4;
        let total: u64 = task.tables.iter().map(bytes).sum();
        let largest = task.tables.iter().map(bytes).max().unwrap_or(0);
        let m = mem.unwrap_or((2 * total / a.ranks as u64).max(2 * largest));
        let opts = plan_options(a.ranks, Some(m), (opt, task), a.seed, cost);
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
