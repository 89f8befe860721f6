//! `torusrec calibrate`: measure what the planner prices and write it (rank 0).

use crate::cli::CalibrateArgs;
use crate::comm::Comm;
use crate::embed::planner::calib::{global_calibrate, CalibOptions, Conditions, Costs};
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
    let costs = global_calibrate(comm, &o, cond)?;
    let res = if root {
        write(&costs, a).map(|_| report(&costs, a, t.elapsed().as_secs_f64()))
    } else {
        Ok(())
    };
    comm.agree(res)
}

fn write(c: &Costs, a: &CalibrateArgs) -> Result<()> {
    crate::outfile::write(&a.out, c.to_json()?.as_bytes())
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
        "fit: {:.1} ns per row access + bytes at {:.2} GB/s; interference {:.3} (k tables on a rank: 1 + that x (1 - 1/k)); all-to-all {:.1} us + {:.2} GB/s, all-reduce {:.1} us + {:.2} GB/s{}; MLP {:.2} GFLOP/s",
        m.lookup_s * 1e9,
        m.mem_bw / 1e9,
        m.interference,
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
    let sizes = m
        .size_factor
        .iter()
        .map(|[b, x]| format!("{}: {x:.2}", crate::metrics::human_bytes(*b as u64)))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "fit: per id at a table size over at {} (uniform ids): {sizes}",
        crate::metrics::human_bytes(k.table_bytes)
    );
    println!("wrote {}", a.out.display());
}
