//! End-to-end runs of `torusrec embed`, `plan` and `generate clicks` under `mpirun`:
//! every placement at several rank counts, dedup on and off give the same checksum,
//! a click log trains like generated data, and bad input exits 2 on every rank with
//! one message. Checkpoints, preemption and the hold of these runs: `ckpt::embed`.

use crate::util;

use std::path::Path;
use util::{serial, tempdir, tiny_embed, Output, TestCommand};

/// The tiny model's run of 12 steps at `np` ranks with `extra` flags.
fn embed_cmd(np: usize, extra: &[&str]) -> TestCommand {
    tiny_embed(np, "12", "4").args(extra)
}

fn embed(np: usize, extra: &[&str]) -> Output {
    embed_cmd(np, extra).run()
}

#[test]
fn every_placement_runs_and_dedup_does_not_change_the_bits() {
    let _serial = serial();
    for np in [1, 2, 4] {
        let mut sums = Vec::new();
        for plan in [
            "auto",
            "table",
            "row_block",
            "row_cyclic",
            "column",
            "data_parallel",
        ] {
            let o = embed(np, &["--plan", plan]);
            o.expect_code(0)
                .stdout_has(&["plan: ", "step     12/12", "final: eval AUC"]);
            sums.push(o.final_checksum());
        }
        // The same placement, dedup off: the same bits.
        let off = embed(np, &["--plan", "column", "--no-dedup"]);
        off.expect_code(0);
        assert_eq!(
            off.final_checksum(),
            sums[4],
            "P={np}: --no-dedup changed the result"
        );
        // Different placements sum in other orders: close, not equal (checked in
        // `embed::threads`); here they must all have trained.
        assert!(sums.iter().all(|s| s.len() == 16));
    }
}

/// Whether OpenBLAS runs its AVX-512 kernels in this process (and so in the ranks it
/// launches, which inherit `OPENBLAS_CORETYPE` and the CPU).
fn openblas_is_avx512() -> bool {
    let core = torusrec::cpu::openblas_core().to_ascii_lowercase();
    ["skylakex", "cooperlake", "sapphirerapids"]
        .iter()
        .any(|c| core.contains(c))
}

/// The eval AUC on rank 0's `final:` line.
fn final_auc(o: &Output) -> f64 {
    o.stdout
        .lines()
        .find(|l| l.starts_with("final:"))
        .and_then(|l| l.split("eval AUC ").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no AUC\n{}", o.dump()))
}

#[test]
fn the_dense_gemm_option_picks_the_kernel_each_reproducible() {
    let _serial = serial();
    let blas = embed(2, &["--dense-gemm", "openblas"]);
    blas.expect_code(0).stdout_has(&["(openblas GEMM)"]);
    let again = embed(2, &["--dense-gemm", "openblas"]);
    assert_eq!(
        again.final_checksum(),
        blas.final_checksum(),
        "openblas twice"
    );
    let auto = embed(2, &[]);
    auto.expect_code(0);
    if auto.stdout.contains("(torusrec-avx512 GEMM)") {
        // AVX-512 here: `auto` is the AVX-512 kernel, which `avx512` names too; it
        // trains the same model as OpenBLAS.
        let avx = embed(2, &["--dense-gemm", "avx512"]);
        avx.expect_code(0).stdout_has(&["(torusrec-avx512 GEMM)"]);
        assert_eq!(
            avx.final_checksum(),
            auto.final_checksum(),
            "auto is avx512 here"
        );
        // OpenBLAS's own AVX-512 sgemm kernels (SkylakeX and its successors) add the
        // products in the order ours does and give its bits; older cores' kernels
        // (Haswell, Zen, e.g. chosen by OPENBLAS_CORETYPE) round otherwise, which
        // shows that `avx512` ran another kernel than `openblas`.
        if !openblas_is_avx512() {
            assert_ne!(
                avx.final_checksum(),
                blas.final_checksum(),
                "the kernels round alike on OpenBLAS core {}?",
                torusrec::cpu::openblas_core()
            );
        }
        assert!(
            (final_auc(&avx) - final_auc(&blas)).abs() < 0.01,
            "AUC {} against {}",
            final_auc(&avx),
            final_auc(&blas)
        );
    } else {
        // No AVX-512: `auto` is OpenBLAS, and `avx512` is refused before training.
        auto.stdout_has(&["(openblas GEMM)"]);
        assert_eq!(auto.final_checksum(), blas.final_checksum());
        embed(2, &["--dense-gemm", "avx512"])
            .expect_code(2)
            .stderr_has(&["no AVX-512F"]);
    }
}

#[test]
fn a_click_log_trains_and_bad_logs_exit_2_on_every_rank() {
    let _serial = serial();
    let dir = tempdir();
    let log = dir.path().join("clicks.h5");
    TestCommand::direct()
        .args([
            "generate",
            "clicks",
            "--preset",
            "tiny",
            "--examples",
            "5000",
            "--out",
        ])
        .arg(&log)
        .run()
        .expect_code(0)
        .stdout_has(&["clicks: 5,000 examples"]);
    // Refuses to overwrite.
    TestCommand::direct()
        .args([
            "generate",
            "clicks",
            "--preset",
            "tiny",
            "--examples",
            "10",
            "--out",
        ])
        .arg(&log)
        .run()
        .expect_code(2)
        .stderr_has(&["exists"]);
    let o = TestCommand::mpirun(3)
        .args([
            "embed",
            "--global-batch",
            "100",
            "--steps",
            "60",
            "--eval-examples",
            "1000",
            "--threads",
            "1",
            "--data",
        ])
        .arg(&log)
        .run();
    o.expect_code(0).stdout_has(&["final: eval AUC"]);
    // A log shorter than one global batch (4,000 training examples, 8,000 a step):
    // the planner's samples read around its end, and the steps take what there is.
    TestCommand::mpirun(2)
        .args([
            "embed",
            "--batch",
            "4000",
            "--steps",
            "3",
            "--eval-examples",
            "1000",
        ])
        .args(["--threads", "1", "--data"])
        .arg(&log)
        .run()
        .expect_code(0)
        .stdout_has(&["final: eval AUC"]);
    let missing = dir.path().join("nope.h5");
    TestCommand::mpirun(2)
        .args(["embed", "--data"])
        .arg(&missing)
        .run()
        .expect_code(2)
        .occurs("nope.h5", 1);
    let junk = dir.path().join("junk.h5");
    std::fs::write(&junk, b"not hdf5").unwrap();
    TestCommand::mpirun(2)
        .args(["embed", "--data"])
        .arg(&junk)
        .run()
        .expect_code(2);
}

#[test]
fn bad_configs_exit_2_once() {
    let _serial = serial();
    let dir = tempdir();
    let toml = dir.path().join("m.toml");
    std::fs::write(&toml, "[[table]]\nname = \"a\"\nvocab = 100\ndim = 0\n").unwrap();
    TestCommand::mpirun(2)
        .args(["embed", "--tables"])
        .arg(&toml)
        .run()
        .expect_code(2)
        .occurs("dim must be", 1);
    embed(2, &["--mem-per-rank", "1k", "--plan", "table"])
        .expect_code(2)
        .stderr_has(&["--mem-per-rank"]);
    embed(2, &["--plan", "auto", "--mem-per-rank", "1k"]).expect_code(2);
    embed(2, &["--accumulate", "0"])
        .expect_code(2)
        .occurs("--accumulate", 1);
    // Options that would otherwise be ignored are refused.
    embed(2, &["--plan", "table", "--stats", "s.json"])
        .expect_code(2)
        .occurs("--stats acts on --plan auto only", 1);
    embed(2, &["--eval-every", "6"])
        .expect_code(2)
        .occurs("must be a multiple of --log-every 4", 1);
    let d = dir.path().join("ck");
    embed(2, &["--checkpoint-dir", d.to_str().unwrap(), "--keep", "0"])
        .expect_code(2)
        .occurs("--keep 0: must be at least 1", 1);
    // --metrics appends: a file that is not JSON lines (a model, a dataset) is refused.
    let model = dir.path().join("model.h5");
    std::fs::write(&model, b"\x89HDF\r\n\x1a\n").unwrap();
    embed(2, &["--metrics", model.to_str().unwrap()])
        .expect_code(2)
        .occurs("is not a JSON-lines metrics file", 1);
    assert_eq!(std::fs::read(&model).unwrap(), b"\x89HDF\r\n\x1a\n");
    let tiny = ["embed", "--preset", "tiny", "--global-batch", "128"];
    let toml_s = toml.to_str().unwrap();
    for (args, says) in [
        (vec![&tiny[..], &["--keep", "2"]], "--checkpoint-dir"),
        (
            vec![&tiny[..], &["--checkpoint-every", "2"]],
            "--checkpoint-dir",
        ),
        (vec![&tiny[..], &["--release-hold"]], "--checkpoint-dir"),
        (vec![&tiny[..], &["--batch", "64"]], "cannot be used with"),
        (
            vec![&["embed", "--tables", toml_s, "--scale", "2"][..]],
            "cannot be used with",
        ),
    ] {
        TestCommand::mpirun(2)
            .args(args.concat())
            .run()
            .expect_code(2)
            .stderr_has(&[says]);
    }
    let plan3 = dir.path().join("p3.json");
    TestCommand::direct()
        .args([
            "plan", "--preset", "tiny", "--ranks", "3", "--batch", "64", "--out",
        ])
        .arg(&plan3)
        .run()
        .expect_code(0)
        .stdout_has(&["planner", "lookup-greedy"]);
    embed(2, &["--plan", plan3.to_str().unwrap()])
        .expect_code(2)
        .stderr_has(&["made for 3 ranks"]);
}

#[test]
fn pooled_output_mode_trains_over_mpi_with_the_bits_of_rows() {
    let _serial = serial();
    for plan in ["table", "column"] {
        let rows = embed(2, &["--plan", plan, "--output-mode", "rows"]);
        let pooled = embed(2, &["--plan", plan, "--output-mode", "pooled"]);
        rows.expect_code(0).stdout_has(&["output 0 pooled"]);
        pooled
            .expect_code(0)
            .stdout_has(&["output 5 pooled, 0 rows"]);
        assert_eq!(rows.final_checksum(), pooled.final_checksum(), "{plan}");
    }
    // The planner names each table's mode and both modes' bytes.
    let o = TestCommand::direct()
        .args(["plan", "--preset", "tiny", "--ranks", "2", "--batch", "64"])
        .run();
    o.expect_code(0)
        .stdout_has(&["output", "rows MB/step", "pooled MB/step"]);
}

/// `large_allocs_per_step` of every interval of a metrics file, in order.
fn large_allocs(metrics: &Path) -> Vec<f64> {
    std::fs::read_to_string(metrics)
        .expect("metrics written")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .filter(|v| v.get("final").is_none())
        .map(|v| {
            v["large_allocs_per_step"]
                .as_f64()
                .expect("large_allocs_per_step")
        })
        .collect()
}

#[test]
fn a_step_allocates_no_large_buffer_once_its_buffers_have_grown() {
    let _serial = serial();
    let dir = tempdir();
    // Per-table payloads of this shape are well above the 64 KiB that counts.
    for (i, extra) in [
        &["--output-mode", "auto"][..],
        &["--output-mode", "rows"],
        &["--output-mode", "pooled", "--table-opt", "sgd"],
        &["--accumulate", "4"],
        &["--pipeline"],
        // Column shards under row-wise Adagrad sort their rows and exchange row
        // statistics; replicas join the dense all-reduce.
        &["--plan", "column"],
        &["--plan", "data_parallel"],
    ]
    .into_iter()
    .enumerate()
    {
        let m = dir.path().join(format!("m{i}.jsonl"));
        let o = TestCommand::mpirun(2)
            .args(["embed", "--preset", "torchrec-peer", "--scale", "0.05"])
            .args([
                "--global-batch",
                "2048",
                "--steps",
                "24",
                "--log-every",
                "8",
            ])
            .args(["--eval-examples", "1024", "--threads", "1", "--seed", "1"])
            .args(["--preload", "--metrics"])
            .arg(&m)
            .args(extra)
            .run();
        o.expect_code(0);
        let a = large_allocs(&m);
        assert_eq!(a.len(), 3, "{extra:?}: {a:?}");
        // The first steps size the buffers (and show that the counter counts) ...
        assert!(a[0] > 1.0, "{extra:?}: {a:?}");
        // ... after which a step reuses them.
        assert_eq!(
            &a[1..],
            &[0.0, 0.0],
            "{extra:?}: large allocations per step"
        );
    }
}

/// rank 0's `plan: N ...; output ...; memory per rank ...` line.
fn plan_line(o: &Output) -> String {
    o.stdout
        .lines()
        .find(|l| l.starts_with("plan: ") && l.contains("memory per rank"))
        .unwrap_or_else(|| panic!("no plan line\n{}", o.dump()))
        .to_string()
}

#[test]
fn the_plan_a_run_writes_trains_the_same_bits_again_and_is_kept_without_force() {
    let _serial = serial();
    let d = tempdir();
    let p = d.path().join("plan.json");
    let ps = p.to_str().unwrap();
    let auto = embed(
        2,
        &[
            "--plan",
            "auto",
            "--output-mode",
            "pooled",
            "--plan-out",
            ps,
        ],
    );
    auto.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
        .unwrap_or_else(|e| panic!("{ps}: {e}"));
    assert!(v["tables"].as_array().is_some_and(|t| !t.is_empty()), "{v}");
    let written = std::fs::read(&p).unwrap();
    // The written plan (with --output-mode's modes) trains the same bits.
    let again = embed(2, &["--plan", ps]);
    again.expect_code(0);
    assert_eq!(plan_line(&again), plan_line(&auto));
    assert!(
        plan_line(&auto).contains(" 0 rows;"),
        "{}",
        plan_line(&auto)
    );
    assert_eq!(again.final_checksum(), auto.final_checksum());
    // An existing file is refused (exit 2, naming it) before training, untouched...
    let kept = embed(2, &["--plan", "table", "--plan-out", ps]);
    kept.expect_code(2).stderr_has(&[ps]);
    assert!(!kept.stdout.contains("step     12/12"), "{}", kept.dump());
    assert_eq!(std::fs::read(&p).unwrap(), written);
    // ...and replaced with --force.
    embed(2, &["--plan", "table", "--plan-out", ps, "--force"]).expect_code(0);
    assert_ne!(std::fs::read(&p).unwrap(), written);
}
