//! `torusrec recommend` end to end: on a small graph with sparse original ids, the
//! top-K of every mode (--all to HDF5, --nodes, --nodes-file, --test to TSV) at 1-4
//! ranks against a brute-force reference computed here (W and H read from the model,
//! test rows folded in by an independent f64 solve, every column scored and sorted,
//! ties by id); seen arcs are never recommended; bad ids, bad outputs and a model of
//! another dataset exit 2; a preemption between blocks exits 75 leaving no output.

use crate::util;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use torusrec::data::graph::dataset::Dataset;
use util::{tempdir, TestCommand};

/// Original ids are sparse: node i is `1000 i + 7`.
fn orig(i: u64) -> u64 {
    1000 * i + 7
}

/// A node that keeps its in- and out-link but whose only out-link goes to a node
/// that is dropped (no out-links): its row is empty after the filter.
const EMPTY_NODE: u64 = 5_000_003;
const DROPPED_NODE: u64 = 5_000_005;

/// A seeded random graph on `n` nodes (about `per` out-links each) as a TSV edge list.
fn write_graph(path: &Path, n: u64, per: u64, seed: u64) {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = |m: u64| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) % m
    };
    let mut text = String::from("# src dst\n");
    for i in 0..n {
        let deg = 1 + next(2 * per);
        for _ in 0..deg {
            // Skewed targets: low ids are popular.
            let t = next(n).min(next(n));
            text.push_str(&format!("{}\t{}\n", orig(i), orig(t)));
        }
    }
    text.push_str(&format!("{}\t{EMPTY_NODE}\n", orig(0)));
    text.push_str(&format!("{EMPTY_NODE}\t{DROPPED_NODE}\n"));
    std::fs::write(path, text).unwrap();
}

fn prepare(dir: &Path, name: &str, n: u64) -> PathBuf {
    let tsv = dir.join(format!("{name}.tsv"));
    write_graph(&tsv, n, 6, n);
    let out = dir.join(format!("{name}.h5"));
    TestCommand::direct()
        .args(["prepare", "--format", "tsv", "--input"])
        .arg(&tsv)
        .arg("--out")
        .arg(&out)
        .run()
        .expect_code(0);
    out
}

fn train(data: &Path, out: &Path, extra: &[&str]) {
    TestCommand::direct()
        .args(["als", "--data"])
        .arg(data)
        .args(["--dim", "8", "--epochs", "3", "--threads", "1", "--solver"])
        .args([
            "cholesky",
            "--reg",
            "0.05",
            "--unobserved-weight",
            "0.1",
            "--out",
        ])
        .arg(out)
        .args(extra)
        .run()
        .expect_code(0);
}

/// A table of the model as f32 (bf16 tables are u16 bit patterns tagged `dtype`).
pub(crate) fn read_table(f: &hdf5::File, name: &str) -> Vec<f32> {
    let ds = f.dataset(name).unwrap();
    let bf16 = ds
        .attr("dtype")
        .and_then(|a| a.read_scalar::<hdf5::types::VarLenUnicode>())
        .is_ok_and(|v| v.as_str() == "bf16");
    if bf16 {
        ds.read_raw::<u16>()
            .unwrap()
            .iter()
            .map(|&b| f32::from_bits((b as u32) << 16))
            .collect()
    } else {
        ds.read_raw::<f32>().unwrap()
    }
}

/// A row's reference: every unseen column's score by original id, the full ranking
/// (score down, id up), and the seen arcs' original ids.
struct Ranking {
    score: HashMap<u64, f64>,
    order: Vec<(u64, f64)>,
    seen: Vec<u64>,
}

/// The brute-force reference.
struct Reference {
    ds: Dataset,
    w: Vec<f32>,
    h: Vec<f32>,
    d: usize,
    reg: f64,
    alpha0: f64,
}

/// Solve the symmetric positive definite `a x = b` (`d x d`) by Gaussian elimination.
pub(crate) fn solve(mut a: Vec<f64>, mut b: Vec<f64>, d: usize) -> Vec<f64> {
    for c in 0..d {
        let p = (c..d)
            .max_by(|&i, &j| a[i * d + c].abs().total_cmp(&a[j * d + c].abs()))
            .unwrap();
        for j in 0..d {
            a.swap(c * d + j, p * d + j);
        }
        b.swap(c, p);
        for r in c + 1..d {
            let f = a[r * d + c] / a[c * d + c];
            for j in c..d {
                a[r * d + j] -= f * a[c * d + j];
            }
            b[r] -= f * b[c];
        }
    }
    let mut x = vec![0.0; d];
    for c in (0..d).rev() {
        let s: f64 = (c + 1..d).map(|j| a[c * d + j] * x[j]).sum();
        x[c] = (b[c] - s) / a[c * d + c];
    }
    x
}

impl Reference {
    fn load(data: &Path, model: &Path) -> Self {
        let ds = Dataset::read(data).unwrap();
        let f = torusrec::io::h5::open(model).unwrap();
        let w = read_table(&f, "W");
        let h = read_table(&f, "H");
        let d = f.dataset("H").unwrap().shape()[1];
        let cfg: serde_json::Value = serde_json::from_str(
            f.attr("config")
                .unwrap()
                .read_scalar::<hdf5::types::VarLenUnicode>()
                .unwrap()
                .as_str(),
        )
        .unwrap();
        Self {
            ds,
            w,
            h,
            d,
            reg: cfg["reg"].as_f64().unwrap(),
            alpha0: cfg["unobserved_weight"].as_f64().unwrap(),
        }
    }

    fn n(&self) -> usize {
        self.ds.node_ids.len()
    }

    fn row_of(&self, node: u64) -> usize {
        self.ds.node_ids.binary_search(&node).expect("a node")
    }

    fn train_arcs(&self, r: usize) -> &[u32] {
        let t = &self.ds.train;
        &t.targets[t.indptr[r] as usize..t.indptr[r + 1] as usize]
    }

    fn test_pos(&self, r: usize) -> Option<usize> {
        self.ds.test_rows.binary_search(&(r as u32)).ok()
    }

    fn fold_arcs(&self, pos: usize) -> &[u32] {
        let f = &self.ds.fold;
        &f.targets[f.indptr[pos] as usize..f.indptr[pos + 1] as usize]
    }

    /// Rows with training arcs or a test split, increasing.
    fn usable_rows(&self) -> Vec<usize> {
        (0..self.n())
            .filter(|&r| self.test_pos(r).is_some() || !self.train_arcs(r).is_empty())
            .collect()
    }

    /// The row's vector (trained, or folded in in f64) and its seen arcs.
    fn vector(&self, r: usize) -> (Vec<f64>, Vec<u32>) {
        let d = self.d;
        let hrow = |c: usize| -> Vec<f64> {
            self.h[c * d..(c + 1) * d]
                .iter()
                .map(|&v| v as f64)
                .collect()
        };
        match self.test_pos(r) {
            None => (
                self.w[r * d..(r + 1) * d]
                    .iter()
                    .map(|&v| v as f64)
                    .collect(),
                self.train_arcs(r).to_vec(),
            ),
            Some(pos) => {
                let seen = self.fold_arcs(pos).to_vec();
                let n_cols = self.h.len() / d;
                let mut a = vec![0.0; d * d];
                for c in 0..n_cols {
                    let hc = hrow(c);
                    for i in 0..d {
                        for j in 0..d {
                            a[i * d + j] += self.alpha0 * hc[i] * hc[j];
                        }
                    }
                }
                let mut b = vec![0.0; d];
                for &c in &seen {
                    let hc = hrow(c as usize);
                    for i in 0..d {
                        b[i] += hc[i];
                        for j in 0..d {
                            a[i * d + j] += hc[i] * hc[j];
                        }
                    }
                }
                let diag = self.reg * (seen.len() as f64 + self.alpha0 * n_cols as f64);
                for i in 0..d {
                    a[i * d + i] += diag;
                }
                // The model stores f32 vectors; so does the fold-in.
                let x = solve(a, b, d).iter().map(|&v| v as f32 as f64).collect();
                (x, seen)
            }
        }
    }

    /// The row's [`Ranking`].
    fn ranking(&self, r: usize) -> Ranking {
        let d = self.d;
        let (x, seen) = self.vector(r);
        let n_cols = self.h.len() / d;
        let mut all: Vec<(u64, f64)> = (0..n_cols)
            .filter(|c| !seen.contains(&(*c as u32)))
            .map(|c| {
                let s: f64 = (0..d).map(|i| x[i] * self.h[c * d + i] as f64).sum();
                (self.ds.node_ids[c], s)
            })
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let seen_ids = seen.iter().map(|&c| self.ds.node_ids[c as usize]).collect();
        Ranking {
            score: all.iter().copied().collect(),
            order: all,
            seen: seen_ids,
        }
    }

    /// Check one row's recommendations (original ids, best first) against the
    /// reference: the same ids (a different id only in a tie within 1e-5 by the
    /// reference's scores), scores within 1e-5, no seen arc.
    #[track_caller]
    fn check(&self, node: u64, got: &[(u64, f32)], k: usize) {
        let r = self.row_of(node);
        let Ranking {
            score,
            order: ranking,
            seen,
        } = self.ranking(r);
        assert_eq!(got.len(), k.min(ranking.len()), "node {node}: {got:?}");
        let mut ids: Vec<u64> = got.iter().map(|g| g.0).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), got.len(), "node {node}: repeated ids {got:?}");
        for (j, &(id, s)) in got.iter().enumerate() {
            assert!(
                !seen.contains(&id),
                "node {node}: seen arc {id} recommended"
            );
            let want = *score
                .get(&id)
                .unwrap_or_else(|| panic!("node {node}: {id} is not a column"));
            assert!(
                (s as f64 - want).abs() <= 1e-5,
                "node {node} rank {}: {id} scored {s}, reference {want}",
                j + 1
            );
            let (rid, rs) = ranking[j];
            assert!(
                id == rid || (want - rs).abs() <= 1e-5,
                "node {node} rank {}: got {id} ({want}), reference {rid} ({rs})",
                j + 1
            );
        }
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    data: PathBuf,
    model: PathBuf,
    reference: Reference,
}

fn fixture() -> Fixture {
    fixture_with(&[])
}

fn fixture_with(train_args: &[&str]) -> Fixture {
    let dir = tempdir();
    let data = prepare(dir.path(), "g", 90);
    let model = dir.path().join("m.h5");
    train(&data, &model, train_args);
    let reference = Reference::load(&data, &model);
    assert!(reference.ds.test_rows.len() >= 5, "a few test rows");
    Fixture {
        dir,
        data,
        model,
        reference,
    }
}

fn recommend(fx: &Fixture, np: usize, extra: &[&str]) -> util::Output {
    TestCommand::mpirun(np)
        .args(["recommend", "--threads", "1", "--model"])
        .arg(&fx.model)
        .arg("--data")
        .arg(&fx.data)
        .args(extra)
        .run()
}

/// Parse TSV output: the rows in order of appearance, each with its list.
fn parse_tsv(text: &str) -> Vec<(u64, Vec<(u64, f32)>)> {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("node\trank\tneighbour\tscore"), "{text}");
    let mut out: Vec<(u64, Vec<(u64, f32)>)> = Vec::new();
    for l in lines {
        let f: Vec<&str> = l.split('\t').collect();
        assert_eq!(f.len(), 4, "{l}");
        let (node, rank, nb, s) = (
            f[0].parse::<u64>().unwrap(),
            f[1].parse::<usize>().unwrap(),
            f[2].parse::<u64>().unwrap(),
            f[3].parse::<f32>().unwrap(),
        );
        if out.last().is_none_or(|(n, _)| *n != node) {
            out.push((node, Vec::new()));
        }
        let list = &mut out.last_mut().unwrap().1;
        assert_eq!(rank, list.len() + 1, "{l}");
        list.push((nb, s));
    }
    out
}

#[test]
fn all_to_hdf5_matches_brute_force_at_1_to_4_ranks() {
    let fx = fixture();
    let r = &fx.reference;
    let usable = r.usable_rows();
    assert!(usable.len() < r.n(), "the graph has a row with nothing");
    let k = 5;
    for np in 1..=4 {
        let out = fx.dir.path().join(format!("all{np}.h5"));
        let o = TestCommand::mpirun(np)
            .args(["recommend", "--threads", "1", "--model"])
            .arg(&fx.model)
            .arg("--data")
            .arg(&fx.data)
            .args(["--all", "-k", "5", "--block-rows", "7", "--out"])
            .arg(&out)
            .run();
        o.expect_code(0).occurs("left out", 1);
        let f = torusrec::io::h5::open(&out).unwrap();
        let fmt = f
            .attr("format")
            .unwrap()
            .read_scalar::<hdf5::types::VarLenUnicode>()
            .unwrap();
        assert_eq!(fmt.as_str(), "torusrec-recommendations");
        let rows = f.dataset("rows").unwrap();
        let topk = f.dataset("topk").unwrap();
        let scores = f.dataset("scores").unwrap();
        assert_eq!(rows.shape(), vec![usable.len()]);
        assert_eq!(topk.shape(), vec![usable.len(), k]);
        assert_eq!(scores.shape(), vec![usable.len(), k]);
        let rows = rows.read_raw::<u64>().unwrap();
        let want: Vec<u64> = usable.iter().map(|&u| r.ds.node_ids[u]).collect();
        assert_eq!(rows, want, "P={np}: /rows");
        assert!(!rows.contains(&EMPTY_NODE));
        let topk = topk.read_raw::<u64>().unwrap();
        let scores = scores.read_raw::<f32>().unwrap();
        for (i, &node) in rows.iter().enumerate() {
            let got: Vec<(u64, f32)> = (0..k)
                .map(|j| (topk[i * k + j], scores[i * k + j]))
                .take_while(|g| g.0 != u64::MAX)
                .collect();
            r.check(node, &got, k);
        }
        assert!(!fx.dir.path().join(format!("all{np}.h5.partial")).exists());
    }
}

#[test]
fn nodes_nodes_file_and_test_match_brute_force() {
    let fx = fixture();
    let r = &fx.reference;
    let test_nodes: Vec<u64> =
        r.ds.test_rows
            .iter()
            .map(|&t| r.ds.node_ids[t as usize])
            .collect();
    let train_node = r.ds.node_ids[(0..r.n()).find(|&u| !r.train_arcs(u).is_empty()).unwrap()];
    // A test row, a training row and a popular node, in this order (a repeat dropped).
    let asked = [test_nodes[1], train_node, orig(2), test_nodes[1]];
    let list = asked
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let o = recommend(&fx, 2, &["--nodes", &list, "-k", "4"]);
    o.expect_code(0);
    let got = parse_tsv(&o.stdout);
    let nodes: Vec<u64> = got.iter().map(|g| g.0).collect();
    assert_eq!(nodes, asked[..3].to_vec());
    for (node, list) in &got {
        r.check(*node, list, 4);
    }

    // A file with comments and blank lines, to a TSV file.
    let file = fx.dir.path().join("ids.txt");
    std::fs::write(
        &file,
        format!(
            "# some nodes\n{}\n\n  {}  # a test row\n{}\n",
            orig(5),
            test_nodes[0],
            orig(40)
        ),
    )
    .unwrap();
    let out = fx.dir.path().join("r.tsv");
    let o = TestCommand::mpirun(3)
        .args(["recommend", "--threads", "1", "--model"])
        .arg(&fx.model)
        .arg("--data")
        .arg(&fx.data)
        .arg("--nodes-file")
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .run();
    o.expect_code(0);
    let got = parse_tsv(&std::fs::read_to_string(&out).unwrap());
    let nodes: Vec<u64> = got.iter().map(|g| g.0).collect();
    assert_eq!(nodes, vec![orig(5), test_nodes[0], orig(40)]);
    for (node, list) in &got {
        r.check(*node, list, 20);
    }

    // Every test row, in blocks of 2, at 4 ranks and at 1.
    let mut texts = Vec::new();
    for np in [4, 1] {
        let o = recommend(&fx, np, &["--test", "-k", "6", "--block-rows", "2"]);
        o.expect_code(0);
        let got = parse_tsv(&o.stdout);
        let nodes: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(nodes, test_nodes, "P={np}");
        for (node, list) in &got {
            r.check(*node, list, 6);
        }
        texts.push(got);
    }
    let ids = |g: &Vec<(u64, Vec<(u64, f32)>)>| -> Vec<Vec<u64>> {
        g.iter()
            .map(|(_, l)| l.iter().map(|x| x.0).collect())
            .collect()
    };
    assert_eq!(ids(&texts[0]), ids(&texts[1]), "P=4 and P=1");
}

#[test]
fn bf16_model_matches_brute_force_on_its_values() {
    let fx = fixture_with(&["--table-dtype", "bf16"]);
    let r = &fx.reference;
    let o = recommend(&fx, 3, &["--test", "-k", "5", "--block-rows", "3"]);
    o.expect_code(0).stderr_has(&["tables=bf16"]);
    let got = parse_tsv(&o.stdout);
    assert_eq!(got.len(), r.ds.test_rows.len());
    for (node, list) in &got {
        r.check(*node, list, 5);
    }
    let o = recommend(
        &fx,
        2,
        &["--nodes", &format!("{},{}", orig(3), orig(9)), "-k", "7"],
    );
    o.expect_code(0);
    for (node, list) in &parse_tsv(&o.stdout) {
        r.check(*node, list, 7);
    }
}

#[test]
fn bad_ids_exit_2_naming_them_once() {
    let fx = fixture();
    let o = recommend(&fx, 2, &["--nodes", &format!("{},123456789,8", orig(0))]);
    o.expect_code(2)
        .occurs("not nodes of the dataset: 123456789, 8", 1);
    assert!(o.stdout.is_empty(), "{}", o.dump());
    let many: Vec<String> = (0..15).map(|i| (10 * i + 1).to_string()).collect();
    recommend(&fx, 2, &["--nodes", &many.join(",")])
        .expect_code(2)
        .stderr_has(&["15 node id(s)", "(and 5 more)"]);
    recommend(&fx, 2, &["--nodes", &format!("{},abc", orig(1))])
        .expect_code(2)
        .occurs("\"abc\"", 1);
    recommend(&fx, 2, &["--nodes", &EMPTY_NODE.to_string()])
        .expect_code(2)
        .stderr_has(&["nothing to recommend from", &EMPTY_NODE.to_string()]);
    let file = fx.dir.path().join("bad.txt");
    std::fs::write(&file, format!("{}\n# ok\nx12\n", orig(1))).unwrap();
    recommend(&fx, 1, &["--nodes-file", file.to_str().unwrap()])
        .expect_code(2)
        .stderr_has(&["bad.txt:3", "x12"]);
}

#[test]
fn outputs_and_models_are_checked() {
    let fx = fixture();
    // --all streams TSV: every usable row in order, as the reference has it.
    let tsv = fx.dir.path().join("all.tsv");
    recommend(
        &fx,
        2,
        &[
            "--all",
            "-k",
            "3",
            "--block-rows",
            "9",
            "--out",
            tsv.to_str().unwrap(),
        ],
    )
    .expect_code(0);
    let got = parse_tsv(&std::fs::read_to_string(&tsv).unwrap());
    let r = &fx.reference;
    let want: Vec<u64> = r.usable_rows().iter().map(|&u| r.ds.node_ids[u]).collect();
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), want);
    for (node, list) in &got {
        r.check(*node, list, 3);
    }
    // User x item flags on a graph.
    recommend(&fx, 1, &["--user", &orig(1).to_string()])
        .expect_code(2)
        .stderr_has(&["--user", "graph", "--nodes"]);
    recommend(&fx, 1, &[]).expect_code(2);
    recommend(&fx, 1, &["--test", "--all"]).expect_code(2);
    recommend(&fx, 1, &["--test", "-k", "0"]).expect_code(2);
    recommend(&fx, 1, &["--test", "--out", "x.csv"]).expect_code(2);
    // An existing output is kept without --force and replaced with it.
    let out = fx.dir.path().join("t.tsv");
    std::fs::write(&out, "keep me").unwrap();
    let o = recommend(&fx, 2, &["--test", "--out", out.to_str().unwrap()]);
    o.expect_code(2).stderr_has(&["output exists"]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me");
    recommend(
        &fx,
        2,
        &["--test", "--force", "--out", out.to_str().unwrap()],
    )
    .expect_code(0);
    assert!(std::fs::read_to_string(&out)
        .unwrap()
        .starts_with("node\trank"));
    // A model of another dataset: both sizes named.
    let other = prepare(fx.dir.path(), "other", 40);
    let n_other = Dataset::read(&other).unwrap().node_ids.len();
    let o = TestCommand::mpirun(2)
        .args(["recommend", "--test", "--model"])
        .arg(&fx.model)
        .arg("--data")
        .arg(&other)
        .run();
    o.expect_code(2)
        .occurs("a model of another dataset", 1)
        .stderr_has(&[
            &format!("{} rows", fx.reference.n()),
            &format!("{n_other} rows"),
        ]);
    // A model with a NaN in a row of /W: refused, the row named.
    let nan = fx.dir.path().join("nan.h5");
    std::fs::copy(&fx.model, &nan).unwrap();
    {
        let f = hdf5::File::open_rw(&nan).unwrap();
        let ds = f.dataset("W").unwrap();
        let mut w: ndarray::Array2<f32> = ds.read_2d().unwrap();
        w[[5, 3]] = f32::NAN;
        ds.write(&w).unwrap();
    }
    TestCommand::mpirun(2)
        .args(["recommend", "--test", "--model"])
        .arg(&nan)
        .arg("--data")
        .arg(&fx.data)
        .run()
        .expect_code(2)
        .occurs("row 5 holds a non-finite value", 1);
    // A dataset is not a model.
    let o = TestCommand::direct()
        .args(["recommend", "--test", "--model"])
        .arg(&fx.data)
        .arg("--data")
        .arg(&fx.data)
        .run();
    o.expect_code(2).stderr_has(&["not a model"]);
}

/// A dataset of the same graph with another split has the same row and column counts
/// but other training arcs: its checksum differs from the one the model records, and
/// `recommend` refuses it (exit 2) naming both files and both checksums. A model
/// without the checksum (written before it was recorded) is accepted with a warning.
#[test]
fn a_model_of_another_split_of_the_same_graph_is_refused() {
    let fx = fixture();
    let tsv = fx.dir.path().join("g.tsv");
    let other = fx.dir.path().join("resplit.h5");
    TestCommand::direct()
        .args(["prepare", "--format", "tsv", "--seed", "7", "--input"])
        .arg(&tsv)
        .arg("--out")
        .arg(&other)
        .run()
        .expect_code(0);
    let (a, b) = (
        Dataset::read(&fx.data).unwrap(),
        Dataset::read(&other).unwrap(),
    );
    assert_eq!(
        (a.meta.num_rows, a.meta.num_cols),
        (b.meta.num_rows, b.meta.num_cols)
    );
    assert_ne!(a.train, b.train, "another split has other training arcs");
    let attr = |p: &Path| -> String {
        let f = hdf5::File::open(p).unwrap();
        let v: hdf5::types::VarLenUnicode = f.attr("data_checksum").unwrap().read_scalar().unwrap();
        v.as_str().to_string()
    };
    let recorded = attr(&fx.model);
    assert_eq!(recorded.len(), 32, "{recorded}");
    // The same dataset passes at any rank count (the checksum does not depend on it).
    for np in [1, 3] {
        let o = recommend(&fx, np, &["--test"]);
        o.expect_code(0);
        assert!(!o.stderr.contains("warning"), "{}", o.stderr);
    }
    // A model trained on the other split records another checksum.
    let m2 = fx.dir.path().join("m2.h5");
    train(&other, &m2, &[]);
    let theirs = attr(&m2);
    assert_ne!(recorded, theirs);
    TestCommand::mpirun(2)
        .args(["recommend", "--test", "--model"])
        .arg(&fx.model)
        .arg("--data")
        .arg(&other)
        .run()
        .expect_code(2)
        .occurs("a model of another dataset", 1)
        .stderr_has(&["g.h5", "resplit.h5", &recorded, &theirs]);
    // An older model, without the attribute: accepted, with a warning naming it.
    let old = fx.dir.path().join("old.h5");
    std::fs::copy(&fx.model, &old).unwrap();
    hdf5::File::open_rw(&old)
        .unwrap()
        .delete_attr("data_checksum")
        .unwrap();
    TestCommand::mpirun(2)
        .args(["recommend", "--test", "--model"])
        .arg(&old)
        .arg("--data")
        .arg(&fx.data)
        .run()
        .expect_code(0)
        .occurs("does not record the dataset it was trained on", 1);
}

#[test]
fn preemption_between_blocks_exits_75_without_output() {
    let fx = fixture();
    let out = fx.dir.path().join("p.h5");
    let o = TestCommand::mpirun(2)
        .env("TORUSREC_PREEMPT_AT", "2")
        .args(["recommend", "--threads", "1", "--model"])
        .arg(&fx.model)
        .arg("--data")
        .arg(&fx.data)
        .args(["--all", "--block-rows", "5", "--out"])
        .arg(&out)
        .run();
    o.expect_code(75).stderr_has(&["after 10 of"]);
    assert!(!out.exists());
    assert!(!fx.dir.path().join("p.h5.partial").exists());
}

#[test]
fn history_and_similar_work_on_a_graph_too() {
    let fx = fixture();
    let r = &fx.reference;
    // A test row's visible arcs as a history: the test row's fold-in, bit for bit.
    let t = r.ds.test_rows[0] as usize;
    let visible: Vec<String> = r
        .fold_arcs(0)
        .iter()
        .map(|&c| r.ds.node_ids[c as usize].to_string())
        .collect();
    let node = r.ds.node_ids[t].to_string();
    let a = recommend(&fx, 2, &["--nodes", &node, "-k", "5"]);
    let b = recommend(&fx, 2, &["--history", &visible.join(","), "-k", "5"]);
    let (a, b) = (
        a.expect_code(0).stdout.clone(),
        b.expect_code(0).stdout.clone(),
    );
    let tail = |s: &str| -> Vec<String> {
        s.lines()
            .skip(1)
            .map(|l| l.split_once('\t').unwrap().1.to_string())
            .collect()
    };
    assert_eq!(tail(&a), tail(&b));
    assert!(b.lines().nth(1).unwrap().starts_with("history\t"), "{b}");
    // Similar nodes: cosine of H rows, the node itself left out.
    let o = recommend(&fx, 3, &["--similar", &orig(2).to_string(), "-k", "3"]);
    let text = o.expect_code(0).stdout.clone();
    assert!(text.starts_with("node\trank\tsimilar\tscore\n"), "{text}");
    let d = r.d;
    let unit = |c: usize| -> Vec<f64> {
        let v: Vec<f64> = r.h[c * d..(c + 1) * d].iter().map(|&x| x as f64).collect();
        let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        v.iter().map(|x| x / n).collect()
    };
    let q = unit(r.row_of(orig(2)));
    for l in text.lines().skip(1) {
        let f: Vec<&str> = l.split('\t').collect();
        let c = r.row_of(f[2].parse().unwrap());
        assert_ne!(f[2], orig(2).to_string());
        let cos: f64 = unit(c).iter().zip(&q).map(|(a, b)| a * b).sum();
        assert!(
            (f[3].parse::<f64>().unwrap() - cos).abs() < 1e-5,
            "{l}: {cos}"
        );
    }
}
