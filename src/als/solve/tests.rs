use super::cg::*;
use super::cholesky::*;
use super::gramian::{self, *};
use super::kernels::*;
use super::loss::*;
use super::*;

use crate::rng::SplitMix64;

/// A random problem: a fixed table and CSR rows over it, stored as a window of a
/// bigger CSR (`indptr[0] > 0`, the leading `indices` are poison never to be read).
struct Problem {
    d: usize,
    n_fixed: usize,
    fixed: Vec<f32>,
    indptr: Vec<u64>,
    indices: Vec<u32>,
}

const POISON: usize = 5;

impl Problem {
    fn new(seed: u64, d: usize, n_fixed: usize, lens: &[usize]) -> Problem {
        let mut rng = SplitMix64::new(seed);
        let scale = 1.0 / (d.max(1) as f64).sqrt();
        let fixed = (0..n_fixed * d)
            .map(|_| (rng.next_normal() * scale) as f32)
            .collect();
        let mut indices = vec![u32::MAX; POISON];
        let mut indptr = vec![POISON as u64];
        for &n in lens {
            for _ in 0..n {
                indices.push(rng.below(n_fixed as u64) as u32);
            }
            indptr.push(indices.len() as u64);
        }
        Problem {
            d,
            n_fixed,
            fixed,
            indptr,
            indices,
        }
    }

    fn rows(&self) -> RowsView<'_> {
        RowsView {
            indptr: &self.indptr,
            indices: &self.indices,
            weights: None,
        }
    }

    fn n_rows(&self) -> usize {
        self.indptr.len() - 1
    }

    fn items(&self, u: usize) -> &[u32] {
        &self.indices[self.indptr[u] as usize..self.indptr[u + 1] as usize]
    }

    fn h(&self, i: u32) -> &[f32] {
        &self.fixed[i as usize * self.d..][..self.d]
    }

    /// Naive dense `A_u`, `b_u` in f64.
    fn dense_system(&self, u: usize, gram: &[f64], p: SolveParams) -> (Vec<f64>, Vec<f64>) {
        let d = self.d;
        let mut a = vec![0.0f64; d * d];
        let mut b = vec![0.0f64; d];
        for &i in self.items(u) {
            let h = self.h(i);
            for k in 0..d {
                b[k] += f64::from(h[k]);
                for l in 0..d {
                    a[k * d + l] += f64::from(h[k]) * f64::from(h[l]);
                }
            }
        }
        let n = self.items(u).len() as f64;
        let lam = f64::from(p.reg) * (n + f64::from(p.alpha0) * p.n_other);
        for k in 0..d {
            for l in 0..d {
                a[k * d + l] += f64::from(p.alpha0) * gram[k * d + l];
            }
            a[k * d + k] += lam;
        }
        (a, b)
    }

    fn params(&self) -> SolveParams {
        SolveParams {
            reg: 0.05,
            alpha0: 0.1,
            n_other: self.n_fixed as f64,
        }
    }
}

/// Textbook Cholesky `A = L L^T` and two triangular solves, in f64.
fn chol_solve_ref(a: &[f64], b: &[f64], d: usize) -> Vec<f64> {
    let mut l = vec![0.0f64; d * d];
    for j in 0..d {
        let mut s = a[j * d + j];
        for k in 0..j {
            s -= l[j * d + k] * l[j * d + k];
        }
        assert!(s > 0.0, "reference: not positive definite");
        l[j * d + j] = s.sqrt();
        for i in j + 1..d {
            let mut s = a[i * d + j];
            for k in 0..j {
                s -= l[i * d + k] * l[j * d + k];
            }
            l[i * d + j] = s / l[j * d + j];
        }
    }
    let mut y = vec![0.0f64; d];
    for i in 0..d {
        let mut s = b[i];
        for k in 0..i {
            s -= l[i * d + k] * y[k];
        }
        y[i] = s / l[i * d + i];
    }
    let mut x = vec![0.0f64; d];
    for i in (0..d).rev() {
        let mut s = y[i];
        for k in i + 1..d {
            s -= l[k * d + i] * x[k];
        }
        x[i] = s / l[i * d + i];
    }
    x
}

fn matvec(a: &[f64], x: &[f32], d: usize) -> Vec<f64> {
    (0..d)
        .map(|k| (0..d).map(|l| a[k * d + l] * f64::from(x[l])).sum())
        .collect()
}

fn norm_inf(v: impl IntoIterator<Item = f64>) -> f64 {
    v.into_iter().fold(0.0, |m, x| m.max(x.abs()))
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("test thread pool")
        .install(f)
}

fn random_x(seed: u64, len: usize, scale: f64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..len)
        .map(|_| (rng.next_normal() * scale) as f32)
        .collect()
}

/// Row lengths with empty rows, short rows, long rows and two hubs.
fn mixed_lens(seed: u64, n: usize, hub: usize) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let mut lens: Vec<usize> = (0..n)
        .map(|_| {
            let u = 1.0 - rng.next_f64();
            (1.5 * u.powf(-0.8)) as usize
        })
        .map(|n| n.min(200))
        .collect();
    lens[0] = 0;
    lens[n / 3] = hub;
    lens[n / 2] = 0;
    lens[n - 1] = hub + 7;
    lens
}

#[test]
fn gramian_matches_reference() {
    let cases = [
        (0, 5),
        (1, 1),
        (3, 3),
        (7, 1),
        (100, 64),
        (GRAM_BLOCK, 4),
        (GRAM_BLOCK * 2 + 13, 16),
        (GRAM_BLOCK * (GRAM_WAVE + 1) + 1, 2),
    ];
    for (seed, &(n, d)) in cases.iter().enumerate() {
        let mut rng = SplitMix64::new(100 + seed as u64);
        let t: Vec<f32> = (0..n * d).map(|_| rng.next_normal() as f32).collect();
        let g = gramian(&t, d);
        let r = gramian_ref(&t, d);
        assert_eq!(g.len(), d * d);
        // f32 sums of at most GRAM_BLOCK products per block, f64 across blocks: the
        // error is at most (GRAM_BLOCK + 1) * 2^-24 times the sum of the products'
        // magnitudes (plus the f64 part, far smaller).
        let u = f64::from(f32::EPSILON) / 2.0;
        let bound = (GRAM_BLOCK.min(n) as f64 + 1.0) * u + 1e-13;
        for k in 0..d {
            for l in 0..d {
                let (a, b) = (g[k * d + l], r[k * d + l]);
                let mag: f64 = t
                    .chunks_exact(d)
                    .map(|row| (f64::from(row[k]) * f64::from(row[l])).abs())
                    .sum();
                assert!(
                    (a - b).abs() <= bound * mag,
                    "n={n} d={d} ({k},{l}): {a} vs {b}"
                );
                assert_eq!(a.to_bits(), g[l * d + k].to_bits(), "not symmetric");
            }
        }
        let g3 = in_pool(3, || gramian(&t, d));
        let g1 = in_pool(1, || gramian(&t, d));
        assert_eq!(g1, g3, "gramian depends on the thread count");
        assert_eq!(g1, g, "gramian depends on the thread count");
    }
    assert!(gramian::<f32>(&[], 0).is_empty());
}

#[test]
fn cholesky_matches_dense_reference() {
    for (case, &d) in [1usize, 3, 16, 64].iter().enumerate() {
        let n_fixed = 300;
        // Row 3 is a hub: several CHOL_CHUNKs of items.
        let lens = [4, 0, 1, 2 * CHOL_CHUNK + 37, 2 * d + 3, 17, 0];
        let pb = Problem::new(10 + case as u64, d, n_fixed, &lens);
        let p = pb.params();
        let gram = gramian(&pb.fixed, d);
        let mut x = vec![7.0f32; pb.n_rows() * d];
        cholesky_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p).expect("SPD systems");
        for u in 0..pb.n_rows() {
            let xu = &x[u * d..][..d];
            if pb.items(u).is_empty() {
                assert!(xu.iter().all(|&v| v == 0.0), "empty row {u} must be 0");
                continue;
            }
            let (a, b) = pb.dense_system(u, &gram, p);
            let xr = chol_solve_ref(&a, &b, d);
            let scale = norm_inf(xr.iter().copied());
            let err = norm_inf(xu.iter().zip(&xr).map(|(&v, &r)| f64::from(v) - r));
            assert!(
                err <= 1e-5 * scale,
                "d={d} row {u}: error {err} vs |x| {scale}"
            );
            // Round trip b = A x, to the accuracy of an f32 x.
            let ax = matvec(&a, xu, d);
            let res = norm_inf(ax.iter().zip(&b).map(|(p, q)| p - q));
            let a_inf = norm_inf((0..d).map(|k| (0..d).map(|l| a[k * d + l].abs()).sum()));
            let x_inf = norm_inf(xu.iter().map(|&v| f64::from(v)));
            let tol = 1e-6 * (a_inf * x_inf + norm_inf(b.iter().copied()));
            assert!(res <= tol, "d={d} row {u}: |Ax - b| = {res} > {tol}");
        }
    }
}

#[test]
fn cholesky_reports_the_first_failing_row() {
    let d = 4;
    let mut pb = Problem::new(20, d, 40, &[0, 3, 0, 5, 2]);
    let gram = gramian(&pb.fixed, d);
    let mut x = vec![0.0f32; pb.n_rows() * d];
    // Indefinite A (negative regularization): the first non-empty row fails.
    let p = SolveParams {
        reg: -10.0,
        alpha0: 0.0,
        n_other: 40.0,
    };
    let e = cholesky_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p).unwrap_err();
    assert_eq!(e.row(), 1, "{e}");
    assert!(e.to_string().starts_with("row 1: "), "{e}");

    // A NaN in a table row that only row 3 uses (item 39: rewire row 3 to it and
    // every other row away from it); the other rows are still solved.
    let p = pb.params();
    for u in 0..pb.n_rows() {
        let range = pb.indptr[u] as usize..pb.indptr[u + 1] as usize;
        for i in &mut pb.indices[range] {
            *i = if u == 3 { 39 } else { *i % 39 };
        }
    }
    pb.fixed[39 * d + 1] = f32::NAN;
    x.fill(-1.0);
    let e = cholesky_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p).unwrap_err();
    assert_eq!(e.row(), 3, "{e}");
    assert!(
        x[3 * d..4 * d].iter().all(|&v| v == -1.0),
        "failed row left unchanged"
    );
    assert!(
        x[4 * d..].iter().all(|&v| v != -1.0 && v.is_finite()),
        "later rows solved"
    );

    // Index out of range and a decreasing indptr.
    let pb = Problem::new(21, d, 40, &[2, 2, 2]);
    let mut indices = pb.indices.clone();
    indices[pb.indptr[2] as usize] = 40;
    let rows = RowsView {
        indptr: &pb.indptr,
        indices: &indices,
        weights: None,
    };
    let mut x = vec![0.0f32; 3 * d];
    let e = cholesky_solve(&mut x, rows, &pb.fixed, d, &gram, p).unwrap_err();
    assert_eq!(e.row(), 2, "{e}");
    let indptr = [POISON as u64, POISON as u64 + 2, POISON as u64 + 1];
    let rows = RowsView {
        indptr: &indptr,
        indices: &pb.indices,
        weights: None,
    };
    let mut x = vec![0.0f32; 2 * d];
    let e = cholesky_solve(&mut x, rows, &pb.fixed, d, &gram, p).unwrap_err();
    assert_eq!(e.row(), 1, "{e}");
}

/// Small batches and a small gather budget, to exercise every batching path.
const SMALL_PLAN: Plan = Plan {
    batch_rows: 5,
    gather_floats: 16 * 40,
    long_gather_floats: 16 * 100,
};

/// The default batches, but every long row read in place (never gathered).
const IN_PLACE_PLAN: Plan = Plan {
    long_gather_floats: 0,
    ..CG_PLAN
};

#[test]
fn cg_converges_to_the_cholesky_solution() {
    for (case, &d) in [1usize, 3, 16, 64].iter().enumerate() {
        let lens = mixed_lens(30 + case as u64, 120, 300);
        let pb = Problem::new(40 + case as u64, d, 500, &lens);
        let p = pb.params();
        let gram = gramian(&pb.fixed, d);
        let gram32 = to_f32(&gram);
        let mut exact = vec![0.0f32; pb.n_rows() * d];
        cholesky_solve(&mut exact, pb.rows(), &pb.fixed, d, &gram, p).expect("SPD");
        for plan in [CG_PLAN, SMALL_PLAN] {
            for hub_chunk in [0, 64] {
                let mut x = vec![0.0f32; pb.n_rows() * d];
                let (rows, fx) = (pb.rows(), &pb.fixed);
                cg_solve_planned(
                    &mut x,
                    rows,
                    fx,
                    d,
                    &gram32,
                    p,
                    50,
                    hub_chunk,
                    plan,
                    Isa::detect(),
                    false,
                );
                for u in 0..pb.n_rows() {
                    let (xu, eu) = (&x[u * d..][..d], &exact[u * d..][..d]);
                    let diff: Vec<f32> = xu.iter().zip(eu).map(|(a, b)| a - b).collect();
                    let (err, scale) = (dot64(&diff, &diff).sqrt(), dot64(eu, eu).sqrt());
                    assert!(
                        err <= 1e-4 * scale,
                        "d={d} hub_chunk={hub_chunk} row {u} (n={}): {err} vs {scale}",
                        pb.items(u).len()
                    );
                    if pb.items(u).is_empty() {
                        assert!(xu.iter().all(|&v| v == 0.0));
                    }
                }
            }
        }
    }
}

#[test]
fn cg_is_exact_after_d_steps() {
    // Ill-conditioned small systems (few items, weak regularization): conjugate
    // directions reach the solution in d steps, steepest descent would not.
    let d = 4;
    let lens: Vec<usize> = (0..40).map(|u| 1 + u % 6).collect();
    let pb = Problem::new(45, d, 50, &lens);
    let p = SolveParams {
        reg: 0.002,
        alpha0: 0.01,
        n_other: 50.0,
    };
    let gram = gramian(&pb.fixed, d);
    let mut exact = vec![0.0f32; pb.n_rows() * d];
    cholesky_solve(&mut exact, pb.rows(), &pb.fixed, d, &gram, p).expect("SPD");
    let mut x = vec![0.0f32; pb.n_rows() * d];
    cg_solve(&mut x, pb.rows(), &pb.fixed, d, &to_f32(&gram), p, d, 0);
    for u in 0..pb.n_rows() {
        let (xu, eu) = (&x[u * d..][..d], &exact[u * d..][..d]);
        let diff: Vec<f32> = xu.iter().zip(eu).map(|(a, b)| a - b).collect();
        let (err, scale) = (dot64(&diff, &diff).sqrt(), dot64(eu, eu).sqrt());
        assert!(err <= 1e-3 * scale, "row {u}: {err} vs {scale}");
    }
}

#[test]
fn cg_three_steps_from_a_warm_start_improve_the_residual() {
    let d = 32;
    let lens = mixed_lens(50, 200, 400);
    let pb = Problem::new(51, d, 600, &lens);
    let p = pb.params();
    let gram = gramian(&pb.fixed, d);
    let mut exact = vec![0.0f32; pb.n_rows() * d];
    cholesky_solve(&mut exact, pb.rows(), &pb.fixed, d, &gram, p).expect("SPD");
    let noise = random_x(52, exact.len(), 0.05);
    let x0: Vec<f32> = exact
        .iter()
        .zip(&noise)
        .map(|(&e, &n)| e * (1.0 + n) + 0.01 * n)
        .collect();
    let mut x = x0.clone();
    cg_solve(&mut x, pb.rows(), &pb.fixed, d, &to_f32(&gram), p, 3, 64);
    let (mut res0, mut res1) = (0.0f64, 0.0f64);
    for u in 0..pb.n_rows() {
        let (a, b) = pb.dense_system(u, &gram, p);
        let r = |xu: &[f32]| {
            let ax = matvec(&a, xu, d);
            ax.iter()
                .zip(&b)
                .map(|(p, q)| (p - q) * (p - q))
                .sum::<f64>()
        };
        let (r0, r1) = (r(&x0[u * d..][..d]), r(&x[u * d..][..d]));
        res0 += r0;
        res1 += r1;
        // CG decreases the A-norm of the error at every step.
        let e_a = |xu: &[f32]| {
            let e: Vec<f32> = xu
                .iter()
                .zip(&exact[u * d..][..d])
                .map(|(a, b)| a - b)
                .collect();
            dot64(&e, &to_f32(&matvec(&a, &e, d)))
        };
        let (e0, e1) = (e_a(&x0[u * d..][..d]), e_a(&x[u * d..][..d]));
        assert!(
            e1 <= e0 * 1.01 + 1e-12,
            "row {u}: A-norm error {e0} -> {e1}"
        );
        if pb.items(u).is_empty() {
            assert!(x[u * d..][..d].iter().all(|&v| v == 0.0));
        }
    }
    assert!(res1 < 0.01 * res0, "residual {res0} -> {res1}");
    assert!(x.iter().all(|v| v.is_finite()));
}

#[test]
fn cg_is_deterministic_and_hub_chunking_agrees() {
    let d = 24;
    let lens = mixed_lens(60, 300, 1000);
    let pb = Problem::new(61, d, 800, &lens);
    let p = pb.params();
    let gram = to_f32(&gramian(&pb.fixed, d));
    let x0 = random_x(62, pb.n_rows() * d, 0.1);
    let run_isa = |threads: usize, hub_chunk: usize, plan: Plan, isa: Isa| {
        let mut x = x0.clone();
        let (rows, fx, g) = (pb.rows(), &pb.fixed, &gram);
        in_pool(threads, || {
            cg_solve_planned(&mut x, rows, fx, d, g, p, 3, hub_chunk, plan, isa, false)
        });
        x
    };
    let run = |threads, hub_chunk, plan| run_isa(threads, hub_chunk, plan, Isa::detect());
    for plan in [CG_PLAN, SMALL_PLAN] {
        let chunked = run(1, 50, plan);
        assert_eq!(chunked, run(2, 50, plan), "1 vs 2 threads");
        assert_eq!(chunked, run(3, 50, plan), "1 vs 3 threads");
        let whole = run(3, 0, plan);
        assert_eq!(whole, run(1, 0, plan), "1 vs 3 threads, no chunking");
        assert_eq!(whole, run(1, usize::MAX, plan), "hub_chunk 0 = never");
        for u in 0..pb.n_rows() {
            let (a, b) = (&chunked[u * d..][..d], &whole[u * d..][..d]);
            let diff: Vec<f32> = a.iter().zip(b).map(|(x, y)| x - y).collect();
            let (err, scale) = (dot64(&diff, &diff).sqrt(), dot64(b, b).sqrt());
            assert!(
                err <= 1e-5 * scale,
                "row {u}: chunked vs whole {err} vs {scale}"
            );
        }
    }
    // The plan only regroups rows: each row's arithmetic is the same.
    assert_eq!(run(2, 50, CG_PLAN), run(2, 50, SMALL_PLAN));
    assert_eq!(run(2, 50, CG_PLAN), run(2, 50, IN_PLACE_PLAN));
    // The portable kernel (no FMA) agrees with the detected one, and is deterministic.
    let plain = run_isa(1, 50, CG_PLAN, Isa::Plain);
    assert_eq!(plain, run_isa(3, 50, CG_PLAN, Isa::Plain));
    let fast = run(1, 50, CG_PLAN);
    for u in 0..pb.n_rows() {
        let (a, b) = (&plain[u * d..][..d], &fast[u * d..][..d]);
        let diff: Vec<f32> = a.iter().zip(b).map(|(x, y)| x - y).collect();
        let (err, scale) = (dot64(&diff, &diff).sqrt(), dot64(b, b).sqrt());
        assert!(
            err <= 1e-5 * scale,
            "row {u}: plain vs detected {err} vs {scale}"
        );
    }
}

#[test]
fn cg_edge_cases_stay_finite() {
    let d = 8;
    let pb = Problem::new(70, d, 30, &[0, 0, 3, 0]);
    let gram = to_f32(&gramian(&pb.fixed, d));
    let p = pb.params();
    // steps = 0 leaves x untouched, even empty rows.
    let mut x = vec![1.0f32; 4 * d];
    cg_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p, 0, 16);
    assert!(x.iter().all(|&v| v == 1.0));
    // Empty rows become exactly 0 from any start.
    let mut x = vec![1.0f32; 4 * d];
    cg_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p, 5, 16);
    for u in [0, 1, 3] {
        assert!(x[u * d..][..d].iter().all(|&v| v == 0.0));
    }
    assert!(x.iter().all(|v| v.is_finite()));
    // Residual exactly 0 (no 0/0): one item h = e_0, no regularization, so
    // A = e_0 e_0^T and b = e_0; from x = e_0 (exact) and from x = 0 (one step).
    let mut e0 = vec![0.0f32; 2 * d];
    e0[0] = 1.0;
    let one = RowsView {
        indptr: &[0, 1],
        indices: &[0],
        weights: None,
    };
    let (g_e0, p_e0) = (
        to_f32(&gramian(&e0, d)),
        SolveParams {
            reg: 0.0,
            alpha0: 0.0,
            n_other: 2.0,
        },
    );
    for start in [1.0f32, 0.0] {
        let mut x = vec![0.0f32; d];
        x[0] = start;
        cg_solve(&mut x, one, &e0, d, &g_e0, p_e0, 5, 16);
        assert_eq!(x, e0[..d], "start {start}");
    }
    // No unobserved weight and no regularization: A = sum h h^T is singular (rank 3
    // < 8), CG stays finite, the empty rows are still 0.
    let p0 = SolveParams {
        reg: 0.0,
        alpha0: 0.0,
        n_other: 30.0,
    };
    let mut x = vec![0.5f32; 4 * d];
    cg_solve(&mut x, pb.rows(), &pb.fixed, d, &gram, p0, 20, 16);
    assert!(x.iter().all(|v| v.is_finite()));
    assert!(x[..d].iter().all(|&v| v == 0.0));
    // No rows at all.
    let empty = RowsView {
        indptr: &[3],
        indices: &[],
        weights: None,
    };
    cg_solve(&mut [], empty, &pb.fixed, d, &gram, p, 3, 16);
    cholesky_solve(&mut [], empty, &pb.fixed, d, &gramian(&pb.fixed, d), p).expect("no rows");
    assert_eq!(
        local_loss_terms(&[], empty, &pb.fixed, d, 0.1, 30.0),
        (0.0, 0.0)
    );
}

/// The transpose of the problem's rows: for each fixed row, its (row) neighbours.
fn transpose(pb: &Problem) -> (Vec<u64>, Vec<u32>) {
    let mut cols: Vec<Vec<u32>> = vec![Vec::new(); pb.n_fixed];
    for u in 0..pb.n_rows() {
        for &i in pb.items(u) {
            cols[i as usize].push(u as u32);
        }
    }
    let mut indptr = vec![0u64];
    let mut indices = Vec::new();
    for c in cols {
        indices.extend(c);
        indptr.push(indices.len() as u64);
    }
    (indptr, indices)
}

fn naive_loss_terms(pb: &Problem, w: &[f32], alpha0: f32) -> (f64, f64) {
    let d = pb.d;
    let (mut obs, mut reg) = (0.0, 0.0);
    for u in 0..pb.n_rows() {
        let wu = &w[u * d..][..d];
        for &i in pb.items(u) {
            let h = pb.h(i);
            let dot: f64 = (0..d).map(|k| f64::from(wu[k]) * f64::from(h[k])).sum();
            obs += (1.0 - dot) * (1.0 - dot);
        }
        let n2: f64 = wu.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        reg += (pb.items(u).len() as f64 + f64::from(alpha0) * pb.n_fixed as f64) * n2;
    }
    (obs, reg)
}

#[test]
fn loss_terms_match_naive_and_the_solve_decreases_the_loss() {
    let d = 8;
    let (n_rows, n_cols) = (60, 50);
    let mut rng = SplitMix64::new(80);
    let lens: Vec<usize> = (0..n_rows).map(|_| rng.below(12) as usize).collect();
    let pb = Problem::new(81, d, n_cols, &lens);
    let p = pb.params();
    let (t_indptr, t_indices) = transpose(&pb);
    let cols = RowsView {
        indptr: &t_indptr,
        indices: &t_indices,
        weights: None,
    };
    let objective = |w: &[f32]| {
        let (obs, reg_w) = local_loss_terms(w, pb.rows(), &pb.fixed, d, p.alpha0, n_cols as f64);
        let (_, reg_h) = local_loss_terms(&pb.fixed, cols, w, d, p.alpha0, n_rows as f64);
        let all = all_pairs_term(&gramian(w, d), &gramian(&pb.fixed, d), d);
        obs + f64::from(p.alpha0) * all + f64::from(p.reg) * (reg_w + reg_h)
    };
    let w0 = random_x(82, n_rows * d, 0.5);

    // local_loss_terms and all_pairs_term against naive sums.
    let (obs, reg) = local_loss_terms(&w0, pb.rows(), &pb.fixed, d, p.alpha0, n_cols as f64);
    let (obs_n, reg_n) = naive_loss_terms(&pb, &w0, p.alpha0);
    assert!((obs - obs_n).abs() <= 1e-12 * obs_n, "{obs} vs {obs_n}");
    assert!((reg - reg_n).abs() <= 1e-12 * reg_n, "{reg} vs {reg_n}");
    let all = all_pairs_term(&gramian(&w0, d), &gramian(&pb.fixed, d), d);
    let mut all_n = 0.0f64;
    for u in 0..n_rows {
        for i in 0..n_cols {
            let dot: f64 = (0..d)
                .map(|k| f64::from(w0[u * d + k]) * f64::from(pb.fixed[i * d + k]))
                .sum();
            all_n += dot * dot;
        }
    }
    // The Gramians are f32 block products (about 1e-7 relative each).
    assert!((all - all_n).abs() <= 1e-6 * all_n, "{all} vs {all_n}");

    // The exact solve minimizes the objective over the rows.
    let l0 = objective(&w0);
    let gram = gramian(&pb.fixed, d);
    let mut w1 = w0.clone();
    cholesky_solve(&mut w1, pb.rows(), &pb.fixed, d, &gram, p).expect("SPD");
    let l1 = objective(&w1);
    assert!(l1 < l0, "exact solve: loss {l0} -> {l1}");
    // ... so any perturbation of the solution increases it,
    let w_pert: Vec<f32> = w1
        .iter()
        .zip(random_x(83, w1.len(), 0.01))
        .map(|(a, b)| a + b)
        .collect();
    assert!(objective(&w_pert) > l1);
    // ... and 3 CG steps from w0 land between.
    let mut w2 = w0.clone();
    cg_solve(&mut w2, pb.rows(), &pb.fixed, d, &to_f32(&gram), p, 3, 4);
    let l2 = objective(&w2);
    assert!(
        l2 < l0 && l2 >= l1 * (1.0 - 1e-6),
        "CG: {l0} -> {l2} (exact {l1})"
    );
}

#[test]
fn gram_term_matches_the_per_element_reference_bitwise() {
    let mut rng = SplitMix64::new(80);
    for (nb, d) in [
        (1, 1),
        (5, 7),
        (6, 16),
        (13, 33),
        (128, 128),
        (7, 40),
        (12, 17),
        (2, 64),
        (3, 64),
        (4, 64),
        (5, 64),
        (15, 64),
    ] {
        let v: Vec<f32> = (0..nb * d).map(|_| rng.next_normal() as f32).collect();
        let g: Vec<f32> = (0..d * d).map(|_| rng.next_normal() as f32).collect();
        for alpha0 in [0.0f32, 0.37] {
            let mut q = vec![f32::NAN; nb * d];
            gram_term_body::<false>(&v, &g, &mut q, nb, d, alpha0);
            assert_eq!(
                q,
                gram_term_ref::<false>(&v, &g, nb, d, alpha0),
                "plain {nb}x{d}"
            );
            #[cfg(target_arch = "x86_64")]
            if Isa::detect() != Isa::Plain {
                let mut q = vec![f32::NAN; nb * d];
                // SAFETY: avx2 and fma were detected.
                unsafe { gram_term_fma_for_test(&v, &g, &mut q, nb, d, alpha0) };
                assert_eq!(
                    q,
                    gram_term_ref::<true>(&v, &g, nb, d, alpha0),
                    "fma {nb}x{d}"
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gram_term_fma_for_test(v: &[f32], g: &[f32], q: &mut [f32], nb: usize, d: usize, a: f32) {
    gram_term_body::<true>(v, g, q, nb, d, a)
}

/// Relative Frobenius distance of two tables.
fn rel_dist(a: &[f32], b: &[f32]) -> f64 {
    let diff: Vec<f32> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    (dot64(&diff, &diff) / dot64(b, b)).sqrt()
}

#[test]
fn bf16_tables_give_the_f32_result_on_the_widened_table() {
    use crate::bf16::{to_bf16, to_f32 as widen_all, Bf16};
    let d = 20;
    let lens = mixed_lens(90, 300, 700);
    let pb = Problem::new(91, d, 800, &lens);
    let p = pb.params();
    let fb: Vec<Bf16> = to_bf16(&pb.fixed);
    let fw: Vec<f32> = widen_all(&fb);
    // Gramians: bitwise.
    let (gb, gw) = (gramian(&fb, d), gramian(&fw, d));
    assert_eq!(gb, gw);
    assert_eq!(gramian_ref(&fb, d), gramian_ref(&fw, d));
    let g32 = to_f32(&gw);
    let x0 = random_x(92, pb.n_rows() * d, 0.1);
    let rows = pb.rows();
    for plan in [CG_PLAN, SMALL_PLAN] {
        for hub_chunk in [0, 64] {
            for threads in [1, 3] {
                let run = |table: Either| {
                    let mut x = x0.clone();
                    let l = in_pool(threads, || match table {
                        Either::F(t) => cg_solve_planned(
                            &mut x,
                            rows,
                            t,
                            d,
                            &g32,
                            p,
                            3,
                            hub_chunk,
                            plan,
                            Isa::detect(),
                            true,
                        ),
                        Either::B(t) => cg_solve_planned(
                            &mut x,
                            rows,
                            t,
                            d,
                            &g32,
                            p,
                            3,
                            hub_chunk,
                            plan,
                            Isa::detect(),
                            true,
                        ),
                    });
                    (x, l)
                };
                let (xb, lb) = run(Either::B(&fb));
                let (xw, lw) = run(Either::F(&fw));
                assert_eq!(
                    xb, xw,
                    "plan {plan:?} hub_chunk {hub_chunk} threads {threads}"
                );
                assert_eq!(lb, lw);
            }
        }
    }
    // Exact solve and the loss pass: bitwise.
    let (mut cb, mut cw) = (x0.clone(), x0.clone());
    cholesky_solve(&mut cb, rows, &fb, d, &gw, p).expect("SPD");
    cholesky_solve(&mut cw, rows, &fw, d, &gw, p).expect("SPD");
    assert_eq!(cb, cw);
    assert_eq!(
        local_loss_terms(&cb, rows, &fb, d, p.alpha0, p.n_other),
        local_loss_terms(&cw, rows, &fw, d, p.alpha0, p.n_other)
    );
    // Against the unrounded f32 table: the exact solutions differ by the effect of
    // rounding H to 8 bits of mantissa (relative 2^-9 per entry).
    let mut cf = x0.clone();
    cholesky_solve(&mut cf, rows, &pb.fixed, d, &gramian(&pb.fixed, d), p).expect("SPD");
    let e = rel_dist(&cb, &cf);
    assert!(
        e > 0.0 && e < 2e-2,
        "bf16 vs f32 exact solutions: relative {e}"
    );
    let mut xf = x0.clone();
    cg_solve(
        &mut xf,
        rows,
        &pb.fixed,
        d,
        &to_f32(&gramian(&pb.fixed, d)),
        p,
        3,
        64,
    );
    let mut xb = x0.clone();
    cg_solve(&mut xb, rows, &fb, d, &g32, p, 3, 64);
    let e = rel_dist(&xb, &xf);
    assert!(e > 0.0 && e < 2e-2, "bf16 vs f32 CG: relative {e}");
}

#[derive(Clone, Copy)]
enum Either<'a> {
    F(&'a [f32]),
    B(&'a [crate::bf16::Bf16]),
}

#[test]
fn fused_loss_matches_the_loss_pass() {
    let d = 24;
    let lens = mixed_lens(100, 400, 900);
    let pb = Problem::new(101, d, 700, &lens);
    let p = pb.params();
    let g32 = to_f32(&gramian(&pb.fixed, d));
    let x0 = random_x(102, pb.n_rows() * d, 0.1);
    let rows = pb.rows();
    for steps in [0usize, 1, 3] {
        for (plan, hub_chunk) in [
            (CG_PLAN, 0),
            (CG_PLAN, 64),
            (SMALL_PLAN, 64),
            (SMALL_PLAN, 0),
        ] {
            let run = |threads: usize, loss: bool| {
                let mut x = x0.clone();
                let l = in_pool(threads, || {
                    cg_solve_planned(
                        &mut x,
                        rows,
                        &pb.fixed[..],
                        d,
                        &g32,
                        p,
                        steps,
                        hub_chunk,
                        plan,
                        Isa::detect(),
                        loss,
                    )
                });
                (x, l)
            };
            let (x, l) = run(1, true);
            // The fused loss does not change the solve; it is thread-count independent.
            assert_eq!(x, run(2, false).0);
            assert_eq!((x.clone(), l), run(3, true));
            if steps == 0 {
                assert_eq!(x, x0);
            }
            let (obs, reg) = local_loss_terms(&x, rows, &pb.fixed, d, p.alpha0, p.n_other);
            let naive = naive_loss_terms(&pb, &x, p.alpha0);
            assert!(
                (l.observed - obs).abs() <= 1e-12 * obs,
                "{} vs {obs}",
                l.observed
            );
            assert!((l.reg - reg).abs() <= 1e-12 * reg, "{} vs {reg}", l.reg);
            assert!((l.observed - naive.0).abs() <= 1e-9 * naive.0);
            assert!((l.reg - naive.1).abs() <= 1e-9 * naive.1);
        }
    }
}

#[test]
fn dot64_vector_kernel_gives_the_plain_bits() {
    use crate::bf16::Bf16;
    let mut rng = SplitMix64::new(77);
    for len in (0..41).chain([127, 128, 129, 256]) {
        let a: Vec<f32> = (0..len).map(|_| rng.next_normal() as f32).collect();
        // Mixed magnitudes, so that the order of the f64 sums matters.
        let b: Vec<f32> = (0..len)
            .map(|i| (rng.next_normal() * if i % 3 == 0 { 1e4 } else { 1e-3 }) as f32)
            .collect();
        let b16: Vec<Bf16> = b.iter().map(|&v| Bf16::from_f32(v)).collect();
        assert_eq!(
            dot64(&a, &b).to_bits(),
            dot64_plain(&a, &b).to_bits(),
            "f32, len {len}"
        );
        assert_eq!(
            dot64(&a, &b16).to_bits(),
            dot64_plain(&a, &b16).to_bits(),
            "bf16, len {len}"
        );
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum();
        let scale: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| (f64::from(x) * f64::from(y)).abs())
            .sum();
        assert!(
            (dot64(&a, &b) - exact).abs() <= 1e-12 * scale.max(1e-300),
            "len {len}"
        );
    }
}

#[test]
fn avx512_cg_gives_the_avx2_bits() {
    #[cfg(target_arch = "x86_64")]
    if Isa::detect() == Isa::Avx512Fma {
        let pb = Problem::new(91, 64, 300, &mixed_lens(5, 200, 900));
        // A symmetric, diagonally dominant Gramian.
        let gram: Vec<f32> = (0..64 * 64)
            .map(|i| {
                if i % 65 == 0 {
                    2.0
                } else {
                    0.01 * (((i / 64 + i % 64) % 7) as f32 - 3.0)
                }
            })
            .collect();
        let run = |isa| {
            let mut x = random_x(3, pb.n_rows() * 64, 0.1);
            let loss = cg_solve_planned(
                &mut x,
                pb.rows(),
                &pb.fixed,
                64,
                &gram,
                pb.params(),
                3,
                50,
                CG_PLAN,
                isa,
                true,
            );
            (x, loss.observed.to_bits(), loss.reg.to_bits())
        };
        assert_eq!(run(Isa::Avx512Fma), run(Isa::Avx2Fma));
    }
}

#[test]
fn rotate_rows_is_the_row_times_matrix_product_bitwise() {
    let mut rng = SplitMix64::new(90);
    for (n, d) in [(0, 4), (1, 1), (3, 7), (300, 16), (700, 33), (260, 128)] {
        let t: Vec<f32> = (0..n * d).map(|_| rng.next_normal() as f32).collect();
        let m: Vec<f32> = (0..d * d).map(|_| rng.next_normal() as f32).collect();
        let want = if Isa::detect() == Isa::Plain {
            gram_term_ref::<false>(&t, &m, n, d, 1.0)
        } else {
            gram_term_ref::<true>(&t, &m, n, d, 1.0)
        };
        for threads in [1, 3] {
            let mut got = t.clone();
            in_pool(threads, || rotate_rows(&mut got, d, &m));
            assert_eq!(got, want, "{n} x {d}, {threads} threads");
        }
    }
}

#[test]
fn eigenbasis_diagonalizes_the_gramian() {
    let d = 24;
    let mut rng = SplitMix64::new(91);
    let t: Vec<f32> = (0..400 * d).map(|_| rng.next_normal() as f32).collect();
    let g = gramian(&t, d);
    let (v, l) = eigenbasis(&g, d).expect("a symmetric matrix");
    assert!(l.windows(2).all(|w| w[0] <= w[1]), "ascending: {l:?}");
    let vtgv = matmul64(&matmul64(&transpose64(&v, d), &g, d), &v, d);
    let vtv = matmul64(&transpose64(&v, d), &v, d);
    let scale = norm_inf(g.iter().copied());
    for i in 0..d {
        for j in 0..d {
            let id = if i == j { 1.0 } else { 0.0 };
            assert!((vtv[i * d + j] - id).abs() < 1e-12, "V^T V at ({i},{j})");
            let want = if i == j { l[i] } else { 0.0 };
            assert!(
                (vtgv[i * d + j] - want).abs() < 1e-12 * scale,
                "V^T G V at ({i},{j}): {} vs {want}",
                vtgv[i * d + j]
            );
        }
    }
    let mut bad = g.clone();
    bad[3] = f64::NAN;
    assert!(eigenbasis(&bad, d).unwrap_err().contains("NaN"));
    assert_eq!(eigenbasis(&[], 0).unwrap(), (Vec::new(), Vec::new()));
}

/// CG on both tables rotated into the Gramian's eigenbasis, with the diagonal Gramian,
/// then rotated back, solves the same systems as CG with the dense Gramian.
#[test]
fn cg_in_the_eigenbasis_matches_cg_with_the_dense_gramian() {
    let d = 32;
    let lens = mixed_lens(92, 150, 300);
    let pb = Problem::new(93, d, 400, &lens);
    let p = pb.params();
    let gram = gramian(&pb.fixed, d);
    let x0 = random_x(94, pb.n_rows() * d, 0.3);
    let mut dense = x0.clone();
    let loss_dense = cg_solve_with_loss(
        &mut dense,
        pb.rows(),
        &pb.fixed,
        d,
        &to_f32(&gram),
        p,
        3,
        64,
    );

    let (v, _) = eigenbasis(&gram, d).unwrap();
    let v32 = to_f32(&v);
    let v64: Vec<f64> = v32.iter().map(|&x| f64::from(x)).collect();
    let vtgv = matmul64(&matmul64(&transpose64(&v64, d), &gram, d), &v64, d);
    let diag: Vec<f32> = (0..d).map(|k| vtgv[k * d + k] as f32).collect();
    let (mut fixed, mut x) = (pb.fixed.clone(), x0.clone());
    rotate_rows(&mut fixed, d, &v32);
    rotate_rows(&mut x, d, &v32);
    let loss_eigen = cg_solve_with_loss(&mut x, pb.rows(), &fixed, d, &diag, p, 3, 64);
    rotate_rows(&mut x, d, &to_f32(&transpose64(&v64, d)));

    let scale = norm_inf(dense.iter().map(|&v| f64::from(v)));
    let err = norm_inf(
        dense
            .iter()
            .zip(&x)
            .map(|(&a, &b)| f64::from(a) - f64::from(b)),
    );
    assert!(
        err <= 1e-4 * scale,
        "max |difference| {err:.3e} of {scale:.3e}"
    );
    assert_ne!(dense, x, "the eigenbasis path did not run");
    for (a, b) in [
        (loss_dense.observed, loss_eigen.observed),
        (loss_dense.reg, loss_eigen.reg),
    ] {
        assert!((a - b).abs() <= 1e-4 * a.abs(), "loss term {a} vs {b}");
    }
}

/// `g[i, j]` as the Gramian kernels define it: one fused multiply-add chain over the
/// rows in order.
fn gram_upper_ref(b: &[f32], nb: usize, d: usize) -> Vec<f32> {
    let mut g = vec![0.0f32; d * d];
    for i in 0..d {
        for j in i..d {
            let mut s = 0.0f32;
            for r in 0..nb {
                s = b[r * d + i].mul_add(b[r * d + j], s);
            }
            g[i * d + j] = s;
        }
    }
    g
}

#[test]
fn gramian_block_kernels_are_the_fma_chain_bitwise() {
    let mut rng = SplitMix64::new(95);
    for (nb, d) in [(0, 32), (1, 32), (7, 64), (300, 128), (1024, 96), (5, 48)] {
        let b: Vec<f32> = (0..nb * d).map(|_| rng.next_normal() as f32).collect();
        let want = gram_upper_ref(&b, nb, d);
        let upper = |g: &[f32]| -> Vec<f32> {
            let mut u = vec![0.0f32; d * d];
            for i in 0..d {
                for j in i..d {
                    u[i * d + j] = g[i * d + j];
                }
            }
            u
        };
        let mut g = vec![f32::NAN; d * d];
        if gramian::block_upper(&b, nb, d, &mut g) {
            assert_eq!(upper(&g), want, "dispatched kernel, {nb} x {d}");
        } else {
            assert!(g.iter().all(|v| v.is_nan()), "touched g without applying");
        }
        #[cfg(target_arch = "x86_64")]
        if Isa::detect() != Isa::Plain && d % 16 == 0 {
            let mut g = vec![f32::NAN; d * d];
            // SAFETY: avx2 and fma were detected; d is a multiple of 16.
            unsafe { gramian::block_upper_avx2(&b, nb, d, &mut g) };
            assert_eq!(upper(&g), want, "avx2 kernel, {nb} x {d}");
        }
    }
    // No kernel for a width that is not a multiple of 16 (syrk then).
    let mut g = vec![0.0f32; 9];
    assert!(!gramian::block_upper(&[1.0; 6], 2, 3, &mut g));
}

/// Confidences of a problem's arcs: `linear:ALPHA` of ratings in 0.5..5 (as in
/// MovieLens), so they span about 1..1 + 5 ALPHA.
fn random_confidences(seed: u64, n: usize, alpha: f32) -> Vec<f32> {
    let conf = crate::als::Confidence::Linear { alpha };
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|_| conf.of(0.5 * (1 + rng.below(10)) as f32))
        .collect()
}

/// `A_u = alpha0 G + sum_i c_ui h_i h_i^T + lambda (|I_u| + alpha0 n) I`,
/// `b_u = sum_i c_ui h_i`, densely in f64 (the system of `docs/als.md`).
fn dense_weighted_system(
    pb: &Problem,
    c: &[f32],
    u: usize,
    gram: &[f64],
    p: SolveParams,
) -> (Vec<f64>, Vec<f64>) {
    let d = pb.d;
    let (mut a, mut b) = (vec![0.0f64; d * d], vec![0.0f64; d]);
    let r = pb.indptr[u] as usize..pb.indptr[u + 1] as usize;
    for (&i, &cu) in pb.indices[r.clone()].iter().zip(&c[r]) {
        let (h, cu) = (pb.h(i), f64::from(cu));
        for k in 0..d {
            b[k] += cu * f64::from(h[k]);
            for l in 0..d {
                a[k * d + l] += cu * f64::from(h[k]) * f64::from(h[l]);
            }
        }
    }
    let lam = f64::from(p.reg) * (pb.items(u).len() as f64 + f64::from(p.alpha0) * p.n_other);
    for k in 0..d {
        for l in 0..d {
            a[k * d + l] += f64::from(p.alpha0) * gram[k * d + l];
        }
        a[k * d + k] += lam;
    }
    (a, b)
}

#[test]
fn weighted_half_step_matches_the_dense_reference_solve() {
    for (case, &d) in [1usize, 3, 16, 32].iter().enumerate() {
        let lens = mixed_lens(70 + case as u64, 90, 2 * CHOL_CHUNK + 5);
        let pb = Problem::new(80 + case as u64, d, 400, &lens);
        let c = random_confidences(90 + case as u64, pb.indices.len(), 2.0);
        let rows = RowsView {
            weights: Some(&c),
            ..pb.rows()
        };
        let p = pb.params();
        let gram = gramian(&pb.fixed, d);
        let gram32 = to_f32(&gram);
        let mut chol = vec![0.0f32; pb.n_rows() * d];
        cholesky_solve(&mut chol, rows, &pb.fixed, d, &gram, p).expect("SPD");
        let mut plain = vec![0.0f32; pb.n_rows() * d];
        cholesky_solve(&mut plain, pb.rows(), &pb.fixed, d, &gram, p).expect("SPD");
        let mut moved = 0.0f64;
        for plan in [CG_PLAN, SMALL_PLAN] {
            for hub_chunk in [0, 64] {
                let mut cg = vec![0.0f32; pb.n_rows() * d];
                cg_solve_planned(
                    &mut cg,
                    rows,
                    &pb.fixed,
                    d,
                    &gram32,
                    p,
                    60,
                    hub_chunk,
                    plan,
                    Isa::detect(),
                    false,
                );
                for u in 0..pb.n_rows() {
                    let (a, b) = dense_weighted_system(&pb, &c, u, &gram, p);
                    let xr = chol_solve_ref(&a, &b, d);
                    let scale = norm_inf(xr.iter().copied()).max(1e-30);
                    for (what, x, tol) in [("cholesky", &chol, 1e-5), ("cg", &cg, 1e-3)] {
                        let xu = &x[u * d..][..d];
                        let err = norm_inf(xu.iter().zip(&xr).map(|(&v, &r)| f64::from(v) - r));
                        assert!(
                            err <= tol * scale,
                            "{what} d={d} plan {plan:?} hub {hub_chunk} row {u} (n={}): {err} vs {scale}",
                            pb.items(u).len()
                        );
                    }
                    let pu = &plain[u * d..][..d];
                    let dist = norm_inf(pu.iter().zip(&xr).map(|(&v, &r)| f64::from(v) - r));
                    moved = moved.max(dist / scale);
                }
            }
        }
        // The confidences change the solution (the test would pass on ignored weights
        // only if they did not).
        assert!(
            moved > 0.05,
            "d={d}: weighted and unweighted solves agree ({moved})"
        );
    }
}

#[test]
fn weighted_loss_terms_match_the_dense_objective() {
    for (case, &d) in [0usize, 3, 16].iter().enumerate() {
        let lens = mixed_lens(100 + case as u64, 3 * LOSS_CHUNK / 2, 300);
        let pb = Problem::new(110 + case as u64, d, 300, &lens);
        let c = random_confidences(120 + case as u64, pb.indices.len(), 0.7);
        let rows = RowsView {
            weights: Some(&c),
            ..pb.rows()
        };
        let p = pb.params();
        let w = random_x(130 + case as u64, pb.n_rows() * d, 0.3);
        // Dense: sum_u sum_{i in I_u} c_ui (1 - w_u . h_i)^2 and the regularizer.
        let (mut obs, mut reg) = (0.0f64, 0.0f64);
        for u in 0..pb.n_rows() {
            let wu = &w[u * d..][..d];
            let r = pb.indptr[u] as usize..pb.indptr[u + 1] as usize;
            for (&i, &cu) in pb.indices[r.clone()].iter().zip(&c[r]) {
                let h = pb.h(i);
                let dot: f64 = (0..d).map(|k| f64::from(wu[k]) * f64::from(h[k])).sum();
                obs += f64::from(cu) * (1.0 - dot) * (1.0 - dot);
            }
            let n2: f64 = wu.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            reg += (pb.items(u).len() as f64 + f64::from(p.alpha0) * p.n_other) * n2;
        }
        let (o, r) = local_loss_terms(&w, rows, &pb.fixed, d, p.alpha0, p.n_other);
        assert!(
            (o - obs).abs() <= 1e-9 * obs,
            "d={d}: observed {o} vs {obs}"
        );
        assert!(
            (r - reg).abs() <= 1e-9 * reg.max(1e-300),
            "d={d}: reg {r} vs {reg}"
        );
        let (o0, _) = local_loss_terms(&w, pb.rows(), &pb.fixed, d, p.alpha0, p.n_other);
        assert!(
            (o0 - obs).abs() > 1e-3 * obs,
            "d={d}: the weights are ignored"
        );
        // The chunked accumulation gives the bits of the one pass.
        let mut accs = vec![(0.0, 0.0); pb.n_rows().div_ceil(LOSS_CHUNK)];
        let half = LOSS_CHUNK / 2;
        let ip = &pb.indptr;
        for (lo, hi) in [(0, half), (half, pb.n_rows())] {
            let part = RowsView {
                indptr: &ip[lo..=hi],
                ..rows
            };
            add_loss_terms_to_chunks(
                &mut accs,
                lo,
                &w[lo * d..hi * d],
                part,
                &pb.fixed,
                d,
                p.alpha0,
                p.n_other,
            );
        }
        assert_eq!(fold_loss_chunks(&accs, None), (o, r), "d={d}");
        if d == 0 {
            continue;
        }
        // CG's fused loss pieces are the loss of the rows it returns.
        let gram32 = to_f32(&gramian(&pb.fixed, d));
        let mut x = w.clone();
        let fused = cg_solve_with_loss(&mut x, rows, &pb.fixed, d, &gram32, p, 3, 64);
        let (o2, r2) = local_loss_terms(&x, rows, &pb.fixed, d, p.alpha0, p.n_other);
        assert!(
            (fused.observed - o2).abs() <= 1e-9 * o2,
            "d={d}: fused {} vs {o2}",
            fused.observed
        );
        assert!(
            (fused.reg - r2).abs() <= 1e-9 * r2,
            "d={d}: fused reg {} vs {r2}",
            fused.reg
        );
    }
}

#[test]
fn confidence_specs_parse_compute_and_refuse() {
    use crate::als::Confidence;
    let lin: Confidence = "linear:40".parse().unwrap();
    assert_eq!(lin, Confidence::Linear { alpha: 40.0 });
    assert_eq!(lin.of(2.5), 101.0);
    let log: Confidence = "log:2,0.5".parse().unwrap();
    assert_eq!(
        log,
        Confidence::Log {
            alpha: 2.0,
            eps: 0.5
        }
    );
    assert_eq!(log.of(1.5), (1.0 + 2.0 * 4f64.ln()) as f32);
    assert_eq!("binary".parse::<Confidence>().unwrap().of(7.0), 1.0);
    for c in [lin, log, Confidence::Binary] {
        assert_eq!(c.to_string().parse::<Confidence>().unwrap(), c);
    }
    for bad in [
        "",
        "linear",
        "linear:",
        "linear:0",
        "linear:-1",
        "linear:x",
        "linear:inf",
        "log:1",
        "log:1,0",
        "log:0,1",
        "log:1,-2",
        "log:a,b",
        "quadratic:1",
        "Binary",
    ] {
        assert!(bad.parse::<Confidence>().is_err(), "{bad:?} accepted");
    }
}
