//! `prepare clicks --format csv|tsv --columns SPEC [--header]`: a csv with quoted
//! strings, multi-hot fields and skipped columns prepares at 1 and 2 ranks to the
//! same log, whose keys are the documented derivation (FNV-1a 64, then splitmix64's
//! finalizer, recomputed here from the definition); the same data as tsv gives the
//! same log; `embed` trains on it with the same bits twice at each rank count; bad
//! input exits 2 naming file, line and column, and writes nothing (per-id weights:
//! `clicks_weights`).

use crate::util;

use std::path::{Path, PathBuf};

use torusrec::data::clicks::log_file::ClickLog;
use util::{tempdir, TestCommand};

/// The documented key of a text categorical, written from its definition (not the
/// crate's function): FNV-1a 64 of the bytes, then splitmix64's finalizer.
fn reference_key(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    let mut z = h;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

fn launcher(np: usize) -> TestCommand {
    if np == 1 {
        TestCommand::direct()
    } else {
        TestCommand::mpirun(np)
    }
}

fn prepare(np: usize, format: &str, input: &[&Path], out: &Path, cols: &str) -> TestCommand {
    launcher(np)
        .args(["prepare", "clicks", "--format", format, "--columns", cols])
        .arg("--input")
        .args(input)
        .arg("--out")
        .arg(out)
}

/// One example: label, price, site, tags (multi-hot), junk (skipped).
struct Row {
    label: u8,
    price: String,
    site: String,
    tags: Vec<String>,
}

/// `n` rows whose sites hold commas and quotes, and whose tag lists are 0 to 3 long.
fn rows(n: usize) -> Vec<Row> {
    (0..n)
        .map(|i| Row {
            label: u8::from((i * 7 + i / 3) % 5 < 2),
            price: if i % 11 == 0 {
                String::new()
            } else {
                format!("{}.{}", i % 17, i % 10)
            },
            site: match i % 4 {
                0 => format!("site {}", i % 13),
                1 => format!("a, b {}", i % 5),
                2 => format!("say \"hi\" {}", i % 3),
                _ => format!("ünï{}", i % 7),
            },
            tags: (0..i % 4)
                .map(|k| format!("t{}", (i + k * 5) % 9))
                .collect(),
        })
        .collect()
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn write_csv(p: &Path, rows: &[Row], header: bool) {
    let mut t = String::new();
    if header {
        t.push_str("click,price,site,tags,junk\n");
    }
    for (i, r) in rows.iter().enumerate() {
        t.push_str(&format!(
            "{},{},{},{},\"j,{i}\"\n",
            r.label,
            r.price,
            csv_field(&r.site),
            r.tags.join("|")
        ));
    }
    std::fs::write(p, t).unwrap();
}

fn write_tsv(p: &Path, rows: &[Row]) {
    let mut t = String::new();
    for (i, r) in rows.iter().enumerate() {
        t.push_str(&format!(
            "{}\t{}\t{}\t{}\tj{i}\n",
            r.label,
            r.price,
            r.site,
            r.tags.join("|")
        ));
    }
    std::fs::write(p, t).unwrap();
}

const BY_NAME: &str = "click=label,price=log,site=cat,tags=cat:list=|,junk=skip";
const POSITIONAL: &str = "label,log,text,text:list=|,skip";

fn read(p: &Path) -> (ClickLog, torusrec::data::clicks::batch::Batch) {
    let log = ClickLog::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let b = log.read(0, log.examples() as usize).unwrap();
    (log, b)
}

#[test]
fn a_csv_of_strings_and_lists_prepares_to_the_documented_keys_at_1_and_2_ranks() {
    let d = tempdir();
    let dir = d.path();
    let rs = rows(300);
    let (a, b) = (dir.join("day0.csv"), dir.join("day1.csv"));
    write_csv(&a, &rs[..170], true);
    write_csv(&b, &rs[170..], true);
    let mut outs: Vec<PathBuf> = Vec::new();
    for np in [1, 2] {
        let out = dir.join(format!("p{np}.h5"));
        prepare(np, "csv", &[&a, &b], &out, BY_NAME)
            .run()
            .expect_code(0)
            .stdout_has(&["prepare clicks: examples 300, days 2", "skipped 0"]);
        outs.push(out);
    }
    let (log, batch) = read(&outs[0]);
    assert_eq!(log.days(), &[0, 170, 300]);
    let names: Vec<&str> = log.spec().tables.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["site", "tags"]);
    assert!(log
        .spec()
        .tables
        .iter()
        .all(|t| t.vocab_kind == torusrec::spec::VocabKind::Hash));
    assert_eq!(log.spec().n_dense, 1);
    for (i, r) in rs.iter().enumerate() {
        assert_eq!(batch.labels[i], f32::from(r.label), "row {i}");
        let x: f64 = if r.price.is_empty() {
            0.0
        } else {
            r.price.parse().unwrap()
        };
        assert_eq!(batch.dense[i].to_bits(), (x.ln_1p() as f32).to_bits());
        assert_eq!(batch.keys[0].bag(i), [reference_key(&r.site)], "row {i}");
        let tags: Vec<u64> = r.tags.iter().map(|t| reference_key(t)).collect();
        assert_eq!(batch.keys[1].bag(i), &tags[..], "row {i}");
    }
    let (_, b2) = read(&outs[1]);
    assert_eq!(b2, batch, "2 ranks prepared another log");

    // The same data as tsv without a header, positionally: the same examples.
    let t = dir.join("all.tsv");
    write_tsv(&t, &rs);
    let out = dir.join("t.h5");
    prepare(2, "tsv", &[&t], &out, POSITIONAL)
        .run()
        .expect_code(0);
    let (tl, tb) = read(&out);
    assert_eq!(tb.keys, batch.keys);
    assert_eq!(tb.dense, batch.dense);
    assert_eq!(tb.labels, batch.labels);
    let names: Vec<&str> = tl.spec().tables.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["C1", "C2"]);

    // --header auto sees a header in a positional csv by its label ("click").
    let out = dir.join("auto.h5");
    prepare(1, "csv", &[&a], &out, POSITIONAL)
        .run()
        .expect_code(0)
        .stdout_has(&["examples 170,"]);
    // ... and none when the first line's label is 0 or 1.
    let nh = dir.join("nh.csv");
    write_csv(&nh, &rs[..10], false);
    prepare(1, "csv", &[&nh], &dir.join("nh.h5"), POSITIONAL)
        .run()
        .expect_code(0)
        .stdout_has(&["examples 10,"]);
}

fn embed(np: usize, log: &Path) -> String {
    let o = launcher(np)
        .args(["embed", "--data"])
        .arg(log)
        .args(["--batch", "32", "--steps", "8", "--log-every", "4"])
        .args(["--threads", "1", "--seed", "5", "--eval-examples", "200"])
        .run();
    o.expect_code(0).stdout_has(&["final: eval AUC"]);
    o.final_checksum()
}

#[test]
fn embed_trains_on_a_multi_hot_string_log_with_the_same_bits_at_each_rank_count() {
    let d = tempdir();
    let dir = d.path();
    let a = dir.join("day.csv");
    write_csv(&a, &rows(1200), true);
    let log = dir.join("log.h5");
    prepare(1, "csv", &[&a], &log, BY_NAME).run().expect_code(0);
    for np in [1, 2] {
        let first = embed(np, &log);
        assert_eq!(first.len(), 16);
        assert_eq!(embed(np, &log), first, "{np} rank(s): another checksum");
    }
}

#[test]
fn bad_input_exits_2_naming_file_line_and_column_and_writes_nothing() {
    let d = tempdir();
    let dir = d.path();
    let rs = rows(400);
    let good = dir.join("good.csv");
    write_csv(&good, &rs, true);
    let text = std::fs::read_to_string(&good).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let out = dir.join("out.h5");
    // Line 300 of the file (1-based, the header is line 1): in rank 1's half at 2 ranks.
    for (bad, want) in [
        (
            "1,x1,a,b,j",
            "column 2 (\"price\"): \"x1\" is not a finite number",
        ),
        ("7,1,a,b,j", "column 1 (\"click\"): \"7\" is not a label"),
        (
            "1,1,a,b||c,j",
            "column 4 (\"tags\"): \"b||c\" has an empty item",
        ),
        ("1,1,a,b", "4 comma-separated fields, expected 5"),
        ("1,1,\"a,b", "without its closing quote"),
    ] {
        lines[299] = bad.to_string();
        let p = dir.join("bad.csv");
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        for np in [1, 2] {
            prepare(np, "csv", &[&good, &p], &out, BY_NAME)
                .run()
                .expect_code(2)
                .stderr_has(&["bad.csv:300: ", want]);
            assert!(!out.exists(), "{bad}: an output was written");
            let partial = dir.join("out.h5.partial");
            assert!(!partial.exists());
        }
    }
    // Without a header the column is numbered.
    let nh = dir.join("nh.csv");
    std::fs::write(&nh, "1,2,a,b,c\n0,zz,a,b,c\n").unwrap();
    prepare(1, "csv", &[&nh], &out, POSITIONAL)
        .run()
        .expect_code(2)
        .stderr_has(&["nh.csv:2: column 2: \"zz\" is not a finite number"]);
    // Files with other headers, a NAME=ROLE SPEC on headerless files and a header on
    // Criteo files are refused before anything is read; a weighted column whose items
    // hold no weight is a bad line (tests/it/data/clicks_weights.rs has the rest).
    let other = dir.join("other.csv");
    std::fs::write(&other, "click,cost,site,tags,junk\n1,2,a,b,c\n").unwrap();
    prepare(1, "csv", &[&good, &other], &out, BY_NAME)
        .run()
        .expect_code(2)
        .stderr_has(&["other.csv", "not the header of"]);
    prepare(1, "csv", &[&nh], &out, BY_NAME)
        .arg("--header")
        .arg("no")
        .run()
        .expect_code(2)
        .stderr_has(&["need --header"]);
    prepare(
        1,
        "csv",
        &[&good],
        &out,
        "click=label,price=log,site=cat:weight=:,*=skip",
    )
    .run()
    .expect_code(2)
    .stderr_has(&["good.csv:2: column 3 (\"site\")", "without its weight"]);
    TestCommand::direct()
        .args(["prepare", "clicks", "--header", "yes", "--input"])
        .arg(&good)
        .arg("--out")
        .arg(&out)
        .run()
        .expect_code(2)
        .stderr_has(&["--header applies only to --format csv|tsv"]);
    assert!(!out.exists());
}
