//! Mutated inputs (issue 11, part A): valid BV, TSV (plain and gzip), MTX and prepared
//! HDF5 inputs, changed at random by proptest (byte flips, truncation, deleted ranges,
//! inserted lines; for HDF5 also values of the CSR arrays), each run through the
//! binary. Every run must end in exit 0 with a valid output (`inspect` accepts the
//! prepared dataset; `als` prints its final line) or in exit 2 with a message: never
//! a panic (101), an abort (134), another code, a signal, or a hang (a timeout).
//!
//! Cases per input kind: `TORUSREC_FUZZ_CASES` (default 40). The runner's seed is
//! fixed, so a failure reproduces; proptest then shrinks it to a small mutation.
//! Each test prints how many mutated inputs it ran (shrinking runs count too).

use crate::util;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use util::{tempdir, TestCommand};

fn cases() -> u32 {
    std::env::var("TORUSREC_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

fn runner() -> TestRunner {
    let cfg = Config {
        cases: cases(),
        max_shrink_iters: 16,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(cfg, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
}

/// One change to a file's bytes. Positions are taken modulo the length.
#[derive(Debug, Clone)]
enum Mutation {
    /// XOR one byte with a non-zero mask.
    Flip { at: usize, mask: u8 },
    /// Keep only the first `at` bytes.
    Truncate { at: usize },
    /// Remove `len` bytes starting at `at`.
    Delete { at: usize, len: usize },
    /// Insert one of the nasty lines after the line that holds `at`.
    InsertLine { at: usize, line: usize },
}

/// Lines that readers must refuse or handle.
const LINES: &[&[u8]] = &[
    b"-1 2",
    b"4294967293 0",
    b"4294967294 1",
    b"99999999999 1",
    b"18446744073709551615 18446744073709551615",
    b"a b",
    b"1 2 3",
    b"0 0",
    b"1e3 2",
    b"\xff\xfe\xfd",
    b"",
    b"%%MatrixMarket matrix coordinate pattern general",
    b"3 3 18446744073709551615",
    b"0 1",
    b"nodes=4294967293",
    b"arcs=-5",
    b"77777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777 1",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        2 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        1 => (any::<usize>(), 1usize..64).prop_map(|(at, len)| Mutation::Delete { at, len }),
        3 => (any::<usize>(), 0..LINES.len()).prop_map(|(at, line)| Mutation::InsertLine { at, line }),
    ]
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..4)
}

fn apply(bytes: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for m in muts {
        let n = b.len().max(1);
        match *m {
            Mutation::Flip { at, mask } => {
                if !b.is_empty() {
                    b[at % n] ^= mask;
                }
            }
            Mutation::Truncate { at } => b.truncate(at % n),
            Mutation::Delete { at, len } => {
                let a = at % n;
                let e = (a + len).min(b.len());
                if a < e {
                    b.drain(a..e);
                }
            }
            Mutation::InsertLine { at, line } => {
                let a = at % n;
                let nl = b[a.min(b.len())..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |i| a + i + 1);
                let mut ins = LINES[line].to_vec();
                ins.push(b'\n');
                b.splice(nl..nl, ins);
            }
        }
    }
    b
}

/// Mutated inputs run, and those of them that exited 0.
#[derive(Default)]
struct Tally {
    tried: AtomicUsize,
    ok: AtomicUsize,
}

impl Tally {
    fn report(&self, name: &str) {
        let (n, ok) = (
            self.tried.load(Ordering::Relaxed),
            self.ok.load(Ordering::Relaxed),
        );
        println!(
            "{name}: {n} mutated inputs tried ({ok} exit 0 with a valid output, {} exit 2)",
            n - ok
        );
    }

    /// [`run_checked`], counted.
    fn run(
        &self,
        args: &[String],
        cwd: &Path,
        valid: &dyn Fn(&util::Output) -> Result<(), String>,
    ) -> Result<(), TestCaseError> {
        self.tried.fetch_add(1, Ordering::Relaxed);
        if run_checked(args, cwd, valid)? == 0 {
            self.ok.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Run the binary on one mutated input and check the contract; returns the exit
/// code (0 or 2). `valid` checks an exit-0 run's output.
fn run_checked(
    args: &[String],
    cwd: &Path,
    valid: &dyn Fn(&util::Output) -> Result<(), String>,
) -> Result<i32, TestCaseError> {
    let cmd = TestCommand::direct()
        .args(args)
        .current_dir(cwd)
        .timeout(Duration::from_secs(60));
    let run = std::panic::catch_unwind(|| cmd.run())
        .map_err(|_| TestCaseError::fail("a hang: the run timed out"))?;
    match run.code {
        0 => valid(&run)
            .map(|_| 0)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{}", run.dump()))),
        2 => {
            if run.stderr.contains("torusrec: ") && !run.stderr.contains("panicked") {
                Ok(2)
            } else {
                Err(TestCaseError::fail(format!(
                    "exit 2 without a message\n{}",
                    run.dump()
                )))
            }
        }
        c => Err(TestCaseError::fail(format!(
            "exit {c} (want 0 or 2)\n{}",
            run.dump()
        ))),
    }
}

/// A prepared output that `inspect` accepts.
fn inspect_ok(out: &Path) -> Result<(), String> {
    let r = TestCommand::direct()
        .arg("inspect")
        .arg(out)
        .timeout(Duration::from_secs(60))
        .run();
    if r.code == 0 {
        Ok(())
    } else {
        Err(format!(
            "prepare exited 0 but inspect refuses its output:\n{}",
            r.dump()
        ))
    }
}

/// The test graph: a ring with chords and a few hubs, `n` nodes.
fn arcs(n: usize) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    for u in 0..n {
        v.push((u, (u + 1) % n));
        v.push((u, (u * 7 + 3) % n));
        v.push(((u * 13 + 5) % n, u));
        if u % 10 == 0 {
            v.push((u, 0));
            v.push((0, u));
        }
    }
    v.retain(|&(a, b)| a != b);
    v.sort_unstable();
    v.dedup();
    v
}

fn tsv_text(a: &[(usize, usize)]) -> Vec<u8> {
    let mut s = String::from("# test graph\n");
    for (u, v) in a {
        s.push_str(&format!("{u}\t{v}\n"));
    }
    s.into_bytes()
}

fn mtx_text(a: &[(usize, usize)], n: usize) -> Vec<u8> {
    let mut s = format!(
        "%%MatrixMarket matrix coordinate pattern general\n% test\n{n} {n} {}\n",
        a.len()
    );
    for (u, v) in a {
        s.push_str(&format!("{} {}\n", u + 1, v + 1));
    }
    s.into_bytes()
}

fn prepare_args(format: &str, input: &Path, out: &Path) -> Vec<String> {
    vec![
        "prepare".into(),
        "--format".into(),
        format.into(),
        "--input".into(),
        input.to_string_lossy().into_owned(),
        "--force".into(),
        "--out".into(),
        out.to_string_lossy().into_owned(),
    ]
}

/// Mutate `file` (bytes `base`) and prepare it in format `format` from `input`.
fn fuzz_text(name: &str, format: &str, base: Vec<u8>, file: &str, gz_wrap: bool) {
    let dir = tempdir();
    let d = dir.path().to_path_buf();
    let input = d.join(file);
    let out = d.join("out.h5");
    let base = if gz_wrap {
        let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        w.write_all(&base).unwrap();
        w.finish().unwrap()
    } else {
        base
    };
    // The unmutated input prepares.
    std::fs::write(&input, &base).unwrap();
    run_checked(&prepare_args(format, &input, &out), &d, &|_| {
        inspect_ok(&out)
    })
    .unwrap_or_else(|e| panic!("{name}: the valid input fails: {e}"));
    let tally = Tally::default();
    let result = runner().run(&mutations(), |muts| {
        std::fs::write(&input, apply(&base, &muts)).unwrap();
        let _ = std::fs::remove_file(&out);
        tally.run(&prepare_args(format, &input, &out), &d, &|_| {
            inspect_ok(&out)
        })
    });
    tally.report(name);
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

#[test]
fn mutated_tsv_exits_0_or_2() {
    let a = arcs(300);
    fuzz_text("tsv", "tsv", tsv_text(&a), "g.tsv", false);
}

#[test]
fn mutated_tsv_gz_exits_0_or_2() {
    let a = arcs(300);
    fuzz_text("tsv.gz", "tsv", tsv_text(&a), "g.tsv.gz", true);
}

#[test]
fn mutated_mtx_exits_0_or_2() {
    let a = arcs(300);
    fuzz_text("mtx", "mtx", mtx_text(&a, 300), "g.mtx", false);
}

/// A BV graph of the test graph, written with the webgraph crate.
fn write_bv(dir: &Path, n: usize) -> PathBuf {
    use webgraph::prelude::*;
    let base = dir.join("g");
    let g = VecGraph::from_arcs(arcs(n));
    BvComp::with_basename(&base)
        .comp_graph::<dsi_bitstream::traits::BE>(&g)
        .expect("compress the test graph");
    base
}

fn file_with(base: &Path, ext: &str) -> PathBuf {
    let mut o = base.as_os_str().to_owned();
    o.push(ext);
    PathBuf::from(o)
}

#[test]
fn mutated_bv_exits_0_or_2() {
    let dir = tempdir();
    let d = dir.path().to_path_buf();
    let base = write_bv(&d, 300);
    let out = d.join("out.h5");
    let graph = std::fs::read(file_with(&base, ".graph")).unwrap();
    let props = std::fs::read(file_with(&base, ".properties")).unwrap();
    let args = prepare_args("bv", &base, &out);
    run_checked(&args, &d, &|_| inspect_ok(&out))
        .unwrap_or_else(|e| panic!("bv: the valid graph fails: {e}"));
    let tally = Tally::default();
    // Mutate the bit stream, or the properties (as text).
    let result = runner().run(&(any::<bool>(), mutations()), |(in_props, muts)| {
        let (g, p) = if in_props {
            (graph.clone(), apply(&props, &muts))
        } else {
            (apply(&graph, &muts), props.clone())
        };
        std::fs::write(file_with(&base, ".graph"), g).unwrap();
        std::fs::write(file_with(&base, ".properties"), p).unwrap();
        let _ = std::fs::remove_file(&out);
        tally.run(&args, &d, &|_| inspect_ok(&out))
    });
    tally.report("bv");
    if let Err(e) = result {
        panic!("bv: {e}");
    }
}

/// One change to a prepared dataset.
#[derive(Debug, Clone)]
enum H5Mutation {
    /// Set element `at` of array `ds` to `value` (cast to the element type).
    Set { ds: usize, at: usize, value: u64 },
    /// Flip bytes of the file itself.
    Bytes(Vec<Mutation>),
}

const ARRAYS: &[(&str, bool)] = &[
    ("train/indptr", true),
    ("train/indices", false),
    ("train_t/indptr", true),
    ("train_t/indices", false),
    ("test/rows", false),
    ("test/fold/indptr", true),
    ("test/fold/indices", false),
    ("test/holdout/indptr", true),
    ("test/holdout/indices", false),
];

fn h5_mutation() -> impl Strategy<Value = H5Mutation> {
    let value = prop_oneof![
        0u64..400,
        Just(u32::MAX as u64),
        Just(u32::MAX as u64 - 1),
        Just(u64::MAX),
        any::<u64>(),
    ];
    prop_oneof![
        4 => (0..ARRAYS.len(), any::<usize>(), value)
            .prop_map(|(ds, at, value)| H5Mutation::Set { ds, at, value }),
        1 => prop::collection::vec(
            prop_oneof![
                (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
                any::<usize>().prop_map(|at| Mutation::Truncate { at }),
            ],
            1..3
        )
        .prop_map(H5Mutation::Bytes),
    ]
}

fn set_element(path: &Path, ds: usize, at: usize, value: u64) -> Result<(), String> {
    let (name, is_u64) = ARRAYS[ds];
    let f = torusrec::io::h5::open_rw(path).map_err(|e| e.to_string())?;
    let d = f.dataset(name).map_err(|e| e.to_string())?;
    if is_u64 {
        let mut v: Vec<u64> = d.read_raw().map_err(|e| e.to_string())?;
        if v.is_empty() {
            return Ok(());
        }
        let i = at % v.len();
        v[i] = value;
        d.write_raw(&v).map_err(|e| e.to_string())
    } else {
        let mut v: Vec<u32> = d.read_raw().map_err(|e| e.to_string())?;
        if v.is_empty() {
            return Ok(());
        }
        let i = at % v.len();
        v[i] = value as u32;
        d.write_raw(&v).map_err(|e| e.to_string())
    }
}

#[test]
fn mutated_hdf5_datasets_exit_0_or_2() {
    let dir = tempdir();
    let d = dir.path().to_path_buf();
    let tsv = d.join("g.tsv");
    std::fs::write(&tsv, tsv_text(&arcs(300))).unwrap();
    let good = d.join("good.h5");
    TestCommand::direct()
        .args(prepare_args("tsv", &tsv, &good))
        .run()
        .expect_code(0);
    let data = d.join("data.h5");
    let args: Vec<String> = [
        "als",
        "--data",
        &data.to_string_lossy(),
        "--dim",
        "4",
        "--epochs",
        "1",
        "--threads",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let trained = |r: &util::Output| {
        if r.stdout.contains("final:") {
            Ok(())
        } else {
            Err("als exited 0 without its final line".to_string())
        }
    };
    let tally = Tally::default();
    let result = runner().run(&prop::collection::vec(h5_mutation(), 1..3), |muts| {
        std::fs::copy(&good, &data).unwrap();
        for m in &muts {
            match m {
                H5Mutation::Set { ds, at, value } => {
                    // A file already cut by an earlier byte mutation may not open.
                    let _ = set_element(&data, *ds, *at, *value);
                }
                H5Mutation::Bytes(b) => {
                    let bytes = std::fs::read(&data).unwrap();
                    std::fs::write(&data, apply(&bytes, b)).unwrap();
                }
            }
        }
        tally.run(&args, &d, &trained)
    });
    tally.report("hdf5");
    if let Err(e) = result {
        panic!("hdf5: {e}");
    }
}
