//! End-to-end tests of the `torusrec` binary: run directly and under `mpirun`, always
//! under a timeout (see `util`). Checks exit codes, printed output, and the prepared
//! files read back through the library.

use crate::util;

use std::path::{Path, PathBuf};
use torusrec::data::graph::dataset::Dataset;
use util::{cnr2000, group, rank_codes, tempdir, Launcher, TestCommand};

// ---------------------------------------------------------------------------------
// helpers

/// `torusrec prepare --format bv` of the bundled cnr-2000 graph.
fn prepare_cnr(launcher: Launcher, k: u64, seed: u64, out: &Path) -> util::Output {
    util::prepare_cnr2000(TestCommand::new(launcher), k, out)
        .args(["--seed", &seed.to_string()])
        .run()
}

#[track_caller]
fn read(path: &Path) -> Dataset {
    Dataset::read(path).unwrap_or_else(|e| panic!("Dataset::read({}): {e}", path.display()))
}

/// The files in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Neither the output nor a `*.partial` temporary exists in the (otherwise empty)
/// output directory.
#[track_caller]
fn assert_no_output(out_dir: &Path, run: &util::Output) {
    assert!(
        listing(out_dir).is_empty(),
        "output directory not empty after a failed run: {:?}\n{}",
        listing(out_dir),
        run.dump()
    );
}

/// Row-major coordinates of `rank` in a torus of `dims`.
fn coords(dims: &[usize], rank: usize) -> Vec<usize> {
    let mut c = vec![0; dims.len()];
    let mut r = rank;
    for d in (0..dims.len()).rev() {
        c[d] = r % dims[d];
        r /= dims[d];
    }
    c
}

fn rank_of(dims: &[usize], c: &[usize]) -> usize {
    c.iter().zip(dims).fold(0, |acc, (&x, &d)| acc * d + x)
}

/// The lines `selftest` prints for a periodic torus of `dims` (computed here
/// independently of the library).
fn expected_torus_lines(dims: &[usize]) -> Vec<String> {
    let p: usize = dims.iter().product();
    let shape = dims
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x");
    let mut lines = vec![format!("torus {shape} ({p} ranks)")];
    for r in 0..p {
        let c = coords(dims, r);
        let nbrs = (0..dims.len())
            .map(|d| {
                let mut down = c.clone();
                down[d] = (c[d] + dims[d] - 1) % dims[d];
                let mut up = c.clone();
                up[d] = (c[d] + 1) % dims[d];
                format!("d{d}: -{} +{}", rank_of(dims, &down), rank_of(dims, &up))
            })
            .collect::<Vec<_>>()
            .join(", ");
        lines.push(format!("  rank {r}: coords {c:?}, neighbours {nbrs}"));
    }
    lines
}

/// Run `selftest` and check the torus lines it prints.
fn check_selftest(launcher: Launcher, torus: Option<&str>, dims: &[usize]) {
    let mut cmd = TestCommand::new(launcher);
    if let Some(t) = torus {
        cmd = cmd.args(["--torus", t]);
    }
    let out = cmd.arg("selftest").run();
    out.expect_code(0)
        .stdout_has(&["selftest passed"])
        .occurs("selftest passed", 1);
    let got: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("torus ") || l.starts_with("  rank "))
        .collect();
    assert_eq!(
        got,
        expected_torus_lines(dims),
        "torus lines of a {dims:?} torus\n{}",
        out.dump()
    );
}

/// Field-by-field comparison with short messages (a failed `assert_eq!` on two whole
/// datasets would print megabytes).
#[track_caller]
fn assert_same_dataset(a: &Dataset, b: &Dataset, what: &str) {
    assert_eq!(a.meta, b.meta, "{what}: root attributes differ");
    let first_diff = |x: &[u64], y: &[u64]| x.iter().zip(y).position(|(p, q)| p != q);
    let first_diff32 = |x: &[u32], y: &[u32]| x.iter().zip(y).position(|(p, q)| p != q);
    for (name, x, y) in [
        ("train", &a.train, &b.train),
        ("train_t", &a.train_t, &b.train_t),
        ("test/fold", &a.fold, &b.fold),
        ("test/holdout", &a.holdout, &b.holdout),
    ] {
        assert!(
            x.indptr == y.indptr,
            "{what}: {name}/indptr differs (lengths {} vs {}, first difference at {:?})",
            x.indptr.len(),
            y.indptr.len(),
            first_diff(&x.indptr, &y.indptr)
        );
        assert!(
            x.targets == y.targets,
            "{what}: {name}/indices differs (lengths {} vs {}, first difference at {:?})",
            x.targets.len(),
            y.targets.len(),
            first_diff32(&x.targets, &y.targets)
        );
    }
    assert!(
        a.test_rows == b.test_rows,
        "{what}: test/rows differs ({} vs {} rows, first difference at {:?})",
        a.test_rows.len(),
        b.test_rows.len(),
        first_diff32(&a.test_rows, &b.test_rows)
    );
    assert!(a.node_ids == b.node_ids, "{what}: node_ids differ");
    assert!(a == b, "{what}: datasets differ");
}

// ---------------------------------------------------------------------------------
// 1. selftest

#[test]
fn selftest_under_mpirun_at_1_to_4_ranks() {
    // Default shape: MPI_Dims_create in 2-D.
    let default_dims = [[1, 1], [2, 1], [3, 1], [2, 2]];
    for (np, dims) in (1..=4).zip(default_dims) {
        check_selftest(Launcher::Mpirun(np), None, &dims);
    }
}

#[test]
fn selftest_singleton_without_mpirun() {
    check_selftest(Launcher::Direct, None, &[1, 1]);
}

#[test]
fn selftest_explicit_torus_shapes() {
    let lines = expected_torus_lines(&[2, 2]);
    assert_eq!(
        lines[1],
        "  rank 0: coords [0, 0], neighbours d0: -2 +2, d1: -1 +1"
    );
    check_selftest(Launcher::Mpirun(4), Some("2x2"), &[2, 2]);
    check_selftest(Launcher::Mpirun(3), Some("3x1"), &[3, 1]);
    check_selftest(Launcher::Mpirun(3), Some("1x3"), &[1, 3]);
    check_selftest(Launcher::Mpirun(4), Some("2x1x2"), &[2, 1, 2]);
}

#[test]
fn selftest_torus_not_matching_world_size_fails_once_on_every_rank() {
    let out = TestCommand::mpirun(4)
        .args(["--torus", "3x2", "selftest"])
        .run();
    out.expect_code(2)
        .stderr_has(&["multiplies to 6", "4 ranks"])
        .occurs("multiplies to 6", 1);
    assert!(!out.stdout.contains("selftest passed"), "{}", out.dump());

    // Every rank (not just the first to exit) exits 2.
    let d = tempdir();
    let out = TestCommand::mpirun(4)
        .args(["--torus", "3x2", "selftest"])
        .record_rank_codes(d.path())
        .run();
    out.occurs("multiplies to 6", 1);
    assert_eq!(
        rank_codes(d.path(), 4),
        vec![Some(2); 4],
        "per-rank exit codes\n{}",
        out.dump()
    );

    // A malformed shape is a command-line error too.
    TestCommand::mpirun(2)
        .args(["--torus", "2xa", "selftest"])
        .run()
        .expect_code(2)
        .occurs("positive integers", 1);
}

// ---------------------------------------------------------------------------------
// 2. prepare: reference counts of docs/design.md

#[test]
fn prepare_cnr2000_reproduces_reference_counts() {
    let d = tempdir();
    let reference = [
        (1u64, 238_598u64, 2_892_560u64),
        (10, 22_988, 477_754),
        (50, 1_121, 19_485),
    ];
    for (k, nodes, arcs) in reference {
        let out_path = d.path().join(format!("k{k}.h5"));
        let out = prepare_cnr(Launcher::Direct, k, 42, &out_path);
        out.expect_code(0).stdout_has(&[
            "325,557 nodes, 3,216,152 arcs",
            &format!("-> K = {k}: {} nodes, {} arcs", group(nodes), group(arcs)),
        ]);
        let ds = read(&out_path);
        assert_eq!(ds.meta.num_rows, nodes, "K = {k}: num_rows");
        assert_eq!(ds.meta.num_cols, nodes, "K = {k}: num_cols");
        assert_eq!(ds.num_arcs(), arcs, "K = {k}: arcs");
        assert_eq!(ds.node_ids.len() as u64, nodes, "K = {k}: node_ids");
        assert_eq!(
            (ds.meta.min_links, ds.meta.seed),
            (k, 42),
            "K = {k}: attributes"
        );
        assert_eq!(
            (ds.meta.source_nodes, ds.meta.source_arcs),
            (325_557, 3_216_152),
            "K = {k}: source attributes"
        );
        // The split line agrees with the file.
        out.stdout_has(&[&format!(
            "split (seed 42): {} test rows ({} visible + {} held-out arcs), {} training arcs",
            group(ds.test_rows.len() as u64),
            group(ds.fold.num_arcs()),
            group(ds.holdout.num_arcs()),
            group(ds.train.num_arcs())
        )]);
        assert!(
            !Path::new(&format!("{}.partial", out_path.display())).exists(),
            "K = {k}: a .partial file remains"
        );
    }
    assert_eq!(listing(d.path()), ["k1.h5", "k10.h5", "k50.h5"]);
}

// ---------------------------------------------------------------------------------
// 3. the split: rank-independent, and of the documented sizes

/// Every row's arcs in the kept graph (training, or fold-in + holdout for a test row).
fn all_rows(ds: &Dataset) -> Vec<Vec<u32>> {
    let mut rows: Vec<Vec<u32>> = (0..ds.meta.num_rows as usize)
        .map(|u| ds.train.row(u).to_vec())
        .collect();
    for (i, &r) in ds.test_rows.iter().enumerate() {
        let row = &mut rows[r as usize];
        assert!(row.is_empty(), "test row {r} has training arcs");
        row.extend_from_slice(ds.fold.row(i));
        row.extend_from_slice(ds.holdout.row(i));
        row.sort_unstable();
    }
    rows
}

#[test]
fn split_is_identical_on_1_and_3_ranks_and_has_documented_sizes() {
    let d = tempdir();
    let p1 = d.path().join("k10-np1.h5");
    let p3 = d.path().join("k10-np3.h5");
    let p4 = d.path().join("k10-np4.h5");
    prepare_cnr(Launcher::Direct, 10, 42, &p1).expect_code(0);
    prepare_cnr(Launcher::Mpirun(3), 10, 42, &p3)
        .expect_code(0)
        .stdout_has(&["on 3 rank(s)", "-> K = 10: 22,988 nodes, 477,754 arcs"])
        .occurs("-> K = 10:", 1);
    let out4 = TestCommand::mpirun(4)
        .args(["--torus", "2x2", "prepare", "--input"])
        .arg(cnr2000())
        .args([
            "--format",
            "bv",
            "--min-links",
            "10",
            "--seed",
            "42",
            "--out",
        ])
        .arg(&p4)
        .run();
    out4.expect_code(0);
    let ds1 = read(&p1);
    let ds3 = read(&p3);
    let ds4 = read(&p4);
    assert_same_dataset(&ds1, &ds3, "1 rank vs 3 ranks");
    assert_same_dataset(&ds1, &ds4, "1 rank vs 4 ranks (2x2)");

    // floor(r/10) test rows among the r rows with at least one arc.
    let nonempty_train = (0..ds1.train.num_rows())
        .filter(|&u| !ds1.train.row(u).is_empty())
        .count();
    let t = ds1.test_rows.len();
    let r = nonempty_train + t;
    assert_eq!(t, r / 10, "test rows: r = {r}");
    assert!(t > 0);
    // Each holdout has max(1, floor(n/4)) arcs, n = the row's arcs.
    for (i, &row) in ds1.test_rows.iter().enumerate() {
        let (f, h) = (ds1.fold.row(i).len(), ds1.holdout.row(i).len());
        let n = f + h;
        assert_eq!(
            h,
            (n / 4).max(1),
            "test row {row}: {f} visible + {h} held out"
        );
    }
    assert_eq!(ds1.num_arcs(), 477_754);

    // Another seed splits the same graph differently.
    let p7 = d.path().join("k10-seed7.h5");
    prepare_cnr(Launcher::Mpirun(2), 10, 7, &p7)
        .expect_code(0)
        .stdout_has(&["split (seed 7):"]);
    let ds7 = read(&p7);
    assert_eq!(ds7.meta.seed, 7);
    assert_eq!(
        ds7.node_ids, ds1.node_ids,
        "the kept nodes do not depend on the seed"
    );
    assert_eq!(
        ds7.test_rows.len(),
        t,
        "the test-row count does not depend on the seed"
    );
    assert_ne!(
        ds7.test_rows, ds1.test_rows,
        "seeds 7 and 42 chose the same test rows"
    );
    assert!(
        all_rows(&ds7) == all_rows(&ds1),
        "train + fold + holdout is not the same graph for seeds 7 and 42"
    );
}

// ---------------------------------------------------------------------------------
// 4. inspect

#[test]
fn inspect_prints_valid_and_the_counts() {
    let d = tempdir();
    let p = d.path().join("k10.h5");
    prepare_cnr(Launcher::Direct, 10, 42, &p).expect_code(0);
    let ds = read(&p);
    let max_out = (0..ds.train.num_rows())
        .map(|u| ds.train.row(u).len())
        .max()
        .unwrap();
    let nonempty_out = (0..ds.train.num_rows())
        .filter(|&u| !ds.train.row(u).is_empty())
        .count();
    let expected = [
        format!("{}: torusrec dataset v1, valid", p.display()),
        format!(
            "source: bv:{} (325,557 nodes, 3,216,152 arcs)",
            cnr2000().display()
        ),
        "variant: K = 10, seed 42: 22,988 nodes, 477,754 arcs".to_string(),
        format!(
            "train: {} arcs; test: {} rows, {} visible + {} held-out arcs",
            group(ds.train.num_arcs()),
            group(ds.test_rows.len() as u64),
            group(ds.fold.num_arcs()),
            group(ds.holdout.num_arcs())
        ),
        format!(
            "train out-degree: {} non-empty; min ",
            group(nonempty_out as u64)
        ),
        format!(", max {max_out}\n"),
    ];
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    for launcher in [Launcher::Direct, Launcher::Mpirun(2)] {
        let out = TestCommand::new(launcher).arg("inspect").arg(&p).run();
        out.expect_code(0)
            .stdout_has(&expected)
            .occurs("valid", 1)
            .stdout_has(&["train in-degree: "]);
    }
}

// ---------------------------------------------------------------------------------
// 5. bad inputs

/// A failing `prepare` of `input`: exit 2, every needle in stderr (once), nothing
/// left in the output directory.
#[track_caller]
fn prepare_fails(launcher: Launcher, input: &Path, format: &str, extra: &[&str], needles: &[&str]) {
    let d = tempdir();
    let out_dir = d.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let out = TestCommand::new(launcher)
        .args(["prepare", "--format", format, "--input"])
        .arg(input)
        .args(extra)
        .arg("--out")
        .arg(out_dir.join("d.h5"))
        .run();
    out.expect_code(2).stderr_has(needles);
    for n in needles {
        out.occurs(n, 1);
    }
    assert!(!out.stdout.contains("wrote"), "{}", out.dump());
    assert_no_output(&out_dir, &out);
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn bad_text_inputs_exit_2_naming_file_and_line() {
    let d = tempdir();
    let dir = d.path();
    let malformed = write(dir, "malformed.tsv", "# c\n0 1\n1\t2\n3 x\n2 0\n");
    prepare_fails(
        Launcher::Direct,
        &malformed,
        "tsv",
        &[],
        &["malformed.tsv:4:", "\"x\" is not a non-negative integer"],
    );
    let three = write(dir, "three.tsv", "0 1\n1 2 3\n");
    prepare_fails(
        Launcher::Direct,
        &three,
        "tsv",
        &[],
        &["three.tsv:2:", "third field"],
    );
    let big = write(dir, "big.tsv", "0 1\n1 0\n4294967296 1\n");
    prepare_fails(
        Launcher::Direct,
        &big,
        "tsv",
        &[],
        &["big.tsv:3:", "does not fit"],
    );
    let negative = write(dir, "negative.tsv", "0 1\n-1 0\n");
    prepare_fails(
        Launcher::Direct,
        &negative,
        "tsv",
        &[],
        &["negative.tsv:2:"],
    );
    let empty = write(dir, "empty.tsv", "");
    prepare_fails(
        Launcher::Direct,
        &empty,
        "tsv",
        &[],
        &["empty.tsv: ", "no arcs"],
    );
    let comments = write(dir, "comments.tsv", "# only\n% comments\n\n");
    prepare_fails(
        Launcher::Direct,
        &comments,
        "tsv",
        &[],
        &["comments.tsv: ", "no arcs"],
    );
    let truncated = write(
        dir,
        "truncated.mtx",
        "%%MatrixMarket matrix coordinate pattern general\n% c\n4 4 5\n1 2\n2 3\n3 4\n",
    );
    prepare_fails(
        Launcher::Direct,
        &truncated,
        "mtx",
        &[],
        &["truncated.mtx:6:", "declares 5 entries but the file has 3"],
    );
    let outside = write(
        dir,
        "outside.mtx",
        "%%MatrixMarket matrix coordinate integer general\n2 2 2\n1 2 7\n3 1 1\n",
    );
    prepare_fails(
        Launcher::Direct,
        &outside,
        "mtx",
        &[],
        &["outside.mtx:4:", "outside the declared 2 x 2 matrix"],
    );

    // Under mpirun every rank exits 2 and the message is printed once.
    prepare_fails(
        Launcher::Mpirun(2),
        &malformed,
        "tsv",
        &[],
        &["malformed.tsv:4:", "\"x\" is not a non-negative integer"],
    );
    prepare_fails(
        Launcher::Mpirun(3),
        &truncated,
        "mtx",
        &[],
        &["truncated.mtx:6:", "but the file has 3: truncated"],
    );
}

#[test]
fn bad_bv_inputs_exit_2_naming_the_file() {
    let d = tempdir();
    let missing = d.path().join("nowhere/graph");
    prepare_fails(
        Launcher::Direct,
        &missing,
        "bv",
        &[],
        &["nowhere/graph.graph", "missing"],
    );

    // A copy with the .graph cut to half its size.
    let bv = d.path().join("bv");
    std::fs::create_dir(&bv).unwrap();
    for ext in ["graph", "offsets", "properties"] {
        let from = cnr2000().with_extension(ext);
        std::fs::copy(&from, bv.join(format!("cnr-2000.{ext}"))).unwrap();
    }
    let graph = bv.join("cnr-2000.graph");
    let len = std::fs::metadata(&graph).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&graph)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let base = bv.join("cnr-2000");
    let graph_name = graph.display().to_string();
    prepare_fails(
        Launcher::Direct,
        &base,
        "bv",
        &[],
        &[&graph_name, "truncated or corrupt"],
    );
    prepare_fails(
        Launcher::Mpirun(2),
        &base,
        "bv",
        &[],
        &[&graph_name, "truncated or corrupt"],
    );

    // A filter that leaves nothing.
    let source = format!(
        "bv:{}: no node has at least 100000 in-links",
        cnr2000().display()
    );
    let needles = [source.as_str(), "the filter leaves an empty graph"];
    prepare_fails(
        Launcher::Direct,
        &cnr2000(),
        "bv",
        &["--min-links", "100000"],
        &needles,
    );
}

#[test]
fn missing_input_files_exit_2() {
    let d = tempdir();
    for (name, format) in [
        ("no-such.tsv", "tsv"),
        ("no-such.mtx", "mtx"),
        ("no-such", "bv"),
    ] {
        prepare_fails(
            Launcher::Direct,
            &d.path().join(name),
            format,
            &[],
            &[&format!("{}", d.path().join(name).display())],
        );
    }
}

/// Errors found by every rank alike after a collective (the filter leaves nothing)
/// are printed once, and every rank exits 2.
#[test]
fn filter_errors_under_mpirun_are_printed_once() {
    let d = tempdir();
    // Nodes 0 and 1 have 2 in-links and 2 out-links, but no arc between them.
    let no_arcs = write(
        d.path(),
        "no-arcs.tsv",
        "0 2\n0 3\n1 2\n1 3\n4 0\n5 0\n4 1\n5 1\n",
    );
    let no_arcs_msg = format!(
        "tsv:{}: the filter with K = 2 keeps 2 nodes but no arcs",
        no_arcs.display()
    );
    prepare_fails(
        Launcher::Direct,
        &no_arcs,
        "tsv",
        &["--min-links", "2"],
        &[&no_arcs_msg],
    );
    let empty_msg = format!(
        "bv:{}: no node has at least 100000 in-links and 100000 out-links",
        cnr2000().display()
    );
    for (input, format, k, msg) in [
        (no_arcs.clone(), "tsv", "2", &no_arcs_msg),
        (cnr2000(), "bv", "100000", &empty_msg),
    ] {
        let codes = tempdir();
        let out = TestCommand::mpirun(2)
            .args(["prepare", "--format", format, "--min-links", k, "--input"])
            .arg(&input)
            .arg("--out")
            .arg(d.path().join("d.h5"))
            .record_rank_codes(codes.path())
            .run();
        assert_eq!(
            rank_codes(codes.path(), 2),
            vec![Some(2); 2],
            "{}",
            out.dump()
        );
        out.occurs(msg, 1);
        assert!(!d.path().join("d.h5").exists());
    }
}

#[test]
fn every_rank_exits_2_on_bad_input() {
    let d = tempdir();
    let input = write(d.path(), "bad.tsv", "0 1\n1 zz\n");
    let codes = d.path().join("codes");
    std::fs::create_dir(&codes).unwrap();
    let out = TestCommand::mpirun(3)
        .args(["prepare", "--format", "tsv", "--input"])
        .arg(&input)
        .arg("--out")
        .arg(d.path().join("d.h5"))
        .record_rank_codes(&codes)
        .run();
    out.occurs("bad.tsv:2:", 1);
    assert_eq!(rank_codes(&codes, 3), vec![Some(2); 3], "{}", out.dump());
    assert!(!d.path().join("d.h5").exists());
}

#[test]
fn output_directory_must_exist() {
    let d = tempdir();
    let out = prepare_cnr(Launcher::Direct, 50, 42, &d.path().join("no/dir/d.h5"));
    out.expect_code(2)
        .stderr_has(&["no/dir", "output directory does not exist"]);
}

#[test]
fn inspect_rejects_files_that_are_not_datasets() {
    let d = tempdir();
    let dir = d.path();
    let inspect =
        |launcher: Launcher, p: &Path| TestCommand::new(launcher).arg("inspect").arg(p).run();

    let text = write(dir, "text.h5", "this is not HDF5\n");
    for launcher in [Launcher::Direct, Launcher::Mpirun(2)] {
        inspect(launcher, &text)
            .expect_code(2)
            .stderr_has(&["text.h5", "not an HDF5 file"])
            .occurs("not an HDF5 file", 1);
    }
    inspect(Launcher::Direct, &dir.join("absent.h5"))
        .expect_code(2)
        .stderr_has(&["absent.h5", "no such file"]);
    let empty = write(dir, "empty.h5", "");
    inspect(Launcher::Direct, &empty)
        .expect_code(2)
        .stderr_has(&["empty.h5", "not an HDF5 file"]);

    // HDF5, but not a torusrec dataset.
    use hdf5::types::VarLenUnicode;
    let str_attr = |f: &hdf5::File, k: &str, v: &str| {
        let v: VarLenUnicode = v.parse().unwrap();
        f.new_attr::<VarLenUnicode>()
            .create(k)
            .unwrap()
            .write_scalar(&v)
            .unwrap();
    };
    let wrong = dir.join("wrong-format.h5");
    {
        let f = torusrec::io::h5::create(&wrong).unwrap();
        str_attr(&f, "format", "someone-else");
        f.new_attr::<u64>()
            .create("version")
            .unwrap()
            .write_scalar(&1u64)
            .unwrap();
    }
    for launcher in [Launcher::Direct, Launcher::Mpirun(2)] {
        inspect(launcher, &wrong)
            .expect_code(2)
            .stderr_has(&["wrong-format.h5", "attribute format", "someone-else"])
            .occurs("someone-else", 1);
    }
    let bare = dir.join("bare.h5");
    torusrec::io::h5::create(&bare).unwrap().close().unwrap();
    inspect(Launcher::Direct, &bare)
        .expect_code(2)
        .stderr_has(&["bare.h5", "attribute format", "missing"]);
    let future = dir.join("future.h5");
    {
        let f = torusrec::io::h5::create(&future).unwrap();
        str_attr(&f, "format", "torusrec-dataset");
        f.new_attr::<u64>()
            .create("version")
            .unwrap()
            .write_scalar(&2u64)
            .unwrap();
    }
    inspect(Launcher::Direct, &future)
        .expect_code(2)
        .stderr_has(&["future.h5", "attribute version", "reads version 1"]);

    // A real dataset with one dataset removed.
    let good = dir.join("k50.h5");
    prepare_cnr(Launcher::Direct, 50, 42, &good).expect_code(0);
    let broken = dir.join("no-node-ids.h5");
    std::fs::copy(&good, &broken).unwrap();
    {
        let f = torusrec::io::h5::open_rw(&broken).unwrap();
        f.unlink("node_ids").unwrap();
    }
    inspect(Launcher::Direct, &broken)
        .expect_code(2)
        .stderr_has(&["no-node-ids.h5", "node_ids", "missing"]);
    inspect(Launcher::Direct, &good)
        .expect_code(0)
        .stdout_has(&["valid"]);
}

// ---------------------------------------------------------------------------------
// 6. --force

#[test]
fn existing_output_is_refused_without_force_and_replaced_with_it() {
    let d = tempdir();
    let out_path = d.path().join("d.h5");
    let precious = b"precious bytes, not a dataset\n";
    std::fs::write(&out_path, precious).unwrap();

    for launcher in [Launcher::Direct, Launcher::Mpirun(2)] {
        prepare_cnr(launcher, 50, 42, &out_path)
            .expect_code(2)
            .stderr_has(&["d.h5", "--force"])
            .occurs("--force", 1);
        assert_eq!(std::fs::read(&out_path).unwrap(), precious);
    }

    // --force with an input that fails: the existing file is still untouched.
    let bad = write(d.path(), "bad.tsv", "0 1\nnope\n");
    TestCommand::mpirun(2)
        .args(["prepare", "--format", "tsv", "--force", "--input"])
        .arg(&bad)
        .arg("--out")
        .arg(&out_path)
        .run()
        .expect_code(2)
        .stderr_has(&["bad.tsv:2:"]);
    assert_eq!(std::fs::read(&out_path).unwrap(), precious);
    assert_eq!(
        listing(d.path()),
        ["bad.tsv", "d.h5"],
        "no .partial file remains"
    );

    // --force replaces it.
    TestCommand::mpirun(2)
        .arg("prepare")
        .arg("--input")
        .arg(cnr2000())
        .args(["--format", "bv", "--min-links", "50", "--force", "--out"])
        .arg(&out_path)
        .run()
        .expect_code(0)
        .stdout_has(&["-> K = 50: 1,121 nodes, 19,485 arcs"]);
    let ds = read(&out_path);
    assert_eq!((ds.meta.num_rows, ds.num_arcs()), (1_121, 19_485));
    assert_eq!(
        listing(d.path()),
        ["bad.tsv", "d.h5"],
        "no .partial file remains"
    );

    // And a dataset is refused like any other file.
    let before = std::fs::read(&out_path).unwrap();
    prepare_cnr(Launcher::Direct, 10, 42, &out_path)
        .expect_code(2)
        .stderr_has(&["--force"]);
    assert_eq!(std::fs::read(&out_path).unwrap(), before);
}

// ---------------------------------------------------------------------------------
// 7. command line

#[test]
fn help_lists_subcommands_and_flags() {
    TestCommand::direct()
        .arg("--help")
        .run()
        .expect_code(0)
        .stdout_has(&[
            "Usage: torusrec",
            "prepare",
            "generate",
            "inspect",
            "selftest",
            "--torus",
        ]);
    TestCommand::direct()
        .args(["prepare", "--help"])
        .run()
        .expect_code(0)
        .stdout_has(&[
            "--input",
            "--format",
            "--min-links",
            "--seed",
            "--out",
            "--force",
            "bv",
            "tsv",
            "mtx",
        ]);
    TestCommand::direct()
        .args(["generate", "webgraph", "--help"])
        .run()
        .expect_code(0)
        .stdout_has(&["--preset", "--scale", "--seed", "--out"]);
    TestCommand::direct()
        .arg("--version")
        .run()
        .expect_code(0)
        .stdout_has(&[concat!("torusrec ", env!("CARGO_PKG_VERSION"))]);
    // Printed once under mpirun, not once per rank.
    TestCommand::mpirun(2)
        .arg("--help")
        .run()
        .expect_code(0)
        .occurs(
            "ALX-style iALS and sharded embedding training on a simulated TPU torus",
            1,
        );
}

#[test]
fn command_line_errors_exit_2_once() {
    TestCommand::direct()
        .run()
        .expect_code(2)
        .stderr_has(&["Usage: torusrec"]);
    TestCommand::direct()
        .args(["prepare", "--format", "bv"])
        .run()
        .expect_code(2)
        .stderr_has(&["--input", "--out"]);
    TestCommand::mpirun(2)
        .args([
            "prepare", "--format", "xyz", "--input", "x", "--out", "y.h5",
        ])
        .run()
        .expect_code(2)
        .occurs("invalid value 'xyz'", 1);
    TestCommand::direct()
        .args(["frobnicate"])
        .run()
        .expect_code(2)
        .stderr_has(&["frobnicate"]);
}

#[test]
fn plan_takes_the_planners_constants_from_a_cost_model_file() {
    let d = tempdir();
    let plan = |name: &str, cost: Option<&str>| -> (String, Vec<String>) {
        let out = d.path().join(format!("{name}.json"));
        let mut cmd = TestCommand::direct().args([
            "plan",
            "--preset",
            "small",
            "--ranks",
            "4",
            "--estimate",
            "--out",
        ]);
        cmd = cmd.arg(&out);
        if let Some(text) = cost {
            let f = d.path().join(format!("{name}-cost.json"));
            std::fs::write(&f, text).unwrap();
            cmd = cmd.arg("--cost-model").arg(&f);
        }
        let run = cmd.run();
        run.expect_code(0);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let kinds = json["tables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["kind"].as_str().unwrap().to_string())
            .collect();
        (run.stdout.clone(), kinds)
    };
    let (stdout, default) = plan("default", None);
    assert!(!stdout.contains("cost model:"), "{stdout}");
    assert!(default.iter().all(|k| k != "data_parallel"), "{default:?}");
    // A slow network: every table replicated (the all-reduce keeps its default rate).
    let (stdout, slow) = plan("slow-net", Some(r#"{"net_bw": 1e7}"#));
    assert!(
        stdout.contains("cost model:") && stdout.contains("network 0.01 GB/s"),
        "{stdout}"
    );
    assert!(slow.iter().all(|k| k == "data_parallel"), "{slow:?}");
    // The all-reduce slower still: nothing replicated.
    let (_, both) = plan("slow-both", Some(r#"{"net_bw": 1e7, "allreduce_bw": 1e3}"#));
    assert!(both.iter().all(|k| k != "data_parallel"), "{both:?}");
}

#[test]
fn als_refuses_the_cg_only_flags_with_cholesky() {
    let dir = tempdir();
    let data = util::synthetic_dataset(dir.path(), 300, 3000, 4);
    let cases: [&[&str]; 3] = [
        &["--cg-steps", "5"],
        &["--hub-chunk", "64"],
        &["--cg-steps", "5", "--hub-chunk", "64"],
    ];
    for extra in cases {
        let o = TestCommand::mpirun(2)
            .arg("als")
            .arg("--data")
            .arg(&data)
            .args(["--dim", "4", "--epochs", "1", "--threads", "1"])
            .args(["--solver", "cholesky"])
            .args(extra)
            .run();
        o.expect_code(2)
            .stderr_has(&["--solver cholesky", "--cg-steps", "--hub-chunk"])
            .occurs("ignores it", 1);
    }
}

#[test]
fn plan_estimate_refuses_stats() {
    let dir = tempdir();
    // plan --estimate measures nothing: no statistics file to reuse or write.
    let stats = dir.path().join("stats.json");
    TestCommand::direct()
        .args(["plan", "--preset", "small", "--ranks", "4", "--estimate"])
        .arg("--stats")
        .arg(&stats)
        .run()
        .expect_code(2)
        .stderr_has(&["--estimate", "--stats"]);
    assert!(!stats.exists());
}

#[test]
fn project_refuses_seed_and_scale_it_would_ignore() {
    let dir = tempdir();
    let data = util::synthetic_dataset(dir.path(), 300, 3000, 4);
    // project embed --estimate samples no click generator.
    TestCommand::direct()
        .args([
            "project",
            "embed",
            "--preset",
            "tiny",
            "--estimate",
            "--seed",
            "5",
        ])
        .run()
        .expect_code(2)
        .stderr_has(&["--estimate", "--seed"]);
    // project als --data reads the arcs: no generator to seed or scale.
    for flag in [["--seed", "3"], ["--scale", "0.5"]] {
        TestCommand::direct()
            .args(["project", "als", "--data"])
            .arg(&data)
            .args(flag)
            .run()
            .expect_code(2)
            .stderr_has(&["--data", flag[0]]);
    }
}

/// Ranks started with different arguments (mpirun's MPMD syntax) stop at start with
/// exit 2 on every rank, the message naming the ranks that differ, instead of meeting
/// in collectives of different sizes (an MPI truncation abort). Identical parts run.
#[test]
fn ranks_launched_with_different_arguments_exit_2_naming_them() {
    let dir = tempdir();
    let data = util::synthetic_dataset(dir.path(), 300, 3000, 4);
    let als = |dim: &str| -> Vec<std::ffi::OsString> {
        let mut v: Vec<std::ffi::OsString> = vec!["als".into(), "--data".into()];
        v.push(data.clone().into());
        for a in ["--dim", dim, "--epochs", "1", "--threads", "1"] {
            v.push(a.into());
        }
        v
    };
    let codes = dir.path().join("codes");
    std::fs::create_dir(&codes).unwrap();
    let o = TestCommand::mpirun(2)
        .record_rank_codes(&codes)
        .args(als("8"))
        .and_rank_with(als("16"))
        .run();
    assert_eq!(rank_codes(&codes, 3), vec![Some(2); 3], "{}", o.dump());
    o.occurs("different command lines or binaries", 1)
        .stderr_has(&["(ranks 0-1; rank 2)", "--dim 8", "[2/3]", "--dim 16"])
        .occurs("this rank differs from rank 0", 1);
    // The same arguments in every part: an ordinary run.
    TestCommand::mpirun(1)
        .args(als("8"))
        .and_rank_with(als("8"))
        .run()
        .expect_code(0)
        .stdout_has(&["final:"]);
}

/// `als` and `embed` take one set of checkpoint flags (`cli::CheckpointArgs`): the
/// same names, help and defaults; each keeps its own `--checkpoint-every` (2
/// half-epochs, 0 steps). Every one of them needs `--checkpoint-dir`.
#[test]
fn als_and_embed_share_the_checkpoint_flags() {
    use clap::CommandFactory;
    let cli = torusrec::cli::Cli::command();
    let flags = [
        "checkpoint_dir",
        "keep",
        "resume",
        "release_hold",
        "checkpoint_every",
    ];
    let describe = |sub: &str| -> Vec<(String, String, Vec<String>)> {
        let cmd = cli.find_subcommand(sub).unwrap();
        flags
            .iter()
            .map(|id| {
                let a = cmd
                    .get_arguments()
                    .find(|a| a.get_id() == id)
                    .unwrap_or_else(|| panic!("{sub} has no {id}"));
                (
                    a.get_long().unwrap().to_string(),
                    a.get_help().map(|h| h.to_string()).unwrap_or_default(),
                    a.get_default_values()
                        .iter()
                        .map(|v| v.to_string_lossy().into_owned())
                        .collect(),
                )
            })
            .collect()
    };
    let (als, embed) = (describe("als"), describe("embed"));
    assert_eq!(als[..4], embed[..4], "als and embed differ");
    assert_eq!(als[1].2, ["3"], "--keep");
    assert_eq!(als[4].2, ["2"], "als --checkpoint-every");
    assert_eq!(embed[4].2, ["0"], "embed --checkpoint-every");
    // Each flag but the directory is refused without --checkpoint-dir, by both.
    for sub in ["als", "embed"] {
        for flag in [
            &["--keep", "2"][..],
            &["--release-hold"],
            &["--checkpoint-every", "1"],
        ] {
            TestCommand::direct()
                .arg(sub)
                .args(flag)
                .run()
                .expect_code(2)
                .stderr_has(&["--checkpoint-dir"]);
        }
    }
}

/// `embed --help` and `tune --help` describe every flag, among them the optimizers'
/// (`--table-lr`, `--dense-opt`, `--dense-lr`), `embed --seed` and the iALS options
/// `tune` passes on (`--init-std`, `--hub-chunk`, `--step-nnz`).
#[test]
fn embed_and_tune_help_describe_every_flag() {
    // The help is wrapped to the terminal: compare with its words joined by one space.
    let help = |sub: &str| -> String {
        let o = TestCommand::direct().args([sub, "--help"]).run();
        o.expect_code(0);
        o.stdout.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let embed = help("embed");
    for needle in [
        "--table-lr <TABLE_LR> Learning rate of every table's optimizer (--table-opt)",
        "rowwise-adagrad by `row -= lr * g / (sqrt(G) + 1e-8)`",
        "[default: 0.02]",
        "--dense-opt <DENSE_OPT> The MLP's optimizer",
        "adam (PyTorch's defaults: betas 0.9 and 0.999, eps 1e-8",
        "--dense-lr <DENSE_LR> Learning rate of the MLP's optimizer (--dense-opt)",
        "[default: 0.002]",
        "--seed <SEED> Seed of the initial table rows and MLP weights",
        "without --data, of the generated examples",
    ] {
        assert!(
            embed.contains(needle),
            "embed --help lacks {needle:?}:\n{embed}"
        );
    }
    let tune = help("tune");
    for needle in [
        "--init-std <INIT_STD> Initial values are N(0, (init_std / sqrt(d))^2)",
        "[default: 0.1]",
        "--hub-chunk <HUB_CHUNK> CG only (--solver cholesky ignores it): rows with more non-zeros are processed in parallel chunks of this many",
        "[default: 8192]",
        "--step-nnz <N> A step (between preemption checks) covers about this many non-zeros",
        "[default: 1000000]",
    ] {
        assert!(tune.contains(needle), "tune --help lacks {needle:?}:\n{tune}");
    }
}

/// A dataset without test rows (fewer than 10 non-empty rows: `floor(r / 10)` are test
/// rows) has nothing to score: the epoch and final lines say so instead of printing a
/// recall of 0; the metrics record is the same as ever (0 over 0 rows).
#[test]
fn als_without_test_rows_says_there_is_nothing_to_score() {
    let dir = tempdir();
    let data = util::synthetic_dataset(dir.path(), 9, 40, 3);
    assert!(
        read(&data).test_rows.is_empty(),
        "the dataset has test rows"
    );
    let metrics = dir.path().join("run.jsonl");
    let o = TestCommand::direct()
        .arg("als")
        .arg("--data")
        .arg(&data)
        .args(["--dim", "4", "--epochs", "2", "--eval-every", "1"])
        .args(["--threads", "1", "--metrics"])
        .arg(&metrics)
        .run();
    o.expect_code(0).occurs("no test rows to score", 3);
    assert!(
        !o.stdout.contains("R@20") && !o.stdout.contains("Recall@20 0"),
        "a recall printed:\n{}",
        o.dump()
    );
    let line = o.stdout.lines().find(|l| l.starts_with("final:")).unwrap();
    assert!(
        line.starts_with("final: no test rows to score (no Recall@20/50)  loss "),
        "{line}"
    );
    o.final_checksum();
    let text = std::fs::read_to_string(&metrics).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["final"], true, "{last}");
    assert_eq!(last["eval_rows"], 0, "{last}");
    assert_eq!(last["recall_at_20"], 0.0, "{last}");
    assert_eq!(last["recall_at_50"], 0.0, "{last}");
}
