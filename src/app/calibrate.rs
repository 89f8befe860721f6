//! `torusrec calibrate`: its flags to the calibration's options and conditions, the
//! measurement ([`global_measure`], in the library), the file and the report (rank 0).

use crate::cli::CalibrateArgs;
use crate::comm::Comm;
use crate::embed::calibrate::timing::{global_measure, Passes};
use crate::embed::calibrate::{CalibOptions, Conditions, Costs};
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
        crate::io::outfile::check_output(&a.out, a.force)?;
        if root {
            crate::io::outfile::probe_writable(&a.out)?;
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
    let (costs, passes) = global_measure(comm, &o, cond)?;
    let res = if root {
        write(&costs, a).map(|_| {
            report(&costs, a, t.elapsed().as_secs_f64());
            report_passes(&passes, &costs);
        })
    } else {
        Ok(())
    };
    comm.agree(res)
}

/// How far apart the passes of the MLP and collective points were: the slowest MLP
/// point and the largest all-to-all, each pass's seconds (the median is what the
/// file keeps).
fn report_passes(p: &Passes, c: &Costs) {
    if p.count() < 2 {
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
    let slowest = (0..c.mlp.len()).max_by(|&x, &y| c.mlp[x].seconds.total_cmp(&c.mlp[y].seconds));
    let largest = (0..c.all_to_all.len()).max_by_key(|&i| c.all_to_all[i].bytes);
    let mut parts = Vec::new();
    if let Some(i) = slowest {
        let layers: Vec<String> = c.mlp[i].layers.iter().map(|n| n.to_string()).collect();
        parts.push(format!(
            "MLP {} at {}: {} ms",
            layers.join("-"),
            c.mlp[i].batch,
            of(&p.mlp, i, 1e3)
        ));
    }
    if let Some(i) = largest {
        parts.push(format!(
            "all-to-all of {:.1} MB: {} ms",
            c.all_to_all[i].bytes as f64 / 1e6,
            of(&p.a2a, i, 1e3)
        ));
    }
    println!(
            "passes: {} of the MLP and collective points over the calibration, each point's median kept; {}",
            p.count(),
            parts.join("; ")
        );
}

fn write(c: &Costs, a: &CalibrateArgs) -> Result<()> {
    crate::io::outfile::write(&a.out, c.to_json()?.as_bytes())
}

/// `[bytes, factor]` pairs as `1.0 MB: 0.21, ...`.
fn by_size(v: &[[f64; 2]]) -> String {
    v.iter()
        .map(|[b, x]| format!("{}: {x:.2}", crate::metrics::human_bytes(*b as u64)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The report of calibration `c` (measured in `secs` seconds), by parts: the run,
/// the fit's rates, its factors, the training steps' coefficients.
fn report(c: &Costs, a: &CalibrateArgs, secs: f64) {
    report_run(c, secs);
    report_rates(c);
    report_factors(c);
    report_steps(c);
    println!("wrote {}", a.out.display());
}

/// The conditions and how many points of each kind.
fn report_run(c: &Costs, secs: f64) {
    let k = &c.conditions;
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
}

/// The fitted row access, interference, collectives and MLP rate.
fn report_rates(c: &Costs) {
    let k = &c.conditions;
    let f = &c.fit;
    let m = &f.model;
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
}

/// The fit's factors per width, per table count and per table size.
fn report_factors(c: &Costs) {
    let k = &c.conditions;
    let f = &c.fit;
    let m = &f.model;
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
}

/// The training steps' coefficients (with pooled points), the asking side's and the
/// `rows` size factor.
fn report_steps(c: &Costs) {
    let k = &c.conditions;
    let m = &c.fit.model;
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
}
