//! iALS end to end under `mpirun`: the Cholesky solver gives the same tables at 1-4
//! ranks, dedup and all-gather give the same tables with fewer bytes for dedup, and
//! bad input fails with exit 2 on every rank, printed once, without hanging.

use crate::util;

use std::path::Path;
use util::{max_rel_diff, prepare_cnr2000, rank_codes, tempdir, Launcher, TestCommand};

fn prepare(dir: &Path, k: u64) -> std::path::PathBuf {
    let out = dir.join(format!("cnr-k{k}.h5"));
    prepare_cnr2000(TestCommand::direct(), k, &out)
        .run()
        .expect_code(0);
    out
}

fn train(np: usize, data: &Path, out: &Path, extra: &[&str]) -> util::Output {
    let o = train_cmd(np, data, out).args(extra).run();
    o.expect_code(0);
    o
}

/// The `als` command of [`train`] (without its extra arguments).
fn train_cmd(np: usize, data: &Path, out: &Path) -> TestCommand {
    TestCommand::new(Launcher::Mpirun(np))
        .arg("als")
        .arg("--data")
        .arg(data)
        .args([
            "--dim",
            "8",
            "--epochs",
            "3",
            "--threads",
            "1",
            "--reg",
            "0.05",
        ])
        // A fixed sample: recall compared across runs must not depend on their speed.
        .args(["--eval-rows", "10000"])
        .args(["--unobserved-weight", "0.05", "--out"])
        .arg(out)
}

fn tables(path: &Path) -> (Vec<f32>, Vec<f32>) {
    let f = torusrec::io::h5::open(path).unwrap();
    let w = f.dataset("W").unwrap().read_raw::<f32>().unwrap();
    let h = f.dataset("H").unwrap().read_raw::<f32>().unwrap();
    (w, h)
}

/// The exchanged bytes the summary line of rank 0 reports for the "exchange" phase.
fn exchange_bytes(o: &util::Output) -> f64 {
    let line = o
        .stderr
        .lines()
        .find(|l| l.contains("comm exchange:"))
        .unwrap_or_else(|| panic!("no exchange summary:\n{}", o.dump()));
    let after = line.split("calls, ").nth(1).unwrap();
    let mut it = after.split_whitespace();
    let v: f64 = it.next().unwrap().parse().unwrap();
    let unit = it.next().unwrap();
    v * match unit {
        "B" => 1.0,
        "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        u => panic!("unit {u}"),
    }
}

#[test]
fn cholesky_tables_agree_at_1_to_4_ranks() {
    let dir = tempdir();
    let data = prepare(dir.path(), 50);
    let reference = dir.path().join("m1.h5");
    train(1, &data, &reference, &["--solver", "cholesky"]).stdout_has(&["final: Recall@20"]);
    let (w1, h1) = tables(&reference);
    for np in 2..=4 {
        let out = dir.path().join(format!("m{np}.h5"));
        train(np, &data, &out, &["--solver", "cholesky"]).occurs("final: Recall@20", 1);
        let (w, h) = tables(&out);
        assert!(
            max_rel_diff(&w1, &w) < 1e-5,
            "W at P={np}: {}",
            max_rel_diff(&w1, &w)
        );
        assert!(
            max_rel_diff(&h1, &h) < 1e-5,
            "H at P={np}: {}",
            max_rel_diff(&h1, &h)
        );
    }
}

#[test]
fn dedup_and_allgather_agree_and_dedup_moves_fewer_bytes() {
    let dir = tempdir();
    let data = prepare(dir.path(), 10);
    let a = dir.path().join("dedup.h5");
    let b = dir.path().join("allgather.h5");
    let oa = train(4, &data, &a, &["--exchange", "dedup"]);
    let ob = train(4, &data, &b, &["--exchange", "allgather"]);
    assert_eq!(
        tables(&a),
        tables(&b),
        "the two exchanges must give the same tables"
    );
    let (da, db) = (exchange_bytes(&oa), exchange_bytes(&ob));
    assert!(da * 4.0 <= db, "dedup {da} B vs allgather {db} B at P=4");
}

#[test]
fn bad_als_input_exits_2_on_every_rank_once() {
    let dir = tempdir();
    let data = prepare(dir.path(), 50);
    // Not a dataset: an HDF5 model file is the wrong format.
    let not_dataset = dir.path().join("model.h5");
    train(1, &data, &not_dataset, &[]);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--data".into(), not_dataset.display().to_string()],
            "expected \"torusrec-dataset\"",
        ),
        (
            vec![
                "--data".into(),
                data.display().to_string(),
                "--dim".into(),
                "0".into(),
            ],
            "--dim 0",
        ),
        (
            vec![
                "--data".into(),
                dir.path().join("missing.h5").display().to_string(),
            ],
            "no such file",
        ),
        (
            // Refused from the sizes alone, before the shards are read.
            vec![
                "--data".into(),
                data.display().to_string(),
                "--mem-per-rank".into(),
                "1M".into(),
            ],
            "more than 1.0 MB (--mem-per-rank)",
        ),
    ];
    for (args, needle) in cases {
        let codes = dir
            .path()
            .join(format!("codes-{}", needle.replace([' ', '"'], "_")));
        std::fs::create_dir_all(&codes).unwrap();
        let o = TestCommand::new(Launcher::Mpirun(3))
            .arg("als")
            .args(&args)
            .record_rank_codes(&codes)
            .run();
        o.stderr_has(&[needle]).occurs(needle, 1);
        assert_eq!(rank_codes(&codes, 3), vec![Some(2); 3], "{}", o.dump());
    }
    let codes = dir.path().join("codes-torus");
    std::fs::create_dir_all(&codes).unwrap();
    let o = TestCommand::new(Launcher::Mpirun(3))
        .args(["--torus", "2x2", "als", "--data"])
        .arg(&data)
        .record_rank_codes(&codes)
        .run();
    o.stderr_has(&["multiplies to 4"]);
    assert_eq!(rank_codes(&codes, 3), vec![Some(2); 3], "{}", o.dump());
}

/// The final Recall@20 rank 0 prints.
fn final_recall(o: &util::Output) -> f64 {
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("final: Recall@20"))
        .unwrap_or_else(|| panic!("no final line:\n{}", o.dump()));
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// The bytes the first epoch line says training exchanged (`exchanged 208.7 kB`).
fn epoch_exchanged(o: &util::Output) -> f64 {
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("epoch"))
        .unwrap_or_else(|| panic!("no epoch line:\n{}", o.dump()));
    let mut it = line.split("exchanged ").nth(1).unwrap().split_whitespace();
    let v: f64 = it.next().unwrap().parse().unwrap();
    let unit = match it.next().unwrap() {
        "B" => 1.0,
        "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        u => panic!("unit {u}"),
    };
    v * unit
}

fn bf16_table(path: &Path, name: &str) -> Vec<f32> {
    let f = torusrec::io::h5::open(path).unwrap();
    let ds = f.dataset(name).unwrap();
    let dtype: hdf5::types::VarLenUnicode = ds.attr("dtype").unwrap().read_scalar().unwrap();
    assert_eq!(dtype.as_str(), "bf16");
    ds.read_raw::<u16>()
        .unwrap()
        .into_iter()
        .map(|b| f32::from_bits((b as u32) << 16))
        .collect()
}

/// How many entries of two bf16 tables differ, after checking that each differs by at
/// most two steps of bf16's 8-bit significand (a rounding the other way, and what it
/// moves in later epochs).
fn bf16_roundings_apart(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len());
    let mut differ = 0;
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        if x != y {
            differ += 1;
            let step = x.abs().max(y.abs()) * 2f32.powi(-7);
            assert!((x - y).abs() <= 2.0 * step, "entry {i}: {x} against {y}");
        }
    }
    differ
}

#[test]
fn bf16_tables_agree_across_ranks_and_track_f32() {
    let dir = tempdir();
    let data = prepare(dir.path(), 10);
    let f32_out = dir.path().join("f32.h5");
    let r32 = final_recall(&train(2, &data, &f32_out, &["--solver", "cholesky"]));
    let mut reference: Option<(Vec<f32>, Vec<f32>)> = None;
    for np in [1, 3] {
        let out = dir.path().join(format!("bf16-{np}.h5"));
        let o = train(
            np,
            &data,
            &out,
            &["--solver", "cholesky", "--table-dtype", "bf16"],
        );
        let r16 = final_recall(&o);
        assert!(
            (r16 - r32).abs() <= 0.02 * r32,
            "bf16 Recall@20 {r16} vs f32 {r32}"
        );
        // Another rank count adds the Gramian's block sums in another order (the same
        // bits are promised at the same rank count only): a table entry next to a
        // rounding boundary of bf16 may round the other way (3 of 184k at P = 1 and 3
        // with OpenBLAS's SkylakeX kernels; none with its Haswell ones), as f32 tables
        // differ in their last bits.
        let t = (bf16_table(&out, "W"), bf16_table(&out, "H"));
        match &reference {
            None => reference = Some(t),
            Some((w1, h1)) => {
                for (name, a, b) in [("W", w1, &t.0), ("H", h1, &t.1)] {
                    let off = bf16_roundings_apart(a, b);
                    assert!(
                        off * 1000 <= a.len(),
                        "{name} at 1 and {np} ranks: {off} of {} entries differ (more \
                         than 1 in 1000)",
                        a.len()
                    );
                }
            }
        }
    }
    // bf16 moves half the training bytes of f32 with the same plan (the epoch line's
    // figure; the evaluation's traffic is counted apart).
    let a = train(2, &data, &dir.path().join("a.h5"), &[]);
    let b = train(
        2,
        &data,
        &dir.path().join("b.h5"),
        &["--table-dtype", "bf16"],
    );
    let (ea, eb) = (epoch_exchanged(&a), epoch_exchanged(&b));
    assert!(
        eb < 0.52 * ea && eb > 0.45 * ea,
        "bf16 exchanged {eb} B vs f32 {ea} B per epoch"
    );
}

#[test]
fn resume_with_the_other_table_dtype_is_a_hold_naming_both() {
    let dir = tempdir();
    let data = prepare(dir.path(), 50);
    let ck = dir.path().join("ck");
    let run = |dtype: &str, out: &str| {
        TestCommand::new(Launcher::Mpirun(2))
            .arg("als")
            .arg("--data")
            .arg(&data)
            .args(["--dim", "8", "--epochs", "2", "--threads", "1"])
            .args([
                "--table-dtype",
                dtype,
                "--resume",
                "auto",
                "--checkpoint-dir",
            ])
            .arg(&ck)
            .arg("--out")
            .arg(dir.path().join(out))
            .run()
    };
    run("bf16", "a.h5").expect_code(0);
    let o = run("f32", "b.h5");
    o.expect_code(76)
        .stderr_has(&["tables are bf16, this run asks for f32"]);
}

#[test]
fn a_fetch_in_many_small_rounds_gives_the_same_tables() {
    let dir = tempdir();
    let data = prepare(dir.path(), 10);
    let (a, b) = (dir.path().join("a.h5"), dir.path().join("b.h5"));
    train(3, &data, &a, &[]);
    let o = train_cmd(3, &data, &b)
        .env("TORUSREC_FETCH_ROUND_BYTES", "512")
        .run();
    o.expect_code(0);
    assert!(
        tables(&a) == tables(&b),
        "tables differ with 512-byte rounds"
    );
    // Many more all-to-all calls: the round count is reported per phase.
    let calls = |o: &util::Output| -> u64 {
        let line = o
            .stderr
            .lines()
            .find(|l| l.contains("comm exchange:"))
            .unwrap();
        line.split("comm exchange: ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let base = TestCommand::new(Launcher::Mpirun(3))
        .env("RUST_LOG", "info")
        .arg("als")
        .arg("--data")
        .arg(&data)
        .args(["--dim", "8", "--epochs", "1", "--threads", "1"])
        .run();
    let many = TestCommand::new(Launcher::Mpirun(3))
        .env("RUST_LOG", "info")
        .env("TORUSREC_FETCH_ROUND_BYTES", "512")
        .arg("als")
        .arg("--data")
        .arg(&data)
        .args(["--dim", "8", "--epochs", "1", "--threads", "1"])
        .run();
    assert!(
        calls(&many) > 2 * calls(&base),
        "{}\n{}",
        base.dump(),
        many.dump()
    );
}

#[test]
fn torus_and_mpi_collectives_give_the_same_recall_and_report_links() {
    let dir = tempdir();
    let data = prepare(dir.path(), 10);
    for (np, shape) in [(4, "2x2"), (3, "3x1")] {
        let run = |c: &str| {
            let out = dir.path().join(format!("m-{np}-{c}.h5"));
            train(
                np,
                &data,
                &out,
                &["--torus", shape, "--collectives", c, "--force"],
            )
        };
        let (t, m) = (run("torus"), run("mpi"));
        let (rt, rm) = (final_recall(&t), final_recall(&m));
        assert!((rt - rm).abs() < 5e-5, "{shape}: torus {rt} vs mpi {rm}");
        t.stderr_has(&[
            "links (torus ",
            "torus collectives, measured",
            "links exchange: busiest",
        ]);
        m.stderr_has(&["MPI collectives; computed", "all-to-all"]);
    }
    // An unknown algorithm is a usage error on every rank.
    TestCommand::new(Launcher::Mpirun(2))
        .args(["--collectives", "ring", "als", "--data"])
        .arg(&data)
        .run()
        .expect_code(2);
}

#[test]
fn collectives_cut_into_pieces_give_the_same_dataset_and_tables() {
    // TORUSREC_MPI_MAX_COUNT lowers the most elements one MPI all-reduce or
    // all-gather is given (2^30 otherwise, under MPI's 32-bit counts), so that the
    // pieces of graphs past 2^31 nodes are exercised on cnr-2000.
    let dir = tempdir();
    let prep = |name: &str, max: Option<&str>| {
        let out = dir.path().join(name);
        let mut c = prepare_cnr2000(TestCommand::mpirun(2), 50, &out);
        if let Some(m) = max {
            c = c.env("TORUSREC_MPI_MAX_COUNT", m);
        }
        c.run().expect_code(0);
        out
    };
    let whole = prep("whole.h5", None);
    let pieces = prep("pieces.h5", Some("1000"));
    let (m1, m2) = (dir.path().join("m1.h5"), dir.path().join("m2.h5"));
    train(2, &whole, &m1, &[]);
    let o = train_cmd(2, &pieces, &m2)
        .env("TORUSREC_MPI_MAX_COUNT", "7")
        .run();
    o.expect_code(0);
    assert!(tables(&m1) == tables(&m2), "the tables differ");
}

#[test]
fn a_signal_during_any_pass_of_prepare_stops_every_rank_with_nothing_written() {
    let dir = tempdir();
    let out = dir.path().join("cnr.h5");
    for pass in ["degrees", "filter", "split+write", "transpose"] {
        prepare_cnr2000(TestCommand::mpirun(2), 10, &out)
            .env("TORUSREC_PREEMPT_IN", pass)
            .run()
            .expect_code(1)
            .occurs(&format!("during the {pass} pass of prepare"), 1);
        assert!(!out.exists(), "{pass}: the output exists");
        let temp = torusrec::io::outfile::temp_path(&out);
        assert!(!temp.exists(), "{pass}: {} left", temp.display());
    }
}
