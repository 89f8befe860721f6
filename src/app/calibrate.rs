//! `torusrec calibrate`: measure what the planner prices and write it (rank 0).

use crate::cli::CalibrateArgs;
use crate::comm::Comm;
use crate::embed::clicks::ClickGen;
use crate::embed::gemm::Gemm;
use crate::embed::keys::IdMap;
use crate::embed::mlp::DenseOpt;
use crate::embed::planner::calib::{
    fit, global_calibrate, median, rows_of, CalibOptions, Conditions, Costs, PooledPoint,
    POOLED_PLACEMENTS, POOLED_TABLE_OPT,
};
use crate::embed::train::{EmbedConfig, EmbedTrainer, Source};
use crate::node::resolve_threads;
use crate::{Error, Result};

use crate::node::cpu_model;

/// `git rev-parse --short HEAD` in the working directory (with `+dirty` when the
/// sources differ from it), or `unknown`.
pub fn commit() -> String {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
    };
    let Some(out) = run(&["rev-parse", "--short", "HEAD"]).filter(|o| o.status.success()) else {
        return "unknown".into();
    };
    let mut c = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if c.is_empty() {
        return "unknown".into();
    }
    if let Some(d) = run(&["diff", "--quiet", "HEAD", "--", "src"]) {
        if !d.status.success() {
            c.push_str("+dirty");
        }
    }
    c
}

fn isa() -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        (
            std::is_x86_feature_detected!("avx512f"),
            std::is_x86_feature_detected!("avx2"),
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (false, false)
    }
}

/// Collective: every rank must call. `torusrec calibrate`.
pub fn global_run<C: Comm>(comm: &C, a: &CalibrateArgs) -> Result<()> {
    let threads = resolve_threads(a.threads);
    let root = comm.rank() == 0;
    let setup = (|| -> Result<CalibOptions> {
        crate::outfile::check_output(&a.out, a.force)?;
        if root {
            crate::outfile::probe_writable(&a.out)?;
        }
        let mut o = CalibOptions::new(a.quick);
        if let Some(r) = a.reps {
            if r == 0 || r > 1000 {
                return Err(Error::Config(format!("--reps {r}: must be in 1..=1000")));
            }
            o.reps = r;
        }
        crate::node::install_threads(threads)?;
        Ok(o)
    })();
    let o = comm.agree(setup)?;
    let (avx512, avx2) = isa();
    let cond = Conditions {
        ranks: comm.size(),
        torus: comm.torus().shape().to_string(),
        threads,
        cpu: cpu_model(),
        avx512,
        avx2,
        commit: if root { commit() } else { String::new() },
        quick: o.quick,
        reps: o.reps,
        table_bytes: o.table_bytes,
    };
    let t = std::time::Instant::now();
    let mut costs = global_calibrate(comm, &o, cond)?;
    costs.pooled = global_pooled_points(comm, &o)?;
    costs.fit = fit(&costs);
    let res = if root {
        write(&costs, a).map(|_| report(&costs, a, t.elapsed().as_secs_f64()))
    } else {
        Ok(())
    };
    comm.agree(res)
}

/// Collective: every rank must call. The pooled points
/// ([`crate::embed::planner::calib::PooledPoint`]): per width and pooling factor,
/// `P` tables (one per rank) whole, in `P` column pieces and in `P` row blocks, and
/// whole in `rows` mode, trained with the real step; the runs of the four
/// interleaved, the median kept; then the whole tables of the other sizes, and the
/// together points (`pooled_together` tables per rank, both modes, each interleaved
/// with its partner: one such table a rank). None on one rank
/// (nothing is split); the three placements none at a width `P` does not divide.
fn global_pooled_points<C: Comm>(comm: &C, o: &CalibOptions) -> Result<Vec<PooledPoint>> {
    let p = comm.size();
    let mut out = Vec::new();
    if p < 2 {
        return Ok(out);
    }
    let point = |dim, pooling, bytes, placement: &str| PooledPoint {
        dim,
        pooling,
        tables: p,
        rows: rows_of(bytes, dim),
        batch: o.pooled_batch,
        placement: placement.to_string(),
        pieces: if placement == "table" { 1 } else { p },
        mode: "pooled".to_string(),
        seconds: 0.0,
    };
    let rows_point = |dim, pooling| PooledPoint {
        mode: "rows".to_string(),
        ..point(dim, pooling, o.table_bytes, "table")
    };
    // Per width and pooling, the three placements at the reference size and the
    // whole tables in `rows` mode; then the whole tables of the other sizes.
    let mut groups: Vec<Vec<PooledPoint>> = Vec::new();
    for &dim in o.pooled_dims.iter().filter(|&&d| d % p == 0) {
        for &pooling in &o.pooled_poolings {
            let mut g: Vec<PooledPoint> = POOLED_PLACEMENTS
                .iter()
                .map(|pl| point(dim, pooling, o.table_bytes, pl))
                .collect();
            g.push(rows_point(dim, pooling));
            groups.push(g);
        }
    }
    // The whole tables of the other sizes, in both modes: `pooled` for the pooled
    // size factor, `rows` for the owners' (`CostModel::rows_size_factor`).
    let (d, pl) = (o.pooled_size_dim, o.pooled_size_pooling);
    let sizes = o.pooled_sizes.iter().filter(|&&b| b != o.table_bytes);
    groups.push(
        sizes
            .flat_map(|&b| {
                let pooled = point(d, pl, b, "table");
                let rows = PooledPoint {
                    mode: "rows".to_string(),
                    ..pooled.clone()
                };
                [pooled, rows]
            })
            .collect(),
    );
    // The together points: `pooled_together` whole tables on every rank, in both
    // modes (the interference of a rank's tables in a real step).
    if o.pooled_together > 1 {
        let together = PooledPoint {
            tables: o.pooled_together * p,
            ..point(d, o.pooled_together_pooling, o.table_bytes, "table")
        };
        let rows = PooledPoint {
            mode: "rows".to_string(),
            ..together.clone()
        };
        // Each beside its partner (one such table a rank) in the same rounds: the
        // interference is fitted to their ratio, which a slow minute moves less.
        groups.push(vec![
            PooledPoint::partner(&together, p),
            together,
            PooledPoint::partner(&rows, p),
            rows,
        ]);
    }
    for mut pts in groups {
        let mut runs = vec![Vec::new(); pts.len()];
        for _ in 0..o.pooled_reps {
            for (q, r) in pts.iter().zip(runs.iter_mut()) {
                r.push(global_pooled_run(comm, o, q)?);
            }
        }
        for (q, r) in pts.iter_mut().zip(runs) {
            // At least 1 ns, as the kernels' points.
            q.seconds = median(r).max(1e-9);
        }
        out.extend(pts);
    }
    Ok(out)
}

/// Collective: every rank must call. One run of point `q`: `pooled_warmup` steps,
/// then the seconds per step of the embedding phases (lookup, pooling, backward and
/// update, their collectives included; each phase the slowest rank's) over
/// `pooled_steps`: what the planner's per-rank cost stands for in a step.
fn global_pooled_run<C: Comm>(comm: &C, o: &CalibOptions, q: &PooledPoint) -> Result<f64> {
    let (p, rank) = (comm.size(), comm.rank());
    let spec = q.spec();
    let plan = q.plan(&spec, p);
    let steps = o.pooled_warmup + o.pooled_steps * 50;
    let cfg = EmbedConfig {
        spec: spec.clone(),
        seed: o.seed,
        micro: q.batch * p,
        accumulate: 1,
        steps,
        table_opt: POOLED_TABLE_OPT,
        dense_opt: DenseOpt::adagrad(0.01),
        dense_gemm: Gemm::auto(),
        dedup: true,
        pipeline: false,
        eval_examples: 0,
        eval_every: 0,
        log_every: 0,
        mem_per_rank: None,
        ids: IdMap::default(),
    };
    let source = Source::Generated(ClickGen::new(&spec, o.seed));
    let mut tr = comm.agree(EmbedTrainer::new(cfg, source, &plan, rank))?;
    comm.agree(tr.local_preload(p, rank, 0, o.pooled_warmup))?;
    let t = std::time::Instant::now();
    for _ in 0..o.pooled_warmup {
        tr.global_step(comm, false)?;
    }
    // The warm-up's interval, discarded; its seconds set the timed steps: at least
    // `pooled_steps`, and enough for `pooled_min_seconds` (the slowest rank's).
    tr.global_interval(comm)?;
    let per = t.elapsed().as_secs_f64() / o.pooled_warmup.max(1) as f64;
    let want = (o.pooled_min_seconds / per.max(1e-9)).ceil() as u64;
    let mine = want.clamp(o.pooled_steps, o.pooled_steps * 50);
    let timed = comm.all_reduce_max(mine);
    let w = o.pooled_warmup;
    comm.agree(tr.local_preload(p, rank, w, w + timed))?;
    for _ in 0..timed {
        tr.global_step(comm, false)?;
    }
    let r = tr.global_interval(comm)?;
    let phases = r.seconds_lookup + r.seconds_pool + r.seconds_backward + r.seconds_update;
    Ok(phases / r.steps.max(1) as f64)
}

fn write(c: &Costs, a: &CalibrateArgs) -> Result<()> {
    crate::outfile::write(&a.out, c.to_json()?.as_bytes())
}

/// `[bytes, factor]` pairs as `1.0 MB: 0.21, ...`.
fn by_size(v: &[[f64; 2]]) -> String {
    v.iter()
        .map(|[b, x]| format!("{}: {x:.2}", crate::metrics::human_bytes(*b as u64)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn report(c: &Costs, a: &CalibrateArgs, secs: f64) {
    let k = &c.conditions;
    let f = &c.fit;
    let m = &f.model;
    println!(
        "calibrate: {} rank(s) (torus {}) x {} thread(s), {} (AVX-512 {}, AVX2 {}), commit {}{}; {} gather + {} scatter points, {} MLP, {} + {} collective points in {secs:.1} s",
        k.ranks,
        k.torus,
        k.threads,
        k.cpu,
        if k.avx512 { "yes" } else { "no" },
        if k.avx2 { "yes" } else { "no" },
        k.commit,
        if k.quick { ", quick" } else { "" },
        c.gather.len(),
        c.scatter.len(),
        c.mlp.len(),
        c.all_to_all.len(),
        c.all_reduce.len()
    );
    println!(
        "fit: {:.1} ns per row access + bytes at {:.2} GB/s; interference {:.3} (a rank's k pieces of B bytes: their owners' seconds times 1 + that x ({}); {}); all-to-all {:.1} us + {:.2} GB/s, all-reduce {:.1} us + {:.2} GB/s{}; MLP {:.2} GFLOP/s",
        m.lookup_s * 1e9,
        m.mem_bw / 1e9,
        m.interference,
        if m.interference_count {
            "1 - 1/k: the size factor at the together training steps' bytes is not above one table's, so the size law cannot price what they measure"
        } else {
            "size factor at B over at their cost-weighted mean size, less 1"
        },
        // Left at the kernel points' when the together steps do not identify it
        // (their sizes share one size factor; see the fit's `IDENTIFIES`).
        if !c.pooled.iter().any(|q| q.together(k.ranks)) {
            "from the kernel points".to_string()
        } else if m.interference == f.kernel_interference {
            "from the kernel points: the together training steps' bytes fall within one size factor and do not identify it".to_string()
        } else {
            format!(
                "from the together training steps; the kernel points give {:.3}",
                f.kernel_interference
            )
        },
        f.all_to_all_latency_s * 1e6,
        m.net_bw / 1e9,
        f.all_reduce_latency_s * 1e6,
        m.allreduce_bw / 1e9,
        if k.ranks == 1 {
            " (one rank: nothing crosses, default rates kept)"
        } else {
            ""
        },
        f.mlp_flops / 1e9
    );
    let pairs = |v: &[[f64; 2]]| {
        v.iter()
            .map(|[w, x]| format!("{w}: {x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "fit: measured over modelled per width: {}",
        pairs(&m.width_factor)
    );
    println!(
        "fit: zipf over uniform per id, per width: {}",
        pairs(&f.zipf_ratio)
    );
    println!(
        "fit: k tables together over alone per id, per k: {}",
        pairs(&f.together_ratio)
    );
    println!(
        "fit: per id at a table size over at {} (uniform ids): {}",
        crate::metrics::human_bytes(k.table_bytes),
        by_size(&m.size_factor)
    );
    if !c.pooled.is_empty() {
        let pts = c
            .pooled
            .iter()
            .map(|q| {
                let placement = if q.together(k.ranks) {
                    format!("{} tables a rank", q.pieces_per_rank(k.ranks))
                } else {
                    format!("{} x{}", q.placement, q.pieces)
                };
                format!(
                    "{}{placement} d{} p{} {} {:.2} ms (model {:.2})",
                    if q.mode == "rows" { "rows " } else { "" },
                    q.dim,
                    q.pooling,
                    crate::metrics::human_bytes(q.span_bytes() as u64),
                    q.seconds * 1e3,
                    q.modelled(m, k.ranks) * 1e3
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "fit: pooled pieces {:.1} ns + {:.3} ns x width per occurrence, {:.1} ns per example served, occurrences at a table size over at the reference: {}; embedding phases per step (measured, modelled): {pts}",
            m.pooled_occ_s * 1e9,
            m.pooled_occ_float_s * 1e9,
            m.pooled_example_s * 1e9,
            by_size(&m.pooled_size_factor)
        );
    }
    if m.ask_measured {
        println!(
            "fit: the asking side of a rows table {:.1} ns + {:.3} ns x width per occurrence, {:.1} ns per example",
            m.ask_occ_s * 1e9,
            m.ask_occ_float_s * 1e9,
            m.ask_example_s * 1e9
        );
    }
    if !m.rows_size_factor.is_empty() {
        println!(
            "fit: a rows table's owners' row accesses at a table size over at the reference (on top of the per-id size factor): {}",
            by_size(&m.rows_size_factor)
        );
    }
    println!("wrote {}", a.out.display());
}
