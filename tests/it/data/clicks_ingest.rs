//! Criteo-format ingestion (`prepare clicks`) and its generator (`generate clicks
//! --format criteo`):
//!
//! 1. the command line: `prepare` with its graph flags and `prepare clicks` both parse;
//! 2. under the thread communicator at 1-4 ranks with small read blocks (many block
//!    and range boundaries): the log prepared from the text equals the generator's
//!    log, bit for bit, with an empty day; bad lines are reported with the right file
//!    and line whatever rank read them, and skipped when allowed;
//! 3. the real binary under `mpirun` at 1, 2 and 3 ranks: generated text (one day
//!    gzipped) -> `prepare clicks` equals `generate clicks --format criteo --out x.h5`,
//!    and 1 and 3 ranks write the same datasets; bad input exits 2 on every rank,
//!    naming file and line, with nothing written; truncated and corrupt gzip; an empty
//!    input; a preemption signal.

use crate::util;

use std::path::{Path, PathBuf};

use clap::Parser;
use torusrec::cli::{Cli, Command, PrepareCmd, PrepareCommand};
use torusrec::comm::threads::run;
use torusrec::comm::Comm;
use torusrec::data::clicks::batch::Batch;
use torusrec::data::clicks::criteo::Layout;
use torusrec::data::clicks::criteo_gen::{CriteoGen, GenSource};
use torusrec::data::clicks::ingest::{global_write_log, IngestReport, LogHeader};
use torusrec::data::clicks::log_file::ClickLog;
use torusrec::data::clicks::textlog::TextFiles;
use torusrec::io::outfile::temp_path;
use torusrec::spec::{preset, VocabKind};
use torusrec::Error;
use util::{rank_codes, tempdir, TestCommand};

const PRESET: &str = "small";
const SCALE: &str = "0.01";
const SEED: u64 = 11;
const DAYS: u64 = 3;
const PER_DAY: u64 = 2000;

fn generator() -> CriteoGen {
    CriteoGen::new(&preset(PRESET, 0.01).unwrap(), SEED)
}

/// The whole log, with its days.
fn read_all(p: &Path) -> (ClickLog, Batch) {
    let log = ClickLog::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let b = log.read(0, log.examples() as usize).unwrap();
    (log, b)
}

/// Two logs hold the same examples, bit for bit, the same days and the same spec.
#[track_caller]
fn assert_same_log(a: &Path, b: &Path) {
    let (la, ba) = read_all(a);
    let (lb, bb) = read_all(b);
    assert!(la.keyed() && lb.keyed());
    assert_eq!(la.spec(), lb.spec());
    assert_eq!(la.days(), lb.days());
    assert_eq!(la.ids_per_table(), lb.ids_per_table());
    assert_eq!(ba.n, bb.n);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&ba.dense), bits(&bb.dense), "dense");
    assert_eq!(bits(&ba.labels), bits(&bb.labels), "labels");
    assert_eq!(ba.keys, bb.keys, "keys");
    assert_eq!(ba.bags, bb.bags);
}

// ---------------------------------------------------------------------------------
// 1. command line

#[test]
fn prepare_parses_with_graph_flags_and_with_the_clicks_subcommand() {
    let c = Cli::try_parse_from([
        "torusrec", "prepare", "--input", "g", "--format", "bv", "--out", "d.h5",
    ])
    .unwrap();
    match c.command {
        Command::Prepare(PrepareCmd {
            graph: Some(g),
            command: None,
        }) => assert_eq!(g.input, PathBuf::from("g")),
        other => panic!("{other:?}"),
    }
    let c = Cli::try_parse_from([
        "torusrec",
        "prepare",
        "clicks",
        "--input",
        "a.tsv",
        "b.tsv.gz",
        "--out",
        "c.h5",
        "--skip-bad-lines",
        "3",
    ])
    .unwrap();
    match c.command {
        Command::Prepare(PrepareCmd {
            graph: None,
            command: Some(PrepareCommand::Clicks(a)),
        }) => {
            assert_eq!(a.input, vec![PathBuf::from("a.tsv"), "b.tsv.gz".into()]);
            assert_eq!((a.skip_bad_lines, a.dim, a.force), (3, 16, false));
        }
        other => panic!("{other:?}"),
    }
    // Graph flags with the subcommand, or neither, are refused.
    assert!(Cli::try_parse_from(["torusrec", "prepare", "--format", "bv", "clicks"]).is_err());
    assert!(Cli::try_parse_from(["torusrec", "prepare"]).is_err());
    assert!(Cli::try_parse_from(["torusrec", "prepare", "clicks", "--out", "x.h5"]).is_err());
}

// ---------------------------------------------------------------------------------
// 2. the library under the thread communicator

/// Day files of the generator in `dir`: plain, but the last day gzipped.
fn write_days(dir: &Path, g: &CriteoGen, per_day: u64) -> Vec<PathBuf> {
    (0..DAYS)
        .map(|d| {
            let gz = d == DAYS - 1;
            let p = dir.join(format!("day_{d}.tsv{}", if gz { ".gz" } else { "" }));
            g.write_day(d, per_day, &p, gz).unwrap();
            p
        })
        .collect()
}

fn header(files: &[PathBuf], seed: u64) -> LogHeader {
    LogHeader {
        format: "criteo".into(),
        columns: None,
        source: files
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect(),
        seed,
        dim: 16,
        table_names: Layout::criteo().table_names(),
    }
}

/// `prepare clicks` of `files` on `p` thread ranks reading `block` bytes at a time.
fn prepare_threads(
    p: usize,
    files: &[PathBuf],
    out: &Path,
    block: usize,
    skip: u64,
) -> Vec<torusrec::Result<IngestReport>> {
    run(p, |comm| {
        let src = TextFiles::new(files, Layout::criteo(), comm.rank(), comm.size())?
            .with_block_bytes(block);
        global_write_log(&comm, &src, &header(files, 0), out, skip)
    })
}

#[test]
fn text_logs_equal_the_generated_log_at_1_to_4_thread_ranks() {
    let dir = tempdir();
    let g = generator();
    let per_day = 700;
    let files = write_days(dir.path(), &g, per_day);
    let want = dir.path().join("gen.h5");
    run(2, |comm| {
        let names = (0..DAYS).map(|d| format!("day_{d}").into()).collect();
        let src = GenSource::new(g.clone(), names, per_day, comm.rank(), comm.size());
        global_write_log(&comm, &src, &header(&files, SEED), &want, 0).unwrap()
    });
    let (log, batch) = read_all(&want);
    assert_eq!(log.days(), &[0, 700, 1400, 2100]);
    assert_eq!(log.source_files().len(), 3);
    assert!(log
        .spec()
        .tables
        .iter()
        .all(|t| t.vocab_kind == VocabKind::Hash));
    assert_eq!(batch.keys.len(), 26);
    assert!(batch
        .bags
        .iter()
        .all(|b| b.ids.is_empty() && b.offsets == vec![0; 2101]));

    for p in 1..=4 {
        for block in [512usize, 70_000] {
            let out = dir.path().join(format!("p{p}-{block}.h5"));
            let reps = prepare_threads(p, &files, &out, block, 0);
            for r in &reps {
                let r = r.as_ref().unwrap();
                assert_eq!((r.examples, r.bad_lines), (3 * per_day, 0));
                assert_eq!(r.day_offsets, vec![0, 700, 1400, 2100]);
            }
            assert!(!temp_path(&out).exists());
            assert_same_log(&out, &want);
        }
    }

    // An empty day (a 0-byte file, and an empty gzip stream) is a day of 0 examples.
    let empty = dir.path().join("empty.tsv");
    std::fs::write(&empty, "").unwrap();
    let empty_gz = dir.path().join("empty.tsv.gz");
    g.write_day(0, 0, &empty_gz, true).unwrap();
    let with_empty = vec![files[0].clone(), empty, empty_gz, files[2].clone()];
    for p in [1, 3] {
        let out = dir.path().join(format!("empty-{p}.h5"));
        prepare_threads(p, &with_empty, &out, 1000, 0)
            .into_iter()
            .for_each(|r| drop(r.unwrap()));
        let (log, b) = read_all(&out);
        assert_eq!(log.days(), &[0, 700, 700, 700, 1400]);
        assert_eq!(b.labels[..700], batch.labels[..700]);
        assert_eq!(b.labels[700..], batch.labels[1400..]);
        assert_eq!(
            b.keys[5].ids[..],
            {
                let k = &batch.keys[5];
                let (a, z) = (k.offsets[0] as usize, k.offsets[700] as usize);
                let (c, e) = (k.offsets[1400] as usize, k.offsets[2100] as usize);
                [&k.ids[a..z], &k.ids[c..e]].concat()
            }[..]
        );
    }
}

/// Replace line `at` (1-based) of a text file with `with`.
fn replace_line(p: &Path, at: usize, with: &str) {
    let text = std::fs::read_to_string(p).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[at - 1] = with;
    std::fs::write(p, lines.join("\n") + "\n").unwrap();
}

#[test]
fn bad_lines_name_their_file_and_line_whatever_rank_reads_them() {
    let dir = tempdir();
    let g = generator();
    let files = write_days(dir.path(), &g, 600);
    // Day 1 (plain): bad lines 377 and 501; day 0: line 5.
    replace_line(&files[1], 377, "1\t2\t3");
    replace_line(&files[1], 501, "");
    for p in 1..=4 {
        let out = dir.path().join(format!("bad-{p}.h5"));
        let res = prepare_threads(p, &files, &out, 900, 0);
        let mut owners = 0;
        for r in &res {
            match r {
                Err(Error::Parse { path, line, msg }) => {
                    owners += 1;
                    assert_eq!((path, *line), (&files[1], 377), "{msg}");
                    assert!(msg.contains("3 tab-separated fields, expected 40"), "{msg}");
                    assert!(msg.contains("2 bad lines in all"), "{msg}");
                }
                Err(Error::Remote { code: 2, .. }) => {}
                other => panic!("{p} ranks: {other:?}"),
            }
        }
        assert_eq!(owners, 1);
        assert!(!out.exists() && !temp_path(&out).exists());

        // Two may be skipped: they are reported in input order.
        let res = prepare_threads(p, &files, &out, 900, 2);
        let r = res[p - 1].as_ref().unwrap();
        assert_eq!((r.examples, r.bad_lines), (3 * 600 - 2, 2));
        let at: Vec<(PathBuf, u64)> = r
            .first_bad
            .iter()
            .map(|b| (b.path.clone(), b.line))
            .collect();
        assert_eq!(at, vec![(files[1].clone(), 377), (files[1].clone(), 501)]);
        assert!(r.first_bad[1].reason.contains("empty line"));
        assert_eq!(r.day_offsets, vec![0, 600, 1198, 1798]);
        std::fs::remove_file(&out).unwrap();
    }
    replace_line(&files[0], 5, "0\tx");
    let res = prepare_threads(3, &files, &dir.path().join("x.h5"), 900, 2);
    match &res[0] {
        Err(Error::Parse { path, line, msg }) => {
            assert_eq!((path, *line), (&files[0], 5));
            assert!(
                msg.contains("3 bad lines in all, more than --skip-bad-lines 2"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------
// 3. the binary under mpirun

fn launcher(np: usize) -> TestCommand {
    if np == 1 {
        TestCommand::direct()
    } else {
        TestCommand::mpirun(np)
    }
}

fn generate(dir: &Path, out: &Path, extra: &[&str]) -> util::Output {
    let o = TestCommand::direct()
        .current_dir(dir)
        .args([
            "generate", "clicks", "--format", "criteo", "--preset", PRESET,
        ])
        .args(["--scale", SCALE, "--days", &DAYS.to_string()])
        .args([
            "--examples",
            &PER_DAY.to_string(),
            "--seed",
            &SEED.to_string(),
        ])
        .arg("--out")
        .arg(out)
        .args(extra)
        .run();
    o.expect_code(0);
    o
}

/// The day files of the end-to-end tests: the last day gzipped, the others plain.
fn e2e_days(dir: &Path) -> Vec<PathBuf> {
    generate(dir, &dir.join("plain"), &[]);
    generate(dir, &dir.join("gz"), &["--gzip"]);
    (0..DAYS)
        .map(|d| {
            if d == DAYS - 1 {
                dir.join(format!("gz/day_{d}.tsv.gz"))
            } else {
                dir.join(format!("plain/day_{d}.tsv"))
            }
        })
        .collect()
}

fn prepare(np: usize, inputs: &[PathBuf], out: &Path, extra: &[&str]) -> TestCommand {
    launcher(np)
        .args(["prepare", "clicks", "--format", "criteo", "--input"])
        .args(inputs)
        .arg("--out")
        .arg(out)
        .args(extra)
}

#[test]
fn prepared_text_equals_the_generated_log_at_1_2_and_3_ranks() {
    let d = tempdir();
    let dir = d.path();
    let inputs = e2e_days(dir);
    let gen = dir.join("gen.h5");
    generate(dir, &gen, &[]).stdout_has(&["6,000 examples over 3 days"]);
    let (log, _) = read_all(&gen);
    assert_eq!(log.seed(), SEED);
    assert_eq!(log.source_files(), &["day_0.tsv", "day_1.tsv", "day_2.tsv"]);

    for np in [1, 2, 3] {
        let out = dir.join(format!("p{np}.h5"));
        prepare(np, &inputs, &out, &[])
            .run()
            .expect_code(0)
            .occurs("prepare clicks: examples 6,000, days 3, bytes ", 1)
            .stdout_has(&["skipped 0", "peak_rss_bytes", "mb_per_s_per_rank"]);
        assert_same_log(&out, &gen);
        let (log, _) = read_all(&out);
        assert_eq!(log.seed(), 0);
        let given: Vec<String> = inputs.iter().map(|p| p.to_string_lossy().into()).collect();
        assert_eq!(log.source_files(), &given[..]);
    }
    assert_same_log(&dir.join("p1.h5"), &dir.join("p3.h5"));

    // The v1 generator is unchanged, and refuses the criteo flags.
    let v1 = dir.join("v1.h5");
    TestCommand::direct()
        .args([
            "generate",
            "clicks",
            "--preset",
            "tiny",
            "--examples",
            "100",
            "--out",
        ])
        .arg(&v1)
        .run()
        .expect_code(0);
    let (log, b) = read_all(&v1);
    assert!(!log.keyed() && b.keys.is_empty());
    assert_eq!(
        (log.days(), log.source_files().len()),
        (&[0u64, 100][..], 0)
    );
    TestCommand::direct()
        .args([
            "generate",
            "clicks",
            "--preset",
            "tiny",
            "--examples",
            "10",
            "--days",
            "2",
        ])
        .arg("--out")
        .arg(dir.join("v1b.h5"))
        .run()
        .expect_code(2)
        .stderr_has(&["--format criteo"]);
}

#[test]
fn a_bad_line_stops_every_rank_and_writes_nothing() {
    let d = tempdir();
    let dir = d.path();
    let inputs = e2e_days(dir);
    // The middle of the second file: in rank 1's range at 2 ranks.
    let bad = inputs[1].clone();
    replace_line(&bad, 1500, "1\t2\t3\tzz");
    let codes = dir.join("codes");
    std::fs::create_dir(&codes).unwrap();
    let out = dir.join("out.h5");
    let line = format!(
        "{}:1500: 4 tab-separated fields, expected 40",
        bad.display()
    );
    prepare(2, &inputs, &out, &[])
        .record_rank_codes(&codes)
        .run()
        .stderr_has(&[&line])
        .occurs(&line, 1);
    assert_eq!(rank_codes(&codes, 2), vec![Some(2), Some(2)]);
    assert!(!out.exists() && !temp_path(&out).exists());

    // An existing output survives a failed --force run, and is refused without it.
    std::fs::write(&out, b"precious").unwrap();
    prepare(2, &inputs, &out, &["--force"])
        .run()
        .expect_code(2)
        .stderr_has(&[&line]);
    prepare(2, &inputs, &out, &[])
        .run()
        .expect_code(2)
        .stderr_has(&["output exists"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
    assert!(!temp_path(&out).exists());

    // One bad line may be skipped: it is reported and the rest is written.
    prepare(2, &inputs, &out, &["--force", "--skip-bad-lines", "1"])
        .run()
        .expect_code(0)
        .stdout_has(&[
            "skipped 1 bad line:",
            &line,
            "prepare clicks: examples 5,999, days 3",
            "skipped 1,",
        ]);
    let (log, _) = read_all(&out);
    assert_eq!(log.days(), &[0, 2000, 3999, 5999]);
}

#[test]
fn truncated_corrupt_and_empty_inputs_exit_2_naming_the_file() {
    let d = tempdir();
    let dir = d.path();
    let inputs = e2e_days(dir);
    let gz = std::fs::read(&inputs[2]).unwrap();
    let cut = dir.join("cut.tsv.gz");
    std::fs::write(&cut, &gz[..gz.len() / 2]).unwrap();
    let mut bad = gz.clone();
    let mid = bad.len() / 2;
    for b in &mut bad[mid..mid + 64] {
        *b ^= 0x5a;
    }
    let corrupt = dir.join("corrupt.tsv.gz");
    std::fs::write(&corrupt, &bad).unwrap();
    let text_gz = dir.join("text.tsv.gz");
    std::fs::copy(&inputs[0], &text_gz).unwrap();
    let out = dir.join("out.h5");
    for (np, f) in [(1, &cut), (2, &cut), (2, &corrupt), (1, &text_gz)] {
        let name = f.display().to_string();
        prepare(np, &[inputs[0].clone(), f.clone()], &out, &[])
            .run()
            .expect_code(2)
            .stderr_has(&[&name, "truncated or corrupt"]);
        assert!(!out.exists() && !temp_path(&out).exists());
    }

    // Empty files are empty days, but an input without any example is an error.
    let e1 = dir.join("e1.tsv");
    let e2 = dir.join("e2.tsv");
    std::fs::write(&e1, "").unwrap();
    std::fs::write(&e2, "").unwrap();
    prepare(2, &[e1.clone(), e2], &out, &[])
        .run()
        .expect_code(2)
        .stderr_has(&["e1.tsv", "no examples in the input (2 files)"]);
    prepare(1, &[e1, inputs[0].clone()], &out, &[])
        .run()
        .expect_code(0)
        .stdout_has(&["examples 2,000, days 2"]);
    prepare(1, &[dir.join("none.tsv")], &dir.join("o2.h5"), &[])
        .run()
        .expect_code(2)
        .stderr_has(&["none.tsv: no such file"]);
    prepare(
        1,
        &inputs[..1],
        &dir.join("o3.h5"),
        &["--columns", "label,cat"],
    )
    .run()
    .expect_code(2)
    .stderr_has(&["--columns applies only to --format tsv"]);
}

#[test]
fn a_signal_in_either_pass_stops_every_rank_with_nothing_written() {
    let d = tempdir();
    let dir = d.path();
    let inputs = e2e_days(dir);
    let out = dir.join("out.h5");
    for pass in ["count", "write"] {
        let codes = dir.join(format!("codes-{pass}"));
        std::fs::create_dir(&codes).unwrap();
        prepare(2, &inputs, &out, &[])
            .env("TORUSREC_PREEMPT_IN", pass)
            .record_rank_codes(&codes)
            .run()
            .stderr_has(&[&format!("during the {pass} pass of prepare clicks")]);
        assert_eq!(rank_codes(&codes, 2), vec![Some(1), Some(1)]);
        assert!(!out.exists() && !temp_path(&out).exists());
    }
}

/// `--format tsv --columns`: another column order reads the same examples.
#[test]
fn a_tsv_layout_reads_reordered_columns() {
    let d = tempdir();
    let dir = d.path();
    let g = generator();
    let day = g.day(0);
    let text = String::from_utf8(g.text(&day, 0, 500)).unwrap();
    // Move the label last and add a skipped column first.
    let moved: String = text
        .lines()
        .map(|l| {
            let (label, rest) = l.split_once('\t').unwrap();
            format!("junk\t{rest}\t{label}\n")
        })
        .collect();
    let a = dir.join("a.tsv");
    let b = dir.join("b.tsv");
    std::fs::write(&a, &text).unwrap();
    std::fs::write(&b, moved).unwrap();
    prepare(1, std::slice::from_ref(&a), &dir.join("a.h5"), &[])
        .run()
        .expect_code(0);
    launcher(2)
        .args(["prepare", "clicks", "--format", "tsv", "--columns"])
        .arg("skip,dense*13,cat*26,label")
        .arg("--input")
        .arg(&b)
        .arg("--out")
        .arg(dir.join("b.h5"))
        .run()
        .expect_code(0);
    let (la, ba) = read_all(&dir.join("a.h5"));
    let (lb, bb) = read_all(&dir.join("b.h5"));
    assert_eq!(la.spec(), lb.spec());
    assert_eq!(ba, bb);
}

// ---------------------------------------------------------------------------------
// 4. training on a prepared log

/// `embed` on a click log at `np` ranks: hash tables, held-out day 2.
fn train_log(np: usize, log: &Path, extra: &[&str]) -> util::Output {
    let o = launcher(np)
        .args(["embed", "--data"])
        .arg(log)
        .args(["--eval-day", "2", "--batch", "256", "--steps", "12"])
        .args(["--log-every", "4", "--threads", "1", "--seed", "3"])
        .args(extra)
        .run();
    o.expect_code(0);
    o
}

#[test]
fn a_model_trained_on_prepared_text_has_the_bits_of_one_trained_on_the_generated_log() {
    let d = tempdir();
    let dir = d.path();
    let inputs = e2e_days(dir);
    let gen = dir.join("gen.h5");
    generate(dir, &gen, &[]);
    let prepared = dir.join("prepared.h5");
    prepare(2, &inputs, &prepared, &[]).run().expect_code(0);
    for np in [1, 2] {
        let a = train_log(np, &prepared, &[]);
        let b = train_log(np, &gen, &[]);
        a.stdout_has(&["over 2,000 held-out examples", "hash: resolve"]);
        assert_eq!(
            a.final_checksum(),
            b.final_checksum(),
            "P={np}\n{}",
            a.dump()
        );
        // Admission and eviction change the model; the two sources still agree.
        let extra = [
            "--capacity",
            "300",
            "--admit-after",
            "2",
            "--evict",
            "ttl:3",
        ];
        let a = train_log(np, &prepared, &extra);
        let b = train_log(np, &gen, &extra);
        assert_eq!(
            a.final_checksum(),
            b.final_checksum(),
            "P={np}\n{}",
            a.dump()
        );
    }
}

#[test]
fn hash_table_options_are_refused_where_they_would_not_act() {
    let d = tempdir();
    let dir = d.path();
    let gen = dir.join("gen.h5");
    generate(dir, &gen, &[]);
    let run = |args: &[&str]| {
        TestCommand::direct()
            .args(["embed", "--steps", "1", "--threads", "1"])
            .args(args)
            .run()
    };
    // Fixed tables of a generated model: the hash options have nothing to act on.
    run(&["--preset", "tiny", "--capacity", "100"])
        .expect_code(2)
        .stderr_has(&["--capacity"]);
    run(&["--preset", "tiny", "--admit-after", "2"])
        .expect_code(2)
        .stderr_has(&["--admit-after"]);
    run(&["--preset", "tiny", "--vocab", "hash", "--evict", "ttl:0"])
        .expect_code(2)
        .stderr_has(&["--evict"]);
    run(&["--preset", "tiny", "--vocab", "hash", "--capacity", "0x"])
        .expect_code(2)
        .stderr_has(&["--capacity"]);
    run(&["--preset", "tiny", "--vocab", "hash", "--pipeline"])
        .expect_code(2)
        .stderr_has(&["--pipeline"]);
    // A keyed log into fixed tables smaller than its ids: an input error, every rank.
    let log = gen.to_string_lossy().to_string();
    run(&["--data", &log, "--vocab", "fixed", "--eval-day", "2"])
        .expect_code(2)
        .stderr_has(&["is not below its vocab"]);
    run(&["--data", &log, "--eval-day", "3"])
        .expect_code(2)
        .stderr_has(&["--eval-day 3", "3 day(s)"]);
    // Modulo tables take any id.
    run(&[
        "--data",
        &log,
        "--vocab",
        "modulo",
        "--capacity",
        "64",
        "--eval-day",
        "2",
    ])
    .expect_code(0);
}
