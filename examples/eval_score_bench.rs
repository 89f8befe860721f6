//! Timing harness of the iALS evaluation's scoring (rank-local: every row against a
//! shard of H, best 50 per row): the OpenBLAS scorer, the fused AVX-512 scorer and its
//! FMA variant, with an f32 and a bf16 table. Not a test: it prints one TSV line per
//! kernel and table type (best of `reps` wall seconds, GFLOP/s counting 2 d flops per
//! score). `scripts/bench_eval.sh` runs it.
//!
//! ```text
//! cargo run --release --example eval_score_bench -- [rows] [cols] [dim] [threads] [reps]
//! ```

use std::time::Instant;

use torusrec::als::eval::{local_score_topk_with, ScoreRows, Scorer, COL_BLOCK, ROW_BLOCK};
use torusrec::bf16::{to_bf16, TableElem};
use torusrec::rng::SplitMix64;

fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut g = SplitMix64::for_id(seed, 81, 0);
    (0..n).map(|_| (g.next_f64() as f32 - 0.5) * 0.4).collect()
}

fn arg(args: &[String], i: usize, default: usize) -> usize {
    args.get(i).map_or(default, |s| s.parse().expect("a count"))
}

fn bench<T: TableElem>(scorer: Scorer, rows: ScoreRows, h: &[T], d: usize, reps: usize) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        let out = local_score_topk_with(scorer, rows, h, 0, d, 50, ROW_BLOCK, COL_BLOCK);
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(out);
    }
    best
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let t = arg(&args, 1, 2000);
    let n = arg(&args, 2, 1_000_000);
    let d = arg(&args, 3, 128);
    let threads = arg(&args, 4, 2);
    let reps = arg(&args, 5, 2);
    torusrec::blas_single_thread();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    let x = values(1, t * d);
    let h = values(2, n * d);
    let hb = to_bf16(&h);
    // Each row masks a few columns, as evaluation rows mask their visible arcs.
    let mut ip = vec![0usize];
    let mut cols = Vec::new();
    for r in 0..t {
        let mut g = SplitMix64::for_id(3, 82, r as u64);
        let mut m: Vec<u32> = (0..20).map(|_| g.below(n as u64) as u32).collect();
        m.sort_unstable();
        m.dedup();
        cols.extend(m);
        ip.push(cols.len());
    }
    let rows = ScoreRows {
        x: &x,
        mask_indptr: &ip,
        mask_cols: &cols,
    };
    let flops = 2.0 * t as f64 * n as f64 * d as f64;
    eprintln!("default kernel: {}", Scorer::auto().name());
    println!("kernel\ttable\trows\tcols\td\tthreads\tseconds\tGFLOP/s");
    let mut kernels = vec![Scorer::Blas];
    if Scorer::auto() == Scorer::Avx512 {
        kernels.extend([Scorer::Avx512, Scorer::Avx512Fma]);
    }
    for k in kernels {
        for table in ["f32", "bf16"] {
            let s = pool.install(|| match table {
                "f32" => bench(k, rows, &h, d, reps),
                _ => bench(k, rows, &hb, d, reps),
            });
            println!(
                "{}\t{table}\t{t}\t{n}\t{d}\t{threads}\t{s:.3}\t{:.1}",
                k.name(),
                flops / s / 1e9
            );
        }
    }
}
