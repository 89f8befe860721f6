//! Checkpoints of the embedding model under `mpirun`: preemption writes a checkpoint
//! and exits 75 and the resumed run equals the uninterrupted one (also resumed on
//! another rank count and plan, and from a periodic checkpoint with pipelining); a NaN
//! holds the run (76) until released, a corrupt checkpoint holds it; a run neither
//! mixes checkpoint directories nor overwrites an output it did not write.

use crate::util;

use std::path::Path;
use util::{serial, tempdir, tiny_embed, Output, TestCommand};

/// The tiny model's run of 12 steps at `np` ranks with `extra` flags (as in
/// `embed::mpi`).
fn embed_cmd(np: usize, extra: &[&str]) -> TestCommand {
    tiny_embed(np, "12", "4").args(extra)
}

fn embed(np: usize, extra: &[&str]) -> Output {
    embed_cmd(np, extra).run()
}

fn ckpt_run(np: usize, dir: &Path, extra: &[&str]) -> Output {
    ckpt_cmd(np, dir, extra).run()
}

fn ckpt_cmd(np: usize, dir: &Path, extra: &[&str]) -> TestCommand {
    let d = dir.to_str().unwrap();
    embed_cmd(np, &["--checkpoint-dir", d, "--plan", "row_cyclic"]).args(extra)
}

#[test]
fn preemption_checkpoints_and_resume_is_exact() {
    let _serial = serial();
    let reference = embed(2, &["--plan", "row_cyclic"]);
    reference.expect_code(0);
    for at in ["1", "5", "11"] {
        let dir = tempdir();
        let o = ckpt_cmd(2, dir.path(), &[])
            .env("TORUSREC_PREEMPT_AT", at)
            .run();
        o.expect_code(75).stderr_has(&["preempted", "checkpoint"]);
        let r = ckpt_run(2, dir.path(), &["--resume", "auto"]);
        r.expect_code(0).stdout_has(&["resumed from"]);
        assert_eq!(
            r.final_checksum(),
            reference.final_checksum(),
            "preempted at {at}"
        );
    }
    // Resume on another rank count and another plan: it finishes where it should.
    let dir = tempdir();
    let d = dir.path().to_str().unwrap();
    embed_cmd(4, &["--checkpoint-dir", d, "--plan", "column"])
        .env("TORUSREC_PREEMPT_AT", "6")
        .run()
        .expect_code(75);
    embed(
        3,
        &[
            "--checkpoint-dir",
            d,
            "--plan",
            "row_block",
            "--resume",
            "auto",
        ],
    )
    .expect_code(0)
    .stdout_has(&["written by 4 rank(s)) at step 6", "step     12/12"]);
}

#[test]
fn with_pipelining_a_resume_from_a_periodic_checkpoint_is_exact() {
    let _serial = serial();
    // The uninterrupted run writes checkpoints at steps 4, 8 and 12; a run resumed
    // from the one at step 4 must end with the same bits, although the uninterrupted
    // run had looked step 5 up during step 4.
    let dir = tempdir();
    let args = ["--pipeline", "--checkpoint-every", "4", "--accumulate", "2"];
    let full = ckpt_run(2, dir.path(), &args);
    full.expect_code(0);
    let steps: Vec<u64> = torusrec::ckpt::list(dir.path())
        .unwrap()
        .iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(steps, vec![4, 8, 12]);
    let at4 = dir.path().join(torusrec::ckpt::file_name(4));
    let again = tempdir();
    let mut resume = args.to_vec();
    resume.extend(["--resume", at4.to_str().unwrap()]);
    let r = ckpt_run(2, again.path(), &resume);
    r.expect_code(0).stdout_has(&["resumed from", "at step 4"]);
    assert_eq!(r.final_checksum(), full.final_checksum());
}

/// A restart under the hold of an embedding-model run names the step the hold
/// happened in (the hold has a step, no epoch: it used to say "epoch ?").
#[test]
fn a_restart_under_an_embed_hold_names_its_step() {
    let _serial = serial();
    let dir = tempdir();
    ckpt_cmd(2, dir.path(), &[])
        .env("TORUSREC_INJECT_NAN", "3@0")
        .run()
        .expect_code(76)
        .stderr_has(&["on rank 0 at step 3"]);
    ckpt_run(2, dir.path(), &["--resume", "auto"])
        .expect_code(76)
        .stderr_has(&["HOLD.json", "(rank 0, step 3)", "--release-hold"])
        .occurs("epoch", 0);
}

#[test]
fn nan_holds_the_run_and_corrupt_checkpoints_hold_it() {
    let _serial = serial();
    let dir = tempdir();
    let o = ckpt_cmd(3, dir.path(), &["--checkpoint-every", "2"])
        .env("TORUSREC_INJECT_NAN", "5@1")
        .run();
    o.expect_code(76)
        .occurs("non-finite", 1)
        .stderr_has(&["on rank 1 at step 5"]);
    let hold = torusrec::ckpt::read_hold(dir.path())
        .unwrap()
        .expect("HOLD.json");
    assert_eq!((hold.rank, hold.step, hold.epoch), (Some(1), Some(5), None));
    ckpt_run(3, dir.path(), &["--resume", "auto"])
        .expect_code(76)
        .stderr_has(&["HOLD.json"]);
    // Released, but another seed: the checkpoint does not belong to this run.
    ckpt_run(
        3,
        dir.path(),
        &["--resume", "auto", "--release-hold", "--seed", "9"],
    )
    .expect_code(76)
    .stderr_has(&["configuration"]);
    ckpt_run(3, dir.path(), &["--resume", "auto", "--release-hold"])
        .expect_code(0)
        .stdout_has(&["resumed from", "at step 4"]);

    // Flip bytes in the middle of the newest checkpoint: restore refuses with 76.
    let (_, newest) = torusrec::ckpt::list(dir.path()).unwrap().pop().unwrap();
    let mut bytes = std::fs::read(&newest).unwrap();
    let n = bytes.len();
    for b in &mut bytes[n / 2..n / 2 + 64] {
        *b ^= 0x5a;
    }
    std::fs::write(&newest, &bytes).unwrap();
    ckpt_run(2, dir.path(), &["--resume", newest.to_str().unwrap()])
        .expect_code(76)
        .stderr_has(&["ckpt-"]);
    assert!(
        newest.exists(),
        "a corrupt checkpoint is kept for a person to look at"
    );
}

#[test]
fn a_run_neither_mixes_checkpoint_directories_nor_overwrites_an_output_it_did_not_write() {
    let _serial = serial();
    let dir = tempdir();
    let ck = dir.path().join("ck");
    let cks = ck.to_str().unwrap();
    let run = |steps: &str, extra: &[&str]| {
        tiny_embed(2, steps, "4")
            .args(["--checkpoint-dir", cks])
            .args(extra)
            .run()
    };
    let steps = || -> Vec<u64> {
        torusrec::ckpt::list(&ck)
            .unwrap()
            .iter()
            .map(|c| c.0)
            .collect()
    };
    run("12", &["--checkpoint-every", "4"]).expect_code(0);
    assert_eq!(steps(), vec![4, 8, 12]);
    // A fresh run would delete them by retention: refused, nothing deleted.
    run("12", &["--seed", "3"])
        .expect_code(2)
        .occurs("3 checkpoint(s) of an earlier run", 1);
    // A branch from step 4 into the same directory: 8 and 12 would outlive its own.
    let at4 = ck.join(torusrec::ckpt::file_name(4));
    run("12", &["--resume", at4.to_str().unwrap()])
        .expect_code(2)
        .occurs("2 checkpoint(s) past step 4", 1);
    // Resuming past --steps is refused rather than reporting a run it did not do.
    run("8", &["--resume", "auto"])
        .expect_code(2)
        .occurs("at step 12, past --steps 8", 1);
    assert_eq!(steps(), vec![4, 8, 12]);

    // --resume auto with nothing to resume is a first attempt: --out is protected.
    let out = dir.path().join("model.h5");
    std::fs::write(&out, "precious").unwrap();
    let fresh = dir.path().join("empty");
    tiny_embed(2, "2", "4")
        .args(["--checkpoint-dir", fresh.to_str().unwrap()])
        .args(["--resume", "auto", "--out", out.to_str().unwrap()])
        .run()
        .expect_code(2)
        .stderr_has(&["--force"]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "precious");
}
