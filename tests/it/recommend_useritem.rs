//! `torusrec recommend` on a user x item dataset (`prepare --matrix user-item`), with
//! sparse integer user ids and string item ids: `--user` (training and test users),
//! `--history` (a new user folded in: bit for bit the test row's fold-in, the solve
//! evaluation uses), `--similar` (cosine on H), `--exclude` / `--allow`, `--all` to a
//! streamed TSV, against a brute-force reference computed here; bad ids and list
//! files exit 2 naming the file and line, nothing written.

use crate::recommend::{read_table, solve};
use crate::util;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use torusrec::data::graph::dataset::Dataset;
use util::{tempdir, TestCommand};

/// User `u`'s original id.
fn user(u: u64) -> u64 {
    100 + 3 * u
}

/// A seeded interaction list: 80 users, 50 items `m0..m49` (low ones popular).
fn write_interactions(path: &Path) {
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |m: u64| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) % m
    };
    let mut text = String::new();
    for u in 0..80 {
        for _ in 0..3 + next(8) {
            let i = next(50).min(next(50));
            text.push_str(&format!("{}\tm{i}\n", user(u)));
        }
    }
    std::fs::write(path, text).unwrap();
}

struct Fx {
    dir: tempfile::TempDir,
    data: PathBuf,
    model: PathBuf,
    ds: Dataset,
    items: Vec<String>,
    w: Vec<f32>,
    h: Vec<f32>,
    d: usize,
    reg: f64,
    alpha0: f64,
}

fn fixture() -> Fx {
    let dir = tempdir();
    let tsv = dir.path().join("ui.tsv");
    write_interactions(&tsv);
    let data = dir.path().join("ui.h5");
    TestCommand::direct()
        .args(["prepare", "--matrix", "user-item", "--format", "tsv"])
        .args(["--header", "no", "--input"])
        .arg(&tsv)
        .arg("--out")
        .arg(&data)
        .run()
        .expect_code(0);
    let model = dir.path().join("m.h5");
    TestCommand::direct()
        .args(["als", "--data"])
        .arg(&data)
        .args(["--dim", "6", "--epochs", "3", "--threads", "1", "--solver"])
        .args(["cholesky", "--reg", "0.05", "--unobserved-weight", "0.1"])
        .arg("--out")
        .arg(&model)
        .run()
        .expect_code(0);
    let ds = Dataset::read(&data).unwrap();
    assert!(ds.test_rows.len() >= 4, "a few test users");
    let f = torusrec::io::h5::open(&data).unwrap();
    let items: Vec<String> = f
        .dataset("item_ids")
        .unwrap()
        .read_raw::<hdf5::types::VarLenUnicode>()
        .unwrap()
        .iter()
        .map(|s| s.as_str().to_string())
        .collect();
    let m = torusrec::io::h5::open(&model).unwrap();
    let cfg: serde_json::Value = serde_json::from_str(
        m.attr("config")
            .unwrap()
            .read_scalar::<hdf5::types::VarLenUnicode>()
            .unwrap()
            .as_str(),
    )
    .unwrap();
    Fx {
        w: read_table(&m, "W"),
        h: read_table(&m, "H"),
        d: m.dataset("H").unwrap().shape()[1],
        reg: cfg["reg"].as_f64().unwrap(),
        alpha0: cfg["unobserved_weight"].as_f64().unwrap(),
        dir,
        data,
        model,
        ds,
        items,
    }
}

impl Fx {
    fn row_of(&self, u: u64) -> usize {
        self.ds.node_ids.binary_search(&u).expect("a user")
    }
    fn item_of(&self, name: &str) -> u32 {
        self.items.iter().position(|s| s == name).expect("an item") as u32
    }
    fn n_items(&self) -> usize {
        self.items.len()
    }
    fn hrow(&self, c: usize) -> Vec<f64> {
        let d = self.d;
        self.h[c * d..(c + 1) * d]
            .iter()
            .map(|&v| v as f64)
            .collect()
    }
    fn test_pos(&self, r: usize) -> Option<usize> {
        self.ds.test_rows.binary_search(&(r as u32)).ok()
    }
    /// The visible items of test user `u`, in stored order.
    fn fold_items(&self, u: u64) -> Vec<u32> {
        let pos = self.test_pos(self.row_of(u)).expect("a test user");
        let f = &self.ds.fold;
        f.targets[f.indptr[pos] as usize..f.indptr[pos + 1] as usize].to_vec()
    }
    /// The exact fold-in in f64 of a row whose visible items are `seen`, rounded to f32.
    fn fold_in(&self, seen: &[u32]) -> Vec<f64> {
        let d = self.d;
        let mut a = vec![0.0; d * d];
        for c in 0..self.n_items() {
            let hc = self.hrow(c);
            for i in 0..d {
                for j in 0..d {
                    a[i * d + j] += self.alpha0 * hc[i] * hc[j];
                }
            }
        }
        let mut b = vec![0.0; d];
        for &c in seen {
            let hc = self.hrow(c as usize);
            for i in 0..d {
                b[i] += hc[i];
                for j in 0..d {
                    a[i * d + j] += hc[i] * hc[j];
                }
            }
        }
        let diag = self.reg * (seen.len() as f64 + self.alpha0 * self.n_items() as f64);
        for i in 0..d {
            a[i * d + i] += diag;
        }
        solve(a, b, d).iter().map(|&v| v as f32 as f64).collect()
    }
    /// User `u`'s vector and seen items.
    fn vector(&self, u: u64) -> (Vec<f64>, Vec<u32>) {
        let r = self.row_of(u);
        if self.test_pos(r).is_some() {
            let seen = self.fold_items(u);
            return (self.fold_in(&seen), seen);
        }
        let t = &self.ds.train;
        let seen = t.targets[t.indptr[r] as usize..t.indptr[r + 1] as usize].to_vec();
        let d = self.d;
        (
            self.w[r * d..(r + 1) * d]
                .iter()
                .map(|&v| v as f64)
                .collect(),
            seen,
        )
    }
    /// The full ranking of the columns `keep` admits: (item, score), best first, ties
    /// to the smaller internal id.
    fn ranking(
        &self,
        score: impl Fn(usize) -> f64,
        keep: impl Fn(u32) -> bool,
    ) -> Vec<(String, f64)> {
        let mut all: Vec<(usize, f64)> = (0..self.n_items())
            .filter(|&c| keep(c as u32))
            .map(|c| (c, score(c)))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all.into_iter()
            .map(|(c, s)| (self.items[c].clone(), s))
            .collect()
    }
    fn user_ranking(&self, u: u64, keep: impl Fn(u32) -> bool) -> Vec<(String, f64)> {
        let (x, seen) = self.vector(u);
        let score = |c: usize| -> f64 { self.hrow(c).iter().zip(&x).map(|(a, b)| a * b).sum() };
        self.ranking(score, |c| !seen.contains(&c) && keep(c))
    }
    fn similar_ranking(&self, item: u32) -> Vec<(String, f64)> {
        let unit = |c: usize| -> Vec<f64> {
            let v = self.hrow(c);
            let n = v.iter().map(|a| a * a).sum::<f64>().sqrt();
            v.iter()
                .map(|a| if n > 0.0 { a / n } else { 0.0 })
                .collect()
        };
        let q = unit(item as usize);
        let score = |c: usize| -> f64 { unit(c).iter().zip(&q).map(|(a, b)| a * b).sum() };
        self.ranking(score, |c| c != item)
    }
    fn run(&self, np: usize, extra: &[&str]) -> util::Output {
        TestCommand::mpirun(np)
            .args(["recommend", "--threads", "1", "--model"])
            .arg(&self.model)
            .arg("--data")
            .arg(&self.data)
            .args(extra)
            .run()
    }
}

/// Check a list (best first) against a reference ranking: the same items (another
/// only in a tie within 1e-5), scores within 1e-5.
#[track_caller]
fn check(what: &str, got: &[(String, f32)], want: &[(String, f64)], k: usize) {
    assert_eq!(got.len(), k.min(want.len()), "{what}: {got:?}");
    let names: HashSet<&String> = got.iter().map(|g| &g.0).collect();
    assert_eq!(names.len(), got.len(), "{what}: repeats in {got:?}");
    for (j, (id, s)) in got.iter().enumerate() {
        let w = want
            .iter()
            .find(|x| &x.0 == id)
            .unwrap_or_else(|| panic!("{what}: {id} not admissible"));
        assert!(
            (*s as f64 - w.1).abs() <= 1e-5,
            "{what} rank {}: {id} {s} vs {}",
            j + 1,
            w.1
        );
        let (rid, rs) = &want[j];
        assert!(
            id == rid || (w.1 - rs).abs() <= 1e-5,
            "{what} rank {}: {id} vs {rid}",
            j + 1
        );
    }
}

type Lists = Vec<(String, Vec<(String, f32)>)>;

/// TSV output (`header` first): the rows in order of appearance, each with its list.
fn parse(text: &str, header: &str) -> Lists {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(header), "{text}");
    let mut out: Lists = Vec::new();
    for l in lines {
        let f: Vec<&str> = l.split('\t').collect();
        assert_eq!(f.len(), 4, "{l}");
        if out.last().is_none_or(|(n, _)| n != f[0]) {
            out.push((f[0].to_string(), Vec::new()));
        }
        let list = &mut out.last_mut().unwrap().1;
        assert_eq!(f[1].parse::<usize>().unwrap(), list.len() + 1, "{l}");
        list.push((f[2].to_string(), f[3].parse().unwrap()));
    }
    out
}

const HEADER: &str = "user\trank\titem\tscore";

fn test_users(fx: &Fx) -> Vec<u64> {
    fx.ds
        .test_rows
        .iter()
        .map(|&t| fx.ds.node_ids[t as usize])
        .collect()
}

fn train_user(fx: &Fx) -> u64 {
    let t = &fx.ds.train;
    let r = (0..fx.ds.node_ids.len())
        .find(|&r| t.indptr[r + 1] > t.indptr[r])
        .unwrap();
    fx.ds.node_ids[r]
}

#[test]
fn history_fold_in_is_the_test_rows_solve_bit_for_bit() {
    let fx = fixture();
    for &u in &test_users(&fx)[..3] {
        let visible = fx.fold_items(u);
        let hist: Vec<String> = visible
            .iter()
            .map(|&c| fx.items[c as usize].clone())
            .collect();
        for np in [1, 3] {
            let by_user = fx.run(np, &["--user", &u.to_string(), "-k", "8"]);
            by_user.expect_code(0);
            let by_hist = fx.run(np, &["--history", &hist.join(","), "-k", "8"]);
            by_hist.expect_code(0);
            let a = parse(&by_user.stdout, HEADER);
            let b = parse(&by_hist.stdout, HEADER);
            assert_eq!((a.len(), b.len()), (1, 1));
            assert_eq!(b[0].0, "history");
            // The same items and the same score bits: the same solve.
            let bits = |l: &[(String, f32)]| -> Vec<(String, u32)> {
                l.iter().map(|(i, s)| (i.clone(), s.to_bits())).collect()
            };
            assert_eq!(bits(&a[0].1), bits(&b[0].1), "user {u} P={np}");
            check(
                &format!("history of {u}"),
                &b[0].1,
                &fx.user_ranking(u, |_| true),
                8,
            );
        }
    }
    // A history with a repeat and an explicit weight (ignored by a binary model)
    // is the history without them.
    let u = test_users(&fx)[0];
    let names: Vec<String> = fx
        .fold_items(u)
        .iter()
        .map(|&c| fx.items[c as usize].clone())
        .collect();
    let mut with = names.clone();
    with.push(names[0].clone());
    with[0] = format!("{}:3", names[0]);
    let a = fx.run(2, &["--history", &names.join(",")]);
    let b = fx.run(2, &["--history", &with.join(",")]);
    assert_eq!(a.expect_code(0).stdout, b.expect_code(0).stdout);
}

#[test]
fn users_similar_items_and_filters_match_brute_force() {
    let fx = fixture();
    let tu = test_users(&fx);
    let asked = [tu[1], train_user(&fx), tu[1]];
    let list = asked
        .iter()
        .map(|u| u.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let o = fx.run(2, &["--user", &list, "-k", "5"]);
    let got = parse(&o.expect_code(0).stdout, HEADER);
    let users: Vec<String> = got.iter().map(|g| g.0.clone()).collect();
    assert_eq!(users, vec![asked[0].to_string(), asked[1].to_string()]);
    for (u, l) in &got {
        check(u, l, &fx.user_ranking(u.parse().unwrap(), |_| true), 5);
    }

    // --exclude and --allow (files with comments), from a user file.
    let u = train_user(&fx);
    let top: Vec<String> = fx
        .user_ranking(u, |_| true)
        .iter()
        .take(3)
        .map(|x| x.0.clone())
        .collect();
    let ex = fx.dir.path().join("ex.txt");
    std::fs::write(
        &ex,
        format!("# drop the best two\n{}\n\n{}  # second\n", top[0], top[1]),
    )
    .unwrap();
    let users = fx.dir.path().join("users.txt");
    std::fs::write(&users, format!("{u}\n")).unwrap();
    let o = fx.run(
        3,
        &[
            "--user-file",
            users.to_str().unwrap(),
            "--exclude",
            ex.to_str().unwrap(),
            "-k",
            "4",
        ],
    );
    let got = parse(&o.expect_code(0).stdout, HEADER);
    let dropped = [fx.item_of(&top[0]), fx.item_of(&top[1])];
    check(
        "exclude",
        &got[0].1,
        &fx.user_ranking(u, |c| !dropped.contains(&c)),
        4,
    );
    assert_eq!(got[0].1[0].0, top[2]);
    let al = fx.dir.path().join("al.txt");
    let allowed: Vec<&str> = [3, 9, 17, 30, 40]
        .iter()
        .map(|&i| fx.items[i].as_str())
        .collect();
    std::fs::write(&al, allowed.join("\n")).unwrap();
    let o = fx.run(
        2,
        &[
            "--user",
            &u.to_string(),
            "--allow",
            al.to_str().unwrap(),
            "--exclude",
            ex.to_str().unwrap(),
            "-k",
            "10",
        ],
    );
    let got = parse(&o.expect_code(0).stdout, HEADER);
    let ok: Vec<u32> = allowed.iter().map(|a| fx.item_of(a)).collect();
    let want = fx.user_ranking(u, |c| ok.contains(&c) && !dropped.contains(&c));
    assert!(want.len() < 10 && !want.is_empty());
    check("allow", &got[0].1, &want, 10);

    // Similar items: cosine on H, the item itself left out.
    let o = fx.run(3, &["--similar", "m0,m7", "-k", "6", "--block-rows", "1"]);
    let got = parse(&o.expect_code(0).stdout, "item\trank\tsimilar\tscore");
    assert_eq!(
        got.iter().map(|g| g.0.as_str()).collect::<Vec<_>>(),
        ["m0", "m7"]
    );
    for (i, l) in &got {
        check(
            &format!("similar {i}"),
            l,
            &fx.similar_ranking(fx.item_of(i)),
            6,
        );
    }
}

#[test]
fn all_streams_tsv_in_row_order_at_any_rank_count() {
    let fx = fixture();
    let out = fx.dir.path().join("recs.tsv");
    let mut texts = Vec::new();
    for np in [1, 3] {
        let o = fx.run(
            np,
            &[
                "--all",
                "-k",
                "3",
                "--block-rows",
                "7",
                "--force",
                "--out",
                out.to_str().unwrap(),
            ],
        );
        o.expect_code(0);
        texts.push(std::fs::read_to_string(&out).unwrap());
    }
    // The Gramian of H is summed over ranks, so test rows' scores may differ in the
    // last bits between rank counts; the lists are the same.
    let got = parse(&texts[0], HEADER);
    let ids = |l: &Lists| -> Vec<Vec<String>> {
        l.iter()
            .map(|(_, v)| v.iter().map(|x| x.0.clone()).collect())
            .collect()
    };
    assert_eq!(ids(&got), ids(&parse(&texts[1], HEADER)), "P=1 and P=3");
    let t = &fx.ds.train;
    let want: Vec<String> = (0..fx.ds.node_ids.len())
        .filter(|&r| fx.test_pos(r).is_some() || t.indptr[r + 1] > t.indptr[r])
        .map(|r| fx.ds.node_ids[r].to_string())
        .collect();
    assert_eq!(got.iter().map(|g| g.0.clone()).collect::<Vec<_>>(), want);
    for (u, l) in &got {
        check(u, l, &fx.user_ranking(u.parse().unwrap(), |_| true), 3);
    }
}

#[test]
fn bad_ids_and_list_files_exit_2_naming_file_and_line() {
    let fx = fixture();
    let out = fx.dir.path().join("r.tsv");
    let o_ = out.to_str().unwrap();
    let u = train_user(&fx).to_string();
    let fails = |args: &[&str], needles: &[&str]| {
        fx.run(2, args).expect_code(2).stderr_has(needles);
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    };
    fails(
        &["--user", &format!("{u},99999"), "--out", o_],
        &["1 user id(s) are not users", "99999"],
    );
    fails(
        &["--history", "m1,nope", "--out", o_],
        &["not items of the dataset", "nope"],
    );
    fails(
        &["--history", "m1:-2", "--out", o_],
        &["--history", "m1:-2"],
    );
    fails(&["--similar", "m999", "--out", o_], &["m999"]);
    let ex = fx.dir.path().join("ex.txt");
    std::fs::write(&ex, "m1\n# fine\nm9999\n").unwrap();
    fails(
        &["--user", &u, "--exclude", ex.to_str().unwrap(), "--out", o_],
        &["ex.txt:3", "m9999"],
    );
    let al = fx.dir.path().join("al.txt");
    std::fs::write(&al, "m1\nm2 m3\n").unwrap();
    fails(
        &["--user", &u, "--allow", al.to_str().unwrap(), "--out", o_],
        &["al.txt:2", "one id per line"],
    );
    std::fs::write(&al, "# nothing\n").unwrap();
    fails(
        &["--user", &u, "--allow", al.to_str().unwrap(), "--out", o_],
        &["al.txt", "no ids"],
    );
    let users = fx.dir.path().join("users.txt");
    std::fs::write(&users, format!("{u}\n\n77777\n")).unwrap();
    fails(
        &["--user-file", users.to_str().unwrap(), "--out", o_],
        &["users.txt:3", "77777"],
    );
    // Graph flags on a user x item dataset; HDF5 output with string item ids.
    fails(&["--nodes", &u, "--out", o_], &["--nodes", "--user"]);
    let h5 = fx.dir.path().join("r.h5");
    fx.run(1, &["--user", &u, "--out", h5.to_str().unwrap()])
        .expect_code(2)
        .stderr_has(&["strings", ".tsv"]);
    assert!(!h5.exists());
}
