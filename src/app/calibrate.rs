//! `torusrec calibrate`: measure what the planner prices and write it (rank 0).

use crate::cli::CalibrateArgs;
use crate::clicks::gen::ClickGen;
use crate::clicks::source::Source;
use crate::comm::Comm;
use crate::embed::dense::gemm::Gemm;
use crate::embed::dense::mlp::DenseOpt;
use crate::embed::planner::calib::{
    fit, global_calibrate, global_collectives, global_mlp_points, median, median_over_passes,
    rows_of, CalibOptions, CollPoint, Conditions, Costs, PooledPoint, POOLED_PLACEMENTS,
    POOLED_TABLE_OPT,
};
use crate::embed::tables::keys::IdMap;
use crate::embed::train::trainer::{EmbedConfig, EmbedTrainer};
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
    // The first pass of the MLP and collective points is global_calibrate's (after
    // the kernel points); the others run between the pooled rounds.
    let mut costs = global_calibrate(comm, &o, cond)?;
    let mut passes = Passes::first(&costs);
    costs.pooled = global_pooled_points(comm, &o, &mut |c: &C| passes.global_add(c, &o))?;
    while passes.count() < o.spread {
        passes.global_add(comm, &o)?;
    }
    passes.apply(&mut costs);
    costs.fit = fit(&costs);
    let res = if root {
        write(&costs, a).map(|_| {
            report(&costs, a, t.elapsed().as_secs_f64());
            passes.report(&costs);
        })
    } else {
        Ok(())
    };
    comm.agree(res)
}

/// The passes of the MLP and collective points (`CalibOptions::spread`): their
/// seconds per pass, in the points' order.
struct Passes {
    mlp: Vec<Vec<f64>>,
    a2a: Vec<Vec<f64>>,
    ar: Vec<Vec<f64>>,
}

impl Passes {
    fn first(c: &Costs) -> Self {
        Passes {
            mlp: vec![c.mlp.iter().map(|p| p.seconds).collect()],
            a2a: vec![c.all_to_all.iter().map(|p| p.seconds).collect()],
            ar: vec![c.all_reduce.iter().map(|p| p.seconds).collect()],
        }
    }

    fn count(&self) -> usize {
        self.mlp.len()
    }

    /// Collective: every rank must call. One more pass.
    fn global_add<C: Comm>(&mut self, comm: &C, o: &CalibOptions) -> Result<()> {
        let mlp = global_mlp_points(comm, o)?;
        let (a2a, ar) = global_collectives(comm, o)?;
        let secs = |v: &[CollPoint]| v.iter().map(|p| p.seconds).collect();
        self.mlp.push(mlp.iter().map(|p| p.seconds).collect());
        self.a2a.push(secs(&a2a));
        self.ar.push(secs(&ar));
        Ok(())
    }

    /// How far apart the passes were: the slowest MLP point and the largest
    /// all-to-all, each pass's seconds (the median is what the file keeps).
    fn report(&self, c: &Costs) {
        if self.count() < 2 {
            return;
        }
        let of = |passes: &[Vec<f64>], i: usize, scale: f64| {
            let v: Vec<String> = passes
                .iter()
                .filter_map(|p| p.get(i))
                .map(|s| format!("{:.2}", s * scale))
                .collect();
            v.join(", ")
        };
        let slowest =
            (0..c.mlp.len()).max_by(|&x, &y| c.mlp[x].seconds.total_cmp(&c.mlp[y].seconds));
        let largest = (0..c.all_to_all.len()).max_by_key(|&i| c.all_to_all[i].bytes);
        let mut parts = Vec::new();
        if let Some(i) = slowest {
            let layers: Vec<String> = c.mlp[i].layers.iter().map(|n| n.to_string()).collect();
            parts.push(format!(
                "MLP {} at {}: {} ms",
                layers.join("-"),
                c.mlp[i].batch,
                of(&self.mlp, i, 1e3)
            ));
        }
        if let Some(i) = largest {
            parts.push(format!(
                "all-to-all of {:.1} MB: {} ms",
                c.all_to_all[i].bytes as f64 / 1e6,
                of(&self.a2a, i, 1e3)
            ));
        }
        println!(
            "passes: {} of the MLP and collective points over the calibration, each point's median kept; {}",
            self.count(),
            parts.join("; ")
        );
    }

    /// Each point's seconds: the median of its passes' (at least 1 ns, as the
    /// kernels' points).
    fn apply(&self, c: &mut Costs) {
        set_medians(c.mlp.iter_mut().map(|p| &mut p.seconds), &self.mlp);
        set_medians(c.all_to_all.iter_mut().map(|p| &mut p.seconds), &self.a2a);
        set_medians(c.all_reduce.iter_mut().map(|p| &mut p.seconds), &self.ar);
    }
}

/// `dst`, in order: the median of each point's passes, at least 1 ns.
fn set_medians<'a>(dst: impl Iterator<Item = &'a mut f64>, passes: &[Vec<f64>]) {
    for (d, s) in dst.zip(median_over_passes(passes)) {
        *d = s.max(1e-9);
    }
}

/// Collective: every rank must call. The pooled points
/// ([`crate::embed::planner::calib::PooledPoint`]): per width and pooling factor,
/// `P` tables (one per rank) whole, in `P` column pieces and in `P` row blocks, and
/// whole in `rows` mode, trained with the real step, the four side by side; then the
/// whole tables of the other sizes, and the together points (`pooled_together`
/// tables per rank, both modes, each beside its partner: one such table a rank).
/// Each point keeps the median of its runs. None on one rank
/// (nothing is split); the three placements none at a width `P` does not divide.
///
/// The runs are round-major over all the points (every point once per round, in
/// order), so that a point's runs are spread over the whole pooled phase; `between`
/// runs the extra passes of the MLP and collective points (`CalibOptions::spread`
/// less the first) after the rounds that spread them evenly, the last one after the
/// last round.
fn global_pooled_points<C: Comm>(
    comm: &C,
    o: &CalibOptions,
    between: &mut dyn FnMut(&C) -> Result<()>,
) -> Result<Vec<PooledPoint>> {
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
    let mut pts: Vec<PooledPoint> = groups.into_iter().flatten().collect();
    let mut runs = vec![Vec::new(); pts.len()];
    let reps = o.pooled_reps.max(1);
    let after = pass_rounds(reps, o.spread.saturating_sub(1));
    for round in 1..=reps {
        for (q, r) in pts.iter().zip(runs.iter_mut()) {
            r.push(global_pooled_run(comm, o, q)?);
        }
        for _ in after.iter().filter(|&&a| a == round) {
            between(comm)?;
        }
    }
    for (q, r) in pts.iter_mut().zip(runs) {
        // At least 1 ns, as the kernels' points.
        q.seconds = median(r).max(1e-9);
    }
    out.extend(pts);
    Ok(out)
}

/// After which of `reps` rounds (1-based) each of `extra` passes runs: pass `j`
/// (1-based) after round `ceil(j reps / extra)`, so that they are spread evenly and
/// the last is after the last round.
fn pass_rounds(reps: usize, extra: usize) -> Vec<usize> {
    (1..=extra).map(|j| (j * reps).div_ceil(extra)).collect()
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
        "fit: {:.1} ns per row access + bytes at {:.2} GB/s; interference {} (a rank's k pieces of B bytes: their owners' seconds times 1 + that x ({}); {}); all-to-all {:.1} us + {:.2} GB/s, all-reduce {:.1} us + {:.2} GB/s{}; MLP {:.2} GFLOP/s",
        m.lookup_s * 1e9,
        m.mem_bw / 1e9,
        match m.interference_rows {
            Some(r) => format!("{:.3} (pooled pieces), {r:.3} (rows pieces)", m.interference),
            None => format!("{:.3}", m.interference),
        },
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

#[cfg(test)]
mod tests {
    use super::pass_rounds;

    #[test]
    fn extra_passes_are_spread_over_the_rounds_the_last_after_the_last() {
        assert_eq!(pass_rounds(3, 2), vec![2, 3]);
        assert_eq!(pass_rounds(3, 1), vec![3]);
        assert_eq!(pass_rounds(3, 3), vec![1, 2, 3]);
        assert_eq!(pass_rounds(1, 2), vec![1, 1]);
        assert_eq!(pass_rounds(6, 2), vec![3, 6]);
        assert!(pass_rounds(3, 0).is_empty());
    }
}
