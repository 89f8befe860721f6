//! The calibration's tests: the timing's points and rounds, the medians, the fit of
//! known constants, the file's round trip and its named errors, the prediction.

use serde_json::Value;

use super::file::parse;
use super::fit::fit;
use super::points::mlp_flops;
use super::timing::{global_calibrate, global_mlp_points};
use super::*;
use crate::embed::planner::CostModel;

/// Conditions of a test file: `ranks` on `torus`, quick, one rep.
fn test_conditions(ranks: usize, torus: &str) -> Conditions {
    Conditions {
        ranks,
        torus: torus.into(),
        threads: 1,
        cpu: "test".into(),
        avx512: false,
        avx2: true,
        commit: "abc".into(),
        quick: true,
        reps: 1,
        table_bytes: 1 << 20,
    }
}

#[test]
fn kernel_rounds_keep_every_point_once_in_the_order_of_one_round() {
    let cond = || test_conditions(1, "1");
    let key = |c: &Costs| -> Vec<(usize, usize, String, usize, u64, u64)> {
        c.gather
            .iter()
            .chain(&c.scatter)
            .map(|p| (p.dim, p.pooling, p.dist.clone(), p.tables, p.rows, p.ids))
            .collect()
    };
    let comm = crate::comm::single::SingleComm::new();
    let one = CalibOptions {
        kernel_rounds: 1,
        reps: 1,
        ..CalibOptions::new(true)
    };
    let three = CalibOptions {
        kernel_rounds: 3,
        ..one.clone()
    };
    let a = global_calibrate(&comm, &one, cond()).unwrap();
    let b = global_calibrate(&comm, &three, cond()).unwrap();
    assert!(!a.gather.is_empty() && a.gather.len() == a.scatter.len());
    assert_eq!(key(&a), key(&b));
    assert!(b.gather.iter().chain(&b.scatter).all(|p| p.seconds > 0.0));
}

#[test]
fn the_mlp_points_are_every_shape_at_every_batch_each_timed_in_every_round() {
    let o = CalibOptions {
        mlp_shapes: vec![vec![8, 4, 1], vec![16, 8, 1]],
        mlp_batches: vec![32, 64],
        mlp_rounds: 5,
        ..CalibOptions::new(true)
    };
    let pts = global_mlp_points(&crate::comm::single::SingleComm::new(), &o).unwrap();
    let got: Vec<(Vec<usize>, usize)> = pts.iter().map(|p| (p.layers.clone(), p.batch)).collect();
    let want = vec![
        (vec![8, 4, 1], 32),
        (vec![8, 4, 1], 64),
        (vec![16, 8, 1], 32),
        (vec![16, 8, 1], 64),
    ];
    assert_eq!(got, want);
    assert!(pts.iter().all(|p| p.seconds > 0.0), "{pts:?}");
    // A bad shape is refused as the MLP refuses it, not timed.
    let bad = CalibOptions {
        mlp_shapes: vec![vec![8]],
        ..o
    };
    assert!(global_mlp_points(&crate::comm::single::SingleComm::new(), &bad).is_err());
}

#[test]
fn each_point_keeps_the_median_of_its_passes() {
    // Three passes of two points; the second pass was a slow minute.
    let passes = vec![vec![1.0, 10.0], vec![3.0, 30.0], vec![2.0, 11.0]];
    assert_eq!(median_over_passes(&passes), vec![2.0, 11.0]);
    // One pass is itself; a point missing from a pass is the median of the rest.
    assert_eq!(median_over_passes(&passes[..1]), vec![1.0, 10.0]);
    assert_eq!(
        median_over_passes(&[vec![1.0, 4.0], vec![3.0]]),
        vec![2.0, 4.0]
    );
    assert!(median_over_passes(&[]).is_empty());
}

#[test]
fn a_synchronized_phase_costs_the_mean_over_rounds_of_the_slowest_rank() {
    // Rank 1 is slow in round 0, rank 0 in round 2: the step waits for each.
    let r0 = [1.0, 2.0, 5.0];
    let r1 = [3.0, 1.0, 4.0];
    let got = synchronized_seconds(&[&r0, &r1]);
    assert!((got - (3.0 + 2.0 + 5.0) / 3.0).abs() < 1e-12, "{got}");
    // One rank: the mean of its rounds (a slow round counts, as in training).
    assert!((synchronized_seconds(&[&r0]) - 8.0 / 3.0).abs() < 1e-12);
    assert_eq!(synchronized_seconds(&[]), 0.0);
    assert_eq!(synchronized_seconds(&[&[], &[]]), 0.0);
}

fn point(dim: usize, dist: &str, tables: usize, per_id: f64) -> KernelPoint {
    KernelPoint {
        dim,
        pooling: 8,
        dist: dist.into(),
        tables,
        rows: rows_of(1 << 20, dim),
        ids: 1000 * tables as u64,
        seconds: per_id * 1000.0 * tables as f64,
    }
}

fn costs() -> Costs {
    // Per id: 10 ns + bytes / 10 GB/s (gather), twice the bytes for a scatter;
    // k tables together 1 + 0.6 (1 - 1/k) times slower per id (k = 2, 4, 8).
    let g = |d: usize| 10e-9 + (4.0 * d as f64).max(64.0) / 10e9;
    let s = |d: usize| 10e-9 + 2.0 * (4.0 * d as f64).max(64.0) / 10e9;
    let mut gather = Vec::new();
    let mut scatter = Vec::new();
    for d in [16, 32, 64, 128] {
        gather.push(point(d, "uniform", 1, g(d)));
        gather.push(point(d, "zipf", 1, 0.5 * g(d)));
        scatter.push(point(d, "uniform", 1, s(d)));
    }
    for k in [2, 4, 8] {
        let r = 1.0 + 0.6 * (1.0 - 1.0 / k as f64);
        gather.push(point(32, "uniform", k, r * g(32)));
        scatter.push(point(32, "uniform", k, r * s(32)));
    }
    Costs {
        pooled: Vec::new(),
        schema: SCHEMA.into(),
        conditions: test_conditions(2, "2x1"),
        gather,
        scatter,
        mlp: vec![MlpPoint {
            layers: vec![10, 10, 1],
            batch: 100,
            seconds: mlp_flops(&[10, 10, 1], 100) / 1e9,
        }],
        all_to_all: vec![
            CollPoint {
                bytes: 1000,
                seconds: 1e-6 + 500.0 / 1e9,
            },
            CollPoint {
                bytes: 100_000,
                seconds: 1e-6 + 50_000.0 / 1e9,
            },
        ],
        all_reduce: vec![
            CollPoint {
                bytes: 1000,
                seconds: 2e-6 + 1000.0 / 2e9,
            },
            CollPoint {
                bytes: 100_000,
                seconds: 2e-6 + 100_000.0 / 2e9,
            },
        ],
        fit: Fit {
            model: CostModel::default(),
            all_to_all_latency_s: 0.0,
            all_reduce_latency_s: 0.0,
            mlp_flops: 1.0,
            zipf_ratio: Vec::new(),
            together_ratio: Vec::new(),
            kernel_interference: 0.0,
        },
    }
}

#[test]
fn the_fit_recovers_the_constants_the_points_were_made_with() {
    let f = fit(&costs());
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs();
    assert!(close(f.model.lookup_s, 10e-9), "{f:?}");
    assert!(close(f.model.mem_bw, 10e9), "{f:?}");
    assert!(close(f.model.interference, 0.6), "{f:?}");
    assert!(f.model.ask_row_access, "{f:?}");
    assert_eq!(f.together_ratio.len(), 3, "{f:?}");
    assert!(close(f.together_ratio[2][1], 1.525), "{f:?}");
    assert!(close(f.model.net_bw, 1e9), "{f:?}");
    assert!(close(f.all_to_all_latency_s, 1e-6), "{f:?}");
    assert!(close(f.model.allreduce_bw, 2e9), "{f:?}");
    assert!(close(f.all_reduce_latency_s, 2e-6), "{f:?}");
    assert!(close(f.mlp_flops, 1e9), "{f:?}");
    for [_, r] in &f.model.width_factor {
        assert!(close(*r, 1.0), "{f:?}");
    }
    // Zipf gathers were made twice as fast per id, at every width.
    assert_eq!(f.zipf_ratio.len(), 4, "{f:?}");
    for [_, r] in &f.zipf_ratio {
        assert!(close(*r, 0.5), "{f:?}");
    }
    // A width made ten times slower: its cost, and only its, grows tenfold.
    let mut c = costs();
    for q in c.gather.iter_mut().chain(c.scatter.iter_mut()) {
        if q.dim == 64 {
            q.seconds *= 10.0;
        }
    }
    let g = fit(&c);
    let per_width = |f: &Fit, w: usize| {
        let m = &f.model;
        // A gather and a scatter per id: two lookups, three row accesses.
        m.factor(w) * (2.0 * m.lookup_s + 3.0 * (4.0 * w as f64).max(64.0) / m.mem_bw)
    };
    for w in [16, 32, 128] {
        assert!(close(per_width(&g, w), per_width(&f, w)), "{w}: {g:?}");
    }
    assert!(close(per_width(&g, 64), 10.0 * per_width(&f, 64)), "{g:?}");
    // Without size points: no size factor (the model prices every size alike).
    assert!(f.model.size_factor.is_empty(), "{f:?}");
}

#[test]
fn the_size_factor_is_the_per_id_ratio_to_the_reference_size() {
    let mut c = costs();
    let f0 = fit(&c);
    // Tables of 64 kB: 0.4 times the reference's per-id seconds (gather 0.3 and
    // scatter 0.533..: geometric mean 0.4); of 16 MB: 2 times, at every width.
    for d in [16, 32, 64, 128] {
        let at = |q: &KernelPoint, bytes: u64, r: f64| KernelPoint {
            rows: rows_of(bytes, d),
            seconds: q.seconds * r,
            ..q.clone()
        };
        let g = c
            .gather
            .iter()
            .find(|q| q.dim == d && q.dist == "uniform")
            .unwrap()
            .clone();
        let s = c
            .scatter
            .iter()
            .find(|q| q.dim == d && q.tables == 1)
            .unwrap()
            .clone();
        c.gather.push(at(&g, 1 << 16, 0.3));
        c.scatter.push(at(&s, 1 << 16, 0.16 / 0.3));
        c.gather.push(at(&g, 16 << 20, 2.0));
        c.scatter.push(at(&s, 16 << 20, 2.0));
    }
    let f = fit(&c);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
    let sf = &f.model.size_factor;
    assert_eq!(sf.len(), 3, "{sf:?}");
    assert!(close(sf[0][0], 65536.0) && close(sf[0][1], 0.4), "{sf:?}");
    assert_eq!(sf[1], [1048576.0, 1.0], "{sf:?}");
    assert!(
        close(sf[2][0], 16777216.0) && close(sf[2][1], 2.0),
        "{sf:?}"
    );
    // The interference's variable is now the size factor of the tables'
    // bytes together over one's: 0.25, 0.5, 0.75 for 2, 4, 8 tables of 1 MB
    // (made 0.3, 0.45, 0.525 slower), so its least-squares slope is
    // 0.69375 / 0.875.
    assert!(
        close(f.model.interference, 0.69375 / 0.875),
        "{}",
        f.model.interference
    );
    // The size points leave the rest of the fit as it was.
    let mut m = f.model.clone();
    m.size_factor.clear();
    m.interference = f0.model.interference;
    assert_eq!(m, f0.model);
    assert_eq!(f.zipf_ratio, f0.zipf_ratio);
    assert_eq!(f.together_ratio, f0.together_ratio);
    // Between sizes: linear in ln bytes; beyond them: the end factors.
    let at = |b: f64| f.model.size_factor_at(b);
    assert!(close(at(4194304.0), 1.5), "{}", at(4194304.0));
    assert!(close(at(262144.0), 0.7), "{}", at(262144.0));
    assert!(close(at(1.0), 0.4) && close(at(1e12), 2.0));
    assert!(f.model.check().is_ok());
    let mut bad = f.model.clone();
    bad.size_factor.swap(0, 2);
    assert!(bad.check().unwrap_err().contains("size_factor[1]"));
}

#[test]
fn the_mlp_rate_is_the_shapes_own_or_interpolated_between_shapes() {
    let mut c = costs();
    // Shape a at 1 and 2 GFLOP/s (batches 100 and 1000); shape b (92 times a's
    // flops per example) at 4 GFLOP/s.
    let (a, b) = (vec![10, 10, 1], vec![100, 100, 1]);
    let at = |l: &Vec<usize>, batch: usize, rate: f64| MlpPoint {
        layers: l.clone(),
        batch,
        seconds: mlp_flops(l, batch) / rate,
    };
    c.mlp = vec![at(&a, 100, 1e9), at(&a, 1000, 2e9), at(&b, 1000, 4e9)];
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * y;
    // A measured shape: its rate at the nearest batch (in log scale).
    assert!(close(c.mlp_rate(&a, 120), 1e9));
    assert!(close(c.mlp_rate(&a, 900), 2e9));
    assert!(close(c.mlp_rate(&b, 10), 4e9));
    // Between: linear in ln(flops per example), from a's rate at that batch.
    let (fa, fb) = (mlp_flops(&a, 1), mlp_flops(&b, 1));
    let mid = vec![1, (fa * 10.0 / 12.0) as usize, 1];
    assert!(close(mlp_flops(&mid, 1), fa * 10.0));
    let want = 2e9 + 10f64.ln() / (fb / fa).ln() * 2e9;
    let got = c.mlp_rate(&mid, 1000);
    assert!(close(got, want), "{got} {want}");
    // Beyond: the nearest shape's.
    assert!(close(c.mlp_rate(&[1, 1, 1], 1000), 2e9));
    assert!(close(c.mlp_rate(&[1000, 1000, 1], 1000), 4e9));
    // predict() prices the MLP at that rate.
    let p = c.predict(vec![0.0], &mid, 1000, 1);
    assert!(close(p.dense, mlp_flops(&mid, 1000) / want));
}

#[test]
fn files_round_trip_and_bad_fields_are_named() {
    let c = costs();
    let text = c.to_json().unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let back = parse(&v).unwrap();
    assert_eq!(back.gather, c.gather);
    assert_eq!(back.conditions, c.conditions);
    let bad = |edit: &dyn Fn(&mut Value), want: &str| {
        let mut w = v.clone();
        edit(&mut w);
        let e = parse(&w).unwrap_err();
        assert!(e.contains(want), "{want}: {e}");
    };
    bad(
        &|w| w["gather"][2]["seconds"] = (-1.0).into(),
        "gather[2].seconds",
    );
    bad(
        &|w| w["scatter"][0]["dist"] = "normal".into(),
        "scatter[0].dist",
    );
    bad(&|w| w["conditions"]["ranks"] = 0.into(), "conditions.ranks");
    bad(
        &|w| {
            w["conditions"].as_object_mut().unwrap().remove("cpu");
        },
        "conditions.cpu: missing",
    );
    bad(
        &|w| w["mlp"][0]["layers"] = serde_json::json!([3]),
        "mlp[0].layers",
    );
    bad(
        &|w| w["all_reduce"][1]["bytes"] = "x".into(),
        "all_reduce[1].bytes",
    );
    bad(
        &|w| w["fit"]["model"]["mem_bw"] = 0.into(),
        "fit.model.mem_bw",
    );
    bad(&|w| w["extra"] = 1.into(), "extra: unknown field");
    bad(&|w| w["schema"] = "v0".into(), "schema");
    bad(
        &|w| w["all_to_all"] = serde_json::json!([]),
        "all_to_all: must not be empty",
    );
}

#[test]
fn interference_raises_the_cost_of_a_rank_with_several_pieces() {
    // Without a size factor (the bytes do not count): 1 + beta (1 - 1/k).
    let mut m = CostModel::default();
    assert_eq!(m.with_interference(2.0, 3, 1e9), 2.0);
    m.interference = 0.25;
    assert_eq!(m.with_interference(2.0, 1, 1e9), 2.0);
    assert_eq!(m.with_interference(2.0, 2, 1e9), 2.25);
    assert_eq!(m.with_interference(2.0, 4, 1e9), 2.375);
    // Saturating: never above 1 + interference times the sum.
    assert!(m.with_interference(2.0, 1000, 1e9) < 2.5);
    assert!(m.with_interference(2.0, 1000, 1e9) > m.with_interference(2.0, 4, 1e9));
}

#[test]
fn with_a_size_factor_pieces_interfere_as_one_table_of_their_bytes() {
    // Per row access: 0.5 at 1 MB, 1 at 100 MB, 1.5 at 1 GB (linear in ln bytes).
    let m = CostModel {
        interference: 2.0,
        size_factor: vec![[1e6, 0.5], [1e8, 1.0], [1e9, 1.5]],
        ..CostModel::default()
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    // Ten tables of 1 MB share the caches as one of 10 MB: 0.75 / 0.5.
    assert!(
        close(m.interference_x(10, 1e7), 0.5),
        "{}",
        m.interference_x(10, 1e7)
    );
    assert!(close(
        m.with_interference(3.0, 10, 1e7),
        3.0 * (1.0 + 2.0 * 0.5)
    ));
    // Two of 100 MB: 1 + 0.5 ln 2 / ln 10 over 1.
    let x = 0.5 * 2f64.ln() / 10f64.ln();
    assert!(
        close(m.interference_x(2, 2e8), x),
        "{}",
        m.interference_x(2, 2e8)
    );
    // Tables past the largest size measured already miss alone: no more together.
    assert_eq!(m.interference_x(4, 8e9), 0.0);
    // One piece never interferes.
    assert_eq!(m.interference_x(1, 1e7), 0.0);
    assert_eq!(m.with_interference(3.0, 1, 1e7), 3.0);
}

#[test]
fn interference_fitted_to_points_that_level_off_stays_within_them() {
    // The ratios measured at 2 ranks: 1.12, 1.30, 1.26 for 2, 4, 8 tables. A
    // rank holding 43 tables (dlrm-synthetic at 2 ranks) is priced near the
    // largest measured ratio, not extrapolated along a line in k (3.1 times).
    let mut c = costs();
    c.gather.retain(|q| q.tables == 1);
    c.scatter.retain(|q| q.tables == 1);
    let g = |d: usize| 10e-9 + (4.0 * d as f64).max(64.0) / 10e9;
    for (k, r) in [(2, 1.12), (4, 1.30), (8, 1.26)] {
        c.gather.push(point(32, "uniform", k, r * g(32)));
    }
    let f = fit(&c);
    let m = &f.model;
    let at = |k: usize| m.with_interference(1.0, k, 1e9);
    assert!(at(43) <= 1.35 && at(43) >= 1.26, "{}: {f:?}", at(43));
    for (k, r) in [(2, 1.12), (4, 1.30), (8, 1.26)] {
        assert!((at(k) - r).abs() < 0.1, "{k}: {} against {r}", at(k));
    }
    let want = [[2.0, 1.12], [4.0, 1.30], [8.0, 1.26]];
    assert_eq!(f.together_ratio.len(), 3, "{f:?}");
    for (got, w) in f.together_ratio.iter().zip(want) {
        assert!(got[0] == w[0] && (got[1] - w[1]).abs() < 1e-9, "{f:?}");
    }
}

/// Pooled points whose seconds are what `m` prices at zero pooled
/// coefficients plus known ones: the fit gives the known ones back.
#[test]
fn the_pooled_fit_recovers_known_coefficients() {
    let mut c = costs();
    let m = fit(&c).model;
    let (occ, occ_w, ex) = (60e-9, 0.5e-9, 90e-9);
    let zero = CostModel {
        pooled_measured: true,
        ..m.clone()
    };
    let world = c.conditions.ranks;
    let tb = c.conditions.table_bytes;
    let mut pts = Vec::new();
    for (dim, pooling) in [(16, 1), (16, 32), (64, 1), (64, 32)] {
        for pl in POOLED_PLACEMENTS {
            pts.push(PooledPoint {
                dim,
                pooling,
                tables: world,
                rows: rows_of(tb, dim),
                batch: 256,
                placement: pl.into(),
                pieces: if pl == "table" { 1 } else { world },
                mode: "pooled".into(),
                seconds: 0.0,
            });
        }
    }
    // A table 4 times the reference size, its occurrences 1.5 times as dear.
    pts.push(PooledPoint {
        rows: rows_of(4 * tb, 64),
        ..pts[9].clone()
    });
    for (i, q) in pts.iter_mut().enumerate() {
        let (o, e) = q.per_rank_work(world);
        let mult = q.interference(&m, world);
        let sf = if i == 12 { 1.5 } else { 1.0 };
        let w = q.piece_width() as f64;
        q.seconds = q.modelled(&zero, world) + mult * (o * sf * (occ + w * occ_w) + e * ex);
    }
    c.pooled = pts;
    let f = fit(&c).model;
    assert!(f.pooled_measured);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
    assert!(close(f.pooled_occ_s, occ), "{f:?}");
    assert!(close(f.pooled_occ_float_s, occ_w), "{f:?}");
    assert!(close(f.pooled_example_s, ex), "{f:?}");
    let sizes = &f.pooled_size_factor;
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    assert!(
        close(sizes[0][1], 1.0) && close(sizes[1][1], 1.5),
        "{sizes:?}"
    );
    // The model prices every point as it was made.
    for q in &c.pooled {
        let got = q.modelled(&f, world);
        assert!((got / q.seconds - 1.0).abs() < 1e-6, "{q:?}: {got}");
    }
    // Written and read back, the fit is the same.
    let path = std::env::temp_dir().join(format!("pooled-fit-{}.json", std::process::id()));
    std::fs::write(&path, c.to_json().unwrap()).unwrap();
    let back = Costs::from_file(&path).unwrap();
    std::fs::remove_file(&path).ok();
    // (JSON numbers come back to within a unit in the last place.)
    assert_eq!(back.pooled.len(), c.pooled.len());
    for (a, b) in back.pooled.iter().zip(&c.pooled) {
        assert!((a.seconds / b.seconds - 1.0).abs() < 1e-12, "{a:?} {b:?}");
    }
    let g = &back.fit.model;
    assert!(
        close(g.pooled_occ_s, occ) && close(g.pooled_example_s, ex),
        "{g:?}"
    );
    assert!(close(g.pooled_size_factor[1][1], 1.5), "{g:?}");
    // No `rows` points: the asking side keeps the kernels' price.
    assert!(!f.ask_measured && !g.ask_measured, "{f:?}");
}

/// `rows` points whose seconds are what `m` prices with a free asking side plus
/// known per-occurrence and per-example seconds: the fit gives them back, the
/// pooled fit is not moved, and the model prices every point as made.
#[test]
fn the_rows_fit_recovers_the_asking_sides_coefficients() {
    let mut c = costs();
    let m = fit(&c).model;
    let (occ, occ_w, ex) = (40e-9, 1.5e-9, 200e-9);
    let free = CostModel {
        ask_measured: true,
        ..m.clone()
    };
    let world = c.conditions.ranks;
    let tb = c.conditions.table_bytes;
    let mut pts = Vec::new();
    for (dim, pooling) in [(16, 1), (16, 32), (64, 1), (64, 32)] {
        let mut q = PooledPoint {
            dim,
            pooling,
            tables: world,
            rows: rows_of(tb, dim),
            batch: 256,
            placement: "table".into(),
            pieces: 1,
            mode: "rows".into(),
            seconds: 0.0,
        };
        // Each rank asks for its 256 examples in every table.
        let asked = 256.0 * world as f64;
        let w = dim as f64;
        q.seconds = q.modelled(&free, world) + asked * (pooling as f64 * (occ + w * occ_w) + ex);
        pts.push(q);
    }
    let before = fit(&c).model;
    c.pooled = pts;
    let f = fit(&c).model;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
    assert!(f.ask_measured, "{f:?}");
    assert!(close(f.ask_occ_s, occ), "{f:?}");
    assert!(close(f.ask_occ_float_s, occ_w), "{f:?}");
    assert!(close(f.ask_example_s, ex), "{f:?}");
    // Only `rows` points: nothing pooled was measured.
    assert!(!f.pooled_measured && !before.pooled_measured, "{f:?}");
    for q in &c.pooled {
        let got = q.modelled(&f, world);
        assert!((got / q.seconds - 1.0).abs() < 1e-6, "{q:?}: {got}");
    }
    // A plan's `rows` asking side is the measured one: twice the pooling, twice
    // the occurrences' seconds.
    let spec = c.pooled[1].spec();
    let ctx_cost = |pooling: usize| {
        let q = PooledPoint {
            pooling,
            ..c.pooled[1].clone()
        };
        q.modelled(&f, world) - q.modelled(&free, world)
    };
    let (a, b) = (ctx_cost(8), ctx_cost(16));
    let per_occ = 256.0 * world as f64 * (occ + 16.0 * occ_w);
    assert!(close(b - a, 8.0 * per_occ), "{a} {b} {spec:?}");
}

/// `rows` points at the reference size priced by a model with known asking-side
/// coefficients, and whole `rows` tables at a quarter and 4 times the reference
/// whose owners' row accesses cost 0.5 and 1.8 times as much: the fit gives the
/// coefficients from the reference points alone and the larger table's factor
/// (the smaller one's is the asking side's to explain, and is left at 1), and a
/// plan's `rows` piece of such a table is priced at it.
#[test]
fn the_rows_size_factor_is_what_the_other_sizes_owners_measure() {
    let mut c = costs();
    let kernel = fit(&c).model;
    let world = c.conditions.ranks;
    let tb = c.conditions.table_bytes;
    let truth = CostModel {
        ask_measured: true,
        ask_occ_s: 40e-9,
        ask_occ_float_s: 1.5e-9,
        ask_example_s: 200e-9,
        ..kernel.clone()
    };
    let point = |dim, pooling, bytes| PooledPoint {
        dim,
        pooling,
        tables: world,
        rows: rows_of(bytes, dim),
        batch: 256,
        placement: "table".into(),
        pieces: 1,
        mode: "rows".into(),
        seconds: 0.0,
    };
    let mut pts: Vec<PooledPoint> = [(16, 1), (16, 32), (64, 1), (64, 32)]
        .iter()
        .map(|&(d, p)| point(d, p, tb))
        .collect();
    pts.push(point(64, 32, tb / 4));
    pts.push(point(64, 32, 4 * tb));
    for q in pts.iter_mut() {
        let f = if q.rows < rows_of(tb, q.dim) {
            0.5
        } else if q.rows > rows_of(tb, q.dim) {
            1.8
        } else {
            1.0
        };
        let at = CostModel {
            rows_size_factor: vec![[1.0, f]],
            ..truth.clone()
        };
        q.seconds = q.modelled(&at, world);
    }
    c.pooled = pts;
    let f = fit(&c).model;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
    // The asking side from the reference points only.
    assert!(close(f.ask_occ_s, 40e-9), "{f:?}");
    assert!(close(f.ask_occ_float_s, 1.5e-9), "{f:?}");
    assert!(close(f.ask_example_s, 200e-9), "{f:?}");
    let sizes = &f.rows_size_factor;
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    let want = [(tb as f64, 1.0), (4.0 * tb as f64, 1.8)];
    for (got, (b, x)) in sizes.iter().zip(want) {
        assert!((got[0] / b - 1.0).abs() < 0.01, "{sizes:?}");
        assert!(close(got[1], x), "{sizes:?}");
    }
    let without = CostModel {
        rows_size_factor: Vec::new(),
        ..f.clone()
    };
    // Every point but the small table's priced as made; that one as at the
    // reference, above what it was made at; a bigger owner factor, a dearer
    // table.
    for (i, q) in c.pooled.iter().enumerate() {
        let got = q.modelled(&f, world);
        let made = if i == 4 {
            q.modelled(&without, world)
        } else {
            q.seconds
        };
        assert!((got / made - 1.0).abs() < 1e-6, "{q:?}: {got}");
    }
    assert!(c.pooled[4].modelled(&f, world) > 1.01 * c.pooled[4].seconds);
    let big = &c.pooled[5];
    assert!(big.modelled(&f, world) > 1.05 * big.modelled(&without, world));
    // A pooled table is not priced by it.
    let pooled = PooledPoint {
        mode: "pooled".into(),
        ..big.clone()
    };
    assert_eq!(pooled.modelled(&f, world), pooled.modelled(&without, world));
    // Written and read back, the fit is the same; a bad factor is named.
    let path = std::env::temp_dir().join(format!("rows-size-{}.json", std::process::id()));
    std::fs::write(&path, c.to_json().unwrap()).unwrap();
    let back = Costs::from_file(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert!(
        close(back.fit.model.rows_size_factor[1][1], 1.8),
        "{back:?}"
    );
    let bad = CostModel {
        rows_size_factor: vec![[4.0, 1.0], [2.0, 1.0]],
        ..f.clone()
    };
    let msg = bad.check().unwrap_err();
    assert!(msg.contains("rows_size_factor"), "{msg}");
}

/// The training-step points of the interference tests, unpriced: pooled steps in
/// each placement and `rows` steps, a table a rank, at two widths and poolings;
/// then one step of each mode with 8 tables a rank (the together points).
fn step_points(world: usize, table_bytes: u64) -> Vec<PooledPoint> {
    let point = |dim, pooling, tables, placement: &str, mode: &str| PooledPoint {
        dim,
        pooling,
        tables,
        rows: rows_of(table_bytes, dim),
        batch: 256,
        placement: placement.into(),
        pieces: if placement == "table" { 1 } else { world },
        mode: mode.into(),
        seconds: 0.0,
    };
    let mut pts = Vec::new();
    for (dim, pooling) in [(16, 1), (16, 32), (64, 1), (64, 32)] {
        for pl in POOLED_PLACEMENTS {
            pts.push(point(dim, pooling, world, pl, "pooled"));
        }
        pts.push(point(dim, pooling, world, "table", "rows"));
    }
    for mode in POOLED_MODES {
        pts.push(point(64, 8, 8 * world, "table", mode));
    }
    pts
}

/// The step coefficients the interference tests price their points with.
fn step_truth(kernel: &CostModel, interference: f64, count: bool) -> CostModel {
    CostModel {
        interference,
        interference_count: count,
        pooled_measured: true,
        pooled_occ_s: 60e-9,
        pooled_occ_float_s: 0.5e-9,
        pooled_example_s: 90e-9,
        ask_measured: true,
        ask_occ_s: 40e-9,
        ask_occ_float_s: 1.5e-9,
        ask_example_s: 200e-9,
        ..kernel.clone()
    }
}

/// Pooled, `rows` and together points priced by a model with known
/// coefficients and interference: the fit, which fits the two in turn, gives
/// both back; without the together points the kernel points' interference stays.
#[test]
fn the_together_points_give_the_interference_with_the_coefficients() {
    let mut c = costs();
    let kernel = fit(&c).model;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
    // The kernel points were made with 0.6 (no size points: 1 - 1/k).
    assert!(close(kernel.interference, 0.6), "{kernel:?}");
    let truth = step_truth(&kernel, 0.25, false);
    let world = c.conditions.ranks;
    let mut pts = step_points(world, c.conditions.table_bytes);
    assert_eq!(pts.iter().filter(|q| q.together(world)).count(), 2);
    assert!(pts.iter().all(|q| q.together(world) == (q.tables > world)));
    for q in pts.iter_mut() {
        q.seconds = q.modelled(&truth, world);
    }
    c.pooled = pts;
    let f = fit(&c);
    let m = &f.model;
    assert!(close(m.interference, 0.25), "{m:?}");
    assert!(close(f.kernel_interference, 0.6), "{f:?}");
    for (got, want) in [
        (m.pooled_occ_s, truth.pooled_occ_s),
        (m.pooled_occ_float_s, truth.pooled_occ_float_s),
        (m.pooled_example_s, truth.pooled_example_s),
        (m.ask_occ_s, truth.ask_occ_s),
        (m.ask_occ_float_s, truth.ask_occ_float_s),
        (m.ask_example_s, truth.ask_example_s),
    ] {
        assert!(close(got, want), "{got} against {want}: {m:?}");
    }
    // The together points moved the interference: what it adds to 8 tables on
    // a rank (their owners' seconds; the asking side is not multiplied) is
    // 0.25 / 0.6 of what the kernel points' would add.
    let crowded = &c.pooled[c.pooled.len() - 2];
    let at = |beta: f64| {
        let b = CostModel {
            interference: beta,
            ..m.clone()
        };
        crowded.modelled(&b, world)
    };
    let r = (at(0.25) - at(0.0)) / (at(0.6) - at(0.0));
    assert!(close(r, 0.25 / 0.6), "{r}");
    assert!(
        close(at(0.25), crowded.seconds),
        "{} {}",
        at(0.25),
        crowded.seconds
    );
    // Without them: the kernel points' interference.
    c.pooled.retain(|q| !q.together(world));
    assert!(close(fit(&c).model.interference, 0.6));
}

/// Together points made with a larger interference in the `rows` mode than in the
/// `pooled` mode: the fit gives each mode's back, and prices each together
/// point at its measured seconds; with one mode's together point only, its
/// interference prices both modes.
#[test]
fn each_output_mode_gets_the_interference_of_its_together_point() {
    let mut c = costs();
    let kernel = fit(&c).model;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
    let truth = CostModel {
        interference_rows: Some(0.4),
        ..step_truth(&kernel, 0.1, false)
    };
    assert!(close(truth.rows_interference(), 0.4));
    let world = c.conditions.ranks;
    let mut pts = step_points(world, c.conditions.table_bytes);
    for q in pts.iter_mut() {
        q.seconds = q.modelled(&truth, world);
    }
    c.pooled = pts.clone();
    let m = fit(&c).model;
    assert!(close(m.interference, 0.1), "{m:?}");
    assert!(close(m.rows_interference(), 0.4), "{m:?}");
    for q in c.pooled.iter().filter(|q| q.together(world)) {
        assert!(close(q.modelled(&m, world), q.seconds), "{q:?}");
    }
    // One shared value prices the `rows` together point below what it measured.
    let shared = CostModel {
        interference_rows: None,
        ..m.clone()
    };
    let rows = c
        .pooled
        .iter()
        .find(|q| q.together(world) && q.mode == "rows")
        .unwrap();
    assert!(rows.modelled(&shared, world) < 0.99 * rows.seconds);
    // Written and read back, the fit keeps both.
    let path = std::env::temp_dir().join(format!("rows-beta-{}.json", std::process::id()));
    std::fs::write(&path, c.to_json().unwrap()).unwrap();
    let back = Costs::from_file(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert!(close(back.fit.model.rows_interference(), 0.4), "{back:?}");
    // Only the `rows` together point: its interference for both modes.
    c.pooled = pts
        .into_iter()
        .filter(|q| !(q.together(world) && q.mode == "pooled"))
        .collect();
    let only = fit(&c).model;
    assert_eq!(only.interference_rows, None, "{only:?}");
    assert!(close(only.interference, 0.4), "{only:?}");
    // A negative value in a file is refused, naming the field.
    let bad = CostModel {
        interference_rows: Some(-1.0),
        ..m
    };
    let msg = bad.check().unwrap_err();
    assert!(msg.contains("interference_rows"), "{msg}");
}

/// A slow minute of a shared machine during the together points' rounds (both
/// modes' together points and their partners 1.3 times their truth): with the
/// partners the fit keeps the interference near its truth; without them, the
/// together points alone carry the slow minute into it.
#[test]
fn a_slow_minute_moves_the_together_points_and_their_partners_not_the_interference() {
    let mut c = costs();
    let kernel = fit(&c).model;
    let truth = step_truth(&kernel, 0.25, false);
    let world = c.conditions.ranks;
    let mut pts = step_points(world, c.conditions.table_bytes);
    let together: Vec<PooledPoint> = pts.iter().filter(|q| q.together(world)).cloned().collect();
    assert_eq!(together.len(), 2);
    for t in &together {
        let a = PooledPoint::partner(t, world);
        assert!(a.is_partner_of(t, world) && !a.together(world), "{a:?}");
        assert!(!t.is_partner_of(t, world));
        pts.push(a);
    }
    for q in pts.iter_mut() {
        q.seconds = q.modelled(&truth, world);
    }
    c.pooled = pts.clone();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
    assert!(close(fit(&c).model.interference, 0.25));
    // The slow minute: the together points and their partners, 1.3 times.
    let slow =
        |q: &PooledPoint| q.together(world) || together.iter().any(|t| q.is_partner_of(t, world));
    for q in c.pooled.iter_mut().filter(|q| slow(q)) {
        q.seconds *= 1.3;
    }
    let with = fit(&c).model.interference;
    assert!((with / 0.25 - 1.0).abs() < 0.15, "{with}");
    // Without the partners: the together points' slow minute is read as
    // interference.
    c.pooled
        .retain(|q| !together.iter().any(|t| q.is_partner_of(t, world)));
    let without = fit(&c).model.interference;
    assert!(without > 2.0 * 0.25, "{without}");
}

#[test]
fn together_steps_the_size_law_cannot_see_are_priced_by_the_table_count() {
    // Size points that fall beyond the reference size (a table of 16 MB at 0.6
    // times the reference's per-id seconds): k tables of the reference size
    // together have no variable under the size law. Their steps, made with an
    // interference of 0.25 under the count law (1 - 1/k), are priced by it.
    let mut c = costs();
    for d in [16, 32, 64, 128] {
        let at = |q: &KernelPoint, bytes: u64, r: f64| KernelPoint {
            rows: rows_of(bytes, d),
            seconds: q.seconds * r,
            ..q.clone()
        };
        let g = c
            .gather
            .iter()
            .find(|q| q.dim == d && q.dist == "uniform" && q.tables == 1)
            .unwrap()
            .clone();
        let s = c
            .scatter
            .iter()
            .find(|q| q.dim == d && q.tables == 1)
            .unwrap()
            .clone();
        c.gather.push(at(&g, 1 << 16, 0.4));
        c.scatter.push(at(&s, 1 << 16, 0.4));
        c.gather.push(at(&g, 16 << 20, 0.6));
        c.scatter.push(at(&s, 16 << 20, 0.6));
    }
    let kernel = fit(&c).model;
    let world = c.conditions.ranks;
    let tb = c.conditions.table_bytes as f64;
    assert!(!kernel.size_factor.is_empty());
    assert!(!kernel.interference_count);
    assert_eq!(
        kernel.interference_x(8 * world, 8.0 * world as f64 * tb),
        0.0
    );
    let truth = step_truth(&kernel, 0.25, true);
    let mut pts = step_points(world, c.conditions.table_bytes);
    for q in pts.iter_mut() {
        q.seconds = q.modelled(&truth, world);
    }
    let crowded = pts[pts.len() - 2].clone();
    let apart = CostModel {
        interference: 0.0,
        ..truth.clone()
    };
    assert!(crowded.seconds > 1.1 * crowded.modelled(&apart, world));
    c.pooled = pts;
    let m = fit(&c).model;
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
    assert!(m.interference_count, "{m:?}");
    assert!(close(m.interference, 0.25), "{m:?}");
    assert!(close(crowded.modelled(&m, world), crowded.seconds));
    for (got, want) in [
        (m.pooled_occ_s, truth.pooled_occ_s),
        (m.ask_occ_s, truth.ask_occ_s),
        (m.ask_example_s, truth.ask_example_s),
    ] {
        assert!(close(got, want), "{got} against {want}: {m:?}");
    }
    // Together steps that cost no more than their pieces: no interference, and
    // the size law kept.
    for q in c.pooled.iter_mut() {
        q.seconds = q.modelled(&apart, world);
    }
    let m = fit(&c).model;
    assert!(!m.interference_count && m.interference == 0.0, "{m:?}");
}

#[test]
fn a_bad_pooled_point_is_refused_by_name() {
    let mut c = costs();
    c.pooled = vec![PooledPoint {
        dim: 16,
        pooling: 8,
        tables: 2,
        rows: 1000,
        batch: 64,
        placement: "column".into(),
        pieces: 2,
        mode: "pooled".into(),
        seconds: 1e-3,
    }];
    let good: Value = serde_json::from_str(&c.to_json().unwrap()).unwrap();
    assert!(parse(&good).is_ok());
    for (field, value, want) in [
        ("placement", Value::from("diagonal"), "pooled[0].placement"),
        (
            "pieces",
            Value::from(3),
            "pooled[0].pieces 3: must divide dim 16",
        ),
        ("seconds", Value::from(-1.0), "pooled[0].seconds"),
        (
            "mode",
            Value::from("both"),
            "pooled[0].mode \"both\": must be one of",
        ),
    ] {
        let mut v = good.clone();
        v["pooled"][0][field] = value;
        let err = parse(&v).unwrap_err();
        assert!(err.contains(want), "{field}: {err}");
    }
    // Points from before the `rows` points (no mode) are pooled.
    let mut no_mode = good.clone();
    no_mode["pooled"][0].as_object_mut().unwrap().remove("mode");
    assert_eq!(parse(&no_mode).unwrap().pooled[0].mode, "pooled");
    // Files from before the pooled points read as none.
    let mut old = good.clone();
    old.as_object_mut().unwrap().remove("pooled");
    assert!(parse(&old).unwrap().pooled.is_empty());
}

#[test]
fn the_width_factor_is_the_nearest_measured_widths() {
    let m = CostModel {
        width_factor: vec![[8.0, 2.0], [64.0, 3.0]],
        ..CostModel::default()
    };
    assert_eq!(m.factor(8), 2.0);
    assert_eq!(m.factor(16), 2.0);
    assert_eq!(m.factor(32), 3.0);
    assert_eq!(m.factor(128), 3.0);
    assert_eq!(CostModel::default().factor(16), 1.0);
}
