//! iALS collective logic under the thread communicator: distributed equals
//! single-process, dedup equals all-gather with fewer bytes, monotone loss with the
//! exact solver, learning beyond popularity, and bad configurations.

use crate::util;

use std::path::Path;
use torusrec::als::train::report::TrainReport;
use torusrec::als::train::run::global_train;
use torusrec::als::{AlsConfig, BasisKind, ExchangeKind, SolverKind};
use torusrec::ckpt::signals::Preemption;
use torusrec::comm::threads::run;
use torusrec::comm::Comm;
use torusrec::data::graph::dataset::Dataset;
use util::max_rel_diff;

fn config(data: &Path) -> AlsConfig {
    AlsConfig {
        dim: 8,
        epochs: 3,
        reg: 0.05,
        unobserved_weight: 0.05,
        solver: SolverKind::Cholesky,
        eval_rows: torusrec::als::eval::EvalRows::All,
        seed: 3,
        hub_chunk: 64,
        step_nnz: 2000,
        ..AlsConfig::new(data)
    }
}

/// Train on `p` simulated ranks; returns the global W, H (by global id), the report
/// and the exchange bytes of the run.
fn train(p: usize, cfg: &AlsConfig) -> (Vec<f32>, Vec<f32>, TrainReport, u64) {
    let parts = run(p, |c| {
        let (tr, rep) = global_train(&c, cfg, Preemption::manual(), |_| {}).unwrap();
        let bytes = c.stats().get("exchange").bytes_sent;
        (tr.w.clone(), tr.h.clone(), rep, bytes)
    });
    let w = parts.iter().flat_map(|x| x.0.clone()).collect();
    let h = parts.iter().flat_map(|x| x.1.clone()).collect();
    let bytes = parts.iter().map(|x| x.3).sum();
    (w, h, parts[0].2.clone(), bytes)
}

#[test]
fn distributed_equals_single_process_with_cholesky() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 700, 9000, 1);
    let cfg = config(&data);
    let (w1, h1, r1, _) = train(1, &cfg);
    for p in 2..=4 {
        let (w, h, r, _) = train(p, &cfg);
        assert!(
            max_rel_diff(&w1, &w) < 1e-5,
            "W at P={p}: {}",
            max_rel_diff(&w1, &w)
        );
        assert!(
            max_rel_diff(&h1, &h) < 1e-5,
            "H at P={p}: {}",
            max_rel_diff(&h1, &h)
        );
        assert!(
            (r1.loss - r.loss).abs() <= 1e-6 * r1.loss.abs(),
            "loss {} vs {}",
            r1.loss,
            r.loss
        );
        let (a, b) = (r1.recall.unwrap(), r.recall.unwrap());
        assert!((a.at20 - b.at20).abs() < 1e-3, "recall {a:?} vs {b:?}");
    }
}

#[test]
fn distributed_cg_is_bitwise_reproducible_and_close_to_single() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 600, 8000, 2);
    let mut cfg = config(&data);
    cfg.solver = SolverKind::Cg;
    let (w1, h1, _, _) = train(1, &cfg);
    let (wa, ha, _, _) = train(3, &cfg);
    let (wb, hb, _, _) = train(3, &cfg);
    assert_eq!(wa, wb, "same P, same bits");
    assert_eq!(ha, hb);
    assert!(max_rel_diff(&w1, &wa) < 1e-3);
    assert!(max_rel_diff(&h1, &ha) < 1e-3);
}

#[test]
fn dedup_and_allgather_give_the_same_tables_and_dedup_moves_less() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 800, 12000, 3);
    let mut cfg = config(&data);
    cfg.solver = SolverKind::Cg;
    cfg.epochs = 2;
    for p in [2, 4] {
        let (wd, hd, _, bytes_dedup) = train(p, &cfg);
        cfg.exchange = ExchangeKind::Allgather;
        let (wa, ha, _, bytes_all) = train(p, &cfg);
        cfg.exchange = ExchangeKind::Dedup;
        assert_eq!(wd, wa, "P={p}: W differs between exchanges");
        assert_eq!(hd, ha, "P={p}: H differs between exchanges");
        assert!(
            bytes_dedup < bytes_all,
            "P={p}: dedup {bytes_dedup} B, allgather {bytes_all} B"
        );
    }
}

#[test]
fn loss_never_increases_with_the_exact_solver() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 500, 7000, 4);
    let mut cfg = config(&data);
    cfg.epochs = 6;
    cfg.loss_every_half = true;
    let (_, _, rep, _) = train(2, &cfg);
    let mut seq = Vec::new();
    for e in &rep.epochs {
        seq.push(e.loss_rows.expect("--loss-every-half"));
        seq.push(e.loss);
    }
    for w in seq.windows(2) {
        assert!(w[1] <= w[0] * (1.0 + 1e-9), "loss went up: {seq:?}");
    }
    assert!(seq[seq.len() - 1] < seq[0]);
}

/// Recall@20 of ranking columns by training popularity, computed like docs/design.md's.
fn popularity_recall(ds: &Dataset, k: usize) -> f64 {
    let n = ds.meta.num_cols as usize;
    let mut pop: Vec<(u64, u32)> = (0..n)
        .map(|c| (ds.train_t.indptr[c + 1] - ds.train_t.indptr[c], c as u32))
        .collect();
    pop.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut total = 0.0;
    for i in 0..ds.test_rows.len() {
        let fold = ds.fold.row(i);
        let hold = ds.holdout.row(i);
        let top: Vec<u32> = pop
            .iter()
            .map(|x| x.1)
            .filter(|c| fold.binary_search(c).is_err())
            .take(k)
            .collect();
        let hits = top.iter().filter(|c| hold.binary_search(c).is_ok()).count();
        total += hits as f64 / k.min(hold.len()) as f64;
    }
    total / ds.test_rows.len() as f64
}

#[test]
fn recall_beats_popularity_on_a_planted_web_graph() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 3000, 60000, 5);
    let ds = Dataset::read(&data).unwrap();
    let baseline = popularity_recall(&ds, 20);
    let mut cfg = config(&data);
    cfg.dim = 32;
    cfg.epochs = 6;
    cfg.solver = SolverKind::Cg;
    let (_, _, rep, _) = train(2, &cfg);
    let r = rep.recall.unwrap();
    assert_eq!(r.test_rows, ds.test_rows.len() as u64);
    assert!(
        r.at20 > 1.5 * baseline && r.at20 > baseline + 0.05,
        "Recall@20 {} vs popularity {baseline}",
        r.at20
    );
}

#[test]
fn bad_configs_fail_on_every_rank_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 300, 3000, 6);
    let mut cfg = config(&data);
    cfg.dim = 0;
    for r in run(3, |c| {
        global_train(&c, &cfg, Preemption::manual(), |_| {}).map(|_| ())
    }) {
        let e = r.unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
    }
    // A file that is HDF5 but not a dataset.
    let bogus = dir.path().join("bogus.h5");
    torusrec::io::h5::create(&bogus)
        .unwrap()
        .new_attr::<u64>()
        .create("version")
        .unwrap()
        .write_scalar(&1u64)
        .unwrap();
    let cfg = config(&bogus);
    let out = run(2, |c| {
        global_train(&c, &cfg, Preemption::manual(), |_| {}).map(|_| ())
    });
    let first = out[0].as_ref().unwrap_err();
    assert_eq!(first.exit_code(), 2);
    assert!(
        first.to_string().contains("bogus.h5") && first.to_string().contains("format"),
        "{first}"
    );
    assert_eq!(out[1].as_ref().unwrap_err().exit_code(), 2);
}

#[test]
fn the_eigenbasis_trains_the_model_of_the_fixed_basis() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 700, 9000, 4);
    let mut cfg = config(&data);
    cfg.solver = SolverKind::Cg;
    cfg.dim = 16;
    cfg.epochs = 4;
    cfg.basis = BasisKind::Fixed;
    let (wf, hf, rf, _) = train(1, &cfg);
    cfg.basis = BasisKind::Eigen;
    for p in [1, 3] {
        let (we, he, re, _) = train(p, &cfg);
        // The same model in the starting basis (the eigenbasis is undone at the end),
        // up to f32 rounding carried through four epochs of CG.
        let (dw, dh) = (max_rel_diff(&wf, &we), max_rel_diff(&hf, &he));
        assert!(dw < 1e-3 && dh < 1e-3, "P={p}: W {dw:.2e}, H {dh:.2e}");
        assert!(
            (rf.loss - re.loss).abs() <= 1e-5 * rf.loss.abs(),
            "P={p}: loss {} vs {}",
            rf.loss,
            re.loss
        );
        let (a, b) = (rf.recall.unwrap(), re.recall.unwrap());
        assert!(
            (a.at20 - b.at20).abs() < 2e-3,
            "P={p}: recall {a:?} vs {b:?}"
        );
    }
    // Reproducible bit for bit at a given rank count, and not the fixed basis's bits
    // (so the rotation did run).
    let (wa, ha, _, _) = train(3, &cfg);
    let (wb, hb, _, _) = train(3, &cfg);
    assert_eq!((&wa, &ha), (&wb, &hb), "same P, same bits");
    cfg.basis = BasisKind::Fixed;
    let (w3, _, _, _) = train(3, &cfg);
    assert_ne!(wa, w3, "--basis eigen gave the fixed basis's bits");
}

#[test]
fn the_eigenbasis_is_refused_where_it_does_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 300, 3000, 6);
    let mut cfg = config(&data);
    cfg.basis = BasisKind::Eigen;
    cfg.solver = SolverKind::Cholesky;
    let e = run(1, |c| {
        global_train(&c, &cfg, Preemption::manual(), |_| {}).map(|_| ())
    })
    .remove(0)
    .unwrap_err();
    assert_eq!(e.exit_code(), 2, "{e}");
    assert!(e.to_string().contains("--basis eigen"), "{e}");
    cfg.solver = SolverKind::Cg;
    cfg.table_dtype = torusrec::bf16::TableDtype::Bf16;
    let e = cfg.validate().unwrap_err();
    assert!(e.to_string().contains("--table-dtype bf16"), "{e}");
    // `auto` picks the eigenbasis only for CG with f32 tables and 2+ steps.
    cfg.basis = BasisKind::Auto;
    assert!(!cfg.eigenbasis());
    cfg.table_dtype = torusrec::bf16::TableDtype::F32;
    assert!(cfg.eigenbasis());
    cfg.cg_steps = 1;
    assert!(!cfg.eigenbasis());
}

#[test]
fn a_resume_with_fewer_epochs_leaves_the_tables_in_the_starting_basis() {
    let dir = tempfile::tempdir().unwrap();
    let data = util::synthetic_dataset(dir.path(), 500, 6000, 7);
    let mut cfg = config(&data);
    cfg.solver = SolverKind::Cg;
    cfg.dim = 16;
    cfg.epochs = 1;
    let (w1, h1, _, _) = train(1, &cfg);
    // Three epochs with a checkpoint after each: the one after epoch 1 holds rotated
    // tables (the run goes on), the rotation and no diagonal.
    let ckpt = dir.path().join("ckpt");
    cfg.epochs = 3;
    cfg.checkpoint.dir = Some(ckpt.clone());
    cfg.checkpoint.every = 2;
    cfg.checkpoint.keep = 10;
    train(1, &cfg);
    let after_one = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.extension().is_some_and(|x| x == "h5")
                && torusrec::als::checkpoint::local_read_manifest(p)
                    .is_ok_and(|m| m.position.epoch == 1 && m.position.half == 0)
        })
        .expect("a checkpoint after epoch 1");
    let m = torusrec::als::checkpoint::local_read_manifest(&after_one).unwrap();
    assert_eq!(m.basis.rotation.len(), 16 * 16, "the checkpoint's rotation");
    // Resumed from it with --epochs 1: no epoch runs, and the model written is the
    // one-epoch run's, bit for bit (the same rotation back). Into a directory of its
    // own: the first one holds checkpoints past this one (refused, see `ckpt::als`).
    cfg.epochs = 1;
    cfg.checkpoint.resume = torusrec::als::Resume::Path(after_one);
    cfg.checkpoint.dir = Some(dir.path().join("ckpt-branch"));
    let (w, h, _, _) = train(1, &cfg);
    assert_eq!((&w, &h), (&w1, &h1));
}
