//! `als` checks every array it reads before training: a corrupt CSR (decreasing or
//! shifted `indptr`, an id out of range, a duplicated column, a `/train_t` that is not
//! the transpose of `/train`, an id space larger than u32 ids can name) exits 2 naming
//! the dataset and the first bad entry, on every rank, never a panic or a silent run.

use crate::util;

use std::path::{Path, PathBuf};
use util::{cnr2000_k10, h5_read, h5_write, rank_codes, tempdir, TestCommand};

/// A copy of the dataset with `mutate` applied.
fn corrupt(dir: &Path, tag: &str, mutate: impl FnOnce(&Path)) -> PathBuf {
    let p = dir.join(format!("{tag}.h5"));
    std::fs::copy(cnr2000_k10(), &p).unwrap();
    mutate(&p);
    p
}

/// Train on `data` at `np` ranks; every rank must exit 2 with all `needles` in stderr.
fn refused(data: &Path, np: usize, needles: &[&str]) {
    let dir = tempdir();
    let codes = dir.path().join("codes");
    std::fs::create_dir_all(&codes).unwrap();
    let cmd = if np == 1 {
        TestCommand::direct()
    } else {
        TestCommand::mpirun(np).record_rank_codes(&codes)
    };
    let run = cmd
        .arg("als")
        .arg("--data")
        .arg(data)
        .args(["--dim", "8", "--epochs", "1", "--threads", "1"])
        .run();
    if np == 1 {
        run.expect_code(2);
    } else {
        assert_eq!(
            rank_codes(&codes, np),
            vec![Some(2); np],
            "rank exit codes\n{}",
            run.dump()
        );
    }
    run.stderr_has(needles);
    assert!(
        !run.stdout.contains("edges/s") && !run.stdout.contains("final:"),
        "it trained:\n{}",
        run.dump()
    );
}

#[test]
fn corrupt_csr_arrays_are_refused_with_exit_2_naming_dataset_and_entry() {
    let dir = tempdir();
    let d = dir.path();
    let ip: Vec<u64> = h5_read(cnr2000_k10(), "train/indptr");
    let idx: Vec<u32> = h5_read(cnr2000_k10(), "train/indices");
    // A row with at least two arcs, away from the ends.
    let row = (ip.len() / 2..ip.len() - 1)
        .find(|&r| ip[r + 1] - ip[r] >= 2)
        .unwrap();
    let (a, b) = (ip[row] as usize, ip[row + 1] as usize);

    let p = corrupt(d, "decreasing", |p| {
        let mut v = ip.clone();
        v[row + 1] = v[row] - 1;
        h5_write(p, "train/indptr", &v);
    });
    refused(
        &p,
        1,
        &["train/indptr", &format!("decreases at entry {}", row + 1)],
    );
    refused(&p, 2, &["train/indptr", "decreases"]);

    let p = corrupt(d, "shifted", |p| {
        let v: Vec<u64> = ip.iter().map(|x| x + 1).collect();
        h5_write(p, "train/indptr", &v);
    });
    refused(&p, 1, &["train/indptr", "starts at 1, expected 0"]);

    let p = corrupt(d, "duplicate", |p| {
        let mut v = idx.clone();
        v[a + 1] = v[a];
        h5_write(p, "train/indices", &v);
    });
    refused(
        &p,
        1,
        &[
            "train/indices",
            &format!("row {row} is not sorted and distinct"),
        ],
    );

    let p = corrupt(d, "out-of-range", |p| {
        let mut v = idx.clone();
        v[b - 1] = u32::MAX;
        h5_write(p, "train/indices", &v);
    });
    refused(
        &p,
        1,
        &["train/indices", &format!("row {row} has id {}", u32::MAX)],
    );
    refused(&p, 2, &["train/indices", "has id"]);

    // The same count per column but another arc: only the transpose check sees it.
    let tip: Vec<u64> = h5_read(cnr2000_k10(), "train_t/indptr");
    let tidx: Vec<u32> = h5_read(cnr2000_k10(), "train_t/indices");
    let col = (0..tip.len() - 1)
        .find(|&c| {
            let r = &tidx[tip[c] as usize..tip[c + 1] as usize];
            r.len() >= 2 && r[1] > r[0] + 1
        })
        .unwrap();
    let p = corrupt(d, "not-transpose", |p| {
        let mut v = tidx.clone();
        v[tip[col] as usize] += 1;
        h5_write(p, "train_t/indices", &v);
    });
    refused(&p, 1, &["train_t/indices", "not the transpose of /train"]);
    refused(&p, 2, &["train_t/indices", "not the transpose of /train"]);

    let p = corrupt(d, "huge-num-rows", |p| {
        let f = torusrec::io::h5::open_rw(p).unwrap();
        f.attr("num_rows").unwrap().write_scalar(&u64::MAX).unwrap();
    });
    refused(&p, 1, &["num_rows", "exceeds the 2^32 ids"]);

    let p = corrupt(d, "num-rows-off-by-one", |p| {
        let f = torusrec::io::h5::open_rw(p).unwrap();
        let n: u64 = f.attr("num_rows").unwrap().read_scalar().unwrap();
        f.attr("num_rows").unwrap().write_scalar(&(n + 1)).unwrap();
    });
    refused(&p, 1, &["train/indptr", "entries, expected"]);

    let test_rows: Vec<u32> = h5_read(cnr2000_k10(), "test/rows");
    let p = corrupt(d, "test-row-with-arcs", |p| {
        let mut v = test_rows.clone();
        // A row with training arcs, between its neighbours in the list.
        let k = (1..v.len())
            .find(|&k| (v[k - 1] + 1..v[k]).any(|r| ip[r as usize + 1] > ip[r as usize]))
            .unwrap();
        let r = (v[k - 1] + 1..v[k])
            .find(|&r| ip[r as usize + 1] > ip[r as usize])
            .unwrap();
        v[k] = r;
        h5_write(p, "test/rows", &v);
    });
    refused(&p, 1, &["train/indices", "has training arcs"]);

    let hip: Vec<u64> = h5_read(cnr2000_k10(), "test/holdout/indptr");
    let p = corrupt(d, "empty-holdout", |p| {
        let mut v = hip.clone();
        v[1] = v[0];
        h5_write(p, "test/holdout/indptr", &v);
    });
    refused(
        &p,
        1,
        &["test/holdout/indptr", "test row 0 has no held-out arc"],
    );
}

#[test]
fn thread_counts_beyond_8_per_core_are_refused() {
    for bad in ["100000", "0", "many"] {
        let run = TestCommand::direct()
            .arg("als")
            .arg("--data")
            .arg(cnr2000_k10())
            .args(["--dim", "8", "--epochs", "1", "--threads", bad])
            .run();
        run.expect_code(2);
        run.stderr_has(&["--threads"]);
    }
    let huge = "7".repeat(5000);
    let run = TestCommand::direct()
        .arg("als")
        .arg("--data")
        .arg(cnr2000_k10())
        .args(["--threads", &huge])
        .run();
    run.expect_code(2);
    assert!(
        run.stderr.lines().all(|l| l.len() < 400),
        "an error line quotes the whole 5000-character token:\n{}",
        &run.stderr[..run.stderr.len().min(2000)]
    );
}
