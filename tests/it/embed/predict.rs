//! `torusrec predict`: the scores of a trained model (`embed --out`) over a click log,
//! one line per example in input order. `scripts/score.py` (numpy and h5py, no
//! torusrec) reproduces them within 1e-5 for every architecture and for hash tables
//! (admission, expiry, mean pooling over the rows found); the file is the same at 1
//! and 2 ranks; `--eval-examples K` scores the last K lines of the full output and its
//! AUC and log loss are the trainer's final evaluation; `--input` (the text through
//! `prepare clicks`' parser) scores as the prepared log does and leaves no temporary;
//! bad inputs exit 2 and write nothing.

use crate::util;

use std::path::{Path, PathBuf};
use std::process::Command;
use util::{serial, tempdir, Output, TestCommand};

/// A click log of the `tiny` preset, 3000 examples.
fn tiny_log(dir: &Path) -> PathBuf {
    let log = dir.join("log.h5");
    TestCommand::direct()
        .args([
            "generate",
            "clicks",
            "--preset",
            "tiny",
            "--examples",
            "3000",
        ])
        .arg("--out")
        .arg(&log)
        .run()
        .expect_code(0);
    log
}

/// `embed` on `log` for 15 steps, 500 held out, the model to `out`.
fn train(log: &Path, out: &Path, extra: &[&str]) -> Output {
    let o = TestCommand::direct()
        .args(["embed", "--data"])
        .arg(log)
        .args([
            "--global-batch",
            "128",
            "--steps",
            "15",
            "--eval-examples",
            "500",
        ])
        .args(["--threads", "1", "--out"])
        .arg(out)
        .args(extra)
        .run();
    o.expect_code(0);
    o
}

fn predict(np: usize, model: &Path, data: &Path, out: &Path, extra: &[&str]) -> Output {
    let l = if np == 1 {
        TestCommand::direct()
    } else {
        TestCommand::mpirun(np)
    };
    l.args(["predict", "--model"])
        .arg(model)
        .arg("--data")
        .arg(data)
        .arg("--out")
        .arg(out)
        .args(["--threads", "1"])
        .args(extra)
        .run()
}

/// A Python with numpy and h5py: `$TORUSREC_PYTHON`, else `python3` on the PATH, else
/// Debian's `/usr/bin/python3` (scripts/install_deps.sh installs python3-numpy and
/// python3-h5py there).
fn python() -> Option<String> {
    let candidates = std::env::var("TORUSREC_PYTHON")
        .into_iter()
        .chain(["python3".to_string(), "/usr/bin/python3".to_string()]);
    for py in candidates {
        let ok = Command::new(&py)
            .args(["-c", "import numpy, h5py"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(py);
        }
    }
    None
}

fn score_py() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/score.py")
}

/// The first number of every line of a scores file.
fn probabilities(path: &Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn score_py_reproduces_every_architecture_and_hash_tables_within_1e_5() {
    let Some(py) = python() else {
        eprintln!(
            "SKIPPED: no Python with numpy and h5py (set TORUSREC_PYTHON, or pip install numpy h5py)"
        );
        return;
    };
    let _serial = serial();
    let d = tempdir();
    let log = tiny_log(d.path());
    let models: [(&str, &[&str]); 6] = [
        ("mlp", &[]),
        ("dlrm", &["--arch", "dlrm", "--dim", "8"]),
        (
            "dcn-stacked-low-rank",
            &["--arch", "dcnv2", "--dim", "8", "--cross-layers", "2"],
        ),
        (
            "dcn-parallel",
            &[
                "--arch",
                "dcnv2",
                "--cross-layers",
                "2",
                "--dcn-structure",
                "parallel",
            ],
        ),
        (
            "hash-admit",
            &[
                "--vocab",
                "hash",
                "--capacity",
                "1.2x",
                "--admit-after",
                "2",
            ],
        ),
        ("hash-ttl", &["--vocab", "hash", "--evict", "ttl:3"]),
    ];
    for (name, flags) in models {
        let mut flags = flags.to_vec();
        if name == "dcn-stacked-low-rank" {
            flags.extend(["--cross-rank", "3"]);
        }
        let model = d.path().join(format!("{name}.h5"));
        train(&log, &model, &flags);
        let out = d.path().join(format!("{name}.tsv"));
        predict(1, &model, &log, &out, &[]).expect_code(0);
        let lines = std::fs::read_to_string(&out).unwrap();
        assert_eq!(lines.lines().count(), 3000, "{name}");
        let o = Command::new(&py)
            .arg(score_py())
            .arg("--model")
            .arg(&model)
            .arg("--data")
            .arg(&log)
            .arg("--compare")
            .arg(&out)
            .args(["--tol", "1e-5"])
            .output()
            .unwrap();
        let text =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: score.py disagrees:\n{text}");
        assert!(
            text.contains("3000 examples") && text.contains("labels equal"),
            "{name}: {text}"
        );
        // The hash models look some ids up as zeros: the scores are not all alike.
        let p = probabilities(&out);
        let spread = p.iter().cloned().fold(0.0, f64::max) - p.iter().cloned().fold(1.0, f64::min);
        assert!(spread > 1e-3, "{name}: every score alike ({spread})");
    }
}

#[test]
fn the_scores_do_not_depend_on_the_rank_count_and_follow_the_input_order() {
    let _serial = serial();
    let d = tempdir();
    let log = tiny_log(d.path());
    let model = d.path().join("m.h5");
    let trained = train(&log, &model, &["--vocab", "hash", "--admit-after", "2"]);
    let one = d.path().join("one.tsv");
    let two = d.path().join("two.tsv");
    predict(1, &model, &log, &one, &["--chunk", "256"])
        .expect_code(0)
        .stdout_has(&["predict: 3,000 examples on 1 rank(s): AUC "]);
    predict(2, &model, &log, &two, &["--chunk", "256"])
        .expect_code(0)
        .stdout_has(&["on 2 rank(s)"]);
    let a = std::fs::read_to_string(&one).unwrap();
    let b = std::fs::read_to_string(&two).unwrap();
    let differ = a.lines().zip(b.lines()).filter(|(x, y)| x != y).count();
    assert!(a == b, "1 and 2 ranks differ on {differ} lines");

    // The held-out part alone: the last 500 lines (scored in other chunks: equal
    // within rounding), scored as the trainer evaluated them.
    let tail = d.path().join("tail.tsv");
    let o = predict(2, &model, &log, &tail, &["--eval-examples", "500"]);
    o.expect_code(0);
    let (full, part) = (probabilities(&one), probabilities(&tail));
    assert_eq!(part.len(), 500);
    let worst = full[2500..]
        .iter()
        .zip(&part)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-6, "not the input order: {worst}");
    let labels = |p: &Path| -> Vec<String> {
        let text = std::fs::read_to_string(p).unwrap();
        text.lines()
            .map(|l| l.split('\t').nth(1).unwrap().to_string())
            .collect()
    };
    assert_eq!(labels(&one)[2500..], labels(&tail)[..]);
    // final: eval AUC 0.4249  logloss 0.69342 ... ; predict: ... AUC 0.424934, log loss 0.693417
    assert_scores_as_trained(&trained.stdout, &o.stdout);
}

/// The AUC and log loss `predict` printed (its `predict:` line) are the trainer's
/// held-out ones (its `final:` line): AUC within 1e-4, log loss within 1e-5.
pub(super) fn assert_scores_as_trained(trained: &str, predicted: &str) {
    let word_after = |line: &str, w: &str| -> f64 {
        let mut it = line.split_whitespace();
        it.find(|x| *x == w).unwrap();
        it.next()
            .unwrap()
            .trim_end_matches([',', ';'])
            .parse()
            .unwrap()
    };
    let line_of = |text: &str, start: &str| -> String {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no {start} line in\n{text}"))
            .to_string()
    };
    let (fin, line) = (line_of(trained, "final:"), line_of(predicted, "predict:"));
    let (auc0, ll0) = (word_after(&fin, "AUC"), word_after(&fin, "logloss"));
    let (auc1, ll1) = (word_after(&line, "AUC"), word_after(&line, "loss"));
    assert!(
        (auc0 - auc1).abs() < 1e-4,
        "AUC {auc0} vs {auc1}\n{fin}\n{line}"
    );
    assert!(
        (ll0 - ll1).abs() < 1e-5,
        "log loss {ll0} vs {ll1}\n{fin}\n{line}"
    );
}

#[test]
fn text_input_scores_as_its_prepared_log_and_leaves_no_temporary() {
    let _serial = serial();
    let d = tempdir();
    TestCommand::direct()
        .args([
            "generate", "clicks", "--format", "criteo", "--preset", "small",
        ])
        .args(["--scale", "0.01", "--examples", "400", "--out"])
        .arg(d.path().join("days"))
        .run()
        .expect_code(0);
    let day = d.path().join("days/day_0.tsv");
    let log = d.path().join("log.h5");
    TestCommand::direct()
        .args(["prepare", "clicks", "--format", "criteo", "--input"])
        .arg(&day)
        .arg("--out")
        .arg(&log)
        .run()
        .expect_code(0);
    let model = d.path().join("m.h5");
    TestCommand::direct()
        .args(["embed", "--data"])
        .arg(&log)
        .args([
            "--global-batch",
            "64",
            "--steps",
            "4",
            "--eval-examples",
            "50",
        ])
        .args(["--threads", "1", "--out"])
        .arg(&model)
        .run()
        .expect_code(0);
    let a = d.path().join("a.tsv");
    predict(1, &model, &log, &a, &[]).expect_code(0);
    let b = d.path().join("out/b.tsv");
    std::fs::create_dir(d.path().join("out")).unwrap();
    TestCommand::mpirun(2)
        .args(["predict", "--model"])
        .arg(&model)
        .arg("--input")
        .arg(&day)
        .args(["--format", "criteo", "--out"])
        .arg(&b)
        .run()
        .expect_code(0);
    let (x, y) = (
        std::fs::read_to_string(&a).unwrap(),
        std::fs::read_to_string(&b).unwrap(),
    );
    assert!(
        x.lines().count() == 400 && x == y,
        "--input and --data differ"
    );
    let left: Vec<_> = std::fs::read_dir(d.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("b.tsv")],
        "a temporary is left"
    );
    // --input without --format is refused before anything is written.
    let c = d.path().join("out/c.tsv");
    TestCommand::direct()
        .args(["predict", "--model"])
        .arg(&model)
        .arg("--input")
        .arg(&day)
        .arg("--out")
        .arg(&c)
        .run()
        .expect_code(2)
        .stderr_has(&["--format"]);
    assert!(!c.exists());
}

#[test]
fn bad_inputs_exit_2_and_write_nothing() {
    let _serial = serial();
    let d = tempdir();
    let log = tiny_log(d.path());
    let model = d.path().join("m.h5");
    let ck = d.path().join("ck");
    train(
        &log,
        &model,
        &[
            "--checkpoint-dir",
            ck.to_str().unwrap(),
            "--checkpoint-every",
            "15",
        ],
    );
    let out = d.path().join("s.tsv");
    let missing = d.path().join("nope.h5");
    predict(1, &missing, &log, &out, &[])
        .expect_code(2)
        .stderr_has(&["nope.h5", "no such file"]);
    assert!(!out.exists());

    // A checkpoint is not a model file (its format attribute says so).
    let ckpt = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "h5"))
        .expect("a checkpoint");
    predict(1, &ckpt, &log, &out, &[])
        .expect_code(2)
        .stderr_has(&["not a torusrec model", "torusrec-checkpoint"]);
    assert!(!out.exists());

    // A click log of other tables.
    let other = d.path().join("small.h5");
    TestCommand::direct()
        .args(["generate", "clicks", "--preset", "small", "--scale", "0.01"])
        .args(["--examples", "100", "--out"])
        .arg(&other)
        .run()
        .expect_code(0);
    predict(2, &model, &other, &out, &[])
        .expect_code(2)
        .stderr_has(&["m.h5", "small.h5"]);
    assert!(!out.exists());

    // An existing output without --force is kept as it was.
    std::fs::write(&out, b"keep").unwrap();
    predict(1, &model, &log, &out, &[]).expect_code(2);
    assert_eq!(std::fs::read(&out).unwrap(), b"keep");
    predict(1, &model, &log, &out, &["--force"]).expect_code(0);
    assert_eq!(probabilities(&out).len(), 3000);
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial") || n.contains(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporaries left: {left:?}");
}
