//! Timing harness of the iALS half-epoch kernels on a prepared dataset (one rank):
//! the CG solve with the separate loss pass, the CG solve with the fused loss, both with
//! an f32 and a bf16 fixed table, and a per-phase split (Gramian term, observed term,
//! gather). Not a test: it prints seconds (wall and CPU).
//!
//! ```text
//! cargo run --release --example als_kernels_bench -- DATA.h5 [dim] [threads] [cg_steps]
//! ```

use std::path::Path;
use std::time::Instant;

use torusrec::als::shard::local_read_shards;
use torusrec::als::solve::{
    cg_solve, cg_solve_with_loss, gramian, local_loss_terms, RowsView, SolveParams,
};
use torusrec::als::train::init_table;
use torusrec::bf16::{to_bf16, Bf16, TableElem};

/// CPU seconds (user + system) of this process so far, from /proc (Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after_name.split_whitespace().collect();
    let t = |k: usize| f.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

/// Best of `reps` runs of `f` (wall seconds, CPU seconds of that run).
fn time<R>(reps: usize, mut f: impl FnMut() -> R) -> (f64, f64, R) {
    let mut best = (f64::INFINITY, 0.0);
    let mut out = None;
    for _ in 0..reps {
        let (t, c) = (Instant::now(), cpu_seconds());
        let r = f();
        let w = t.elapsed().as_secs_f64();
        if w < best.0 {
            best = (w, cpu_seconds() - c);
        }
        out = Some(r);
    }
    (best.0, best.1, out.expect("reps >= 1"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: als_kernels_bench DATA.h5 [dim] [threads] [cg_steps]");
    let d: usize = args.get(2).map_or(128, |s| s.parse().expect("dim"));
    let threads: usize = args.get(3).map_or(2, |s| s.parse().expect("threads"));
    let steps: usize = args.get(4).map_or(3, |s| s.parse().expect("cg_steps"));
    let reps = 3;
    let sh = local_read_shards(Path::new(path), 0, 1, &|_, _| {
        Ok(torusrec::als::memory::Layout::in_memory())
    })
    .expect("read the dataset");
    let (nr, nc) = (sh.rows.num_rows(), sh.cols.num_rows());
    println!(
        "{path}: {nr} rows, {nc} cols, {} nnz; d = {d}, {threads} threads, {steps} CG steps, best of {reps}",
        sh.rows.nnz()
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let (reg, alpha0, hub_chunk) = (1e-4f32, 3e-3f32, 1024usize);
    pool.install(|| {
        let mut w = init_table(0, nr, d, 42, 0, 0.1);
        let mut h = init_table(0, nc, d, 42, 1, 0.1);
        let rows = RowsView {
            indptr: &sh.rows.indptr,
            indices: &sh.rows.indices,
        };
        let cols = RowsView {
            indptr: &sh.cols.indptr,
            indices: &sh.cols.indices,
        };
        let pr = SolveParams { reg, alpha0, n_other: nc as f64 };
        let pc = SolveParams { reg, alpha0, n_other: nr as f64 };
        // Two epochs to get realistic tables.
        for _ in 0..2 {
            let g: Vec<f32> = gramian(&h, d).iter().map(|&v| v as f32).collect();
            cg_solve(&mut w, rows, &h, d, &g, pr, steps, hub_chunk);
            let g: Vec<f32> = gramian(&w, d).iter().map(|&v| v as f32).collect();
            cg_solve(&mut h, cols, &w, d, &g, pc, steps, hub_chunk);
        }
        let hb: Vec<Bf16> = to_bf16(&h);
        let (tg, cg, g64) = time(reps, || gramian(&h, d));
        let (tgb, cgb, _) = time(reps, || gramian(&hb, d));
        println!("gramian of H: f32 {tg:.3} s ({cg:.2} cpu), bf16 {tgb:.3} s ({cgb:.2} cpu)");
        let g: Vec<f32> = g64.iter().map(|&v| v as f32).collect();
        let gb: Vec<f32> = gramian(&hb, d).iter().map(|&v| v as f32).collect();
        let w0 = w.clone();

        // The half-epoch of the row side (solve W against H), several ways.
        #[allow(clippy::too_many_arguments)]
        fn solve<T: TableElem>(
            w0: &[f32], rows: RowsView, h: &[T], d: usize, g: &[f32], p: SolveParams,
            steps: usize, hub_chunk: usize, fused: bool,
        ) -> f64 {
            let mut w = w0.to_vec();
            if fused {
                let l = cg_solve_with_loss(&mut w, rows, h, d, g, p, steps, hub_chunk);
                l.observed
            } else {
                cg_solve(&mut w, rows, h, d, g, p, steps, hub_chunk);
                w[0] as f64
            }
        }
        let copy = time(reps, || w0.to_vec()).0;
        println!("(copy of W0 inside each timing: {copy:.3} s)");
        let (t, c, _) = time(reps, || solve(&w0, rows, &h, d, &g, pr, steps, hub_chunk, false));
        println!("cg_solve f32:                     {t:.3} s wall, {c:.2} s cpu");
        let mut w1 = w0.clone();
        cg_solve(&mut w1, rows, &h, d, &g, pr, steps, hub_chunk);
        let (tl, cl, lt) = time(reps, || local_loss_terms(&w1, rows, &h, d, alpha0, nc as f64));
        println!("local_loss_terms f32 (loss pass): {tl:.3} s wall, {cl:.2} s cpu");
        println!("  = solve + separate loss pass:   {:.3} s", t + tl);
        let (t, c, lf) = time(reps, || solve(&w0, rows, &h, d, &g, pr, steps, hub_chunk, true));
        println!("cg_solve_with_loss f32:           {t:.3} s wall, {c:.2} s cpu (observed {lf:.6e} vs pass {:.6e})", lt.0);
        let (t, c, _) = time(reps, || solve(&w0, rows, &hb, d, &gb, pr, steps, hub_chunk, false));
        println!("cg_solve bf16:                    {t:.3} s wall, {c:.2} s cpu");
        let (t, c, _) = time(reps, || solve(&w0, rows, &hb, d, &gb, pr, steps, hub_chunk, true));
        println!("cg_solve_with_loss bf16:          {t:.3} s wall, {c:.2} s cpu");
        let (tl, cl, _) = time(reps, || local_loss_terms(&w1, rows, &hb, d, alpha0, nc as f64));
        println!("local_loss_terms bf16:            {tl:.3} s wall, {cl:.2} s cpu");

        // Phase split (f32): without the Gramian term (alpha0 = 0), and with 1 step.
        let p0 = SolveParams { alpha0: 0.0, ..pr };
        let (t_full, _, _) = time(reps, || solve(&w0, rows, &h, d, &g, pr, steps, hub_chunk, false));
        let (t_nog, _, _) = time(reps, || solve(&w0, rows, &h, d, &g, p0, steps, hub_chunk, false));
        let (t_nog1, _, _) = time(reps, || solve(&w0, rows, &h, d, &g, p0, 1, hub_chunk, false));
        let (t_nogb, _, _) = time(reps, || solve(&w0, rows, &hb, d, &gb, p0, steps, hub_chunk, false));
        let (t_nogb1, _, _) = time(reps, || solve(&w0, rows, &hb, d, &gb, p0, 1, hub_chunk, false));
        let per_step = (t_nog - t_nog1) / (steps.max(2) - 1) as f64;
        println!(
            "phases (f32, {steps} steps): Gramian term {:.3} s; observed matvec {:.3} s per step; \
             gather + initial residual + vector ops ~{:.3} s",
            t_full - t_nog,
            per_step,
            t_nog1 - 2.0 * per_step
        );
        let per_step_b = (t_nogb - t_nogb1) / (steps.max(2) - 1) as f64;
        println!(
            "phases (bf16): observed matvec {:.3} s per step; gather + initial residual ~{:.3} s",
            per_step_b,
            t_nogb1 - 2.0 * per_step_b
        );
        let _ = &mut w;
        let _ = &mut h;
    });
}
