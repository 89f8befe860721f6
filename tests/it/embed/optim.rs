//! The optimizers and the learning-rate schedule end to end under `mpirun`: every table
//! optimizer trains at 2 ranks with a finite, falling loss; an interrupted run under
//! adam or ftrl (with a schedule and weight decay) resumes to the uninterrupted run's
//! bits; a resume under other optimizer settings is refused; flags of an optimizer or
//! decay not chosen are refused (exit 2).

use crate::util;

use util::{serial, tempdir, tiny_embed, Output, TestCommand};

/// The tiny model at 2 ranks, row-cyclic, for `steps` steps (a report every 6).
fn embed_cmd(steps: &str, extra: &[&str]) -> TestCommand {
    tiny_embed(2, steps, "6")
        .args(["--plan", "row_cyclic"])
        .args(extra)
}

/// [`embed_cmd`] with the tables' learning rate `lr` (`tiny_embed` sets 0.05).
fn embed_lr(steps: &str, lr: &str, extra: &[&str]) -> TestCommand {
    TestCommand::mpirun(2)
        .args(["embed", "--preset", "tiny", "--global-batch", "128"])
        .args([
            "--steps",
            steps,
            "--log-every",
            "6",
            "--eval-examples",
            "2048",
        ])
        .args(["--threads", "1", "--table-lr", lr, "--dense-lr", "0.01"])
        .args(["--plan", "row_cyclic"])
        .args(extra)
}

/// The `loss` values of the progress lines.
fn losses(o: &Output) -> Vec<f64> {
    o.stdout
        .lines()
        .filter(|l| l.starts_with("step "))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|x| *x == "loss")?;
            w.next()?.parse().ok()
        })
        .collect()
}

#[test]
fn every_table_optimizer_trains_at_two_ranks_with_a_falling_loss() {
    let _serial = serial();
    for (opt, lr) in [
        ("sgd", "0.5"),
        ("rowwise-adagrad", "0.05"),
        ("adagrad", "0.05"),
        ("adam", "0.005"),
        ("rowwise-adam", "0.005"),
        ("ftrl", "0.05"),
    ] {
        let o = embed_lr("36", lr, &["--table-opt", opt]).run();
        o.expect_code(0).stdout_has(&["final: eval AUC"]);
        let l = losses(&o);
        assert_eq!(l.len(), 6, "{opt}: {l:?}\n{}", o.dump());
        assert!(l.iter().all(|x| x.is_finite()), "{opt}: {l:?}");
        assert!(l[5] < l[0], "{opt}: the loss did not fall: {l:?}");
    }
}

#[test]
fn adam_and_ftrl_resume_exactly_and_other_settings_are_refused() {
    let _serial = serial();
    let sched = [
        "--lr-warmup",
        "3",
        "--lr-decay",
        "poly",
        "--lr-decay-steps",
        "8",
        "--lr-decay-end",
        "0.2",
        "--dense-opt",
        "adam",
        "--dense-weight-decay",
        "0.01",
    ];
    let ftrl = [
        "--table-opt",
        "ftrl",
        "--ftrl-l1",
        "0.001",
        "--ftrl-l2",
        "0.01",
    ];
    let sgd_sched: Vec<&str> = ["--table-opt", "sgd"]
        .iter()
        .chain(&sched)
        .copied()
        .collect();
    let mut ftrl_other: Vec<&str> = ftrl.to_vec();
    ftrl_other[3] = "0.002";
    ftrl_other.extend(sched);
    // Each resumed once more under other settings: another optimizer; the same one
    // without the schedule; another l1.
    for (opt, other) in [
        (
            &["--table-opt", "adam", "--table-weight-decay", "0.01"][..],
            sgd_sched,
        ),
        (
            &["--table-opt", "rowwise-adam"][..],
            vec!["--table-opt", "rowwise-adam"],
        ),
        (&ftrl[..], ftrl_other),
    ] {
        let reference = embed_cmd("12", opt).args(sched).run();
        reference.expect_code(0);
        let dir = tempdir();
        let d = dir.path().to_str().unwrap();
        let o = embed_cmd("12", opt)
            .args(sched)
            .args(["--checkpoint-dir", d])
            .env("TORUSREC_PREEMPT_AT", "5")
            .run();
        o.expect_code(75);
        let r = embed_cmd("12", opt)
            .args(sched)
            .args(["--checkpoint-dir", d, "--resume", "auto"])
            .run();
        r.expect_code(0).stdout_has(&["resumed from"]);
        assert_eq!(r.final_checksum(), reference.final_checksum(), "{opt:?}");
        // Refused: the run holds (76) naming the settings that must match.
        embed_cmd("12", &other)
            .args(["--checkpoint-dir", d, "--resume", "auto"])
            .run()
            .expect_code(76)
            .stderr_has(&["differs from this run's", "optimizers"]);
    }
}

#[test]
fn flags_of_an_optimizer_or_decay_not_chosen_are_refused() {
    let _serial = serial();
    for (args, msg) in [
        (
            &["--ftrl-l1", "0.1"][..],
            "--ftrl-l1 is a setting of --table-opt ftrl",
        ),
        (
            &["--table-opt", "sgd", "--table-beta1", "0.8"][..],
            "--table-beta1",
        ),
        (
            &["--table-opt", "ftrl", "--table-weight-decay", "0.1"][..],
            "use --ftrl-l2",
        ),
        (
            &["--lr-decay-steps", "5"][..],
            "--lr-decay-steps is a setting of --lr-decay poly",
        ),
        (&["--lr-decay", "poly"][..], "needs --lr-decay-steps"),
        (&["--lr-decay", "step"][..], "needs --lr-decay-every"),
        (
            &[
                "--lr-decay",
                "step",
                "--lr-decay-every",
                "2",
                "--lr-decay-factor",
                "2",
            ][..],
            "--lr-decay-factor 2",
        ),
        (
            &["--table-opt", "adam", "--table-beta2", "1"][..],
            "--table-beta2 1",
        ),
        (&["--dense-weight-decay=-1"][..], "--dense-weight-decay -1"),
    ] {
        tiny_embed(2, "4", "2")
            .args(args)
            .run()
            .expect_code(2)
            .occurs(msg, 1);
    }
    // Per-element state cannot be split over column shards.
    tiny_embed(2, "4", "2")
        .args(["--table-opt", "adam", "--plan", "column"])
        .run()
        .expect_code(2)
        .stderr_has(&["placed column-wise", "--table-opt adam"]);
}
