//! `embed --arch dlrm|dcnv2` end to end under `mpirun`: they train at 1 and 2 ranks
//! (the loss falls), a run's bits do not depend on the thread count where the dense
//! step is not cut into blocks, a preempted and resumed run equals the uninterrupted
//! one, and options of another architecture are refused with exit 2.

use crate::util;

use util::{serial, tempdir, tiny_embed, Output, TestCommand};

const DLRM: &[&str] = &[
    "--arch",
    "dlrm",
    "--dim",
    "8",
    "--bottom-mlp",
    "16,8",
    "--top-mlp",
    "16",
];
const DCN_STACKED: &[&str] = &["--arch", "dcnv2", "--cross-layers", "2"];
const DCN_PARALLEL: &[&str] = &[
    "--arch",
    "dcnv2",
    "--cross-layers",
    "2",
    "--cross-rank",
    "4",
    "--dcn-structure",
    "parallel",
];

/// [`tiny_embed`] with `threads` threads per rank.
fn tiny_threads(np: usize, threads: &str) -> TestCommand {
    TestCommand::mpirun(np).args([
        "embed",
        "--preset",
        "tiny",
        "--global-batch",
        "128",
        "--steps",
        "24",
        "--log-every",
        "4",
        "--eval-examples",
        "2048",
        "--table-lr",
        "0.05",
        "--dense-lr",
        "0.01",
        "--threads",
        threads,
    ])
}

fn run(np: usize, arch: &[&str], extra: &[&str]) -> Output {
    tiny_embed(np, "24", "4").args(arch).args(extra).run()
}

/// The training losses of the step lines, in order.
fn losses(o: &Output) -> Vec<f64> {
    o.stdout
        .lines()
        .filter(|l| l.starts_with("step "))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.position(|t| t == "loss")?;
            w.next()?.parse().ok()
        })
        .collect()
}

#[test]
fn dlrm_and_dcnv2_train_at_one_and_two_ranks_and_threads_keep_the_bits() {
    let _serial = serial();
    for arch in [DLRM, DCN_STACKED, DCN_PARALLEL] {
        for np in [1, 2] {
            let o = run(np, arch, &[]);
            o.expect_code(0).stdout_has(&["final: eval AUC"]);
            let l = losses(&o);
            assert!(l.len() == 6, "{arch:?} P={np}: {l:?}\n{}", o.dump());
            assert!(l[5] < l[0], "{arch:?} P={np}: the loss did not fall: {l:?}");
            // 64 examples per rank at P = 2: below the 64 x threads rows at which
            // the dense step is cut into blocks, so 2 threads give the bits of 1
            // (at P = 1 the blocks sum in another order, as documented).
            if np == 1 {
                continue;
            }
            let t2 = tiny_threads(np, "2").args(arch).run();
            t2.expect_code(0);
            assert_eq!(t2.final_checksum(), o.final_checksum(), "{arch:?} P={np}");
        }
    }
}

#[test]
fn a_preempted_dlrm_or_dcnv2_run_resumes_exactly() {
    let _serial = serial();
    for arch in [DLRM, DCN_PARALLEL] {
        let reference = run(2, arch, &["--plan", "row_cyclic"]);
        reference.expect_code(0);
        let dir = tempdir();
        let d = dir.path().to_str().unwrap();
        let ck = ["--plan", "row_cyclic", "--checkpoint-dir", d];
        tiny_embed(2, "24", "4")
            .args(arch)
            .args(ck)
            .env("TORUSREC_PREEMPT_AT", "9")
            .run()
            .expect_code(75);
        let r = run(2, arch, &[&ck[..], &["--resume", "auto"]].concat());
        r.expect_code(0).stdout_has(&["resumed from"]);
        assert_eq!(r.final_checksum(), reference.final_checksum(), "{arch:?}");
        // The checkpoint of this arch is refused by a run of another.
        let other = run(
            2,
            &["--arch", "mlp"],
            &[&ck[..], &["--resume", "auto"]].concat(),
        );
        assert_ne!(other.code, 0, "{}", other.dump());
    }
}

#[test]
fn options_of_another_arch_are_refused() {
    let _serial = serial();
    for (args, needle) in [
        (
            &["--arch", "mlp", "--cross-layers", "2"][..],
            "cross_layers",
        ),
        (&["--bottom-mlp", "8"][..], "bottom_mlp"),
        (&["--arch", "dcnv2", "--top-mlp", "8"][..], "top_mlp"),
        (
            &["--arch", "dlrm", "--dcn-structure", "parallel"][..],
            "dcn_structure",
        ),
        (&["--arch", "dlrm"][..], "\"b\" (dim 4)"),
        (
            &["--arch", "dlrm", "--dim", "8", "--bottom-mlp", "16,4"][..],
            "D = 4",
        ),
        (&["--arch", "dcnv2", "--cross-rank", "0"][..], "cross_rank"),
        (
            &["--arch", "dlrm", "--dim", "8", "--top-mlp", "4,x"][..],
            "--top-mlp",
        ),
    ] {
        let o = tiny_embed(1, "2", "1").args(args).run();
        o.expect_code(2).stderr_has(&[needle]);
    }
}
