//! Outputs written through a temporary name (`<out>.partial`, `io::outfile`) are kept
//! apart from the inputs and from what is in the way, before any work: an input named
//! like the temporary, an output that is an input (with `--force`), and a directory or
//! symbolic link at the temporary name each exit 2 on every rank, naming the file, with
//! every input and every earlier output as it was. Covered: `prepare clicks`,
//! `generate clicks` (day files and the v1 log), `embed --out`, `plan --out`,
//! `prepare` of a graph, `als --out` and `recommend --out`.

use crate::util;

use std::path::{Path, PathBuf};

use torusrec::io::outfile::temp_path;
use util::{rank_codes, serial, tempdir, TestCommand};

/// Two Criteo-format days of 300 examples in `dir/days`.
fn days(dir: &Path) -> Vec<PathBuf> {
    TestCommand::direct()
        .args([
            "generate", "clicks", "--format", "criteo", "--preset", "small",
        ])
        .args([
            "--scale",
            "0.01",
            "--days",
            "2",
            "--examples",
            "300",
            "--out",
        ])
        .arg(dir.join("days"))
        .run()
        .expect_code(0);
    (0..2)
        .map(|d| dir.join(format!("days/day_{d}.tsv")))
        .collect()
}

fn prepare(np: usize, inputs: &[PathBuf], out: &Path, extra: &[&str]) -> TestCommand {
    let l = if np == 1 {
        TestCommand::direct()
    } else {
        TestCommand::mpirun(np)
    };
    l.args(["prepare", "clicks", "--format", "criteo", "--input"])
        .args(inputs)
        .arg("--out")
        .arg(out)
        .args(extra)
}

/// The bytes of every file in `files`, to check that none changed.
fn snapshot(files: &[&Path]) -> Vec<Vec<u8>> {
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

#[test]
fn an_input_named_like_the_temporary_output_is_refused_and_kept() {
    let _serial = serial();
    let d = tempdir();
    let dir = d.path();
    let inputs = days(dir);
    let out = dir.join("o.h5");
    // The first day, renamed to the output's temporary name.
    let tmp = temp_path(&out);
    std::fs::rename(&inputs[0], &tmp).unwrap();
    let given = vec![tmp.clone(), inputs[1].clone()];
    let before = snapshot(&[&tmp, &inputs[1]]);
    let codes = dir.join("codes");
    std::fs::create_dir(&codes).unwrap();
    let o = prepare(2, &given, &out, &[])
        .record_rank_codes(&codes)
        .run();
    o.stderr_has(&[
        &format!(
            "{}: is an input (--input) named like the temporary output",
            tmp.display()
        ),
        "o.h5",
    ]);
    assert_eq!(rank_codes(&codes, 2), vec![Some(2), Some(2)]);
    assert!(!out.exists());
    assert_eq!(snapshot(&[&tmp, &inputs[1]]), before);
    // With --force over an earlier output: refused, the output and the input kept.
    std::fs::write(&out, b"earlier output").unwrap();
    prepare(1, &given, &out, &["--force"])
        .run()
        .expect_code(2)
        .stderr_has(&["o.h5.partial: is an input (--input)"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"earlier output");
    assert_eq!(snapshot(&[&tmp, &inputs[1]]), before);
}

#[test]
fn an_output_that_is_an_input_is_refused_with_force() {
    let d = tempdir();
    let dir = d.path();
    let inputs = days(dir);
    let before = snapshot(&[&inputs[0], &inputs[1]]);
    prepare(1, &inputs, &inputs[1], &["--force"])
        .run()
        .expect_code(2)
        .stderr_has(&[&format!(
            "{}: is also an input (--input {})",
            inputs[1].display(),
            inputs[1].display()
        )]);
    // Through a symbolic link too.
    let link = dir.join("link.h5");
    std::os::unix::fs::symlink(&inputs[0], &link).unwrap();
    prepare(1, &inputs, &link, &["--force"])
        .run()
        .expect_code(2)
        .stderr_has(&["link.h5: is also an input (--input"]);
    assert_eq!(snapshot(&[&inputs[0], &inputs[1]]), before);
    assert!(!temp_path(&inputs[1]).exists() && !temp_path(&link).exists());
}

#[test]
fn a_directory_at_the_temporary_name_is_refused_before_the_first_pass() {
    let _serial = serial();
    let d = tempdir();
    let dir = d.path();
    let inputs = days(dir);
    let out = dir.join("o.h5");
    let tmp = temp_path(&out);
    std::fs::create_dir(&tmp).unwrap();
    std::fs::write(tmp.join("inside"), b"keep").unwrap();
    std::fs::write(&out, b"earlier output").unwrap();
    let codes = dir.join("codes");
    std::fs::create_dir(&codes).unwrap();
    // A preemption in the count pass would exit 1: exit 2 on every rank shows that
    // the refusal came before it.
    prepare(2, &inputs, &out, &["--force"])
        .env("TORUSREC_PREEMPT_IN", "count")
        .record_rank_codes(&codes)
        .run()
        .stderr_has(&[&format!(
            "{}: is a directory, in the way of the temporary output",
            tmp.display()
        )]);
    assert_eq!(rank_codes(&codes, 2), vec![Some(2), Some(2)]);
    assert_eq!(std::fs::read(tmp.join("inside")).unwrap(), b"keep");
    assert_eq!(std::fs::read(&out).unwrap(), b"earlier output");
    // A symbolic link there would be written through: refused, its target kept.
    std::fs::remove_dir_all(&tmp).unwrap();
    std::os::unix::fs::symlink(&inputs[0], &tmp).unwrap();
    let before = snapshot(&[&inputs[0]]);
    prepare(1, &inputs, &out, &["--force"])
        .run()
        .expect_code(2)
        .stderr_has(&["o.h5.partial: is a symbolic link"]);
    assert_eq!(snapshot(&[&inputs[0]]), before);
    assert_eq!(std::fs::read(&out).unwrap(), b"earlier output");
}

#[test]
fn generate_clicks_refuses_a_directory_at_a_day_files_temporary_name() {
    let d = tempdir();
    let dir = d.path();
    let days = dir.join("days");
    let tmp = temp_path(&days.join("day_1.tsv"));
    std::fs::create_dir_all(&tmp).unwrap();
    TestCommand::direct()
        .args([
            "generate", "clicks", "--format", "criteo", "--preset", "small",
        ])
        .args([
            "--scale",
            "0.01",
            "--days",
            "2",
            "--examples",
            "50",
            "--out",
        ])
        .arg(&days)
        .run()
        .expect_code(2)
        .stderr_has(&["day_1.tsv.partial: is a directory"]);
    assert!(tmp.is_dir() && !days.join("day_0.tsv").exists());
    // The v1 log must not replace its own model file.
    let toml = dir.join("m.toml");
    std::fs::write(&toml, "[[table]]\nname = \"a\"\nvocab = 100\ndim = 4\n").unwrap();
    TestCommand::direct()
        .args([
            "generate",
            "clicks",
            "--examples",
            "10",
            "--force",
            "--tables",
        ])
        .arg(&toml)
        .arg("--out")
        .arg(&toml)
        .run()
        .expect_code(2)
        .stderr_has(&["m.toml: is also an input (--tables"]);
    assert!(std::fs::read_to_string(&toml)
        .unwrap()
        .contains("vocab = 100"));
}

#[test]
fn embed_and_plan_outputs_are_kept_apart_from_their_inputs() {
    let d = tempdir();
    let dir = d.path();
    let log = dir.join("log.h5");
    TestCommand::direct()
        .args([
            "generate",
            "clicks",
            "--preset",
            "tiny",
            "--examples",
            "600",
            "--out",
        ])
        .arg(&log)
        .run()
        .expect_code(0);
    let before = snapshot(&[&log]);
    let embed = |out: &Path| {
        TestCommand::direct()
            .args([
                "embed",
                "--steps",
                "1",
                "--threads",
                "1",
                "--eval-examples",
                "100",
            ])
            .arg("--data")
            .arg(&log)
            .arg("--out")
            .arg(out)
            .arg("--force")
            .run()
    };
    embed(&log)
        .expect_code(2)
        .stderr_has(&["log.h5: is also an input (--data"]);
    // The click log renamed to the model's temporary name.
    let model = dir.join("model.h5");
    let log_tmp = temp_path(&model);
    std::fs::hard_link(&log, &log_tmp).unwrap();
    embed(&model).expect_code(2).stderr_has(&[&format!(
        "model.h5.partial: is an input (--data {}) named like the temporary output",
        log.display()
    )]);
    assert!(!model.exists());
    assert_eq!(
        snapshot(&[&log, &log_tmp]),
        [before.clone(), before].concat()
    );
    // `plan --out` over its model file.
    let toml = dir.join("m.toml");
    std::fs::write(&toml, "[[table]]\nname = \"a\"\nvocab = 100\ndim = 4\n").unwrap();
    TestCommand::direct()
        .args(["plan", "--ranks", "2", "--force", "--tables"])
        .arg(&toml)
        .arg("--out")
        .arg(&toml)
        .run()
        .expect_code(2)
        .stderr_has(&["m.toml: is also an input (--tables"]);
    assert!(std::fs::read_to_string(&toml)
        .unwrap()
        .contains("vocab = 100"));
}

#[test]
fn prepare_of_a_graph_refuses_an_input_named_like_its_temporary() {
    let d = tempdir();
    let dir = d.path();
    let out = dir.join("g.h5");
    let input = temp_path(&out);
    let text: String = (0..50u32)
        .map(|u| format!("{u}\t{}\n", (u + 1) % 50))
        .collect();
    std::fs::write(&input, &text).unwrap();
    let prepare = |out: &Path| {
        TestCommand::direct()
            .args(["prepare", "--format", "tsv", "--input"])
            .arg(&input)
            .arg("--out")
            .arg(out)
            .arg("--force")
            .run()
    };
    prepare(&out)
        .expect_code(2)
        .stderr_has(&["g.h5.partial: is an input (--input) named like the temporary output"]);
    prepare(&input)
        .expect_code(2)
        .stderr_has(&["g.h5.partial: is also an input (--input"]);
    assert_eq!(std::fs::read_to_string(&input).unwrap(), text);
    assert!(!out.exists());
}

#[test]
fn als_and_recommend_outputs_are_kept_apart_from_their_inputs() {
    let d = tempdir();
    let dir = d.path();
    let data = util::synthetic_dataset(dir, 200, 1200, 3);
    let before = snapshot(&[&data]);
    TestCommand::direct()
        .args([
            "als",
            "--threads",
            "1",
            "--epochs",
            "1",
            "--force",
            "--data",
        ])
        .arg(&data)
        .arg("--out")
        .arg(&data)
        .run()
        .expect_code(2)
        .stderr_has(&[&format!("{}: is also an input (--data", data.display())]);
    // A model file (its contents do not matter: refused before it is read).
    let model = dir.join("model.h5");
    std::fs::write(&model, b"earlier model").unwrap();
    TestCommand::direct()
        .args(["recommend", "--threads", "1", "--all", "--force", "--model"])
        .arg(&model)
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&model)
        .run()
        .expect_code(2)
        .stderr_has(&["model.h5: is also an input (--model"]);
    assert_eq!(std::fs::read(&model).unwrap(), b"earlier model");
    assert_eq!(snapshot(&[&data]), before);
}
