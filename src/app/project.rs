//! `torusrec project als` and `torusrec project measure` (see `crate::projection`).

use crate::als::ExchangeKind;
use crate::ckpt::signals::Preemption;
use crate::cli::{ChipArgs, ProjectAlsArgs, ProjectCommand, ProjectEmbedArgs, ProjectMeasureArgs};
use crate::comm::{parse_torus, Comm};
use crate::data::graph::webgraph_gen::WebGraphSpec;
use crate::error::{quote, Error, Result};
use crate::projection::als::{AlsModel, AlsParams, DegreeSample};
use crate::projection::chip::{default_shapes, preset, Calibration, Chip, PRESETS};
use crate::projection::measure::{global_measure, TrainArcs};
use std::fmt::Write as _;
use std::path::Path;

/// Collective: every rank must call.
pub fn global_run<C: Comm>(comm: &C, cmd: &ProjectCommand, preempt: Preemption) -> Result<()> {
    match cmd {
        ProjectCommand::Als(args) => comm.agree(if comm.rank() == 0 {
            run_als(args, &preempt)
        } else {
            Ok(())
        }),
        ProjectCommand::Embed(args) => comm.agree(if comm.rank() == 0 {
            run_embed(args, &preempt)
        } else {
            Ok(())
        }),
        ProjectCommand::Measure(args) => global_run_measure(comm, args, preempt),
    }
}

fn read_calibration(path: &Path) -> Result<Calibration> {
    let bad = |msg: String| Error::Input {
        path: path.to_path_buf(),
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let c = v.get("calibration").cloned().unwrap_or(v);
    let c: Calibration = serde_json::from_value(c)
        .map_err(|e| bad(format!("not a calibration from `project measure`: {e}")))?;
    let ok = |x: f64| x.is_finite() && x > 0.0;
    if !(ok(c.link_bandwidth)
        && ok(c.solve_flops)
        && ok(c.peak_flops)
        && c.link_latency >= 0.0
        && c.node_bandwidth.is_none_or(ok))
    {
        return Err(bad("rates must be positive and finite".into()));
    }
    Ok(c)
}

fn chip_of(args: &ChipArgs, cal: Option<&Calibration>) -> Result<Chip> {
    let mut chip = if args.chip == "here" {
        cal.ok_or_else(|| {
            Error::Config(
                "--chip here needs --calibration (from `torusrec project measure`)".into(),
            )
        })?
        .chip()
    } else {
        preset(&args.chip).ok_or_else(|| {
            Error::Config(format!(
                "--chip {}: expected one of {} or here",
                quote(&args.chip),
                PRESETS.join(", ")
            ))
        })?
    };
    let pos = |name: &str, v: Option<f64>| -> Result<Option<f64>> {
        match v {
            Some(x) if !(x.is_finite() && x > 0.0) => Err(Error::Config(format!(
                "--{name} must be positive and finite (got {x})"
            ))),
            other => Ok(other),
        }
    };
    if let Some(x) = pos("peak-tflops", args.peak_tflops)? {
        chip.peak_flops = x * 1e12;
    }
    if let Some(x) = pos("memory-gib", args.memory_gib)? {
        chip.memory_bytes = (x * (1u64 << 30) as f64) as u64;
    }
    if let Some(x) = pos("memory-gbs", args.memory_gbs)? {
        chip.memory_bandwidth = Some(x * 1e9);
    }
    if let Some(x) = pos("link-gbs", args.link_gbs)? {
        chip.link_bandwidth = x * 1e9;
    }
    if let Some(x) = args.link_latency_us {
        if !(x.is_finite() && x >= 0.0) {
            return Err(Error::Config(format!(
                "--link-latency-us must be >= 0 and finite (got {x})"
            )));
        }
        chip.link_latency = x * 1e-6;
    }
    Ok(chip)
}

fn shapes_of(args: &ChipArgs, chip: &Chip) -> Result<Vec<Vec<usize>>> {
    match &args.shapes {
        None => Ok(default_shapes(&chip.max_shape)),
        Some(list) => list
            .split(',')
            .map(|s| {
                let s = s.trim();
                let n: usize = s
                    .split('x')
                    .map(|t| t.parse::<usize>().unwrap_or(0))
                    .product();
                let dims = parse_torus(s, n.max(1))?;
                if n == 0 || dims.len() > 3 {
                    return Err(Error::Config(format!(
                        "--shapes: {} is not a torus shape like 4x4 or 4x4x4",
                        quote(s)
                    )));
                }
                if n > 8192 {
                    return Err(Error::Config(format!(
                        "--shapes: {} has {n} chips; at most 8192 are projected",
                        quote(s)
                    )));
                }
                Ok(dims)
            })
            .collect(),
    }
}

/// One row of the projection table.
struct Row {
    shape: String,
    chips: usize,
    cores: usize,
    scheme: &'static str,
    memory: u64,
    fits: bool,
    compute: Option<f64>,
    comm: f64,
    busiest: u64,
    mean: f64,
    exchanged: u64,
    /// The epoch's traffic and row-gather bytes (for the anchors).
    traffic: crate::projection::traffic::Traffic,
    gather_bytes: f64,
}

/// The ALS workload at P chips, built per chip count: exact from a dataset's training
/// arcs, or the degree model of a `--webgraph` preset. A model at P chips.
type ModelAt = Box<dyn Fn(usize) -> Result<AlsModel>>;

/// `project als`'s workload and the line that names it.
fn als_model_at(args: &ProjectAlsArgs) -> Result<(String, ModelAt)> {
    Ok(match (&args.data, &args.webgraph) {
        (Some(path), _) => {
            // Read once; the model is rebuilt per chip count.
            let arcs = TrainArcs::local_read(path)?;
            (
                format!("{} (exact, from its training arcs)", path.display()),
                Box::new(move |p| Ok(arcs.model(p))),
            )
        }
        (None, Some(name)) => {
            let spec = WebGraphSpec::from_preset(name, args.scale).map_err(Error::Config)?;
            let sample = DegreeSample::new(&spec, args.seed);
            let label = format!("webgraph {name} x{}", args.scale);
            (
                format!(
                    "webgraph {name} at scale {} ({} nodes, {} arcs; expected under the generator's degree model)",
                    args.scale,
                    super::group(spec.nodes),
                    super::group(spec.arcs)
                ),
                Box::new(move |p| Ok(AlsModel::from_webgraph(&label, &spec, &sample, p))),
            )
        }
        (None, None) => unreachable!("clap requires --data or --webgraph"),
    })
}

/// One row of `project als`'s table: the projection of `model` on the `dims` torus
/// with `scheme`'s exchange.
fn als_row(
    args: &ProjectAlsArgs,
    dims: &[usize],
    model: &AlsModel,
    scheme: ExchangeKind,
    elem: u64,
    chip: &Chip,
    rate: Option<f64>,
) -> Row {
    let p: usize = dims.iter().product();
    let params = AlsParams {
        dim: args.dim,
        elem,
        exchange: scheme,
        cg_steps: args.cg_steps,
        step_nnz: args.step_nnz,
        // A chip fetches a half's rows in one round (this machine's round
        // limit exists for its memory, not a TPU's).
        round_bytes: if args.chip.chip == "here" {
            crate::als::shard::exchange::round_bytes() as u64
        } else {
            u64::MAX / 4
        },
    };
    let proj = model.project(dims, &params);
    let t = proj.epoch_traffic();
    let ex = proj.phase("exchange").expect("the exchange phase");
    let (_, _, busiest, mean) = ex.summary();
    let exchanged: u64 = ex.links.iter().flatten().map(|l| l.bytes).sum();
    Row {
        shape: dims
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("x"),
        chips: p,
        cores: p * chip.cores,
        scheme: match scheme {
            ExchangeKind::Dedup => "dedup",
            ExchangeKind::Allgather => "allgather",
        },
        memory: proj.memory,
        fits: proj.memory <= chip.memory_bytes,
        compute: rate.map(|r| {
            let bound = chip.memory_bandwidth.map_or(0.0, |b| proj.gather_bytes / b);
            (proj.flops / r).max(bound)
        }),
        comm: t.seconds(chip.link_latency, chip.link_bandwidth),
        busiest,
        mean,
        exchanged,
        traffic: t.clone(),
        gather_bytes: proj.gather_bytes,
    }
}

fn run_als(args: &ProjectAlsArgs, preempt: &Preemption) -> Result<()> {
    if args.dim == 0 || args.dim > 4096 {
        return Err(Error::Config(format!(
            "--dim {}: must be in 1..=4096",
            args.dim
        )));
    }
    if args.step_nnz == 0 {
        return Err(Error::Config("--step-nnz must be positive".into()));
    }
    let (cal, chip, shapes) = setup(&args.chip)?;
    let elem = match args.table_dtype {
        crate::bf16::TableDtype::F32 => 4,
        crate::bf16::TableDtype::Bf16 => 2,
    };
    let rate = cal.as_ref().map(|c| c.solve_rate_on(&chip));
    let (what, model_at) = als_model_at(args)?;
    println!(
        "project als: {what}; d={} {} tables, {} CG steps; chip {}: {:.0} TFLOP/s peak, {:.1} GiB, links {:.1} GB/s one way, {:.2} us per message",
        args.dim,
        args.table_dtype,
        args.cg_steps,
        chip.name,
        chip.peak_flops / 1e12,
        chip.memory_bytes as f64 / (1u64 << 30) as f64,
        chip.link_bandwidth / 1e9,
        chip.link_latency * 1e6
    );
    match (&cal, rate) {
        (Some(c), Some(r)) => println!(
            "compute: the solve rate measured at {} ({:.2} GFLOP/s of a {:.2} GFLOP/s matrix-multiply peak per rank) scaled to this chip: {:.2} TFLOP/s{}",
            c.shape,
            c.solve_flops / 1e9,
            c.peak_flops / 1e9,
            r / 1e12,
            chip.memory_bandwidth.map_or(String::new(), |b| format!(
                ", and at most {:.0} GB/s of row gathers from memory (the slower bound counts)",
                b / 1e9
            ))
        ),
        _ => println!("compute: no --calibration given, so no compute time (communication and memory only)"),
    }
    let mut rows = Vec::new();
    for dims in &shapes {
        if preempt.is_set() {
            return Err(Error::Interrupted("project: signal received".into()));
        }
        let p: usize = dims.iter().product();
        let model = model_at(p)?;
        for &scheme in &args.exchange {
            rows.push(als_row(args, dims, &model, scheme, elem, &chip, rate));
        }
    }
    print!("{}", render_table(&rows, &chip));
    for scheme in ["dedup", "allgather"] {
        if let Some(r) = rows.iter().find(|r| r.scheme == scheme && r.fits) {
            println!(
                "smallest shape that holds the run ({scheme}): {} ({} chips, {} cores), {:.1} GiB per chip",
                r.shape,
                r.chips,
                r.cores,
                r.memory as f64 / (1u64 << 30) as f64
            );
        } else if rows.iter().any(|r| r.scheme == scheme) {
            println!(
                "no shape listed holds the run ({scheme}) in {:.1} GiB per chip",
                chip.memory_bytes as f64 / (1u64 << 30) as f64
            );
        }
    }
    if let Some(name) = &args.webgraph {
        let costs = args
            .costs
            .as_deref()
            .map(crate::embed::calibrate::Costs::from_file)
            .transpose()?;
        for line in anchor_lines(name, args.scale, &rows, &chip, rate, costs.as_ref()) {
            println!("{line}");
        }
    }
    if let Some(t) = &args.chip.tsv {
        crate::app::plot::write_atomic(t, &render_tsv(&rows))?;
        println!("table written to {}", t.display());
    }
    Ok(())
}

/// The published points a WebGraph projection answers to, beside the projection of
/// ALX's scheme (all-gather) at the same core count, the gap explained by term, and
/// with measured costs (`--costs`, from `torusrec calibrate`) the same scheme at the
/// efficiencies measured on this machine.
fn anchor_lines(
    preset: &str,
    scale: f64,
    rows: &[Row],
    chip: &Chip,
    rate: Option<f64>,
    costs: Option<&crate::embed::calibrate::Costs>,
) -> Vec<String> {
    use crate::projection::als::ANCHORS;
    let mut out = Vec::new();
    for a in ANCHORS.iter().filter(|a| a.preset == preset) {
        out.push(format!(
            "anchor: {} (published: {}): {} on {} {} cores",
            a.label, a.source, a.claim, a.cores, a.chip
        ));
        if scale != 1.0 {
            out.push(format!(
                "anchor: this projection is of scale {scale}, the published point of scale 1: not compared"
            ));
            continue;
        }
        let Some(r) = rows
            .iter()
            .find(|r| r.scheme == "allgather" && r.cores == a.cores)
        else {
            out.push(format!(
                "anchor: no projected shape with --exchange allgather has {} cores (give --shapes, e.g. one of {} chips)",
                a.cores,
                a.cores / chip.cores.max(1)
            ));
            continue;
        };
        let compute = r.compute.unwrap_or(0.0);
        let epoch = compute + r.comm;
        let what = if a.per_epoch {
            "per epoch"
        } else {
            "for the whole run (a bound)"
        };
        out.push(format!(
            "anchor: ALX's scheme (allgather) projected at {} ({} chips, {} cores) on {}{}: {:.1} s per epoch = compute {} + communication {:.1} s; published {:.0} s {what}, {:.0}x the projected epoch",
            r.shape,
            r.chips,
            r.cores,
            chip.name,
            if r.fits {
                ""
            } else {
                " (its tables do not fit the chip's memory at f32)"
            },
            epoch,
            r.compute.map_or("- (no --calibration)".to_string(), |c| format!("{c:.1} s")),
            r.comm,
            a.seconds,
            a.seconds / epoch.max(1e-12)
        ));
        if a.per_epoch {
            let mut gap = format!(
                "anchor: gap by term: to take the published {:.0} s, the communication alone would need the links at {:.3}% of their {:.0} GB/s ({:.0}x slower)",
                a.seconds,
                100.0 * r.comm / a.seconds,
                chip.link_bandwidth / 1e9,
                a.seconds / r.comm.max(1e-12)
            );
            if r.compute.is_some() {
                gap.push_str(&format!(
                    ", or the compute alone at {:.3}% of the rate assumed ({:.1} TFLOP/s)",
                    100.0 * compute / a.seconds,
                    rate.unwrap_or(0.0) / 1e12
                ));
            }
            out.push(gap);
        }
        if let Some(c) = costs {
            let f = &c.fit;
            let comm_here = r.traffic.seconds(f.all_to_all_latency_s, f.model.net_bw);
            let gather_here = r.gather_bytes / f.model.mem_bw;
            let solve = rate.map(|_| compute);
            let epoch_here = comm_here + gather_here.max(solve.unwrap_or(0.0));
            out.push(format!(
                "anchor: at the efficiencies measured here ({} ranks, commit {}: collectives {:.1} us + {:.2} GB/s, row gathers at {:.2} GB/s): communication {:.1} s ({:.0}x the chip's links), row gathers {:.1} s{}: {:.1} s per epoch, {:.2}x the published",
                c.conditions.ranks,
                c.conditions.commit,
                f.all_to_all_latency_s * 1e6,
                f.model.net_bw / 1e9,
                f.model.mem_bw / 1e9,
                comm_here,
                comm_here / r.comm.max(1e-12),
                gather_here,
                solve.map_or(String::new(), |s| format!(", solve {s:.1} s (from --calibration)")),
                epoch_here,
                epoch_here / a.seconds
            ));
        }
    }
    out
}

/// The calibration, the chip and its shapes; an existing --tsv refused.
#[allow(clippy::type_complexity)]
fn setup(args: &ChipArgs) -> Result<(Option<Calibration>, Chip, Vec<Vec<usize>>)> {
    let cal = args
        .calibration
        .as_deref()
        .map(read_calibration)
        .transpose()?;
    let chip = chip_of(args, cal.as_ref())?;
    let shapes = shapes_of(args, &chip)?;
    if let Some(t) = &args.tsv {
        crate::io::outfile::check_output(t, args.force)?;
    }
    Ok((cal, chip, shapes))
}

fn run_embed(args: &ProjectEmbedArgs, preempt: &Preemption) -> Result<()> {
    use crate::embed::planner::{plan_auto, PlanOptions};
    use crate::embed::train::batch_stats::{load_or_measure_stats, synthetic_stats};
    let spec = super::embed::model::resolve_model(&args.model)?;
    if args.batch == 0 || args.batch > 1 << 20 {
        return Err(Error::Config(format!(
            "--batch {}: must be in 1..=1048576",
            args.batch
        )));
    }
    let (_, chip, shapes) = setup(&args.chip)?;
    let state = super::embed::config::table_state_per_row(args.table_opt, &spec);
    // The planner uses the distinct ids of one chip's batch, which do not depend on
    // the chip count: measured (or estimated) once.
    let (stats, how) = if args.estimate {
        (synthetic_stats(&spec, 1, args.batch), "estimated")
    } else {
        let src = crate::data::clicks::source::Source::Generated(
            crate::data::clicks::gen::ClickGen::new(&spec, args.seed),
        );
        let ids = crate::embed::tables::keys::IdMap::default();
        load_or_measure_stats(&spec, &src, &ids, args.seed, 1, args.batch, 4, None)?
    };
    println!(
        "project embed: {} tables, {} rows, MLP {:?}, {} examples per chip, batch statistics {how}; chip {}: {:.0} TFLOP/s peak, {:.1} GiB, {} GB/s memory, links {:.1} GB/s one way, {:.2} us per message",
        spec.tables.len(),
        super::group(spec.tables.iter().map(|t| t.vocab).sum()),
        spec.mlp_layers(),
        args.batch,
        chip.name,
        chip.peak_flops / 1e12,
        chip.memory_bytes as f64 / (1u64 << 30) as f64,
        chip.memory_bandwidth.map_or("-".into(), |b| format!("{:.0}", b / 1e9)),
        chip.link_bandwidth / 1e9,
        chip.link_latency * 1e6
    );
    let mut table = String::from("| shape | chips | memory/chip GiB | fits | lookup MB busiest link | compute ms | comm ms | step ms | examples/s |\n|---|---|---|---|---|---|---|---|---|\n");
    let mut tsv = String::from(
        "shape\tchips\tmemory_gib\tfits\tcompute_ms\tcomm_ms\tstep_ms\texamples_per_s\n",
    );
    let mut plans = String::new();
    for dims in &shapes {
        if preempt.is_set() {
            return Err(Error::Interrupted("project: signal received".into()));
        }
        let p: usize = dims.iter().product();
        let mut opts = PlanOptions::new(p, chip.memory_bytes);
        opts.state_per_row = state;
        opts.model = crate::projection::embed::cost_model(&chip, dims);
        let shape = dims
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("x");
        let plan = match plan_auto(&spec, &stats, &opts) {
            Ok((plan, _)) => plan,
            Err(Error::Config(msg)) => {
                let _ = writeln!(
                    table,
                    "| {shape} | {p} | - | no ({msg}) | - | - | - | - | - |"
                );
                continue;
            }
            Err(e) => return Err(e),
        };
        let _ = writeln!(
            plans,
            "plan {shape}: {}",
            super::embed::report::plan_kinds(&plan)
        );
        let proj =
            crate::projection::embed::project_step(&spec, &stats, &plan, dims, args.batch, state);
        let mut t = crate::projection::traffic::Traffic::new(dims);
        for (_, ph) in &proj.phases {
            t.add(ph);
        }
        let comm = t.seconds(chip.link_latency, chip.link_bandwidth);
        let compute = proj.flops / chip.peak_flops
            + chip
                .memory_bandwidth
                .map_or(0.0, |b| proj.memory_traffic / b);
        let step = comm + compute;
        let fits = proj.memory <= chip.memory_bytes;
        let (_, _, busiest, _) = proj.phases[0].1.summary();
        let eps = (p * args.batch) as f64 / step;
        let _ = writeln!(
            table,
            "| {shape} | {p} | {:.2} | {} | {:.2} | {:.3} | {:.3} | {:.3} | {:.0} |",
            proj.memory as f64 / (1u64 << 30) as f64,
            if fits { "yes" } else { "no" },
            busiest as f64 / 1e6,
            compute * 1e3,
            comm * 1e3,
            step * 1e3,
            eps
        );
        let _ = writeln!(
            tsv,
            "{shape}\t{p}\t{:.3}\t{fits}\t{:.4}\t{:.4}\t{:.4}\t{eps:.0}",
            proj.memory as f64 / (1u64 << 30) as f64,
            compute * 1e3,
            comm * 1e3,
            step * 1e3
        );
    }
    print!("{table}{plans}");
    if let Some(t) = &args.chip.tsv {
        crate::app::plot::write_atomic(t, &tsv)?;
        println!("table written to {}", t.display());
    }
    Ok(())
}

fn render_table(rows: &[Row], chip: &Chip) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| shape | chips | cores | exchange | memory/chip GiB | fits in {:.0} GiB | compute s | comm s | epoch s | exchange busiest link MB | exchange mean link MB | exchange link bytes GB |",
        chip.memory_bytes as f64 / (1u64 << 30) as f64
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let c = r.compute.map_or("-".into(), |c| format!("{c:.3}"));
        let e = r
            .compute
            .map_or("-".into(), |c| format!("{:.3}", c + r.comm));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} | {} | {c} | {:.3} | {e} | {:.1} | {:.1} | {:.2} |",
            r.shape,
            r.chips,
            r.cores,
            r.scheme,
            r.memory as f64 / (1u64 << 30) as f64,
            if r.fits { "yes" } else { "no" },
            r.comm,
            r.busiest as f64 / 1e6,
            r.mean / 1e6,
            r.exchanged as f64 / 1e9
        );
    }
    s
}

fn render_tsv(rows: &[Row]) -> String {
    let mut s = String::from(
        "shape\tchips\tcores\texchange\tmemory_gib\tfits\tcompute_s\tcomm_s\tepoch_s\tbusiest_link_mb\tmean_link_mb\n",
    );
    for r in rows {
        let c = r.compute.map_or("-".into(), |c| format!("{c:.6}"));
        let e = r
            .compute
            .map_or("-".into(), |c| format!("{:.6}", c + r.comm));
        let _ = writeln!(
            s,
            "{}\t{}\t{}\t{}\t{:.3}\t{}\t{c}\t{:.6}\t{e}\t{:.3}\t{:.3}",
            r.shape,
            r.chips,
            r.cores,
            r.scheme,
            r.memory as f64 / (1u64 << 30) as f64,
            r.fits,
            r.comm,
            r.busiest as f64 / 1e6,
            r.mean / 1e6
        );
    }
    s
}

fn global_run_measure<C: Comm>(
    comm: &C,
    args: &ProjectMeasureArgs,
    preempt: Preemption,
) -> Result<()> {
    comm.agree(crate::io::outfile::check_output(&args.out, args.force))?;
    let threads = crate::node::resolve_threads(args.threads);
    comm.agree(crate::node::install_threads(threads))?;
    let cfg = crate::als::AlsConfig {
        data: args.data.clone(),
        dim: args.dim,
        epochs: args.epochs,
        cg_steps: args.cg_steps,
        exchange: args.exchange,
        eval_every: 0,
        ..als_defaults(&args.data)
    };
    let m = global_measure(comm, &cfg, threads, preempt)?;
    let result = match m {
        None => Ok(()),
        Some(m) => {
            let c = &m.calibration;
            println!(
                "project measure: torus {} x {threads} thread(s): links {:.1} us + {:.2} GB/s per shift{} (each call after a Gramian over {} per rank); solve {:.2} GFLOP/s of a {:.2} GFLOP/s matrix-multiply peak per rank",
                c.shape,
                c.link_latency * 1e6,
                c.link_bandwidth / 1e9,
                c.node_bandwidth.map_or(String::new(), |nb| format!(
                    " + {:.2} GB/s over all links",
                    nb / 1e9
                )),
                crate::metrics::human_bytes(m.evict_bytes),
                c.solve_flops / 1e9,
                c.peak_flops / 1e9
            );
            println!("| phase | per-link bytes and messages, every rank | busiest link measured / projected | mean link measured / projected | seconds measured / projected |");
            println!("|---|---|---|---|---|");
            for k in &m.checks {
                println!(
                    "| {}{} | {} | {} / {} | {:.0} / {:.0} | {:.4} / {:.4} |",
                    k.phase,
                    if k.phase == "plan" {
                        " (once)"
                    } else {
                        " (per epoch)"
                    },
                    if k.links_equal { "equal" } else { "DIFFERENT" },
                    k.measured_busiest,
                    k.projected_busiest,
                    k.measured_mean,
                    k.projected_mean,
                    k.measured_seconds,
                    k.projected_seconds
                );
            }
            println!(
                "communication per epoch: measured {:.4} s, projected {:.4} s ({:+.1}%); epoch: measured {:.3} s, projected {:.3} s",
                m.comm_seconds,
                m.projected_comm_seconds,
                100.0 * (m.projected_comm_seconds / m.comm_seconds.max(1e-12) - 1.0),
                m.epoch_seconds,
                m.projected_epoch_seconds
            );
            let text = serde_json::to_string_pretty(&m)
                .map_err(|e| Error::Check(format!("calibration: {e}")))?;
            crate::app::plot::write_atomic(&args.out, &(text + "\n"))?;
            println!("calibration written to {}", args.out.display());
            if m.checks.iter().all(|k| k.links_equal) {
                Ok(())
            } else {
                Err(Error::Check(
                    "projected per-link bytes differ from the measured ones".into(),
                ))
            }
        }
    };
    comm.agree(result)
}

/// `als`'s configuration with every flag at its default.
fn als_defaults(data: &Path) -> crate::als::AlsConfig {
    crate::als::AlsConfig::new(data)
}
