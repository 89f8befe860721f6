//! `inspect --stats` end to end: two hand-made edge lists whose every statistic is
//! computed by hand (asserted exactly through `--json`); the same JSON at 1, 2 and 3
//! ranks for a BV graph (cnr-2000) and a prepared dataset, with the reciprocity
//! keys' budget forced small so that they take several passes; a K = 0 dataset has
//! the statistics of the graph it was prepared from; bad inputs exit 2 naming the
//! file, on every rank.

use crate::util;

use std::path::{Path, PathBuf};
use torusrec::data::graph::stats::{DegreeSummary, GraphStats};
use util::{cnr2000, cnr2000_k10, h5_read, h5_write, rank_codes, serial, tempdir, TestCommand};

/// 10 nodes, 22 arcs once cleaned: a duplicate (`0 1`), two self-loops (`2 2`, `6 6`:
/// node 6's row stays empty), both comment styles, tabs, rows out of order.
const DENSE: &str = "# a hand-made graph
% of 10 nodes
0\t1
0 2
0 3
1 4
1 0
0 4
0 5
0 1
1 2
1 3
2 3
2 0
2 2
3 0
4 0
4 5
5 6
5 4
6 6
7 9
7 0
7 8
8 7
8 9
9 0
";

/// The rows of [`DENSE`], cleaned: 0: 1 2 3 4 5 | 1: 0 2 3 4 | 2: 0 3 | 3: 0 |
/// 4: 0 5 | 5: 4 6 | 6: - | 7: 0 8 9 | 8: 7 9 | 9: 0.
fn dense_stats() -> GraphStats {
    GraphStats {
        nodes: 10,
        arcs: 22,
        // Out-degrees sorted 0 1 1 2 2 2 2 3 4 5: positions 5, 9, 10, 10. The
        // positive ones' 90 % quantile (position 9 of 9) is 5, held by one node only:
        // no exponent.
        out_degree: DegreeSummary {
            mean: 22.0 / 10.0,
            max: 5,
            zero_fraction: 1.0 / 10.0,
            quantiles: [2, 4, 5, 5],
            tail_exponent: 0.0,
            tail_min: 5,
        },
        // In-degrees: node 0 has 6; 3 and 4 have 3; 2, 5, 9 have 2; 1, 6, 7, 8 have
        // 1: sorted 1 1 1 1 2 2 2 3 3 6. x_min = position 9 of 10 = 3; the tail is
        // 3 3 6: alpha = 1 + 3 / (2 ln(3 / 2.5) + ln(6 / 2.5)).
        in_degree: DegreeSummary {
            mean: 22.0 / 10.0,
            max: 6,
            zero_fraction: 0.0,
            quantiles: [2, 3, 6, 6],
            tail_exponent: 1.0 + 3.0 / (2.0 * (3.0f64 / 2.5).ln() + (6.0f64 / 2.5).ln()),
            tail_min: 3,
        },
        // Every gap is below 16.
        gap_below: [1.0; 4],
        // Mutual pairs {0,1} {0,2} {0,3} {0,4} {4,5} {7,8}: 12 of 22 arcs.
        reciprocity: 12.0 / 22.0,
        // Pairs (0,1) 3/6, (1,2) 2/4, (2,3) 1/2, (3,4) 1/2, (4,5) 0, (7,8) 1/4,
        // (8,9) 0; (5,6) and (6,7) have an empty row.
        adjacent_jaccard: 2.25 / 7.0,
        // ceil(10 / 100) = 1 node: node 0, 6 of 22 arcs.
        top1_in_share: 6.0 / 22.0,
        // No arc has a gap of 2^16 or more.
        far_target_share: 0.0,
        far_source_share: 0.0,
        // Node 6, the one without out-links, has one in-link (5 -> 6).
        sink_in_share: 1.0 / 22.0,
    }
}

/// 70,001 nodes (the largest id is 70,000), 12 arcs once cleaned (`70000 3` twice,
/// a self-loop `5000 5000`), with gaps across every threshold.
const SPARSE: &str = "0 1
0 2
0 20
1 0
1 2
1 20
2 0
2 300
3 5000
4 70000
70000 4
70000 3
70000 3
5000 5000
";

/// The rows of [`SPARSE`]: 0: 1 2 20 | 1: 0 2 20 | 2: 0 300 | 3: 5000 | 4: 70000 |
/// 70000: 3 4; every other row empty.
fn sparse_stats() -> GraphStats {
    let n = 70_001.0;
    GraphStats {
        nodes: 70_001,
        arcs: 12,
        // Out-degrees 3 3 2 2 1 1 and 69,995 zeros: every quantile 0. The positive
        // ones' 90 % quantile (position 6 of 6) is 3, twice: alpha = 1 + 2 / (2 ln 1.2).
        out_degree: DegreeSummary {
            mean: 12.0 / n,
            max: 3,
            zero_fraction: 69_995.0 / n,
            quantiles: [0; 4],
            tail_exponent: 1.0 + 2.0 / (2.0 * (3.0f64 / 2.5).ln()),
            tail_min: 3,
        },
        // In-degree 2 for nodes 0, 2, 20; 1 for 1, 3, 4, 300, 5000, 70000; x_min = 2
        // (position 9 of 9), three of them: alpha = 1 + 3 / (3 ln(2 / 1.5)).
        in_degree: DegreeSummary {
            mean: 12.0 / n,
            max: 2,
            zero_fraction: 69_992.0 / n,
            quantiles: [0; 4],
            tail_exponent: 1.0 + 3.0 / (3.0 * (2.0f64 / 1.5).ln()),
            tail_min: 2,
        },
        // Gaps 1 2 1 1 2 (< 16), 20 19 (< 256), 298 (< 4096), 4997 (< 65536),
        // 69996 69997 69996 (none).
        gap_below: [5.0 / 12.0, 7.0 / 12.0, 8.0 / 12.0, 9.0 / 12.0],
        // Mutual pairs {0,1} {0,2} {4,70000}.
        reciprocity: 6.0 / 12.0,
        // (0,1) 2/4, (1,2) 1/4, (2,3) 0, (3,4) 0.
        adjacent_jaccard: 0.75 / 4.0,
        // ceil(70001 / 100) = 701 nodes hold every arc.
        top1_in_share: 1.0,
        // Far arcs: 4 -> 70000, 70000 -> 3, 70000 -> 4: three, to three targets.
        far_target_share: 1.0,
        // From two sources, 4 and 70000.
        far_source_share: 2.0 / 3.0,
        // Into rows without links: 20 (from 0 and 1), 300, 5000.
        sink_in_share: 4.0 / 12.0,
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The JSON line `inspect --stats --json` prints for `s` (compared as text: the
/// shortest representation of each `f64` is exact, while serde_json's default parser
/// may round the last bit).
fn json(s: &GraphStats) -> String {
    serde_json::to_string(s).unwrap()
}

/// `inspect --stats G --json` (with `extra` flags and `env`) under `launcher`: the one
/// line of stdout and what it parses to.
#[track_caller]
fn stats_json(
    launcher: TestCommand,
    g: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (String, GraphStats) {
    let mut cmd = launcher
        .args(["inspect", "--stats"])
        .arg(g)
        .args(extra)
        .arg("--json");
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    let o = cmd.run();
    o.expect_code(0);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line expected\n{}", o.dump());
    let s: GraphStats = serde_json::from_str(lines[0])
        .unwrap_or_else(|e| panic!("not GraphStats JSON: {e}\n{}", o.dump()));
    (lines[0].to_string(), s)
}

#[test]
fn hand_made_edge_lists_exactly() {
    let d = tempdir();
    let dense = write(d.path(), "dense.tsv", DENSE);
    let sparse = write(d.path(), "sparse.txt", SPARSE);
    let (got, _) = stats_json(TestCommand::direct(), &dense, &[], &[]);
    assert_eq!(got, json(&dense_stats()));
    let (got, _) = stats_json(TestCommand::direct(), &sparse, &["--format", "tsv"], &[]);
    assert_eq!(got, json(&sparse_stats()));
    // Gzipped, the same.
    let gz = d.path().join("dense.tsv.gz");
    {
        use std::io::Write;
        let mut w = flate2::write::GzEncoder::new(
            std::fs::File::create(&gz).unwrap(),
            flate2::Compression::default(),
        );
        w.write_all(DENSE.as_bytes()).unwrap();
        w.finish().unwrap();
    }
    assert_eq!(
        stats_json(TestCommand::direct(), &gz, &[], &[]).0,
        json(&dense_stats())
    );
    // The same graph as Matrix Market (1-based, the raw lines without comments).
    let body: Vec<String> = DENSE
        .lines()
        .filter(|l| !l.starts_with(['#', '%']))
        .map(|l| {
            let mut it = l.split_whitespace().map(|x| x.parse::<u64>().unwrap() + 1);
            format!("{} {}", it.next().unwrap(), it.next().unwrap())
        })
        .collect();
    let mtx = write(
        d.path(),
        "dense.mtx",
        &format!(
            "%%MatrixMarket matrix coordinate pattern general\n10 10 {}\n{}\n",
            body.len(),
            body.join("\n")
        ),
    );
    assert_eq!(
        stats_json(TestCommand::direct(), &mtx, &[], &[]).0,
        json(&dense_stats())
    );
    let _lock = serial();
    // At 2 and 3 ranks, with a key budget of two keys (several passes) and
    // one-arc chunks: the same line.
    for p in [2, 3] {
        let env = [
            ("TORUSREC_STATS_KEY_BYTES", "16"),
            ("TORUSREC_STATS_CHUNK_ARCS", "1"),
        ];
        for (g, want) in [(&dense, dense_stats()), (&sparse, sparse_stats())] {
            let (line, _) = stats_json(TestCommand::mpirun(p), g, &[], &env);
            assert_eq!(line, json(&want), "{} at {p} ranks", g.display());
        }
    }
}

#[test]
fn the_table_shows_every_statistic() {
    let d = tempdir();
    let dense = write(d.path(), "dense.tsv", DENSE);
    let o = TestCommand::direct()
        .args(["inspect", "--stats"])
        .arg(&dense)
        .run();
    o.expect_code(0).stdout_has(&[
        "dense.tsv (tsv): 10 nodes, 22 arcs",
        "locality: arcs with |v - u| < 16 1.0000, < 256 1.0000, < 4,096 1.0000, < 65,536 1.0000",
        "reciprocity: 0.5455 (pair keys in 1 pass(es))",
        "adjacent Jaccard: 0.3214",
        "top-1 % in-degree share: 0.2727",
        "seconds ",
    ]);
    // The degree rows: a name, then the out- and the in-degree's value.
    let tail = format!("{:.3}", dense_stats().in_degree.tail_exponent);
    for (name, out, inn) in [
        ("out-degree", "", "in-degree"),
        ("mean", "2.200", "2.200"),
        ("max", "5", "6"),
        ("zero fraction", "0.1000", "0"),
        ("q50", "2", "2"),
        ("q90", "4", "3"),
        ("q99", "5", "6"),
        ("q99.9", "5", "6"),
        ("tail exponent", "0.000", &tail),
        ("its x_min", "5", "3"),
    ] {
        let want: Vec<&str> = name
            .split(' ')
            .chain([out, inn])
            .filter(|w| !w.is_empty())
            .collect();
        assert!(
            o.stdout
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == want),
            "no row {want:?}\n{}",
            o.dump()
        );
    }
    // A budget of one key: the most passes (256 at one rank; a reciprocated pair's
    // two keys always share a bucket), reading the input again.
    TestCommand::direct()
        .args(["inspect", "--stats"])
        .arg(&dense)
        .env("TORUSREC_STATS_KEY_BYTES", "8")
        .run()
        .expect_code(0)
        .stdout_has(&["reciprocity: 0.5455 (pair keys in 256 pass(es), reading the input again)"]);
}

/// cnr-2000 (BV) and its K = 10 dataset: one JSON line at 1, 2 and 3 ranks, with the
/// default budget (one exchange of the keys kept from the first pass) and with a
/// small one (several passes, each reading the input again), in small chunks.
#[test]
fn bv_and_h5_agree_at_1_2_3_ranks_and_any_budget() {
    let k10 = cnr2000_k10();
    let _lock = serial();
    for (g, format, budget, arcs) in [
        (cnr2000(), "bv", "4M", 3_216_152u64),
        (k10.to_path_buf(), "h5", "1M", 477_754),
    ] {
        let (want, s) = stats_json(TestCommand::direct(), &g, &["--format", format], &[]);
        // prepare counts the arcs after cleaning the same way (docs/design.md).
        if format == "h5" {
            assert_eq!((s.nodes, s.arcs), (22_988, arcs));
        } else {
            assert_eq!(s.nodes, 325_557);
            assert!(s.arcs <= arcs, "{}", s.arcs);
        }
        assert!(s.reciprocity > 0.0 && s.reciprocity < 1.0);
        assert!(s.adjacent_jaccard > 0.0 && s.adjacent_jaccard < 1.0);
        let env = [
            ("TORUSREC_STATS_KEY_BYTES", budget),
            ("TORUSREC_STATS_CHUNK_ARCS", "100000"),
        ];
        for p in 1..=3 {
            let launcher = if p == 1 {
                TestCommand::direct()
            } else {
                TestCommand::mpirun(p)
            };
            let (line, _) = stats_json(launcher, &g, &[], &env);
            assert_eq!(line, want, "{format} at {p} ranks, budget {budget}");
        }
        // Several passes indeed.
        TestCommand::mpirun(2)
            .args(["inspect", "--stats"])
            .arg(&g)
            .env("TORUSREC_STATS_KEY_BYTES", budget)
            .run()
            .expect_code(0)
            .stdout_has(&["reading the input again"])
            .occurs("pass(es)", 1);
    }
}

/// At K = 0 a dataset's variant graph is its source, cleaned: the same statistics,
/// test rows (their visible and held-out arcs merged) included.
#[test]
fn a_k0_dataset_has_the_statistics_of_its_source() {
    let d = tempdir();
    let dense = write(d.path(), "dense.tsv", DENSE);
    let out = d.path().join("dense-k0.h5");
    TestCommand::direct()
        .args(["prepare", "--format", "tsv", "--min-links", "0", "--input"])
        .arg(&dense)
        .arg("--out")
        .arg(&out)
        .run()
        .expect_code(0);
    assert_eq!(
        stats_json(TestCommand::direct(), &out, &[], &[]).0,
        json(&dense_stats())
    );
    let cnr_k0 = d.path().join("cnr-k0.h5");
    util::prepare_cnr2000(TestCommand::direct(), 0, &cnr_k0)
        .run()
        .expect_code(0);
    assert!(
        !h5_read::<u32>(&cnr_k0, "test/rows").is_empty(),
        "the split has test rows"
    );
    let (bv, _) = stats_json(TestCommand::direct(), &cnr2000(), &[], &[]);
    let (h5, _) = stats_json(TestCommand::direct(), &cnr_k0, &[], &[]);
    assert_eq!(h5, bv);
}

#[test]
fn bad_inputs_exit_2_naming_the_file() {
    let d = tempdir();
    let run = |args: &[&std::ffi::OsStr]| {
        TestCommand::direct()
            .args(["inspect", "--stats"])
            .args(args)
            .arg("--json")
            .run()
    };
    let os = |p: &Path| p.as_os_str().to_owned();
    // Missing, guessed or named.
    let missing = d.path().join("nothing.tsv");
    run(&[&os(&missing)])
        .expect_code(2)
        .stderr_has(&["nothing.tsv: no such file"]);
    run(&[&os(&missing), "--format".as_ref(), "tsv".as_ref()])
        .expect_code(2)
        .stderr_has(&["nothing.tsv: no such file"]);
    // A malformed line: file and line.
    let bad = write(d.path(), "bad.tsv", "0 1\n1 2\n2 x\n");
    run(&[&os(&bad)])
        .expect_code(2)
        .stderr_has(&["bad.tsv:3: target \"x\" is not a non-negative integer"]);
    // --format bv on an edge list: the missing .graph named.
    run(&[&os(&bad), "--format".as_ref(), "bv".as_ref()])
        .expect_code(2)
        .stderr_has(&["bad.tsv.graph: missing"]);
    // A truncated .graph, on every rank of two.
    let base = d.path().join("cut");
    let graph = std::fs::read(cnr2000().with_extension("graph")).unwrap();
    std::fs::write(base.with_extension("graph"), &graph[..graph.len() / 2]).unwrap();
    std::fs::copy(
        cnr2000().with_extension("properties"),
        base.with_extension("properties"),
    )
    .unwrap();
    run(&[&os(&base)])
        .expect_code(2)
        .stderr_has(&["cut.graph: "]);
    // An HDF5 file that is not a dataset, and a file that is not HDF5.
    let other = d.path().join("other.h5");
    {
        let f = torusrec::io::h5::create(&other).unwrap();
        f.new_dataset::<u32>().shape(3).create("x").unwrap();
    }
    run(&[&os(&other)])
        .expect_code(2)
        .stderr_has(&["other.h5: not a torusrec dataset"]);
    run(&[&os(&bad), "--format".as_ref(), "h5".as_ref()])
        .expect_code(2)
        .stderr_has(&["bad.tsv: not an HDF5 file"]);

    let _lock = serial();
    let codes = d.path().join("codes");
    std::fs::create_dir_all(&codes).unwrap();
    let both = |g: &Path, needle: &str| {
        let o = TestCommand::mpirun(2)
            .record_rank_codes(&codes)
            .args(["inspect", "--stats"])
            .arg(g)
            .run();
        assert_eq!(
            rank_codes(&codes, 2),
            vec![Some(2), Some(2)],
            "{}",
            o.dump()
        );
        assert!(o.stderr.contains(needle), "{}", o.dump());
        assert!(o.stdout.is_empty(), "{}", o.dump());
    };
    both(&base, "cut.graph: ");
    // A dataset whose last row names a node out of range: only the last rank reads
    // it, and both stop.
    let broken = d.path().join("broken.h5");
    std::fs::copy(cnr2000_k10(), &broken).unwrap();
    let mut idx = h5_read::<u32>(&broken, "train/indices");
    let last = idx.len() - 1;
    idx[last] = 99_999_999;
    h5_write(&broken, "train/indices", &idx);
    both(&broken, "has id 99999999 >= 22988");
}
