//! `generate clicks --planted fm`: labels that need pairwise interactions. The log keeps
//! the linear log's dense features and ids and records its planted model; the option is
//! refused where it cannot act (Criteo-format text, `embed --data`), and `embed` trains
//! on generated fm examples.

use crate::util;

use std::path::Path;

use util::{h5_read, tempdir, TestCommand};

fn generate(out: &Path, planted: &str) -> util::Output {
    TestCommand::direct()
        .args([
            "generate",
            "clicks",
            "--preset",
            "tiny",
            "--examples",
            "2000",
        ])
        .args(["--seed", "5", "--planted", planted, "--out"])
        .arg(out)
        .run()
}

fn planted_attr(path: &Path) -> Option<String> {
    let f = hdf5::File::open(path).unwrap();
    f.attr("planted").ok().map(|a| {
        a.read_scalar::<hdf5::types::VarLenUnicode>()
            .unwrap()
            .to_string()
    })
}

#[test]
fn an_fm_log_has_the_linear_logs_features_and_other_labels() {
    let d = tempdir();
    let (lin, fm) = (d.path().join("lin.h5"), d.path().join("fm.h5"));
    generate(&lin, "linear")
        .expect_code(0)
        .stdout_has(&["linear labels"]);
    generate(&fm, "fm:4:2")
        .expect_code(0)
        .stdout_has(&["fm:4:2 labels"]);
    assert_eq!(planted_attr(&lin), None);
    assert_eq!(planted_attr(&fm).as_deref(), Some("fm:4:2"));
    assert_eq!(h5_read::<f32>(&lin, "dense"), h5_read::<f32>(&fm, "dense"));
    for t in 0..2 {
        let ids = format!("tables/{t}/ids");
        assert_eq!(h5_read::<u32>(&lin, &ids), h5_read::<u32>(&fm, &ids));
    }
    let (ll, lf) = (
        h5_read::<f32>(&lin, "labels"),
        h5_read::<f32>(&fm, "labels"),
    );
    let differ = ll.iter().zip(&lf).filter(|(a, b)| a != b).count();
    assert!(differ > 100, "only {differ} of 2000 labels differ");
}

#[test]
fn planted_is_refused_where_it_cannot_act() {
    let d = tempdir();
    let out = d.path().join("days");
    TestCommand::direct()
        .args([
            "generate",
            "clicks",
            "--preset",
            "tiny",
            "--examples",
            "100",
        ])
        .args(["--format", "criteo", "--planted", "fm", "--out"])
        .arg(&out)
        .run()
        .expect_code(2)
        .stderr_has(&["--planted applies to --format log"]);
    assert!(!out.exists());
    for bad in ["fm:0", "quadratic", "fm:2:-1"] {
        generate(&d.path().join("x.h5"), bad)
            .expect_code(2)
            .stderr_has(&["--planted"]);
    }
    assert!(!d.path().join("x.h5").exists());
    let lin = d.path().join("lin.h5");
    generate(&lin, "linear").expect_code(0);
    TestCommand::direct()
        .args(["embed", "--data"])
        .arg(&lin)
        .args(["--planted", "fm", "--steps", "2"])
        .run()
        .expect_code(2)
        .stderr_has(&["--planted"]);
}

#[test]
fn embed_trains_on_generated_fm_examples_and_a_resume_keeps_the_model() {
    let d = tempdir();
    let ck = d.path().join("ck");
    let run = |planted: &str, steps: &str, resume: bool, release: bool| {
        let mut c = util::tiny_embed(2, steps, "4")
            .args(["--planted", planted, "--checkpoint-dir"])
            .arg(&ck)
            .args(["--checkpoint-every", "4"]);
        if resume {
            c = c.args(["--resume", "auto"]);
        }
        if release {
            c = c.arg("--release-hold");
        }
        c.run()
    };
    run("fm:4", "8", false, false)
        .expect_code(0)
        .stdout_has(&["eval AUC"]);
    // A checkpoint of fm labels is not resumed with other labels: a mismatched
    // checkpoint is a training hold (exit 76, DESIGN.md), released by a person.
    run("linear", "12", true, false).expect_code(76);
    run("fm:4", "12", true, true)
        .expect_code(0)
        .stdout_has(&["at step 8", "step     12/12"]);
}
