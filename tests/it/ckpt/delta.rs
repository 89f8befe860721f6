//! Incremental checkpoints of the embedding model (`--checkpoint-full-every`) under
//! `mpirun`: writing deltas leaves the training bits alone; a delta chain restores bit
//! for bit (the restore verifies the writer's checksum) on the writer's and on other
//! rank counts, where it continues exactly as a full checkpoint of the same step does;
//! a crash while a delta is written keeps the previous chain; retention keeps every
//! file a retained checkpoint's chain needs; a broken chain is refused (exit 2) naming
//! the file; bf16 deltas are smaller and say that their resume is inexact.

use crate::util;

use std::path::{Path, PathBuf};
use util::{serial, tempdir, tiny_embed, Output, TestCommand};

/// The tiny model, 12 steps at `np` ranks, checkpoints every 2 steps into `dir`.
fn run_cmd(np: usize, dir: &Path, plan: &str, extra: &[&str]) -> TestCommand {
    let d = dir.to_str().unwrap();
    tiny_embed(np, "12", "4")
        .args(["--checkpoint-dir", d, "--plan", plan])
        .args(["--checkpoint-every", "2"])
        .args(extra)
}

fn run(np: usize, dir: &Path, extra: &[&str]) -> Output {
    run_cmd(np, dir, "row_cyclic", extra).run()
}

fn steps(dir: &Path) -> Vec<u64> {
    torusrec::ckpt::list(dir)
        .unwrap()
        .iter()
        .map(|c| c.0)
        .collect()
}

fn at(dir: &Path, step: u64) -> PathBuf {
    dir.join(torusrec::ckpt::file_name(step))
}

/// The manifest's `delta` object of a checkpoint (`None`: a full checkpoint).
fn delta_of(path: &Path) -> Option<Box<torusrec::embed::io::delta::DeltaInfo>> {
    torusrec::embed::io::checkpoint::local_read_manifest(path)
        .unwrap()
        .delta
}

/// Resume `from` at `np` ranks with `plan` into a fresh directory: the final checksum.
fn resumed_checksum(np: usize, plan: &str, from: &Path, extra: &[&str]) -> String {
    let fresh = tempdir();
    let o = run_cmd(
        np,
        fresh.path(),
        plan,
        &[&["--resume", from.to_str().unwrap()], extra].concat(),
    )
    .run();
    o.expect_code(0).stdout_has(&["resumed from", "at step 6"]);
    o.final_checksum()
}

#[test]
fn a_delta_chain_restores_bit_for_bit_on_any_rank_count() {
    let _serial = serial();
    let full = tempdir();
    let delta = tempdir();
    let f = run(2, full.path(), &["--keep", "10"]);
    f.expect_code(0);
    let d = run(
        2,
        delta.path(),
        &["--keep", "10", "--checkpoint-full-every", "3"],
    );
    d.expect_code(0);
    assert_eq!(
        d.final_checksum(),
        f.final_checksum(),
        "deltas change no bit"
    );
    assert_eq!(steps(delta.path()), vec![2, 4, 6, 8, 10, 12]);
    // Full at 2 and 8; 4 on 2, 6 on 4, 10 on 8, 12 on 10.
    let chain: Vec<Option<(String, u64)>> = steps(delta.path())
        .into_iter()
        .map(|s| delta_of(&at(delta.path(), s)).map(|d| (d.file, d.chain)))
        .collect();
    let name = torusrec::ckpt::file_name;
    assert_eq!(
        chain,
        vec![
            None,
            Some((name(2), 1)),
            Some((name(4), 2)),
            None,
            Some((name(8), 1)),
            Some((name(10), 2)),
        ]
    );
    for s in [2u64, 4, 6, 8, 10, 12] {
        assert!(delta_of(&at(full.path(), s)).is_none());
    }
    // Resumed from the delta at step 6 (chain 2, 4, 6): on the writer's rank count the
    // uninterrupted bits; on 1 and 3 ranks (other plans) the bits of a resume from
    // the full checkpoint of step 6. Each restore verified the writer's checksum.
    let d6 = at(delta.path(), 6);
    assert_eq!(
        resumed_checksum(2, "row_cyclic", &d6, &[]),
        f.final_checksum()
    );
    for (np, plan) in [(1, "row_block"), (3, "column")] {
        assert_eq!(
            resumed_checksum(np, plan, &d6, &[]),
            resumed_checksum(np, plan, &at(full.path(), 6), &[]),
            "{np} ranks, plan {plan}"
        );
    }
}

#[test]
fn a_crash_while_writing_a_delta_keeps_the_previous_chain() {
    let _serial = serial();
    let reference = tiny_embed(2, "12", "4")
        .args(["--plan", "row_cyclic"])
        .run();
    reference.expect_code(0);
    let dir = tempdir();
    let args = ["--checkpoint-full-every", "3", "--keep", "2"];
    // Rank 1's third checkpoint turn is the delta of step 6: it dies after writing
    // its part, before the commit.
    let o = run_cmd(2, dir.path(), "row_cyclic", &args)
        .env("TORUSREC_FAULT", "after-shard-write@1#3")
        .run();
    assert!(
        o.code != 0 && o.code != 75 && o.code != 76,
        "the job should die\n{}",
        o.dump()
    );
    o.stderr_has(&["[fault]"]);
    // The chain 2 <- 4 survives (keep 2), with the temporary of 6.
    assert_eq!(steps(dir.path()), vec![2, 4]);
    assert!(dir
        .path()
        .join(format!("{}.partial", torusrec::ckpt::file_name(6)))
        .exists());
    let r = run(2, dir.path(), &[&args[..], &["--resume", "auto"]].concat());
    r.expect_code(0)
        .stdout_has(&["resumed from", "at step 4"])
        .stderr_has(&["removed an incomplete checkpoint"]);
    assert_eq!(r.final_checksum(), reference.final_checksum());
    // The resumed run continued the chain: 6 on 4 (chain 2), 8 full, 10, 12 deltas;
    // keep 2 keeps 12, 10 and 10's base 8.
    assert_eq!(steps(dir.path()), vec![8, 10, 12]);
    assert!(delta_of(&at(dir.path(), 8)).is_none());
    assert_eq!(delta_of(&at(dir.path(), 12)).unwrap().chain, 2);
}

#[test]
fn a_broken_chain_is_refused_naming_the_file() {
    let _serial = serial();
    let full = tempdir();
    let delta = tempdir();
    run(2, full.path(), &["--keep", "10"]).expect_code(0);
    run(
        2,
        delta.path(),
        &["--keep", "10", "--checkpoint-full-every", "3"],
    )
    .expect_code(0);
    // Another file under the name of 6's base (4): not the checkpoint 6 was written on.
    std::fs::copy(at(full.path(), 4), at(delta.path(), 4)).unwrap();
    let fresh = tempdir();
    let d6 = at(delta.path(), 6);
    run(2, fresh.path(), &["--resume", d6.to_str().unwrap()])
        .expect_code(2)
        .stderr_has(&[
            "ckpt-0000000006.h5",
            "ckpt-0000000004.h5",
            "is not the checkpoint it was written on",
        ]);
    // Its base missing.
    std::fs::remove_file(at(delta.path(), 4)).unwrap();
    run(2, fresh.path(), &["--resume", d6.to_str().unwrap()])
        .expect_code(2)
        .stderr_has(&["ckpt-0000000004.h5", "is missing", "chain is broken"]);
}

/// bf16 and int8 deltas (fixed and hash tables): the run itself is exact, the deltas
/// are smaller than f32's (the tiny model's rows are 6 wide, so int8's 8 bytes of
/// range per row make it no smaller than bf16 here), a resume from them works and warns that it is
/// inexact, and the resumed run stays close to the exact one (loss within 1%).
#[test]
fn lossy_deltas_are_smaller_and_say_so() {
    let _serial = serial();
    let size = |p: PathBuf| std::fs::metadata(p).unwrap().len();
    for vocab in [&[][..], &["--vocab", "hash", "--capacity", "1.1x"][..]] {
        let exact = tempdir();
        let args = [vocab, &["--keep", "10", "--checkpoint-full-every", "3"]].concat();
        let e = run(2, exact.path(), &args);
        e.expect_code(0);
        let full = size(at(exact.path(), 6));
        for dtype in ["bf16", "int8"] {
            let lossy = tempdir();
            let l = run(
                2,
                lossy.path(),
                &[&args[..], &["--ckpt-delta-dtype", dtype]].concat(),
            );
            l.expect_code(0);
            assert_eq!(
                l.final_checksum(),
                e.final_checksum(),
                "{dtype}: the run itself is exact"
            );
            let s6 = size(at(lossy.path(), 6));
            assert!(s6 < full, "{vocab:?} {dtype}: {s6} bytes, f32's {full}");
            let fresh = tempdir();
            let d6 = at(lossy.path(), 6);
            let resume = [vocab, &["--resume", d6.to_str().unwrap()]].concat();
            let o = run(2, fresh.path(), &resume);
            o.expect_code(0)
                .stdout_has(&["resumed from", "at step 6"])
                .stderr_has(&[dtype, "lossy", "not the uninterrupted one's bit for bit"]);
            let (a, b) = (o.final_logloss(), e.final_logloss());
            assert!(
                (a - b).abs() < 0.01 * b,
                "{vocab:?} {dtype}: log loss {a} vs exact {b}"
            );
        }
    }
    // A lossy dtype with every checkpoint full would do nothing: refused.
    for dtype in ["bf16", "int8"] {
        run(2, tempdir().path(), &["--ckpt-delta-dtype", dtype])
            .expect_code(2)
            .stderr_has(&["--checkpoint-full-every 2 or more"]);
    }
}

/// Chains written by other placements (column shards, replicas, whole tables) and
/// other table optimizers restore on another rank count and plan: each restore
/// verified the writer's checksum of the whole state.
#[test]
fn chains_of_every_placement_and_optimizer_restore() {
    let _serial = serial();
    for (np, plan, opt) in [
        (3, "column", "rowwise-adagrad"),
        (2, "data_parallel", "rowwise-adagrad"),
        (2, "row_block", "adam"),
        (2, "table", "sgd"),
    ] {
        let dir = tempdir();
        let extra = [
            "--keep",
            "10",
            "--checkpoint-full-every",
            "4",
            "--table-opt",
            opt,
        ];
        run_cmd(np, dir.path(), plan, &extra).run().expect_code(0);
        assert!(delta_of(&at(dir.path(), 6)).is_some());
        let fresh = tempdir();
        let d6 = at(dir.path(), 6);
        let resume = ["--table-opt", opt, "--resume", d6.to_str().unwrap()];
        run_cmd(3 - np % 2, fresh.path(), "row_cyclic", &resume)
            .run()
            .expect_code(0)
            .stdout_has(&["resumed from", "at step 6"]);
    }
}

/// Tables stored at 16 bits (`--table-dtype bf16`, f16) in a delta chain: the chain
/// changes no bit, and a restore from a delta (columns split over 3 ranks, so the
/// delta's rows land in pieces) verifies the writer's checksum and continues as a
/// resume from the full checkpoint of the same step does.
#[test]
fn chains_of_16_bit_tables_restore_bit_for_bit() {
    let _serial = serial();
    for dtype in ["bf16", "f16"] {
        let full = tempdir();
        let delta = tempdir();
        let t = ["--table-dtype", dtype];
        let f = run(2, full.path(), &[&t[..], &["--keep", "10"]].concat());
        f.expect_code(0);
        let args = ["--keep", "10", "--checkpoint-full-every", "3"];
        let d = run(2, delta.path(), &[&t[..], &args[..]].concat());
        d.expect_code(0);
        assert_eq!(d.final_checksum(), f.final_checksum(), "{dtype}");
        let d6 = at(delta.path(), 6);
        assert!(delta_of(&d6).is_some(), "{dtype}: step 6 is a delta");
        assert_eq!(
            resumed_checksum(3, "column", &d6, &t),
            resumed_checksum(3, "column", &at(full.path(), 6), &t),
            "{dtype}: resumed at 3 ranks, plan column"
        );
    }
}

/// Hash tables in a chain (their entries whole in every delta, the changed rows by
/// key): with admission and LFU eviction in a table a third of the id space, and with
/// expiry (TTL), the deltas change no training bit; a resume from a delta continues
/// the uninterrupted run on the writer's rank count (entries back in their slots), and
/// on 1 rank (entries re-sharded by key) as a resume from the full checkpoint of the
/// same step does. Each restore verified the writer's checksum.
#[test]
fn chains_of_hash_tables_restore_bit_for_bit() {
    let _serial = serial();
    let cases: [&[&str]; 2] = [
        &["--capacity", "0.3x", "--admit-after", "2"],
        &["--capacity", "1.1x", "--evict", "ttl:2"],
    ];
    for h in cases {
        let h = [&["--vocab", "hash"][..], h].concat();
        let full = tempdir();
        let delta = tempdir();
        let f = run(2, full.path(), &[&h[..], &["--keep", "10"]].concat());
        f.expect_code(0);
        let args = ["--keep", "10", "--checkpoint-full-every", "3"];
        let d = run(2, delta.path(), &[&h[..], &args[..]].concat());
        d.expect_code(0);
        assert_eq!(d.final_checksum(), f.final_checksum(), "{h:?}");
        let d6 = at(delta.path(), 6);
        assert_eq!(delta_of(&d6).map(|d| d.chain), Some(2), "{h:?}");
        assert_eq!(
            resumed_checksum(2, "row_cyclic", &d6, &h),
            f.final_checksum(),
            "{h:?}: resumed at 2 ranks"
        );
        assert_eq!(
            resumed_checksum(1, "row_cyclic", &d6, &h),
            resumed_checksum(1, "row_cyclic", &at(full.path(), 6), &h),
            "{h:?}: resumed at 1 rank"
        );
    }
}
