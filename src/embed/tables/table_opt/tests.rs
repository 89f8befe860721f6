//! Each update rule against a reference written from its paper's formulas, in f64, on
//! small vectors over several steps.

use super::TableOpt;

/// Three steps of gradients for a 3-wide row (the last step is small so FTRL's l1
/// zeroes a coordinate).
const GRADS: [[f32; 3]; 3] = [[0.5, -1.0, 0.25], [-0.25, -0.5, 2.0], [0.01, 0.3, -0.02]];
const ROW0: [f32; 3] = [0.1, -0.2, 0.3];

fn row_stat(g: &[f32]) -> f64 {
    super::super::store::row_stat(g)
}

/// Runs `opt` for the three steps at multiplier `mult` and returns the rows.
fn run(opt: TableOpt, mult: f32) -> Vec<[f32; 3]> {
    let mut row = ROW0;
    let mut st = vec![0.0f32; opt.state_per_row(3)];
    let mut out = Vec::new();
    for (s, g) in GRADS.iter().enumerate() {
        opt.at_step(mult, s as u64)
            .apply(&mut row, &mut st, g, row_stat(g));
        out.push(row);
    }
    out
}

fn close(got: &[[f32; 3]], want: &[[f64; 3]], what: &str) {
    for (s, (g, w)) in got.iter().zip(want).enumerate() {
        for j in 0..3 {
            let tol = 1e-6 + 1e-5 * w[j].abs();
            assert!(
                (g[j] as f64 - w[j]).abs() <= tol,
                "{what} step {s} col {j}: got {} want {}",
                g[j],
                w[j]
            );
        }
    }
}

#[test]
fn sgd_with_l2_weight_decay_matches_the_reference() {
    let (lr, wd) = (0.1, 0.01);
    let mut w: [f64; 3] = ROW0.map(|x| x as f64);
    let mut want = Vec::new();
    for g in GRADS {
        for j in 0..3 {
            w[j] -= lr * 0.5 * (g[j] as f64 + wd * w[j]);
        }
        want.push(w);
    }
    close(&run(TableOpt::Sgd { lr: 0.1, wd: 0.01 }, 0.5), &want, "sgd");
}

#[test]
fn adagrad_per_element_matches_the_reference() {
    let (lr, eps, wd) = (0.3, 1e-8, 0.05);
    let mut w: [f64; 3] = ROW0.map(|x| x as f64);
    let mut acc = [0.0f64; 3];
    let mut want = Vec::new();
    for g in GRADS {
        for j in 0..3 {
            let gj = g[j] as f64 + wd * w[j];
            acc[j] += gj * gj;
            w[j] -= lr * gj / (acc[j].sqrt() + eps);
        }
        want.push(w);
    }
    let opt = TableOpt::Adagrad {
        lr: 0.3,
        eps: 1e-8,
        wd: 0.05,
    };
    close(&run(opt, 1.0), &want, "adagrad");
}

#[test]
fn rowwise_adagrad_with_decoupled_decay_matches_the_reference() {
    let (lr, wd) = (0.2, 0.1);
    let mut w: [f64; 3] = ROW0.map(|x| x as f64);
    let mut acc = 0.0f64;
    let mut want = Vec::new();
    for g in GRADS {
        acc += g.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / 3.0;
        for j in 0..3 {
            w[j] *= 1.0 - lr * wd;
            w[j] -= lr * g[j] as f64 / (acc.sqrt() + 1e-8);
        }
        want.push(w);
    }
    let opt = TableOpt::RowWiseAdagrad {
        lr: 0.2,
        eps: 1e-8,
        wd: 0.1,
    };
    close(&run(opt, 1.0), &want, "rowwise adagrad");
}

/// Adam (rowwise: one second moment of the row's mean square) with bias correction
/// at global steps 1, 2, 3 and decoupled weight decay.
fn adam_reference(rowwise: bool, lr: f64, wd: f64) -> Vec<[f64; 3]> {
    let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8f64);
    let mut w: [f64; 3] = ROW0.map(|x| x as f64);
    let (mut m, mut v, mut vr) = ([0.0f64; 3], [0.0f64; 3], 0.0f64);
    let mut want = Vec::new();
    for (s, g) in GRADS.iter().enumerate() {
        let t = (s + 1) as i32;
        let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        let ms = g.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / 3.0;
        vr = b2 * vr + (1.0 - b2) * ms;
        for j in 0..3 {
            let gj = g[j] as f64;
            m[j] = b1 * m[j] + (1.0 - b1) * gj;
            v[j] = b2 * v[j] + (1.0 - b2) * gj * gj;
            let vj = if rowwise { vr } else { v[j] };
            w[j] *= 1.0 - lr * wd;
            w[j] -= lr * (m[j] / bc1) / ((vj / bc2).sqrt() + eps);
        }
        want.push(w);
    }
    want
}

#[test]
fn adam_and_rowwise_adam_match_the_reference_with_bias_correction() {
    // The first step of Adam moves every coordinate by about lr (bias corrected).
    let got = run(TableOpt::adam(0.01, 0.0), 1.0);
    for j in 0..3 {
        let moved = (got[0][j] - ROW0[j]).abs();
        assert!((moved - 0.01).abs() < 1e-6, "col {j} moved {moved}");
    }
    close(&got, &adam_reference(false, 0.01, 0.0), "adam");
    let got = run(TableOpt::adam(0.01, 0.1), 0.5);
    close(
        &got,
        &adam_reference(false, 0.005, 0.1),
        "adam wd, mult 0.5",
    );
    let got = run(TableOpt::rowwise_adam(0.01, 0.1), 1.0);
    close(&got, &adam_reference(true, 0.01, 0.1), "rowwise adam");
    // Without bias correction (bc = 1) the first step would be 0.1 / sqrt(0.001),
    // about 3.16 times lr.
    let mut row = ROW0;
    let mut st = [0.0f32; 6];
    TableOpt::adam(0.01, 0.0).apply(&mut row, &mut st, &GRADS[0], 0.0);
    assert!(((row[0] - ROW0[0]).abs() - 0.0316).abs() < 1e-3);
}

#[test]
fn ftrl_matches_the_reference_and_l1_zeroes_small_coordinates() {
    let (alpha, beta, l1, l2) = (0.5f64, 1.0f64, 0.3f64, 0.1f64);
    let mut w: [f64; 3] = ROW0.map(|x| x as f64);
    let (mut z, mut n) = ([0.0f64; 3], [0.0f64; 3]);
    let mut want = Vec::new();
    for g in GRADS {
        for j in 0..3 {
            let gj = g[j] as f64;
            let sigma = ((n[j] + gj * gj).sqrt() - n[j].sqrt()) / alpha;
            z[j] += gj - sigma * w[j];
            n[j] += gj * gj;
            w[j] = if z[j].abs() <= l1 {
                0.0
            } else {
                -(z[j] - z[j].signum() * l1) / ((beta + n[j].sqrt()) / alpha + l2)
            };
        }
        want.push(w);
    }
    // The reference itself zeroes a coordinate and keeps another: l1 acts.
    assert!(want.iter().flatten().any(|&x| x == 0.0));
    assert!(want[2].iter().any(|&x| x != 0.0));
    let opt = TableOpt::Ftrl {
        alpha: 0.5,
        beta: 1.0,
        l1: 0.3,
        l2: 0.1,
    };
    let got = run(opt, 1.0);
    close(&got, &want, "ftrl");
    for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
        assert_eq!(*g == 0.0, *w == 0.0, "exact zeros agree");
    }
}

#[test]
fn a_multiplier_of_one_keeps_the_bits_and_state_sizes_are_as_documented() {
    for opt in [
        TableOpt::Sgd { lr: 0.1, wd: 0.0 },
        TableOpt::RowWiseAdagrad {
            lr: 0.1,
            eps: 1e-8,
            wd: 0.0,
        },
    ] {
        assert_eq!(opt.at_step(1.0, 7), opt);
    }
    let sizes: Vec<(usize, usize)> = [
        TableOpt::Sgd { lr: 0.1, wd: 0.0 },
        TableOpt::RowWiseAdagrad {
            lr: 0.1,
            eps: 1e-8,
            wd: 0.0,
        },
        TableOpt::Adagrad {
            lr: 0.1,
            eps: 1e-8,
            wd: 0.0,
        },
        TableOpt::adam(0.1, 0.0),
        TableOpt::rowwise_adam(0.1, 0.0),
        TableOpt::Ftrl {
            alpha: 0.1,
            beta: 1.0,
            l1: 0.0,
            l2: 0.0,
        },
    ]
    .iter()
    .map(|o| (o.state_fixed_per_row(), o.state_per_element()))
    .collect();
    assert_eq!(sizes, [(0, 0), (1, 0), (0, 1), (0, 2), (1, 1), (0, 2)]);
}
