//! iALS evaluation: the blocked scorer against a brute-force reference, the seeded
//! `--eval-rows` sample (the same rows and recall bits at every rank count), `all`
//! against the reference full evaluation, a bf16 H against the same values in f32, and
//! the ranking metrics of `--k` (the same bits at every rank count, Recall@20/50 kept).

use crate::util;

use std::path::Path;
use torusrec::als::eval::{
    global_evaluate_all_ref, global_evaluate_all_ref_ranking, local_score_topk,
    local_score_topk_ref, local_score_topk_tiled, local_score_topk_with, AtK, Cand, EvalRows,
    EvalSet, Ranking, Recall, ScoreRows, Scorer, TopK, MAX_K,
};
use torusrec::als::shard::read::global_read_shards;
use torusrec::als::solve::{gramian, SolveParams};
use torusrec::bf16::{Bf16, TableElem};
use torusrec::comm::single::SingleComm;
use torusrec::comm::threads::run;
use torusrec::comm::Comm;
use torusrec::rng::{hash3, SplitMix64};

/// A value in {-1, -0.75, ..., 1}: dot products of a few of them are exact in f32 in
/// any order (so sgemm and the reference agree bit for bit) and tie often.
fn quarter(seed: u64, id: u64) -> f32 {
    (hash3(seed, 77, id) % 9) as f32 / 4.0 - 1.0
}

/// Random sorted distinct masks per row over `0..n_cols` (some rows empty, some long).
fn masks(rows: usize, n_cols: u64, seed: u64) -> (Vec<usize>, Vec<u32>) {
    let mut ip = vec![0usize];
    let mut cols = Vec::new();
    for r in 0..rows {
        let mut g = SplitMix64::for_id(seed, 78, r as u64);
        let len = match r % 4 {
            0 => 0,
            1 => 1 + g.below(3) as usize,
            _ => g.below((n_cols / 2).max(1)) as usize,
        };
        let mut m: Vec<u32> = (0..len).map(|_| g.below(n_cols) as u32).collect();
        m.sort_unstable();
        m.dedup();
        cols.extend(m);
        ip.push(cols.len());
    }
    (ip, cols)
}

fn pairs(c: &[Cand]) -> Vec<(u32, u32)> {
    c.iter().map(|c| (c.score.to_bits(), c.col)).collect()
}

/// Score a whole table split into shards at `bounds`, each shard with tiles
/// `rb x cb`, and merge every row's candidates as the owners do.
fn sharded_topk<T: TableElem>(
    rows: ScoreRows,
    h: &[T],
    d: usize,
    k: usize,
    bounds: &[usize],
    rb: usize,
    cb: usize,
) -> Vec<Cand> {
    let t = rows.num_rows();
    let parts: Vec<Vec<Cand>> = bounds
        .windows(2)
        .map(|w| local_score_topk_tiled(rows, &h[w[0] * d..w[1] * d], w[0] as u64, d, k, rb, cb))
        .collect();
    let mut out = Vec::new();
    for r in 0..t {
        let mut top = TopK::new(k);
        for p in &parts {
            for &c in &p[r * k..(r + 1) * k] {
                top.push(c);
            }
        }
        out.extend(top.into_padded());
    }
    out
}

#[test]
fn blocked_scorer_equals_brute_force() {
    for (case, &(t, n, d, k)) in [
        (23, 97, 5, 7),
        (9, 40, 3, 50),
        (64, 300, 8, 20),
        (1, 1, 2, 3),
    ]
    .iter()
    .enumerate()
    {
        let seed = case as u64;
        let x: Vec<f32> = (0..t * d).map(|i| quarter(seed, i as u64)).collect();
        let h: Vec<f32> = (0..n * d).map(|i| quarter(seed + 100, i as u64)).collect();
        let (ip, cols) = masks(t, n as u64, seed);
        let rows = ScoreRows {
            x: &x,
            mask_indptr: &ip,
            mask_cols: &cols,
        };
        let want = local_score_topk_ref(rows, &h, 0, d, k);
        assert_eq!(want.len(), t * k);
        // Ties happen: the reference breaks them by the lower column id.
        if n >= 40 {
            assert!(want
                .windows(2)
                .any(|w| w[0].score == w[1].score && w[0].col != u32::MAX));
        }
        // One shard with the default tiles.
        assert_eq!(
            pairs(&local_score_topk(rows, &h, 0, d, k)),
            pairs(&want),
            "case {case}"
        );
        // Several shards (boundaries inside tiles and inside rows' masks), small tiles
        // so that a row's visible arcs fall in several of them.
        let cut = |a: usize, b: usize| vec![0, (n * a / 7).min(n), (n * b / 7).min(n), n];
        for bounds in [vec![0, n], cut(2, 5), cut(1, 1), cut(3, 6)] {
            for (rb, cb) in [(1, 1), (3, 7), (4, 16), (256, 1024)] {
                let got = sharded_topk(rows, &h, d, k, &bounds, rb, cb);
                assert_eq!(
                    pairs(&got),
                    pairs(&want),
                    "case {case} bounds {bounds:?} tiles {rb}x{cb}"
                );
            }
        }
        // bf16 storage of the same values (exact in bf16) gives the same candidates.
        let hb: Vec<Bf16> = h.iter().map(|&v| Bf16::from_f32(v)).collect();
        assert_eq!(
            pairs(&local_score_topk_tiled(rows, &hb, 0, d, k, 3, 7)),
            pairs(&want)
        );
        assert_eq!(
            pairs(&local_score_topk_ref(rows, &hb, 0, d, k)),
            pairs(&want)
        );
    }
}

/// Brute force with fused multiply-adds: every score `fma(x[k], h[k], s)` in `k` order
/// from `+0`, visible arcs dropped, all columns sorted (score down, id up), first `k`.
fn reference_fma<T: TableElem>(
    rows: ScoreRows,
    h: &[T],
    col_lo: u64,
    d: usize,
    k: usize,
) -> Vec<Cand> {
    let n = h.len() / d;
    let mut out = Vec::new();
    for r in 0..rows.num_rows() {
        let x = &rows.x[r * d..(r + 1) * d];
        let mask = &rows.mask_cols[rows.mask_indptr[r]..rows.mask_indptr[r + 1]];
        let mut all: Vec<Cand> = (0..n)
            .map(|j| Cand {
                score: x
                    .iter()
                    .zip(&h[j * d..(j + 1) * d])
                    .fold(0f32, |s, (&a, b)| a.mul_add(b.to_f32(), s)),
                col: (col_lo + j as u64) as u32,
            })
            .filter(|c| !mask.contains(&c.col))
            .collect();
        all.sort_by(|a, b| {
            b.score
                .partial_cmp(&a.score)
                .unwrap()
                .then(a.col.cmp(&b.col))
        });
        all.truncate(k);
        all.resize(k, Cand::NONE);
        out.extend(all);
    }
    out
}

/// Both fused AVX-512 scorers give their brute-force reference's candidates bit for
/// bit (scores included: the same sums in `k` order, each step rounded, or fused) on
/// real-valued tables, where most scores are distinct, f32 and bf16, at any tile size
/// and thread count; skipped (with a note) on a CPU without AVX-512F.
#[test]
fn fused_scorers_equal_their_references_on_real_values() {
    if Scorer::auto() == Scorer::Blas {
        eprintln!("no AVX-512F: the fused scorers are not used on this CPU");
        return;
    }
    let gauss = |seed: u64, n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| {
                let mut g = SplitMix64::for_id(seed, 80, i as u64);
                (g.next_f64() as f32 - 0.5) * 0.7 + (g.next_f64() as f32 - 0.5) * 0.3
            })
            .collect()
    };
    for (case, &(t, n, d, k)) in [
        (70, 3000, 128, 50),
        (33, 1000, 8, 20),
        (5, 777, 33, 50),
        (40, 500, 1, 7),
    ]
    .iter()
    .enumerate()
    {
        let seed = 1000 + case as u64;
        let x = gauss(seed, t * d);
        let h = gauss(seed + 1, n * d);
        let (ip, cols) = masks(t, n as u64, seed);
        let rows = ScoreRows {
            x: &x,
            mask_indptr: &ip,
            mask_cols: &cols,
        };
        let hb: Vec<Bf16> = h.iter().map(|&v| Bf16::from_f32(v)).collect();
        for scorer in [Scorer::Avx512, Scorer::Avx512Fma] {
            let (want, want_b) = if scorer == Scorer::Avx512 {
                (
                    local_score_topk_ref(rows, &h, 5, d, k),
                    local_score_topk_ref(rows, &hb, 5, d, k),
                )
            } else {
                (
                    reference_fma(rows, &h, 5, d, k),
                    reference_fma(rows, &hb, 5, d, k),
                )
            };
            for (rb, cb) in [(256, 1024), (7, 13), (32, 12), (1, 100)] {
                let got = local_score_topk_with(scorer, rows, &h, 5, d, k, rb, cb);
                assert_eq!(
                    pairs(&got),
                    pairs(&want),
                    "case {case} {scorer:?} f32 {rb}x{cb}"
                );
                let got = local_score_topk_with(scorer, rows, &hb, 5, d, k, rb, cb);
                assert_eq!(
                    pairs(&got),
                    pairs(&want_b),
                    "case {case} {scorer:?} bf16 {rb}x{cb}"
                );
            }
            // One thread and several (other column segments) give the same candidates.
            for threads in [1, 3] {
                let got = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap()
                    .install(|| local_score_topk_with(scorer, rows, &h, 5, d, k, 8, 64));
                assert_eq!(
                    pairs(&got),
                    pairs(&want),
                    "case {case} {scorer:?} {threads} threads"
                );
            }
        }
        // The two round differently: for real values some scores differ in their bits.
        let a = local_score_topk_with(Scorer::Avx512, rows, &h, 5, d, k, 256, 1024);
        let b = local_score_topk_with(Scorer::Avx512Fma, rows, &h, 5, d, k, 256, 1024);
        if d > 1 {
            assert_ne!(pairs(&a), pairs(&b), "case {case}");
        }
    }
}

#[test]
fn scorer_pads_rows_with_too_few_columns() {
    let (d, n) = (2, 4);
    let x = vec![1.0, 0.0, 0.0, 1.0];
    let h: Vec<f32> = (0..n * d).map(|i| i as f32).collect();
    // Row 0 masks columns 1 and 3; row 1 masks nothing.
    let ip = vec![0, 2, 2];
    let cols = vec![1, 3];
    let rows = ScoreRows {
        x: &x,
        mask_indptr: &ip,
        mask_cols: &cols,
    };
    let got = local_score_topk_tiled(rows, &h, 0, d, 3, 1, 2);
    let want = vec![
        (4.0, 2),
        (0.0, 0),
        (f32::NEG_INFINITY, u32::MAX),
        (7.0, 3),
        (5.0, 2),
        (3.0, 1),
    ];
    let got: Vec<(f32, u32)> = got.iter().map(|c| (c.score, c.col)).collect();
    assert_eq!(got, want);
}

/// A table of `n` rows by global id (the same values at any rank count).
fn table(n: u64, d: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .flat_map(|id| {
            let mut g = SplitMix64::for_id(seed, 79, id);
            (0..d)
                .map(|_| (g.next_f64() as f32 - 0.5) * 0.6)
                .collect::<Vec<_>>()
        })
        .collect()
}

struct Run {
    recall: Recall,
    rows: Vec<u32>,
}

/// Evaluate the fixed H `h_all` on `p` simulated ranks; every rank uses the Gramian
/// of the whole table (so the fold-in does not depend on `p`).
fn evaluate<T: TableElem>(data: &Path, p: usize, which: EvalRows, h_all: &[T], d: usize) -> Run {
    let h32: Vec<f32> = h_all.iter().map(|v| v.to_f32()).collect();
    let gram = gramian(&h32, d);
    let parts = run(p, |c| {
        let s = global_read_shards(&c, data).unwrap();
        let lo = s.col_bounds[c.rank()] as usize;
        let hi = s.col_bounds[c.rank() + 1] as usize;
        let params = SolveParams {
            reg: 0.05,
            alpha0: 0.05,
            n_other: s.meta.num_cols as f64,
        };
        let set = EvalSet::global_build(&c, &s, which).unwrap();
        let r = set
            .global_evaluate(&c, &h_all[lo * d..hi * d], lo as u64, d, &gram, params)
            .unwrap();
        assert_eq!(set.num_rows() as u64, r.test_rows);
        (r, set.local_rows().to_vec())
    });
    for x in &parts {
        assert_eq!(x.0, parts[0].0, "every rank reports the same recall");
    }
    Run {
        recall: parts[0].0,
        rows: parts.iter().flat_map(|x| x.1.clone()).collect(),
    }
}

/// The reference full evaluation (`torusrec als` before `--eval-rows`) on `p` ranks.
fn reference(data: &Path, p: usize, h_all: &[f32], d: usize) -> Recall {
    let gram = gramian(h_all, d);
    let parts = run(p, |c| {
        let s = global_read_shards(&c, data).unwrap();
        let lo = s.col_bounds[c.rank()] as usize;
        let hi = s.col_bounds[c.rank() + 1] as usize;
        let params = SolveParams {
            reg: 0.05,
            alpha0: 0.05,
            n_other: s.meta.num_cols as f64,
        };
        global_evaluate_all_ref(&c, &s, &h_all[lo * d..hi * d], d, &gram, params).unwrap()
    });
    parts[0]
}

#[test]
fn sample_is_the_same_rows_and_bits_at_every_rank_count() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 900, 12000, 4);
    let d = 8;
    let s = global_read_shards(&SingleComm::new(), &data).unwrap();
    let t = s.num_test as usize;
    assert!(t > 60, "the dataset has {t} test rows");
    let h = table(s.meta.num_cols, d, 9);
    let n = 40;
    let one = evaluate(&data, 1, EvalRows::Sample(n), &h, d);
    assert_eq!(one.recall.test_rows, n);
    assert_eq!(one.rows.len(), n as usize);
    // The rows are test rows, in test order, without repeats.
    assert!(one.rows.iter().all(|r| s.test_rows.contains(r)));
    assert!(one.rows.windows(2).all(|w| {
        let pos = |r: u32| s.test_rows.iter().position(|&x| x == r).unwrap();
        pos(w[0]) < pos(w[1])
    }));
    assert!(
        one.recall.at50 > 0.0,
        "the planted graph is learnable at all"
    );
    for p in 2..=4 {
        let r = evaluate(&data, p, EvalRows::Sample(n), &h, d);
        assert_eq!(r.rows, one.rows, "P = {p} picks other rows");
        assert_eq!(r.recall.test_rows, n);
        assert_eq!(
            r.recall.at20.to_bits(),
            one.recall.at20.to_bits(),
            "P = {p}"
        );
        assert_eq!(
            r.recall.at50.to_bits(),
            one.recall.at50.to_bits(),
            "P = {p}"
        );
    }
    // Another sample size picks another set (the first rows are not simply taken).
    let fewer = evaluate(&data, 2, EvalRows::Sample(20), &h, d);
    assert_eq!(fewer.rows.len(), 20);
    assert!(fewer.rows.iter().all(|r| one.rows.contains(r)));
}

#[test]
fn all_equals_the_reference_full_evaluation() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 700, 9000, 1);
    let d = 8;
    let s = global_read_shards(&SingleComm::new(), &data).unwrap();
    let h = table(s.meta.num_cols, d, 3);
    for p in 1..=3 {
        let got = evaluate(&data, p, EvalRows::All, &h, d);
        let want = reference(&data, p, &h, d);
        assert_eq!(got.recall, want, "P = {p}");
        assert_eq!(got.recall.test_rows, s.num_test);
        assert_eq!(got.rows, s.test_rows);
    }
}

#[test]
fn more_rows_than_the_test_set_evaluates_all_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 700, 9000, 2);
    let d = 6;
    let s = global_read_shards(&SingleComm::new(), &data).unwrap();
    let h = table(s.meta.num_cols, d, 5);
    let all = evaluate(&data, 2, EvalRows::All, &h, d);
    for n in [s.num_test, s.num_test + 1, 1 << 40] {
        let r = evaluate(&data, 2, EvalRows::Sample(n), &h, d);
        assert_eq!(r.recall, all.recall, "--eval-rows {n}");
        assert_eq!(r.recall.test_rows, s.num_test);
        assert_eq!(r.rows, all.rows);
    }
}

#[test]
fn bf16_table_equals_its_values_in_f32() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 700, 9000, 3);
    let d = 8;
    let s = global_read_shards(&SingleComm::new(), &data).unwrap();
    let hb: Vec<Bf16> = table(s.meta.num_cols, d, 6)
        .into_iter()
        .map(Bf16::from_f32)
        .collect();
    let h32: Vec<f32> = hb.iter().map(|v| v.to_f32()).collect();
    for p in [1, 3] {
        let a = evaluate(&data, p, EvalRows::Sample(50), &hb, d);
        let b = evaluate(&data, p, EvalRows::Sample(50), &h32, d);
        assert_eq!(a.recall, b.recall, "P = {p}");
        assert_eq!(a.rows, b.rows);
    }
}

/// The epoch JSON lines of a metrics file.
fn epoch_records(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("epoch").is_some())
        .collect()
}

/// `als` on `data` with 2 ranks, 2 epochs, evaluating both, `--eval-rows which`.
fn als_run(data: &Path, dir: &Path, which: &str) -> (util::Output, Vec<serde_json::Value>) {
    let metrics = dir.join(format!("m-{which}.jsonl"));
    let o = util::TestCommand::new(util::Launcher::Mpirun(2))
        .arg("als")
        .arg("--data")
        .arg(data)
        .args([
            "--dim",
            "8",
            "--epochs",
            "2",
            "--eval-every",
            "1",
            "--threads",
            "1",
        ])
        .args(["--eval-rows", which, "--metrics"])
        .arg(&metrics)
        .run();
    o.expect_code(0);
    (o, epoch_records(&metrics))
}

#[test]
fn auto_rows_are_reported_kept_and_score_as_that_many_rows() {
    let dir = util::tempdir();
    // More test rows than the probe, so that auto times the probe and chooses.
    let data = util::synthetic_dataset(dir.path(), 8000, 100_000, 7);
    let s = global_read_shards(&SingleComm::new(), &data).unwrap();
    assert!(s.num_test > 256, "{} test rows", s.num_test);
    let (o, auto) = als_run(&data, dir.path(), "auto");
    assert_eq!(auto.len(), 2);
    let n = auto[0]["eval_rows"].as_u64().unwrap();
    assert!(
        (100..=s.num_test).contains(&n),
        "auto chose {n} of {} rows",
        s.num_test
    );
    // The same rows at every epoch; the choice is stated on the epoch lines and in
    // the metrics.
    assert_eq!(auto[1]["eval_rows"].as_u64(), Some(n));
    for (e, first) in [(&auto[0], true), (&auto[1], false)] {
        let a = &e["eval_auto"];
        assert_eq!(a["rows"].as_u64(), Some(n));
        assert_eq!(a["available"].as_u64(), Some(s.num_test));
        assert_eq!(a["probe_rows"].as_u64(), Some(256));
        assert_eq!(a["first"].as_bool(), Some(first));
        assert!(e["eval_flops_per_second"].as_f64().unwrap() > 0.0);
    }
    o.stdout_has(&["auto: <= 25% of epoch, from 256 rows in", "GFLOP/s)"]);
    // Its recall is that of `--eval-rows n`, bit for bit, at both epochs.
    let (_, fixed) = als_run(&data, dir.path(), &n.to_string());
    for (a, f) in auto.iter().zip(&fixed) {
        assert_eq!(f["eval_rows"].as_u64(), Some(n));
        assert!(f["eval_auto"].is_null());
        for key in ["at20", "at50"] {
            assert_eq!(
                a["recall"][key].as_f64().unwrap().to_bits(),
                f["recall"][key].as_f64().unwrap().to_bits(),
                "epoch {}: {key}",
                a["epoch"]
            );
        }
    }
}

/// `als --FLAG=V` for each bad V exits 2 naming the flag, before any epoch.
fn bad_values_are_usage_errors(flag: &str, bad: &[&str]) {
    let dir = util::tempdir();
    let data = util::synthetic_dataset(dir.path(), 300, 3000, 1);
    for v in bad {
        let o = util::TestCommand::direct()
            .arg("als")
            .arg("--data")
            .arg(&data)
            .arg(format!("--{flag}={v}"))
            .run();
        o.expect_code(2);
        o.stderr_has(&[&format!("--{flag}")]);
        assert!(!o.stdout.contains("epoch"), "{}", o.dump());
    }
}

#[test]
fn eval_rows_zero_or_garbage_is_a_usage_error() {
    bad_values_are_usage_errors("eval-rows", &["0", "many", "-5", "1.5", ""]);
}

#[test]
fn the_default_scores_a_seeded_sample_of_10000_stated_on_the_first_line() {
    let dir = util::tempdir();
    let data = util::synthetic_dataset(dir.path(), 8000, 100_000, 7);
    let s = global_read_shards(&SingleComm::new(), &data).unwrap();
    let run = |extra: &[&str], name: &str| {
        let metrics = dir.path().join(name);
        let o = util::TestCommand::new(util::Launcher::Mpirun(2))
            .arg("als")
            .arg("--data")
            .arg(&data)
            .args(["--dim", "8", "--epochs", "1", "--threads", "1"])
            .args(extra)
            .arg("--metrics")
            .arg(&metrics)
            .run();
        o.expect_code(0);
        (o, epoch_records(&metrics))
    };
    let (o, default) = run(&[], "m-default.jsonl");
    let n = s.num_test.min(10_000);
    let first = o.stdout.lines().next().unwrap_or("").to_string();
    assert!(
        first.contains(&format!(
            "eval_rows=10000 ({} of ",
            torusrec::metrics::group(n)
        )),
        "first line: {first}"
    );
    assert_eq!(default[0]["eval_rows"].as_u64(), Some(n));
    // It is `--eval-rows 10000`, bit for bit.
    let (_, fixed) = run(&["--eval-rows", "10000"], "m-fixed.jsonl");
    assert!(default[0]["recall"]["at20"].as_f64().is_some());
    assert_eq!(default[0]["recall"], fixed[0]["recall"]);
    assert_eq!(default[0]["eval_rows"], fixed[0]["eval_rows"]);
}

/// Every metric's bits at every K.
fn ranking_bits(r: &Ranking) -> Vec<[u64; 4]> {
    (1..=MAX_K)
        .map(|k| {
            let a: AtK = r.at(k).unwrap();
            [a.precision, a.map, a.ndcg, a.recall].map(f64::to_bits)
        })
        .collect()
}

/// `--eval-rows which` on `p` simulated ranks: the recall and the ranking metrics.
fn evaluate_ranking(
    data: &Path,
    p: usize,
    which: EvalRows,
    h_all: &[f32],
    d: usize,
) -> (Recall, Ranking) {
    let gram = gramian(h_all, d);
    let parts = run(p, |c| {
        let s = global_read_shards(&c, data).unwrap();
        let lo = s.col_bounds[c.rank()] as usize;
        let hi = s.col_bounds[c.rank() + 1] as usize;
        let params = SolveParams {
            reg: 0.05,
            alpha0: 0.05,
            n_other: s.meta.num_cols as f64,
        };
        let set = EvalSet::global_build(&c, &s, which).unwrap();
        let got = set
            .global_evaluate_ranking(&c, &h_all[lo * d..hi * d], lo as u64, d, &gram, params)
            .unwrap();
        let want = (which == EvalRows::All).then(|| {
            global_evaluate_all_ref_ranking(&c, &s, &h_all[lo * d..hi * d], d, &gram, params)
                .unwrap()
        });
        (got, want)
    });
    for (got, want) in &parts {
        assert_eq!(got.0, parts[0].0 .0, "every rank reports the same recall");
        assert_eq!(ranking_bits(&got.1), ranking_bits(&parts[0].0 .1));
        if let Some(w) = want {
            assert_eq!(got.0, w.0, "P = {p}: the reference's recall");
            assert_eq!(
                ranking_bits(&got.1),
                ranking_bits(&w.1),
                "P = {p}: the reference"
            );
        }
    }
    parts[0].0
}

#[test]
fn ranking_metrics_have_the_same_bits_at_every_rank_count_and_keep_recall() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 900, 12000, 4);
    let d = 8;
    let s = global_read_shards(&SingleComm::new(), &data).unwrap();
    let h = table(s.meta.num_cols, d, 9);
    for which in [EvalRows::Sample(40), EvalRows::All] {
        let (recall, one) = evaluate_ranking(&data, 1, which, &h, d);
        assert_eq!(one.rows, recall.test_rows);
        // Recall@20/50 of the metrics are the Recall's, bit for bit.
        assert_eq!(one.at(20).unwrap().recall.to_bits(), recall.at20.to_bits());
        assert_eq!(one.at(50).unwrap().recall.to_bits(), recall.at50.to_bits());
        let a = one.at(50).unwrap();
        assert!(
            a.precision > 0.0 && a.map > 0.0 && a.ndcg > 0.0,
            "{which}: {a:?}"
        );
        for k in 1..=MAX_K {
            let a = one.at(k).unwrap();
            for v in [a.precision, a.map, a.ndcg, a.recall] {
                assert!((0.0..=1.0).contains(&v), "{which} K = {k}: {a:?}");
            }
        }
        for p in 2..=3 {
            let (r, m) = evaluate_ranking(&data, p, which, &h, d);
            assert_eq!(r, recall, "{which} P = {p}");
            assert_eq!(ranking_bits(&m), ranking_bits(&one), "{which} P = {p}");
        }
    }
}

/// The final JSON record of a metrics file.
fn final_record(path: &Path) -> serde_json::Value {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v.get("final").is_some())
        .unwrap_or_else(|| panic!("no final record in {}", path.display()))
}

/// The number after `name` on rank 0's `final:` line.
fn final_word(o: &util::Output, name: &str) -> Option<f64> {
    let line = o.stdout.lines().find(|l| l.starts_with("final:"))?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let i = w.iter().position(|x| *x == name)?;
    w.get(i + 1)?.parse().ok()
}

#[test]
fn k_list_prints_and_records_the_metrics_and_default_runs_keep_their_recall() {
    let dir = util::tempdir();
    let data = util::synthetic_dataset(dir.path(), 3000, 40_000, 5);
    let als = |extra: &[&str], name: &str| {
        let metrics = dir.path().join(name);
        let o = util::TestCommand::new(util::Launcher::Mpirun(2))
            .arg("als")
            .arg("--data")
            .arg(&data)
            .args([
                "--dim",
                "8",
                "--epochs",
                "2",
                "--eval-every",
                "1",
                "--threads",
                "1",
            ])
            .args(extra)
            .arg("--metrics")
            .arg(&metrics)
            .run();
        o.expect_code(0);
        (o, epoch_records(&metrics), final_record(&metrics))
    };
    let (o_def, ep_def, fin_def) = als(&[], "m-default.jsonl");
    let (o_k, ep_k, fin_k) = als(&["--k", "10,5"], "m-k.jsonl");
    // Today's words and keys stay, with the same bits whatever --k.
    for key in [
        "recall_at_20",
        "recall_at_50",
        "loss",
        "checksum",
        "eval_rows",
    ] {
        assert!(fin_def.get(key).is_some(), "{key} in {fin_def}");
        assert_eq!(fin_def[key], fin_k[key], "{key}");
    }
    assert_eq!(o_def.final_checksum(), o_k.final_checksum());
    for (a, b) in ep_def.iter().zip(&ep_k) {
        assert_eq!(a["recall"], b["recall"], "epoch {}", a["epoch"]);
    }
    assert_eq!(ep_def.len(), 2);
    for o in [&o_def, &o_k] {
        assert!(
            o.stdout.lines().any(|l| l.starts_with("final: Recall@20 ")),
            "{}",
            o.dump()
        );
        assert!(final_word(o, "Recall@50").is_some());
    }
    // The default adds Precision, MAP and NDCG at 20 and 50; the recall keys are the
    // recall's.
    assert_eq!(fin_def["ranking_k"], serde_json::json!([20, 50]));
    assert_eq!(fin_k["ranking_k"], serde_json::json!([5, 10]));
    let check = |o: &util::Output, fin: &serde_json::Value, k: usize| {
        for (word, key) in [
            ("Recall", "recall"),
            ("Precision", "precision"),
            ("MAP", "map"),
            ("NDCG", "ndcg"),
        ] {
            let v = fin[format!("{key}_at_{k}")]
                .as_f64()
                .unwrap_or_else(|| panic!("{key}_at_{k} in {fin}"));
            assert!((0.0..=1.0).contains(&v), "{key}@{k} = {v}");
            let printed = final_word(o, &format!("{word}@{k}"))
                .unwrap_or_else(|| panic!("{word}@{k} on the final line\n{}", o.dump()));
            assert!((printed - v).abs() <= 5e-5, "{word}@{k}: {printed} vs {v}");
        }
    };
    for k in [20, 50] {
        check(&o_def, &fin_def, k);
    }
    for k in [5, 10] {
        check(&o_k, &fin_k, k);
    }
    assert!(fin_k.get("ndcg_at_20").is_none() && final_word(&o_k, "NDCG@20").is_none());
    assert!(
        fin_def["ndcg_at_50"].as_f64().unwrap() > 0.0,
        "the planted graph is learnable"
    );
}

#[test]
fn k_out_of_range_or_garbage_is_a_usage_error() {
    bad_values_are_usage_errors("k", &["0", "51", "10,100", "ten", ""]);
}
