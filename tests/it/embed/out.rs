//! `torusrec embed --out`: the model file holds every table's full rows by global id,
//! its optimizer state and the MLP, equal to the run's last checkpoint bitwise and,
//! whatever the rank count and placement, the same model (bitwise before training,
//! where every value comes from the seed and the global id; within the tolerance of
//! `embed::threads` after it). An existing file is refused without --force
//! (exit 2, untouched, before training) and replaced with it; an unwritable output
//! exits 2 before training; a preempted run writes none, its resumed run writes it.

use crate::util;

use std::path::Path;
use util::{max_rel_diff, serial, tempdir, tiny_embed, Output, TestCommand};

fn embed(np: usize, steps: &str, extra: &[&str]) -> Output {
    tiny_embed(np, steps, "6").args(extra).run()
}

/// The datasets of a model or checkpoint file: per table rows and (if any) state,
/// then the MLP's parameters and optimizer state.
#[derive(Debug, PartialEq)]
struct Model {
    rows: Vec<Vec<f32>>,
    state: Vec<Option<Vec<f32>>>,
    mlp: Vec<f32>,
    mlp_state: Vec<f32>,
}

fn read_model(path: &Path) -> Model {
    let f = torusrec::io::h5::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let n = f.group("tables").unwrap().member_names().unwrap().len();
    assert!(n > 0, "{}: no tables", path.display());
    let mut m = Model {
        rows: Vec::new(),
        state: Vec::new(),
        mlp: f.dataset("mlp/params").unwrap().read_raw().unwrap(),
        mlp_state: f.dataset("mlp/state").unwrap().read_raw().unwrap(),
    };
    for t in 0..n {
        let ds = f.dataset(&format!("tables/{t}/rows")).unwrap();
        assert_eq!(ds.shape().len(), 2);
        m.rows.push(ds.read_raw().unwrap());
        m.state.push(
            f.dataset(&format!("tables/{t}/state"))
                .ok()
                .map(|d| d.read_raw().unwrap()),
        );
    }
    m
}

fn str_attr(path: &Path, name: &str) -> String {
    let f = torusrec::io::h5::open(path).unwrap();
    f.attr(name)
        .and_then(|a| a.read_scalar::<hdf5::types::VarLenUnicode>())
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|e| panic!("{}: attribute {name}: {e}", path.display()))
}

fn u64_attr(path: &Path, name: &str) -> u64 {
    let f = torusrec::io::h5::open(path).unwrap();
    f.attr(name)
        .and_then(|a| a.read_scalar::<u64>())
        .unwrap_or_else(|e| panic!("{}: attribute {name}: {e}", path.display()))
}

fn has_attr(path: &Path, name: &str) -> bool {
    torusrec::io::h5::open(path).unwrap().attr(name).is_ok()
}

#[test]
fn the_model_equals_the_checkpoint_and_does_not_depend_on_the_placement() {
    let _serial = serial();
    let dir = tempdir();
    let mut models = Vec::new();
    for (np, plan) in [(1, "table"), (2, "column"), (3, "row_cyclic"), (3, "auto")] {
        let ck = dir.path().join(format!("ck-{np}-{plan}"));
        let out = dir.path().join(format!("m-{np}-{plan}.h5"));
        let o = embed(
            np,
            "12",
            &[
                "--plan",
                plan,
                "--checkpoint-dir",
                ck.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
        );
        o.expect_code(0)
            .stdout_has(&["final: eval AUC", "wrote the model"]);
        let what = format!("P={np} --plan {plan}");
        // The attributes: what the run printed and what its checkpoint records.
        assert_eq!(str_attr(&out, "format"), "torusrec-embed-model", "{what}");
        assert_eq!(u64_attr(&out, "version"), 1, "{what}");
        assert_eq!(u64_attr(&out, "step"), 12, "{what}");
        assert_eq!(str_attr(&out, "checksum"), o.final_checksum(), "{what}");
        assert!(has_attr(&out, "auc") && has_attr(&out, "logloss"), "{what}");
        let (_, ckpt) = torusrec::ckpt::list(&ck).unwrap().pop().unwrap();
        let manifest = torusrec::embed::io::checkpoint::local_read_manifest(&ckpt).unwrap();
        assert_eq!(manifest.step, 12);
        assert_eq!(
            str_attr(&out, "config_hash"),
            manifest.config_hash,
            "{what}"
        );
        assert_eq!(str_attr(&out, "checksum"), manifest.checksum, "{what}");
        // The tables, their state and the MLP: the checkpoint's bits.
        let m = read_model(&out);
        assert_eq!(
            m,
            read_model(&ckpt),
            "{what}: the model differs from the checkpoint"
        );
        assert!(
            m.state.iter().all(|s| s.is_some()),
            "row-wise Adagrad keeps state"
        );
        assert!(m.rows.iter().flatten().all(|v| v.is_finite()), "{what}");
        models.push((what, m));
    }
    // Placements and rank counts sum in other orders: close, as in `embed::threads`.
    let (_, reference) = &models[0];
    for (what, m) in &models[1..] {
        for t in 0..reference.rows.len() {
            let d = max_rel_diff(&reference.rows[t], &m.rows[t]);
            assert!(d < 2e-5, "{what}: table {t} differs by {d:e}");
            let (a, b) = (reference.state[t].as_ref(), m.state[t].as_ref());
            let d = max_rel_diff(a.unwrap(), b.unwrap());
            assert!(d < 2e-5, "{what}: state of table {t} differs by {d:e}");
        }
        let d = max_rel_diff(&reference.mlp, &m.mlp);
        assert!(d < 2e-5, "{what}: MLP differs by {d:e}");
    }
}

#[test]
fn untrained_models_are_the_same_bits_at_every_placement() {
    let _serial = serial();
    let dir = tempdir();
    let mut models = Vec::new();
    for (np, plan) in [
        (1, "table"),
        (2, "column"),
        (2, "data_parallel"),
        (3, "row_block"),
        (3, "row_cyclic"),
    ] {
        let out = dir.path().join(format!("m-{np}-{plan}.h5"));
        embed(
            np,
            "0",
            &[
                "--plan",
                plan,
                "--table-opt",
                "sgd",
                "--out",
                out.to_str().unwrap(),
            ],
        )
        .expect_code(0);
        assert_eq!(u64_attr(&out, "step"), 0);
        let m = read_model(&out);
        assert!(
            m.state.iter().all(|s| s.is_none()),
            "SGD keeps no row state"
        );
        models.push((
            format!("P={np} --plan {plan}"),
            m,
            str_attr(&out, "checksum"),
        ));
    }
    let (_, reference, sum) = &models[0];
    // Every table holds distinct, non-zero values: each row really was written.
    for (t, rows) in reference.rows.iter().enumerate() {
        assert!(
            rows.iter().all(|&v| v != 0.0),
            "table {t} has unwritten rows"
        );
    }
    for (what, m, s) in &models[1..] {
        assert_eq!(m, reference, "{what}: the initial model differs");
        assert_eq!(s, sum, "{what}: checksum");
    }
}

#[test]
fn an_existing_model_is_refused_without_force_and_replaced_with_it() {
    let _serial = serial();
    let dir = tempdir();
    let out = dir.path().join("model.h5");
    std::fs::write(&out, b"an earlier model").unwrap();
    let o = embed(2, "4", &["--out", out.to_str().unwrap()]);
    o.expect_code(2)
        .occurs("model.h5: output exists (pass --force to overwrite)", 1);
    assert!(
        !o.stdout.contains("step "),
        "trained before refusing\n{}",
        o.dump()
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"an earlier model");

    embed(2, "4", &["--out", out.to_str().unwrap(), "--force"])
        .expect_code(0)
        .stdout_has(&["wrote the model"]);
    assert_eq!(str_attr(&out, "format"), "torusrec-embed-model");
    assert_eq!(u64_attr(&out, "step"), 4);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["model.h5"], "a temporary was left behind");
}

#[test]
fn an_unwritable_output_exits_2_before_training() {
    let _serial = serial();
    let dir = tempdir();
    let missing = dir.path().join("no-such-dir").join("model.h5");
    let is_dir = dir.path().join("a-dir");
    std::fs::create_dir(&is_dir).unwrap();
    let mut bad = vec![(missing, "does not exist"), (is_dir, "is a directory")];
    // A read-only file system (root may write anywhere else).
    if Path::new("/proc/self").exists() {
        bad.push((
            Path::new("/proc/torusrec-model.h5").to_path_buf(),
            "cannot write",
        ));
    }
    for (out, why) in bad {
        let o = embed(3, "4", &["--out", out.to_str().unwrap(), "--force"]);
        o.expect_code(2).occurs(why, 1);
        assert!(
            !o.stdout.contains("step ") && !o.stdout.contains("embed: "),
            "started before refusing\n{}",
            o.dump()
        );
    }
}

#[test]
fn a_preempted_run_writes_no_model_and_its_resumed_run_does() {
    let _serial = serial();
    let dir = tempdir();
    let ck = dir.path().join("ck");
    let out = dir.path().join("model.h5");
    let args = [
        "--plan",
        "row_block",
        "--checkpoint-dir",
        ck.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    TestCommand::mpirun(2)
        .args(["embed", "--preset", "tiny", "--global-batch", "128"])
        .args(["--steps", "8", "--threads", "1"])
        .args(args)
        .env("TORUSREC_PREEMPT_AT", "3")
        .run()
        .expect_code(75);
    assert!(!out.exists(), "a preempted run wrote the model");
    // Resumed on another rank count (the same command line plus --resume): it writes
    // the finished model; an existing one is the first attempt's and is replaced.
    std::fs::write(&out, b"the first attempt's").unwrap();
    let o = TestCommand::mpirun(3)
        .args(["embed", "--preset", "tiny", "--global-batch", "128"])
        .args(["--steps", "8", "--threads", "1"])
        .args(args)
        .args(["--resume", "auto"])
        .run();
    o.expect_code(0)
        .stdout_has(&["resumed from", "wrote the model"]);
    assert_eq!(u64_attr(&out, "step"), 8);
    assert_eq!(str_attr(&out, "checksum"), o.final_checksum());
}
