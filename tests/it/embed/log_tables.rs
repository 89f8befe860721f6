//! `embed --data LOG --tables T.toml`: the model file's tables are matched to the log's
//! columns by name. A model file in the log's order trains with the bits of the log's
//! own model; a reordered one trains the same model; a renamed, unknown or missing
//! table, or another dense-feature count, exits 2 on every rank naming both files.
//! And the messages about a log name the log: `--vocab fixed` on a keyed log (not
//! the texts it was prepared from), a directory given as `--data`.

use crate::util;

use std::path::{Path, PathBuf};

use util::{rank_codes, serial, tempdir, TestCommand};

/// Three fixed tables of different sizes, widths and pooling.
const TABLES: [&str; 3] = [
    "[[table]]\nname = \"a\"\nvocab = 200\ndim = 4\n",
    "[[table]]\nname = \"b\"\nvocab = 50\ndim = 8\npooling = \"mean\"\nvalency = 2.0\n",
    "[[table]]\nname = \"c\"\nvocab = 120\ndim = 4\n",
];

/// A model file of `tables` (indices into [`TABLES`], in that order) and `n_dense`.
fn toml(dir: &Path, name: &str, n_dense: usize, tables: &[&str]) -> PathBuf {
    let p = dir.join(name);
    let text = format!("n_dense = {n_dense}\nhidden = [8]\n\n{}", tables.concat());
    std::fs::write(&p, text).unwrap();
    p
}

/// The v1 click log of the model file [`TABLES`] in order.
fn log(dir: &Path) -> (PathBuf, PathBuf) {
    let m = toml(dir, "m.toml", 3, &TABLES);
    let log = dir.join("log.h5");
    TestCommand::direct()
        .args(["generate", "clicks", "--examples", "3000", "--seed", "2"])
        .arg("--tables")
        .arg(&m)
        .arg("--out")
        .arg(&log)
        .run()
        .expect_code(0);
    (m, log)
}

fn embed(np: usize, log: &Path, extra: &[&str]) -> TestCommand {
    let l = if np == 1 {
        TestCommand::direct()
    } else {
        TestCommand::mpirun(np)
    };
    l.args(["embed", "--data"])
        .arg(log)
        .args(["--batch", "64", "--steps", "6"])
        .args(["--log-every", "3", "--threads", "1", "--seed", "3"])
        .args(extra)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_model_file_in_any_order_trains_the_logs_columns_by_name() {
    let d = tempdir();
    let dir = d.path();
    let (m, log) = log(dir);
    let own = embed(1, &log, &["--eval-examples", "500"]).run();
    own.expect_code(0);
    let sum = own.final_checksum();
    // In the log's order: the log's own model, bit for bit.
    let same = embed(1, &log, &["--eval-examples", "500", "--tables", s(&m)]).run();
    assert_eq!(same.final_checksum(), sum, "{}", same.dump());
    // Reordered: each table still trains on its own column (by position, table c's
    // 120 rows would take a's ids up to 200, and the widths would differ).
    let r = toml(dir, "r.toml", 3, &[TABLES[2], TABLES[0], TABLES[1]]);
    let re = embed(1, &log, &["--eval-examples", "500", "--tables", s(&r)]).run();
    assert_eq!(re.final_checksum(), sum, "{}", re.dump());
}

#[test]
fn renamed_unknown_and_missing_tables_exit_2_naming_both_files() {
    let _serial = serial();
    let d = tempdir();
    let dir = d.path();
    let (m, log) = log(dir);
    let renamed = TABLES[1].replace("\"b\"", "\"bee\"");
    let extra = "[[table]]\nname = \"z\"\nvocab = 10\ndim = 4\n";
    let cases: [(&str, usize, Vec<&str>, Vec<String>); 4] = [
        (
            "renamed.toml",
            3,
            vec![TABLES[0], &renamed, TABLES[2]],
            vec![
                "table \"bee\" is not a table of the click log".into(),
                "its tables are \"a\", \"b\", \"c\"".into(),
            ],
        ),
        (
            "unknown.toml",
            3,
            vec![TABLES[0], TABLES[1], TABLES[2], extra],
            vec!["table \"z\" is not a table of the click log".into()],
        ),
        (
            "missing.toml",
            3,
            vec![TABLES[2], TABLES[0]],
            vec![
                "2 table(s), but the click log".into(),
                "has 3: no table for its column(s) \"b\"".into(),
            ],
        ),
        (
            "dense.toml",
            5,
            TABLES.to_vec(),
            vec![
                "n_dense = 5, but the click log".into(),
                "has 3 dense features".into(),
            ],
        ),
    ];
    let log_bytes = std::fs::read(&log).unwrap();
    let out = dir.join("model.h5");
    for (i, (name, n_dense, tables, needles)) in cases.iter().enumerate() {
        let t = toml(dir, name, *n_dense, tables);
        let text = std::fs::read(&t).unwrap();
        // One case at 2 ranks: every rank exits 2, the message printed once.
        let np = if i == 0 { 2 } else { 1 };
        let args = [
            "--eval-examples",
            "500",
            "--tables",
            s(&t),
            "--out",
            s(&out),
        ];
        let o = if np == 1 {
            let o = embed(np, &log, &args).run();
            o.expect_code(2);
            o
        } else {
            let codes = dir.join(format!("codes-{i}"));
            std::fs::create_dir(&codes).unwrap();
            let o = embed(np, &log, &args).record_rank_codes(&codes).run();
            assert_eq!(rank_codes(&codes, np), vec![Some(2); np]);
            o
        };
        let head = format!("{}: ", t.display());
        let mut want: Vec<&str> = vec![&head, s(&log), "(--data)"];
        want.extend(needles.iter().map(String::as_str));
        o.stderr_has(&want).occurs(&head, 1);
        assert!(!out.exists(), "{name}");
        assert_eq!(std::fs::read(&t).unwrap(), text, "{name}");
    }
    assert_eq!(std::fs::read(&log).unwrap(), log_bytes);
    assert!(std::fs::read_to_string(&m)
        .unwrap()
        .contains("name = \"b\""));
}

#[test]
fn errors_about_a_log_name_the_log() {
    let d = tempdir();
    let dir = d.path();
    // A keyed log generated as if from day files day_0.tsv and day_1.tsv.
    let keyed = dir.join("keyed.h5");
    TestCommand::direct()
        .args([
            "generate", "clicks", "--format", "criteo", "--preset", "small",
        ])
        .args([
            "--scale",
            "0.01",
            "--days",
            "2",
            "--examples",
            "300",
            "--out",
        ])
        .arg(&keyed)
        .run()
        .expect_code(0);
    let bytes = std::fs::read(&keyed).unwrap();
    let o = embed(1, &keyed, &["--vocab", "fixed", "--eval-day", "1"]).run();
    o.expect_code(2).stderr_has(&[
        &format!("{}: table \"C1\": id ", keyed.display()),
        "is not below its vocab",
        "raw 64-bit ids",
        "use --vocab modulo or hash",
    ]);
    assert!(!o.stderr.contains("day_0.tsv"), "{}", o.dump());
    assert_eq!(std::fs::read(&keyed).unwrap(), bytes);
    // A directory as --data is a directory, not a missing file.
    let sub = dir.join("logs");
    std::fs::create_dir(&sub).unwrap();
    let o = embed(1, &sub, &["--eval-examples", "500"]).run();
    o.expect_code(2).stderr_has(&[&format!(
        "{}: is a directory, not an HDF5 file",
        sub.display()
    )]);
    assert!(!o.stderr.contains("no such file"), "{}", o.dump());
    assert!(sub.is_dir());
}
