//! Per-id weights of `prepare clicks --columns` (`cat:weight=C`, `weights:TABLE`):
//! the prepared log holds `/tables/<t>/weights` (f32, one per id) for the weighted
//! tables only, with the weights as written (negative ones too); a log whose every
//! weight is 1.0 trains with the bits of the same log without weights at 1 and 2
//! ranks; bad weights exit 2 naming file, line and column and write nothing; and
//! `embed --output-mode pooled` on a weighted log exits 2.

use crate::util;

use std::path::{Path, PathBuf};

use torusrec::data::clicks::log_file::ClickLog;
use util::{serial, tempdir, TestCommand};

fn launcher(np: usize) -> TestCommand {
    if np == 1 {
        TestCommand::direct()
    } else {
        TestCommand::mpirun(np)
    }
}

/// The columns of [`weighted_csv`]: `site` weighted item by item (`KEY:WEIGHT`),
/// `tags` by the `tagw` column.
pub(crate) const WEIGHTED: &str =
    "click=label,price=log,site=cat:weight=:,tags=cat:list=|,tagw=weights:tags";
/// The same file's columns without weights (`tagw` skipped; for the unweighted file
/// of [`weighted_csv`] with `weight = None`).
const UNWEIGHTED: &str = "click=label,price=log,site=cat,tags=cat:list=|,tagw=skip";

/// Row `i`'s weight of item `k` (2 and 0.5 among them, and negative ones).
pub(crate) fn some_weight(i: usize, k: usize) -> f32 {
    [2.0, 0.5, 1.0, -0.75, 1.5, 0.25, 3.0][(i + 3 * k) % 7]
}

/// `n` examples as a csv with a header: click, price, site (one id), tags (0 to 3
/// ids), tagw (the tags' weights). With `weight`, `site` is `KEY:W` and `tagw` holds
/// the weights `weight(i, k)` (item 0 is the site, 1.. the tags); without, `site` is
/// the key alone and `tagw` is 1s (skipped by [`UNWEIGHTED`]).
pub(crate) fn weighted_csv(p: &Path, n: usize, weight: Option<fn(usize, usize) -> f32>) {
    let mut t = String::from("click,price,site,tags,tagw\n");
    for i in 0..n {
        let label = u8::from((i * 7 + i / 3) % 5 < 2);
        let site = format!("s{}", (i * 5) % 23);
        let tags: Vec<String> = (0..i % 4)
            .map(|k| format!("t{}", (i + k * 5) % 9))
            .collect();
        let w = |k: usize| weight.map_or(1.0, |f| f(i, k));
        let site = match weight {
            Some(_) => format!("{site}:{}", w(0)),
            None => site,
        };
        let tagw: Vec<String> = (0..tags.len()).map(|k| w(k + 1).to_string()).collect();
        t.push_str(&format!(
            "{label},{}.{},{site},{},{}\n",
            i % 17,
            i % 10,
            tags.join("|"),
            tagw.join("|")
        ));
    }
    std::fs::write(p, t).unwrap();
}

fn prepare(np: usize, input: &Path, out: &Path, cols: &str) -> TestCommand {
    launcher(np)
        .args(["prepare", "clicks", "--format", "csv", "--columns", cols])
        .arg("--input")
        .arg(input)
        .arg("--out")
        .arg(out)
}

fn ones(_: usize, _: usize) -> f32 {
    1.0
}

#[test]
fn the_log_holds_the_weights_of_the_weighted_tables_only() {
    let d = tempdir();
    let dir = d.path();
    let csv = dir.join("w.csv");
    weighted_csv(&csv, 300, Some(some_weight));
    let out = dir.join("w.h5");
    prepare(1, &csv, &out, WEIGHTED).run().expect_code(0);
    let log = ClickLog::open(&out).unwrap();
    assert_eq!(log.weighted(), &[true, true]);
    let b = log.read(0, 300).unwrap();
    let (mut site, mut tags) = (Vec::new(), Vec::new());
    for i in 0..300 {
        site.push(some_weight(i, 0));
        tags.extend((0..i % 4).map(|k| some_weight(i, k + 1)));
    }
    assert_eq!(b.weights[0], site);
    assert_eq!(b.weights[1], tags);
    assert_eq!(b.weights[1].len(), b.keys[1].ids.len());
    assert!(tags.contains(&-0.75), "a negative weight is kept");
    assert_eq!(
        util::h5_read::<f32>(&out, "tables/1/weights"),
        tags,
        "/tables/1/weights"
    );
    // Tags weighted, the site not: only /tables/1/weights.
    let csv1 = dir.join("u.csv");
    weighted_csv(&csv1, 300, None);
    let part = dir.join("part.h5");
    let cols = "click=label,price=log,site=cat,tags=cat:list=|,tagw=weights:tags";
    prepare(2, &csv1, &part, cols).run().expect_code(0);
    assert_eq!(ClickLog::open(&part).unwrap().weighted(), &[false, true]);
    let f = torusrec::io::h5::open(&part).unwrap();
    assert!(f.dataset("tables/0/weights").is_err());
    assert_eq!(
        util::h5_read::<f32>(&part, "tables/1/weights"),
        vec![1.0; b.keys[1].ids.len()]
    );
    // Prepared at 2 ranks: the same weights.
    let two = dir.join("w2.h5");
    prepare(2, &csv, &two, WEIGHTED).run().expect_code(0);
    let b2 = ClickLog::open(&two).unwrap().read(0, 300).unwrap();
    assert_eq!(b2, b, "2 ranks prepared another log");
}

/// The `final:` line of `embed` on `log` (8 steps of 32, 200 held out): the held-out
/// AUC and log loss, the checksum of the model.
fn final_line(np: usize, log: &Path, extra: &[&str]) -> String {
    let o = launcher(np)
        .args(["embed", "--data"])
        .arg(log)
        .args(["--batch", "32", "--steps", "8", "--log-every", "4"])
        .args(["--threads", "1", "--seed", "5", "--eval-examples", "200"])
        .args(extra)
        .run();
    o.expect_code(0);
    let sum = o.final_checksum();
    assert_eq!(sum.len(), 16);
    let line = o.stdout.lines().find(|l| l.starts_with("final:")).unwrap();
    // Without the peak RSS (not a result).
    line.split("  peak RSS").next().unwrap().to_string()
}

#[test]
fn weights_of_one_train_with_the_bits_of_no_weights_at_1_and_2_ranks() {
    let _serial = serial();
    let d = tempdir();
    let dir = d.path();
    let (u, w) = (dir.join("u.csv"), dir.join("w.csv"));
    weighted_csv(&u, 1200, None);
    weighted_csv(&w, 1200, Some(ones));
    let (lu, lw): (PathBuf, PathBuf) = (dir.join("u.h5"), dir.join("w.h5"));
    prepare(1, &u, &lu, UNWEIGHTED).run().expect_code(0);
    prepare(1, &w, &lw, WEIGHTED).run().expect_code(0);
    assert_eq!(ClickLog::open(&lw).unwrap().weighted(), &[true, true]);
    for np in [1, 2] {
        for extra in [&[][..], &["--output-mode", "rows"][..], &["--no-dedup"][..]] {
            let (a, b) = (final_line(np, &lu, extra), final_line(np, &lw, extra));
            assert_eq!(
                a, b,
                "{np} rank(s) {extra:?}: weights of 1.0 changed the run"
            );
        }
    }
    // Weights other than 1.0 train another model.
    let x = dir.join("x.csv");
    weighted_csv(&x, 1200, Some(some_weight));
    let lx = dir.join("x.h5");
    prepare(1, &x, &lx, WEIGHTED).run().expect_code(0);
    assert_ne!(final_line(1, &lx, &[]), final_line(1, &lw, &[]));
}

#[test]
fn bad_weights_exit_2_naming_file_line_and_column_and_write_nothing() {
    let d = tempdir();
    let dir = d.path();
    let good = dir.join("good.csv");
    weighted_csv(&good, 400, Some(some_weight));
    let text = std::fs::read_to_string(&good).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let out = dir.join("out.h5");
    // Line 300 of the file (the header is line 1): in rank 1's half at 2 ranks.
    for (bad, want) in [
        (
            "1,1.5,s1:x,t1|t2,1|2",
            "column 3 (\"site\"): \"s1:x\" has a weight that is not a finite number",
        ),
        (
            "1,1.5,s1:NaN,t1,1",
            "\"s1:NaN\" has a weight that is not a finite number",
        ),
        (
            "1,1.5,s1:inf,t1,1",
            "\"s1:inf\" has a weight that is not a finite number",
        ),
        (
            "1,1.5,s1:1e39,t1,1",
            "\"s1:1e39\" has a weight that is not a finite number",
        ),
        (
            "1,1.5,s1,t1,1",
            "column 3 (\"site\"): \"s1\" has an item without its weight",
        ),
        (
            "1,1.5,s1:1,t1|t2,1|abc",
            "column 5 (\"tagw\"): \"1|abc\" has a weight that is not a finite number",
        ),
        (
            "1,1.5,s1:1,t1|t2,1|nan",
            "column 5 (\"tagw\"): \"1|nan\" has a weight that is not a finite number",
        ),
        (
            "1,1.5,s1:1,t1|t2,1",
            "column 5 (\"tagw\"): \"1\" holds 1 weights for the 2 ids of column 4 (\"tags\")",
        ),
        ("1,1.5,s1:1,,2", "holds 1 weights for the 0 ids of column 4"),
        (
            "1,1.5,s1:1,t1,",
            "holds 0 weights for the 1 ids of column 4",
        ),
    ] {
        lines[299] = bad.to_string();
        let p = dir.join("bad.csv");
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        for np in [1, 2] {
            prepare(np, &p, &out, WEIGHTED)
                .run()
                .expect_code(2)
                .stderr_has(&["bad.csv:300: ", want]);
            assert!(!out.exists(), "{bad}: an output was written");
            assert!(!dir.join("out.h5.partial").exists(), "{bad}: a temporary");
        }
    }
    // A negative weight and 0 are weights.
    lines[299] = "1,1.5,s1:-2,t1|t2,0|-0.5".to_string();
    let p = dir.join("neg.csv");
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    prepare(1, &p, &out, WEIGHTED).run().expect_code(0);
    let b = ClickLog::open(&out).unwrap().read(298, 1).unwrap();
    assert_eq!(b.weights, vec![vec![-2.0], vec![0.0, -0.5]]);
    std::fs::remove_file(&out).unwrap();
    // A table weighted twice, and weights of no cat column: refused before any input
    // is read.
    for (cols, want) in [
        (
            "click=label,price=log,site=cat:weight=:,tags=skip,tagw=weights:site",
            "given weights twice",
        ),
        (
            "click=label,price=log,site=cat,tags=skip,tagw=weights:price",
            "weights:price: no cat or hex column named \"price\"",
        ),
    ] {
        prepare(1, &good, &out, cols)
            .run()
            .expect_code(2)
            .stderr_has(&[want]);
        assert!(!out.exists());
    }
}

#[test]
fn output_mode_pooled_on_a_weighted_log_exits_2() {
    let _serial = serial();
    let d = tempdir();
    let dir = d.path();
    let csv = dir.join("w.csv");
    weighted_csv(&csv, 400, Some(some_weight));
    let log = dir.join("w.h5");
    prepare(1, &csv, &log, WEIGHTED).run().expect_code(0);
    for np in [1, 2] {
        let out = dir.join(format!("m{np}.h5"));
        launcher(np)
            .args(["embed", "--data"])
            .arg(&log)
            .args(["--batch", "32", "--steps", "2", "--threads", "1"])
            .args(["--eval-examples", "100", "--output-mode", "pooled", "--out"])
            .arg(&out)
            .run()
            .expect_code(2)
            .stderr_has(&["--output-mode pooled", "per-id weights"]);
        assert!(!out.exists(), "{np} rank(s): a model was written");
    }
    // rows and auto train.
    for mode in ["rows", "auto"] {
        launcher(2)
            .args(["embed", "--data"])
            .arg(&log)
            .args(["--batch", "32", "--steps", "2", "--threads", "1"])
            .args(["--eval-examples", "100", "--output-mode", mode])
            .run()
            .expect_code(0);
    }
}
