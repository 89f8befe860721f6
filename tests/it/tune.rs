//! `torusrec tune`: the validation split (disjoint from the test rows, the test
//! protocol applied to training rows, the same at 1-3 ranks), the search (every grid
//! point scored as a fresh training of it would be, the arg-max chosen; halving within
//! its budget), and the binary end to end (the printed `als` command reproduces the
//! final training; bad options exit 2; the same split under mpirun at 1-3 ranks).

use crate::util;

use std::path::{Path, PathBuf};
use std::time::Duration;
use torusrec::als::shard::read::{global_read_shards, Shards};
use torusrec::als::train::run::{global_train_unsaved, EvalAt};
use torusrec::als::train::trainer::Trainer;
use torusrec::als::tune::{
    arg_best, global_refine, global_search, global_validation_shards, grid_points, schedule,
    total_epochs, Refiner, Strategy, ValSpec,
};
use torusrec::als::AlsConfig;
use torusrec::ckpt::signals::Preemption;
use torusrec::comm::single::SingleComm;
use torusrec::comm::threads::run;
use torusrec::data::graph::dataset::Dataset;
use util::{tempdir, TestCommand};

fn config(data: &Path) -> AlsConfig {
    AlsConfig {
        dim: 8,
        epochs: 2,
        reg: 0.05,
        unobserved_weight: 0.05,
        eval_rows: torusrec::als::eval::EvalRows::All,
        seed: 3,
        hub_chunk: 64,
        step_nnz: 2000,
        ..AlsConfig::new(data)
    }
}

/// What one rank derived: its validation rows with their visible and held-out arcs,
/// its rows' training arcs, its columns' training rows, and the split's sizes.
type RankSplit = (
    Vec<(u32, Vec<u32>, Vec<u32>)>,
    Vec<(u64, Vec<u32>)>,
    Vec<(u64, Vec<u32>)>,
    torusrec::als::tune::ValStats,
);

/// The validation shards of `data` on one rank (fraction 0.1, seed 1).
fn one_rank_validation(data: &Path) -> Shards {
    let c = SingleComm::new();
    let full = global_read_shards(&c, data).unwrap();
    let spec = ValSpec {
        fraction: 0.1,
        seed: 1,
    };
    global_validation_shards(&c, &full, spec).unwrap().0
}

fn split_at(p: usize, data: &Path, spec: ValSpec) -> Vec<RankSplit> {
    run(p, |c| {
        let full = global_read_shards(&c, data).unwrap();
        let (v, stats) = global_validation_shards(&c, &full, spec).unwrap();
        let row = |s: &torusrec::als::shard::csr::CsrShard, i: usize| {
            s.indices[s.indptr[i] as usize..s.indptr[i + 1] as usize].to_vec()
        };
        let val = (0..v.test_rows.len())
            .map(|i| (v.test_rows[i], row(&v.fold, i), row(&v.holdout, i)))
            .collect();
        let rows = (0..v.rows.num_rows())
            .map(|i| (v.rows.lo + i as u64, row(&v.rows, i)))
            .collect();
        let cols = (0..v.cols.num_rows())
            .map(|i| (v.cols.lo + i as u64, row(&v.cols, i)))
            .collect();
        (val, rows, cols, stats)
    })
}

#[test]
fn validation_rows_avoid_the_test_rows_and_are_the_same_at_1_to_3_ranks() {
    let dir = tempdir();
    let data = util::synthetic_dataset(dir.path(), 700, 9000, 1);
    let ds = Dataset::read(&data).unwrap();
    let spec = ValSpec {
        fraction: 0.2,
        seed: 7,
    };
    let nonempty: Vec<u32> = (0..ds.meta.num_rows as usize)
        .filter(|&i| !ds.train.row(i).is_empty())
        .map(|i| i as u32)
        .collect();
    let mut reference = None;
    for p in 1..=3 {
        let parts = split_at(p, &data, spec);
        let val: Vec<(u32, Vec<u32>, Vec<u32>)> = parts.iter().flat_map(|x| x.0.clone()).collect();
        let rows: Vec<(u64, Vec<u32>)> = parts.iter().flat_map(|x| x.1.clone()).collect();
        let cols: Vec<(u64, Vec<u32>)> = parts.iter().flat_map(|x| x.2.clone()).collect();
        assert!(
            parts.iter().all(|x| x.3 == parts[0].3),
            "stats differ by rank"
        );
        let stats = parts[0].3;
        assert_eq!(val.len() as u64, stats.rows);
        assert_eq!(val.len(), (nonempty.len() as f64 * 0.2).floor() as usize);
        assert!(
            val.windows(2).all(|w| w[0].0 < w[1].0),
            "validation rows out of order"
        );
        for (r, fold, hold) in &val {
            assert!(
                ds.test_rows.binary_search(r).is_err(),
                "test row {r} chosen"
            );
            let arcs = ds.train.row(*r as usize);
            assert!(!arcs.is_empty(), "row {r} has no training arc");
            assert_eq!(hold.len(), (arcs.len() / 4).max(1), "row {r}");
            let mut both: Vec<u32> = fold.iter().chain(hold).copied().collect();
            both.sort_unstable();
            assert_eq!(both, arcs, "row {r}: visible + held out != its arcs");
        }
        // Training keeps every other row whole and drops the validation rows entirely.
        assert_eq!(rows.len() as u64, ds.meta.num_rows);
        for (r, arcs) in &rows {
            let is_val = val.binary_search_by_key(&(*r as u32), |v| v.0).is_ok();
            let want: &[u32] = if is_val {
                &[]
            } else {
                ds.train.row(*r as usize)
            };
            assert_eq!(arcs.as_slice(), want, "row {r}");
        }
        // The column side is the transpose of the row side.
        let mut t: Vec<Vec<u32>> = vec![Vec::new(); ds.meta.num_cols as usize];
        for (r, arcs) in &rows {
            for &c in arcs {
                t[c as usize].push(*r as u32);
            }
        }
        assert_eq!(cols.len() as u64, ds.meta.num_cols);
        for (c, rs) in &cols {
            assert_eq!(rs, &t[*c as usize], "column {c}");
        }
        assert_eq!(
            stats.train_arcs,
            rows.iter().map(|r| r.1.len() as u64).sum::<u64>()
        );
        match &reference {
            None => reference = Some((val, stats)),
            Some((v1, s1)) => {
                assert_eq!(&val, v1, "validation split differs at {p} ranks");
                assert_eq!(&stats, s1);
            }
        }
    }
    // Another seed picks other rows.
    let other = split_at(
        1,
        &data,
        ValSpec {
            fraction: 0.2,
            seed: 8,
        },
    );
    assert_ne!(other[0].3.digest, reference.unwrap().1.digest);
}

#[test]
fn grid_scores_every_point_as_a_fresh_training_and_picks_the_arg_max() {
    let dir = tempdir();
    let data = util::synthetic_dataset(dir.path(), 600, 8000, 2);
    let cfg = config(&data);
    let spec = ValSpec {
        fraction: 0.1,
        seed: 1,
    };
    let points = grid_points(&[1e-3, 1e-1], &[1e-3, 1e-1]);
    let rungs = schedule(Strategy::Grid, points.len(), Some(8), 4, 3).unwrap();
    assert_eq!(rungs[0].epochs, 2);
    let c = SingleComm::new();
    let full = global_read_shards(&c, &data).unwrap();
    let (val, _) = global_validation_shards(&c, &full, spec).unwrap();
    let report = global_search::<_, f32>(
        &c,
        &cfg,
        val.clone(),
        &points,
        &rungs,
        Preemption::manual(),
        |_| {},
    )
    .unwrap();
    assert_eq!(report.results.len(), 4);
    assert_eq!(report.epochs_run, 8);
    let idx: Vec<usize> = report.results.iter().map(|r| r.index).collect();
    assert_eq!(idx, vec![0, 1, 2, 3]);
    // Each point scores what training it alone, from scratch, scores.
    for r in &report.results {
        let mut one = cfg.clone();
        one.reg = r.point.reg;
        one.unobserved_weight = r.point.unobserved_weight;
        let tr = Trainer::<f32>::global_from_shards(&c, &one, val.clone(), Preemption::manual())
            .unwrap();
        let (_, reports) = global_train_unsaved(&c, tr, EvalAt::Last).unwrap();
        assert_eq!(reports.len(), 2);
        let last = reports.last().unwrap();
        assert_eq!(last.recall.unwrap(), r.recall, "point {}", r.index);
        assert_eq!(last.loss, r.loss, "point {}", r.index);
    }
    let distinct: std::collections::BTreeSet<u64> = report
        .results
        .iter()
        .map(|r| r.recall.at20.to_bits())
        .collect();
    assert!(
        distinct.len() > 1,
        "every point scored the same: {report:?}"
    );
    let best = &report.results[report.best];
    for r in &report.results {
        assert!(
            (best.recall.at20, best.recall.at50) >= (r.recall.at20, r.recall.at50),
            "{best:?} is not the best: {r:?}"
        );
    }
}

#[test]
fn halving_keeps_the_best_and_stays_within_the_budget() {
    let dir = tempdir();
    let data = util::synthetic_dataset(dir.path(), 600, 8000, 3);
    let cfg = config(&data);
    let regs = [1e-4, 1e-3, 1e-2, 1e-1];
    let points = grid_points(&regs, &[1e-3, 1e-1]);
    let budget = 30;
    let rungs = schedule(Strategy::Halving, points.len(), Some(budget), 4, 2).unwrap();
    let sizes: Vec<(usize, usize)> = rungs.iter().map(|r| (r.points, r.epochs)).collect();
    assert_eq!(sizes, vec![(8, 1), (4, 2), (2, 4)]);
    let c = SingleComm::new();
    let val = one_rank_validation(&data);
    let mut seen = Vec::new();
    let report =
        global_search::<_, f32>(&c, &cfg, val, &points, &rungs, Preemption::manual(), |r| {
            seen.push(r.clone())
        })
        .unwrap();
    assert_eq!(seen, report.results);
    assert_eq!(report.epochs_run, total_epochs(&rungs));
    assert!(report.epochs_run <= budget);
    for (k, rung) in rungs.iter().enumerate() {
        let here: Vec<_> = report.results.iter().filter(|r| r.rung == k).collect();
        assert_eq!(here.len(), rung.points, "rung {k}");
        assert!(here.iter().all(|r| r.epochs == rung.epochs));
        if k > 0 {
            // The survivors are the previous rung's best `rung.points`.
            let mut prev: Vec<_> = report.results.iter().filter(|r| r.rung == k - 1).collect();
            prev.sort_by(|a, b| {
                (b.recall.at20, b.recall.at50)
                    .partial_cmp(&(a.recall.at20, a.recall.at50))
                    .unwrap()
                    .then(a.index.cmp(&b.index))
            });
            let mut want: Vec<usize> = prev[..rung.points].iter().map(|r| r.index).collect();
            want.sort_unstable();
            let got: Vec<usize> = here.iter().map(|r| r.index).collect();
            assert_eq!(got, want, "rung {k}");
        }
    }
    let best = &report.results[report.best];
    assert_eq!(best.rung, rungs.len() - 1);
}

/// A refine search on `data` at `p` ranks (threads): every rank's report.
fn refine_at(
    p: usize,
    cfg: &AlsConfig,
    regs: &[f32],
    weights: &[f32],
    trainings: usize,
) -> Vec<torusrec::als::tune::SearchReport> {
    run(p, |c| {
        let full = global_read_shards(&c, &cfg.data).unwrap();
        let spec = ValSpec {
            fraction: 0.1,
            seed: 1,
        };
        let (val, _) = global_validation_shards(&c, &full, spec).unwrap();
        global_refine::<_, f32>(
            &c,
            cfg,
            val,
            regs,
            weights,
            trainings,
            2,
            Preemption::manual(),
            |_| {},
        )
        .unwrap()
    })
}

#[test]
fn refine_trains_the_budget_inside_the_box_picks_the_arg_max_and_is_the_same_at_1_and_2_ranks() {
    let dir = tempdir();
    let data = util::synthetic_dataset(dir.path(), 600, 8000, 6);
    let cfg = config(&data);
    let (regs, weights) = ([1e-4f32, 1e-1], [1e-3f32, 1e-1]);
    let trainings = 9;
    let one = refine_at(1, &cfg, &regs, &weights, trainings).remove(0);
    let res = &one.results;
    assert_eq!(res.len(), trainings, "one training per budgeted point");
    assert_eq!(one.epochs_run, trainings * 2);
    // The centres of the grid's cells first (one cell here), in order, then compass
    // points: new, inside the box.
    let rf = Refiner::new(&regs, &weights, trainings).unwrap();
    let design = rf.design().to_vec();
    assert_eq!(design.len(), 1);
    assert!((design[0].reg / 10f32.powf(-2.5) - 1.0).abs() < 1e-5);
    assert!((design[0].unobserved_weight / 1e-2 - 1.0).abs() < 1e-5);
    let pts: Vec<_> = res.iter().map(|r| r.point).collect();
    assert_eq!(&pts[..1], design.as_slice());
    assert!(res[..1].iter().all(|r| r.rung == 0) && res[1..].iter().all(|r| r.rung == 1));
    // A poll at half the spacing from the centre reaches the grid's corners.
    let grid = grid_points(&regs, &weights);
    assert!(pts.iter().any(|p| grid.contains(p)), "{pts:?}");
    for (i, p) in pts.iter().enumerate() {
        assert!(rf.inside(*p), "{p:?} outside the box");
        assert!(!pts[..i].contains(p), "{p:?} trained twice");
        assert!((1e-4..=1e-1).contains(&p.reg) && (1e-3..=1e-1).contains(&p.unobserved_weight));
        assert_eq!(res[i].index, i);
        assert_eq!(res[i].epochs, 2);
    }
    // The best is the arg-max over every point trained.
    assert_eq!(Some(one.best), arg_best(res));
    let best = &res[one.best];
    for r in res {
        assert!((best.recall.at20, best.recall.at50) >= (r.recall.at20, r.recall.at50));
    }
    // A refinement point scores what training it alone, from scratch, scores.
    let last = &res[res.len() - 1];
    let c = SingleComm::new();
    let val = one_rank_validation(&data);
    let mut solo = cfg.clone();
    solo.reg = last.point.reg;
    solo.unobserved_weight = last.point.unobserved_weight;
    let tr = Trainer::<f32>::global_from_shards(&c, &solo, val, Preemption::manual()).unwrap();
    let (_, reports) = global_train_unsaved(&c, tr, EvalAt::Last).unwrap();
    let rep = reports.last().unwrap();
    assert_eq!(rep.recall.unwrap(), last.recall);
    // Two ranks propose and pick the same points (every rank the same).
    let two = refine_at(2, &cfg, &regs, &weights, trainings);
    for rep in &two {
        let p2: Vec<_> = rep.results.iter().map(|r| r.point).collect();
        assert_eq!(p2, pts, "the points differ at 2 ranks");
        assert_eq!(rep.best, one.best);
        for (a, b) in rep.results.iter().zip(res) {
            assert!(
                (a.recall.at20 - b.recall.at20).abs() < 1e-9,
                "{a:?} vs {b:?}"
            );
        }
    }
}

#[test]
fn bad_options_exit_2_with_a_message() {
    let dir = tempdir();
    let data = util::synthetic_dataset(dir.path(), 300, 3000, 4);
    let cases: [(&[&str], &str); 11] = [
        (&["--reg", ""], "empty"),
        (&["--eta", "2"], "--eta is for --strategy halving"),
        (
            &["--strategy", "grid", "--eta", "2"],
            "--eta is for --strategy halving",
        ),
        (
            &["--reg", "1e-3", "--unobserved-weight", "1e-2"],
            "needs at least two values",
        ),
        (
            &["--reg", "0,1e-3", "--unobserved-weight", "1e-2"],
            "must be > 0",
        ),
        (&["--reg=-0.1"], ">= 0"),
        (&["--unobserved-weight", "1e-3:1e-2:0"], "empty grid"),
        (&["--budget", "3"], "--budget 3"),
        (&["--val-fraction", "0"], "--val-fraction 0"),
        (&["--val-fraction", "1.5"], "--val-fraction 1.5"),
        (&["--eval-rows", "auto"], "--eval-rows auto"),
    ];
    for (extra, needle) in cases {
        let o = TestCommand::direct()
            .arg("tune")
            .arg("--data")
            .arg(&data)
            .args(["--dim", "4", "--epochs", "2", "--threads", "1"])
            .args(extra)
            .timeout(Duration::from_secs(60))
            .run();
        o.expect_code(2).stderr_has(&[needle]);
    }
}

fn prepare_cnr(dir: &Path) -> PathBuf {
    let out = dir.join("cnr-k50.h5");
    util::prepare_cnr2000(TestCommand::direct(), 50, &out)
        .run()
        .expect_code(0);
    out
}

fn tune(np: usize, data: &Path, extra: &[&str]) -> util::Output {
    let o = TestCommand::mpirun(np)
        .arg("tune")
        .arg("--data")
        .arg(data)
        .args(["--dim", "8", "--epochs", "2", "--threads", "1"])
        .args(["--reg", "1e-3,1e-1", "--unobserved-weight", "1e-2"])
        .args(["--eval-rows", "all"])
        .args(extra)
        .timeout(Duration::from_secs(300))
        .run();
    o.expect_code(0);
    o
}

/// The points of the search's `point` lines, in their order: the point (`reg .. weight
/// .. epochs ..`) and its validation Recall@20.
fn scored_points(o: &util::Output) -> Vec<(String, f64)> {
    o.stdout
        .lines()
        .filter(|l| l.starts_with("point "))
        .map(|l| {
            let (head, tail) = l.split_once("val R@20 ").unwrap_or_else(|| panic!("`{l}`"));
            let point = head.split_once("reg ").map_or(head, |(_, p)| p);
            let point = point.split_whitespace().collect::<Vec<_>>().join(" ");
            let recall = tail.split_whitespace().next().and_then(|r| r.parse().ok());
            (point, recall.unwrap_or_else(|| panic!("`{l}`")))
        })
        .collect()
}

fn line_with<'a>(o: &'a util::Output, prefix: &str) -> &'a str {
    o.stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line\n{}", o.dump()))
}

#[test]
fn mpirun_split_is_the_same_at_1_to_3_ranks_and_the_printed_command_reproduces_the_final_run() {
    let dir = tempdir();
    let data = prepare_cnr(dir.path());
    let json = dir.path().join("tune.json");
    let o1 = TestCommand::mpirun(1)
        .arg("tune")
        .arg("--data")
        .arg(&data)
        .args(["--dim", "8", "--epochs", "2", "--threads", "1"])
        .args(["--reg", "1e-3,1e-1", "--unobserved-weight", "1e-2"])
        .args(["--eval-rows", "all", "--train-final", "--final-epochs", "3"])
        .arg("--out-json")
        .arg(&json)
        .timeout(Duration::from_secs(300))
        .run();
    o1.expect_code(0);
    let split = line_with(&o1, "validation:").to_string();
    let points1 = scored_points(&o1);
    assert_eq!(points1.len(), 3, "{}", o1.dump());
    for np in [2, 3] {
        let o = tune(np, &data, &[]);
        assert_eq!(line_with(&o, "validation:"), split, "at {np} ranks");
        // The search visits the same points and scores them alike. Not bit for bit:
        // another rank count adds the Gramian's block sums in another order, which can
        // move a validation row across a top-20 boundary (one row at reg 1e-3 and P = 2
        // with OpenBLAS's SkylakeX kernels), so the choice between two points whose
        // recall ties within that may differ.
        let points = scored_points(&o);
        assert_eq!(points.len(), points1.len(), "at {np} ranks\n{}", o.dump());
        for ((p, r), (p1, r1)) in points.iter().zip(&points1) {
            assert_eq!(p, p1, "at {np} ranks");
            assert!(
                (r - r1).abs() <= 0.005,
                "{p}: Recall@20 {r} at {np} ranks, {r1} at 1"
            );
        }
    }
    // The printed command, run as is, trains what --train-final trained.
    let cmd = line_with(&o1, "train it with: ")
        .trim_start_matches("train it with: ")
        .to_string();
    let words: Vec<&str> = cmd.split_whitespace().collect();
    assert_eq!(&words[..2], &["torusrec", "als"], "{cmd}");
    assert!(cmd.contains("--epochs 3"), "{cmd}");
    let als = TestCommand::direct()
        .args(&words[1..])
        .timeout(Duration::from_secs(300))
        .run();
    als.expect_code(0);
    assert_eq!(als.final_checksum(), o1.final_checksum());
    let loss = |o: &util::Output, prefix: &str| {
        line_with(o, prefix)
            .split("loss ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap()
            .to_string()
    };
    assert_eq!(loss(&als, "final:"), loss(&o1, "final: test"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["command"].as_str().unwrap(), cmd);
    // refine (the default): the one centre of the grid's cell (reg 1e-2), then two
    // compass points (three times the design).
    assert_eq!(v["results"].as_array().unwrap().len(), 3);
    assert_eq!(
        v["final"]["checksum"].as_str().unwrap(),
        als.final_checksum()
    );
}

#[test]
fn every_point_of_the_table_is_printed_and_the_best_is_marked() {
    let dir = tempdir();
    let data = util::synthetic_dataset(dir.path(), 400, 5000, 5);
    let o = TestCommand::direct()
        .arg("tune")
        .arg("--data")
        .arg(&data)
        .args(["--dim", "4", "--epochs", "2", "--threads", "1"])
        .args(["--reg", "1e-3:1e-1:3", "--unobserved-weight", "1e-3,1e-1"])
        .args(["--strategy", "grid"])
        .timeout(Duration::from_secs(120))
        .run();
    o.expect_code(0);
    o.occurs("| best |", 1);
    let rows = o
        .stdout
        .lines()
        .filter(|l| l.starts_with("| best |") || l.starts_with("|  |"))
        .count();
    assert_eq!(rows, 6, "{}", o.dump());
    let points = o.stdout.lines().filter(|l| l.starts_with("point ")).count();
    assert_eq!(points, 6, "{}", o.dump());
}

#[test]
fn a_preempted_tune_exits_1_on_every_rank_and_saves_nothing() {
    let dir = tempdir();
    let data = prepare_cnr(dir.path());
    let codes = dir.path().join("codes");
    std::fs::create_dir_all(&codes).unwrap();
    let json = dir.path().join("tune.json");
    let o = TestCommand::mpirun(2)
        .arg("tune")
        .arg("--data")
        .arg(&data)
        .args(["--dim", "8", "--epochs", "2", "--threads", "1"])
        .args(["--reg", "1e-3,1e-1", "--unobserved-weight", "1e-2"])
        .arg("--out-json")
        .arg(&json)
        .env("TORUSREC_PREEMPT_AT", "1")
        .record_rank_codes(&codes)
        .timeout(Duration::from_secs(300))
        .run();
    o.expect_code(0); // the rank-recording wrapper exits 0
    let got = util::rank_codes(&codes, 2);
    // 75 would ask Slurm to requeue a run that saved nothing.
    assert!(got.iter().all(|c| *c == Some(1)), "{got:?}\n{}", o.dump());
    o.stderr_has(&["interrupted", "a tune saves nothing", "a rerun starts over"]);
    assert!(!o.stdout.contains("best:"), "{}", o.dump());
    assert!(!json.exists(), "a preempted tune wrote its JSON");
}

/// `--out-json` reaches its name whole or not at all (`torusrec::io::outfile`): a crash
/// after the new JSON is written but before it is renamed into place
/// (`TORUSREC_FAULT=before-rename`) leaves the old file as it was (the file was
/// written in place before, so a crash could leave half of it).
#[test]
fn a_crash_while_writing_out_json_keeps_the_old_file() {
    let dir = tempdir();
    let data = prepare_cnr(dir.path());
    let json = dir.path().join("tune.json");
    std::fs::write(&json, "{\"old\": true}\n").unwrap();
    let o = TestCommand::mpirun(1)
        .arg("tune")
        .arg("--data")
        .arg(&data)
        .args(["--dim", "8", "--epochs", "2", "--threads", "1"])
        .args(["--reg", "1e-3,1e-1", "--unobserved-weight", "1e-2"])
        .args(["--force", "--out-json"])
        .arg(&json)
        .env("TORUSREC_FAULT", "before-rename")
        .timeout(Duration::from_secs(300))
        .run();
    assert_ne!(o.code, 0, "{}", o.dump());
    o.stderr_has(&["aborting at before-rename"]);
    assert_eq!(
        std::fs::read_to_string(&json).unwrap(),
        "{\"old\": true}\n",
        "{}",
        o.dump()
    );
    // What was to replace it is complete under the temporary name.
    let partial = torusrec::io::outfile::temp_path(&json);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&partial).unwrap()).unwrap();
    assert!(v.get("best").is_some() || v.get("points").is_some(), "{v}");
}
