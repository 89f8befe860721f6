//! iALS preempted inside a spilled half gathered in blocks (`TORUSREC_PREEMPT_AT`: rank
//! 0 of the simulated ranks raises the preemption after that global step) resumes to
//! the bits of the uninterrupted run, in either layout, and on another rank count to
//! the bits the in-memory layout gives there. The rest of the out-of-core tests:
//! `als::ooc` of `tests/it`.

use crate::util;
use crate::EnvVar;

use std::path::{Path, PathBuf};
use torusrec::als::{AlsConfig, Resume};
use torusrec::bf16::TableDtype;
use torusrec::ckpt::file_name;
use util::ooc::{
    assert_no_loss_mismatch, assert_same_bits, cnr, config, describe, differing, gather_rows,
    train, try_train, with_memory, Outcome, Setting, SETTINGS, TINY_CSR,
};
use util::{max_rel_diff, serial, tempdir};

/// Run `cfg` on `p` ranks until the preemption after global step `step`; returns the
/// checkpoint it wrote.
#[track_caller]
fn preempt(p: usize, cfg: &AlsConfig, step: u64, dir: &Path) -> PathBuf {
    let mut cfg = cfg.clone();
    cfg.checkpoint.dir = Some(dir.to_path_buf());
    cfg.checkpoint.every = 0;
    let out = {
        let _at = EnvVar::set("TORUSREC_PREEMPT_AT", &step.to_string());
        try_train(p, &cfg)
    };
    for (r, x) in out.into_iter().enumerate() {
        match x {
            Ok(_) => panic!("rank {r} finished a run preempted at step {step}"),
            Err(e) => assert_eq!(e.exit_code(), 75, "rank {r}: {e}"),
        }
    }
    let file = dir.join(file_name(step));
    assert!(file.is_file(), "no checkpoint {}", file.display());
    file
}

/// `cfg` resumed from `file` (its checkpoints in a directory of their own).
fn resumed(cfg: &AlsConfig, file: &Path, dir: &Path) -> AlsConfig {
    let mut cfg = cfg.clone();
    std::fs::create_dir_all(dir).unwrap();
    cfg.checkpoint.dir = Some(dir.to_path_buf());
    cfg.checkpoint.every = 0;
    cfg.checkpoint.resume = Resume::Path(file.to_path_buf());
    cfg
}

/// A step `j` of a half, inside a gather block of several steps on every rank (no
/// round starts at `j`): the middle of the longest run of steps without a round.
fn inside_a_block(rounds: &[usize], steps: usize) -> usize {
    let mut starts = rounds.to_vec();
    starts.push(steps);
    let (a, b) = starts
        .windows(2)
        .map(|w| (w[0], w[1]))
        .max_by_key(|(a, b)| b - a)
        .unwrap();
    assert!(b - a >= 2, "no gather block of several steps: {rounds:?}");
    a + (b - a).div_ceil(2)
}

/// Preempted at P=3, spilled and gathered in blocks, inside a block of the half of
/// `half_of_epoch` (0: rows, 1: columns) in epoch `epoch` (from 0); resumed at P=3
/// spilled and in memory (the same bits as the uninterrupted run) and at P=2 spilled
/// and in memory (the same bits as each other, close to the uninterrupted P=2 run).
fn preempt_and_resume(s: Setting, epoch: u64, half: u64) {
    let data = cnr();
    let cfg = config(data, s);
    let ooc = with_memory(&cfg, TINY_CSR, gather_rows(&cfg, 3000));
    let what = describe(s);
    let mut losses = Vec::new();
    let reference3 = train(3, &cfg);
    let ooc3 = train(3, &ooc);
    assert!(ooc3.spilled() && ooc3.gathers_in_blocks(), "{what}");
    assert_same_bits(
        &ooc3,
        &reference3,
        &format!("{what}, uninterrupted"),
        &mut losses,
    );
    let steps = ooc3.steps_per_half;
    let side_rounds = |o: &Outcome| {
        let (r, c) = &o.layout[0];
        if half == 0 {
            r.rounds.clone()
        } else {
            c.rounds.clone()
        }
    };
    let j = inside_a_block(&side_rounds(&ooc3), steps);
    let step = (epoch * 2 + half) * steps as u64 + j as u64;
    let what = format!("{what}, preempted at P=3 after global step {step} (step {j} of {steps} of half {half}, epoch {})", epoch + 1);
    let dir = tempdir();
    let file = preempt(3, &ooc, step, &dir.path().join("ckpt"));

    // The same rank count: the uninterrupted run's bits in either layout.
    for (layout, c) in [("spilled, in blocks", &ooc), ("in memory", &cfg)] {
        let got = train(
            3,
            &resumed(c, &file, &dir.path().join(format!("p3-{layout}"))),
        );
        let what = format!("{what}, resumed at P=3 {layout}");
        if c.memory.csr_buffer == TINY_CSR {
            assert!(got.spilled() && got.gathers_in_blocks(), "{what}");
        } else {
            assert!(got.in_memory(), "{what}");
        }
        let (dw, dh) = (
            differing(&got.w, &reference3.w),
            differing(&got.h, &reference3.h),
        );
        assert!(
            dw == 0 && dh == 0,
            "{what}: {dw} values of W and {dh} of H differ from the uninterrupted run"
        );
        assert_eq!(got.checksum, reference3.checksum, "{what}: checksum");
        let (a, b) = (
            f64::from_bits(got.final_loss),
            f64::from_bits(reference3.final_loss),
        );
        assert!(
            (a - b).abs() <= 1e-9 * b.abs(),
            "{what}: loss {a} vs the uninterrupted run's {b}"
        );
    }

    // Another rank count: the rows the 3-rank layout had not reached are caught up;
    // spilled and in memory give the same bits, close to the uninterrupted P=2 run.
    let ooc_p2 = train(2, &resumed(&ooc, &file, &dir.path().join("p2-ooc")));
    let mem_p2 = train(2, &resumed(&cfg, &file, &dir.path().join("p2-mem")));
    assert!(ooc_p2.spilled() && ooc_p2.gathers_in_blocks(), "{what}");
    assert!(mem_p2.in_memory(), "{what}");
    assert_same_bits(
        &ooc_p2,
        &mem_p2,
        &format!("{what}, resumed at P=2"),
        &mut losses,
    );
    let reference2 = train(2, &cfg);
    let (dw, dh) = (
        max_rel_diff(&reference2.w_f32(), &ooc_p2.w_f32()),
        max_rel_diff(&reference2.h_f32(), &ooc_p2.h_f32()),
    );
    // As `ckpt::als` of tests/it asks of a resume on another rank count (bf16 tables: one
    // rounding step of bf16 where a sum's order differs).
    let tol = if s.dtype == TableDtype::Bf16 {
        1e-2
    } else {
        1e-5
    };
    assert!(
        dw <= tol && dh <= tol,
        "{what}, resumed at P=2: W {dw:.2e}, H {dh:.2e} from the uninterrupted P=2 run"
    );
    assert_no_loss_mismatch(&losses);
}

#[test]
fn preempted_in_a_spilled_column_half_with_cg_resumes_to_the_same_bits() {
    let _serial = serial();
    preempt_and_resume(SETTINGS[0], 0, 1);
}

#[test]
fn preempted_in_a_spilled_row_half_with_cholesky_resumes_to_the_same_bits() {
    let _serial = serial();
    // --loss-every-half: the row half's loss is not fused into the solves.
    preempt_and_resume(SETTINGS[3], 1, 0);
}

#[test]
fn preempted_in_a_spilled_half_with_bf16_resumes_to_the_same_bits() {
    let _serial = serial();
    preempt_and_resume(SETTINGS[1], 0, 1);
}
