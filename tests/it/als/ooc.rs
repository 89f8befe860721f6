//! iALS with the training CSR out of core (`--csr-buffer`, `--spill-dir`) and the
//! fixed table gathered in blocks of steps (`--gather-buffer`): the tables have the
//! same bits, and the loss the same value, as with everything in memory at a given
//! rank count (CG f32, CG bf16, Cholesky; cnr-2000 and a synthetic graph); a spill
//! read error stops every rank with exit 1; the memory limit refuses what cannot fit
//! and otherwise picks gather blocks. Preempted inside a spilled half gathered in
//! blocks, a run resumes to the same bits: `tests/faults` (the preemption is planted
//! through the environment).
//!
//! Most runs use the thread communicator (`comm::threads::run`, the harness in
//! `util::ooc`); `mpirun` (under a timeout) only for process-level behaviour. The
//! tests take [`util::serial`]: each trains on three simulated ranks at a time or
//! starts `mpirun`.

use crate::util;

use std::path::Path;
use std::sync::Mutex;
use torusrec::als::shard::memory::{GatherBuffer, ShardSizes};
use torusrec::als::SolverKind;
use torusrec::bf16::TableDtype;
use torusrec::comm::threads::run;
use torusrec::comm::Comm;
use util::ooc::{
    assert_no_loss_mismatch, assert_same_bits, cnr, config, describe, gather_rows, large_synthetic,
    synthetic, train, try_train, with_memory, Data, Setting, DIM, SETTINGS, TINY_CSR,
};
use util::{rank_codes, serial, tempdir, TestCommand};

// ---------------------------------------------------------------------------------
// 1. a spilled CSR and gathering in blocks give the bits of the in-memory layout

/// At P = 1, 2, 3 and every setting: a tiny and a small CSR buffer give the bits
/// of the CSR in memory.
fn spilled_csr_gives_the_in_memory_bits(data: &Data, name: &str) {
    let mut losses = Vec::new();
    for s in SETTINGS {
        let cfg = config(data, s);
        for p in 1..=3 {
            let what = format!("{name}, {}, P={p}", describe(s));
            let reference = train(p, &cfg);
            assert!(reference.in_memory(), "{what}: {:?}", reference.layout);
            assert!(reference.steps_per_half >= 10, "{what}: too few steps");
            for buf in [TINY_CSR, data.small_csr] {
                let got = train(p, &with_memory(&cfg, buf, GatherBuffer::All));
                let what = format!("{what}, --csr-buffer {buf}");
                assert!(got.spilled(), "{what}: not spilled: {:?}", got.layout);
                for (r, c) in &got.layout {
                    assert!(r.one_gather && c.one_gather, "{what}: {:?}", got.layout);
                    assert!(r.chunks > 1 && c.chunks > 1, "{what}: {:?}", got.layout);
                }
                if buf == data.small_csr {
                    assert!(
                        got.layout.iter().any(|(r, _)| r.max_chunk_steps > 1),
                        "{what}: no chunk of several steps: {:?}",
                        got.layout
                    );
                }
                assert_same_bits(&got, &reference, &what, &mut losses);
            }
        }
    }
    assert_no_loss_mismatch(&losses);
}

#[test]
fn a_spilled_csr_gives_the_in_memory_bits_on_cnr2000() {
    let _serial = serial();
    spilled_csr_gives_the_in_memory_bits(cnr(), "cnr-2000 K=10");
}

#[test]
fn a_spilled_csr_gives_the_in_memory_bits_on_a_synthetic_graph() {
    let _serial = serial();
    spilled_csr_gives_the_in_memory_bits(synthetic(), "synthetic");
}

/// At P = 2, 3 and every setting: gather buffers of one step's rows (a round per
/// step) and of a few steps' rows give the bits of one gather per half, with a tiny
/// and the default CSR buffer (gathering in blocks spills the CSR).
fn gathering_in_blocks_gives_the_in_memory_bits(data: &Data, name: &str, moderate: u64) {
    let mut losses = Vec::new();
    for s in SETTINGS {
        let cfg = config(data, s);
        for p in [2, 3] {
            let what = format!("{name}, {}, P={p}", describe(s));
            let reference = train(p, &cfg);
            assert!(reference.in_memory(), "{what}: {:?}", reference.layout);
            for (rows, buf) in [
                (1, TINY_CSR),
                (moderate, TINY_CSR),
                (moderate, cfg.memory.csr_buffer),
            ] {
                let got = train(p, &with_memory(&cfg, buf, gather_rows(&cfg, rows)));
                let what = format!("{what}, gather buffer of {rows} rows, --csr-buffer {buf}");
                assert!(got.spilled(), "{what}: not spilled: {:?}", got.layout);
                assert!(
                    got.gathers_in_blocks(),
                    "{what}: one gather per half: {:?}",
                    got.layout
                );
                let rounds = got.layout[0].0.rounds.len();
                if rows == 1 {
                    // A block of one step's rows at least: a round at every step.
                    assert_eq!(rounds, got.steps_per_half, "{what}");
                } else {
                    // Blocks of several steps.
                    assert!(rounds < got.steps_per_half, "{what}: {rounds} rounds");
                }
                assert_same_bits(&got, &reference, &what, &mut losses);
            }
        }
    }
    assert_no_loss_mismatch(&losses);
}

#[test]
fn gathering_in_blocks_gives_the_in_memory_bits_on_cnr2000() {
    let _serial = serial();
    gathering_in_blocks_gives_the_in_memory_bits(cnr(), "cnr-2000 K=10", 3000);
}

#[test]
fn gathering_in_blocks_gives_the_in_memory_bits_on_a_synthetic_graph() {
    let _serial = serial();
    gathering_in_blocks_gives_the_in_memory_bits(synthetic(), "synthetic", 1000);
}

// ---------------------------------------------------------------------------------
// 3. spill errors, --spill-dir

/// `als` on `data` with the shared settings and `extra` flags.
fn als(launcher: TestCommand, data: &Data, extra: &[&str]) -> TestCommand {
    let step = data.step_nnz.to_string();
    let dim = DIM.to_string();
    launcher
        .arg("als")
        .arg("--data")
        .arg(&data.path)
        .args([
            "--dim",
            &dim,
            "--epochs",
            "1",
            "--step-nnz",
            &step,
            "--threads",
            "1",
            "--seed",
            "3",
        ])
        .args(extra)
}

#[test]
fn a_spill_read_error_stops_every_rank_with_exit_1() {
    let _serial = serial();
    let data = cnr();
    let dir = tempdir();
    let codes = dir.path().join("codes");
    std::fs::create_dir_all(&codes).unwrap();
    // Rank 1's spill reads fail.
    let run = als(TestCommand::mpirun(2), data, &["--csr-buffer", "4K"])
        .env("TORUSREC_INJECT_SPILL_ERROR", "1")
        .record_rank_codes(&codes)
        .run();
    run.expect_code(0); // the rank-recording wrapper exits 0
    let got = rank_codes(&codes, 2);
    assert_eq!(got, vec![Some(1), Some(1)], "rank codes\n{}", run.dump());
    run.stderr_has(&["spill read", "torusrec-spill-"]);
    assert!(!run.stdout.contains("final:"), "{}", run.dump());

    // One rank: the failure comes from the chunk reader, in the middle of a half.
    let run = als(TestCommand::direct(), data, &["--csr-buffer", "4K"])
        .env("TORUSREC_INJECT_SPILL_ERROR", "0")
        .run();
    run.expect_code(1).stderr_has(&["spill read"]);
    assert!(!run.stdout.contains("final:"), "{}", run.dump());

    // Without the fault the same runs finish.
    als(TestCommand::mpirun(2), data, &["--csr-buffer", "4K"])
        .run()
        .expect_code(0)
        .stdout_has(&["final:"]);
}

#[test]
fn a_spill_dir_that_is_not_a_directory_is_refused_with_exit_2() {
    let _serial = serial();
    let data = cnr();
    let dir = tempdir();
    let missing = dir.path().join("no-such-dir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for bad in [&missing, &file] {
        for launcher in [TestCommand::direct(), TestCommand::mpirun(2)] {
            let run = als(launcher, data, &["--csr-buffer", "4K", "--spill-dir"])
                .arg(bad)
                .run();
            run.expect_code(2)
                .stderr_has(&["--spill-dir", &bad.display().to_string()]);
        }
    }
    // A usable one: the run finishes and leaves nothing there (the spill is unlinked).
    let spill = dir.path().join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let run = als(
        TestCommand::mpirun(2),
        data,
        &["--csr-buffer", "4K", "--spill-dir"],
    )
    .arg(&spill)
    .run();
    run.expect_code(0).stdout_has(&["final:"]);
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0);
}

/// A directory that exists but cannot hold files (procfs: root may write anywhere
/// else): refused on every rank with exit 2, naming the directory, no hang.
#[test]
fn an_unwritable_spill_dir_is_refused_with_exit_2() {
    let _serial = serial();
    let data = cnr();
    let dir = tempdir();
    let codes = dir.path().join("codes");
    std::fs::create_dir_all(&codes).unwrap();
    let run = als(
        TestCommand::mpirun(2),
        data,
        &["--csr-buffer", "4K", "--spill-dir", "/proc"],
    )
    .record_rank_codes(&codes)
    .run();
    run.expect_code(0); // the rank-recording wrapper exits 0
    run.stderr_has(&["--spill-dir /proc", "not writable"]);
    assert!(!run.stdout.contains("final:"), "{}", run.dump());
    let got = rank_codes(&codes, 2);
    assert_eq!(
        got,
        vec![Some(2), Some(2)],
        "an unusable --spill-dir: every rank should exit 2\n{}",
        run.dump()
    );
}

// ---------------------------------------------------------------------------------
// 4. the memory limit

#[test]
fn a_run_that_cannot_fit_is_refused_naming_mem_per_rank() {
    let _serial = serial();
    let data = cnr();
    for launcher in [TestCommand::direct(), TestCommand::mpirun(2)] {
        let run = als(launcher, data, &["--mem-per-rank", "1M"]).run();
        run.expect_code(2).stderr_has(&["--mem-per-rank"]);
        assert!(!run.stdout.contains("final:"), "{}", run.dump());
    }
}

/// Each rank's shard sizes of `path` at `p` ranks.
fn shard_sizes(path: &Path, p: usize) -> Vec<ShardSizes> {
    let mut got = run(p, |c| {
        let seen = Mutex::new(None);
        torusrec::als::shard::read::global_read_shards_admitted(&c, path, &|all, rank| {
            *seen.lock().unwrap() = Some(all[rank]);
            Ok(torusrec::als::shard::memory::Layout::in_memory())
        })
        .unwrap();
        let s = seen.lock().unwrap().take();
        (c.rank(), s.unwrap())
    });
    got.sort_by_key(|x| x.0);
    got.into_iter().map(|x| x.1).collect()
}

#[test]
fn a_moderate_mem_per_rank_gathers_in_blocks_with_the_same_bits() {
    let _serial = serial();
    let data = large_synthetic();
    let s = Setting {
        solver: SolverKind::Cg,
        dtype: TableDtype::F32,
        loss_every_half: false,
    };
    let mut cfg = config(data, s);
    cfg.epochs = 1;
    let p = 2;
    // A limit that leaves every rank room for about the midpoint between the
    // automatic buffer's floor and the whole half's rows: the layout must gather in
    // blocks (the same arithmetic as `memory::layout`).
    let row_bytes = (DIM * 4) as u64;
    let threads = rayon::current_num_threads();
    let limit = shard_sizes(&data.path, p)
        .iter()
        .map(|sz| {
            let whole = sz
                .num_cols
                .min(sz.nnz_rows)
                .max(sz.num_rows.min(sz.nnz_cols));
            let floor = torusrec::als::shard::memory::MIN_GATHER_ROWS;
            assert!(whole > 2 * floor, "the graph is too small: {whole} rows");
            let rest = torusrec::als::shard::memory::estimate_with(
                sz,
                DIM,
                TableDtype::F32,
                false,
                cfg.step_nnz,
                threads,
                &torusrec::als::shard::memory::Layout {
                    csr_in_memory: false,
                    csr_buffer: cfg.memory.csr_buffer,
                    gather_rows: Some(0),
                    hub_chunk: cfg.hub_chunk as u64,
                },
            )
            .total();
            rest + (floor + whole) / 2 * row_bytes
        })
        .max()
        .unwrap();
    let reference = train(p, &cfg);
    assert!(reference.in_memory(), "{:?}", reference.layout);
    let mut limited = cfg.clone();
    limited.mem_per_rank = Some(limit);
    // The layout chosen for this limit must also fit it: a refusal here means the
    // automatic gather buffer left out a part of the estimate that grows with it.
    for (r, x) in try_train(p, &limited).iter().enumerate() {
        if let Err(e) = x {
            panic!(
                "--mem-per-rank {limit} ({:.1} MB) with --gather-buffer auto: rank {r} refused \
                 the layout it chose for that limit: {e}",
                limit as f64 / 1e6
            );
        }
    }
    let got = train(p, &limited);
    assert!(
        got.gathers_in_blocks_somewhere(),
        "--mem-per-rank {limit}: one gather per half: {:?}",
        got.layout
    );
    let mut losses = Vec::new();
    assert_same_bits(
        &got,
        &reference,
        &format!("--mem-per-rank {limit}"),
        &mut losses,
    );
    assert_no_loss_mismatch(&losses);

    // The binary says so at RUST_LOG=info, and prints the in-memory run's checksum.
    let limit = limit.to_string();
    let run = als(TestCommand::mpirun(p), data, &["--mem-per-rank", &limit])
        .env("RUST_LOG", "info")
        .run();
    run.expect_code(0);
    let log = format!("{}{}", run.stdout, run.stderr);
    assert!(
        log.contains("gather in blocks of at most") && log.contains("spilled"),
        "{}",
        run.dump()
    );
    let plain = als(TestCommand::mpirun(p), data, &[]).run();
    plain.expect_code(0);
    assert_eq!(run.final_checksum(), plain.final_checksum());
}

/// `--gather-buffer` of a few steps' rows: the binary logs the blocks and the
/// layout, and prints the checksum of the run that gathers once per half.
#[test]
fn an_explicit_gather_buffer_is_logged_and_keeps_the_checksum() {
    let _serial = serial();
    let data = cnr();
    let plain = als(TestCommand::mpirun(3), data, &[]).run();
    plain.expect_code(0);
    for extra in [
        &["--gather-buffer", "64K"][..],
        &["--gather-buffer", "2K", "--csr-buffer", "4K"][..],
    ] {
        let run = als(TestCommand::mpirun(3), data, extra)
            .env("RUST_LOG", "info")
            .run();
        run.expect_code(0).stderr_has(&[
            "gather in blocks of at most",
            "CSR spilled, read in chunks of",
            "gather rounds per half",
        ]);
        assert_eq!(
            run.final_checksum(),
            plain.final_checksum(),
            "{}",
            run.dump()
        );
    }
}
