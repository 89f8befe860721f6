//! `torusrec project`: the degree model against exact counts; the command line
//! (tables, TSV, refusals) and `project measure` under mpirun; the step of the
//! embedding model and the chip cost model. The projected per-link traffic against
//! the measured counters: `tests/faults` (it plants the round size through the
//! environment).

use crate::util;

use torusrec::data::graph::webgraph_gen::WebGraphSpec;
use torusrec::projection::als::{AlsModel, DegreeSample};
use torusrec::projection::measure::local_read_model;
use util::TestCommand;

#[test]
fn degree_model_is_close_to_the_exact_counts() {
    let dir = util::tempdir();
    let data = util::synthetic_dataset(dir.path(), 40_000, 800_000, 42);
    let spec = WebGraphSpec::new(40_000, 800_000).unwrap();
    let sample = DegreeSample::new(&spec, 42);
    for p in [4usize, 16] {
        let exact = local_read_model(&data, p).unwrap();
        let model = AlsModel::from_webgraph("m", &spec, &sample, p);
        for half in 0..2 {
            let off = |m: &AlsModel| -> u64 {
                (0..p * p)
                    .filter(|i| i / p != i % p)
                    .map(|i| m.need[half][i])
                    .sum()
            };
            let (e, m) = (off(&exact) as f64, off(&model) as f64);
            let ratio = m / e;
            eprintln!("P={p} half {half}: rows sent exact {e}, model {m} ({ratio:.3})");
            assert!(
                (0.85..=1.15).contains(&ratio),
                "P={p} half {half}: the model's {m} rows against {e} exact"
            );
        }
    }
}

#[test]
fn project_als_prints_a_table_writes_tsv_and_refuses_bad_input() {
    let dir = util::tempdir();
    let data = util::synthetic_dataset(dir.path(), 900, 9000, 5);
    let tsv = dir.path().join("p.tsv");
    let out = TestCommand::direct()
        .args(["project", "als", "--data"])
        .arg(&data)
        .args([
            "--chip",
            "v4",
            "--shapes",
            "2x2x1,2x2x2",
            "--dim",
            "16",
            "--tsv",
        ])
        .arg(&tsv)
        .run();
    out.expect_code(0);
    assert!(
        out.stdout.contains("| 2x2x2 | 8 | 16 | dedup |"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("allgather"), "{}", out.stdout);
    assert!(out.stdout.contains("no --calibration"), "{}", out.stdout);
    let text = std::fs::read_to_string(&tsv).unwrap();
    assert_eq!(text.lines().count(), 1 + 2 * 2, "{text}");
    // The TSV exists now: refused without --force.
    let again = TestCommand::direct()
        .args(["project", "als", "--data"])
        .arg(&data)
        .args(["--shapes", "2x2", "--tsv"])
        .arg(&tsv)
        .run();
    again.expect_code(2);
    assert!(again.stderr.contains("--force"), "{}", again.stderr);
    // The degree model on a preset: ALX's sparse on v3 at 8x16 (256 cores).
    let sparse = TestCommand::direct()
        .args([
            "project",
            "als",
            "--webgraph",
            "sparse",
            "--shapes",
            "8x16",
            "--table-dtype",
            "bf16",
        ])
        .run();
    sparse.expect_code(0);
    assert!(
        sparse.stdout.contains("| 8x16 | 128 | 256 | dedup |"),
        "{}",
        sparse.stdout
    );
    let bad: &[(&[&str], &str)] = &[
        (&["--data", "/nonexistent.h5"], "nonexistent"),
        (&["--webgraph", "huge"], "unknown webgraph preset"),
        (&["--webgraph", "in-dense", "--chip", "v9"], "--chip"),
        (
            &["--webgraph", "in-dense", "--chip", "here"],
            "--calibration",
        ),
        (&["--webgraph", "in-dense", "--shapes", "2xq"], "2xq"),
        (&["--webgraph", "in-dense", "--link-gbs", "0"], "--link-gbs"),
        (&["--webgraph", "in-dense", "--dim", "0"], "--dim"),
        (
            &[
                "--webgraph",
                "in-dense",
                "--calibration",
                "/nonexistent.json",
            ],
            "nonexistent.json",
        ),
    ];
    for (args, msg) in bad {
        let o = TestCommand::direct()
            .args(["project", "als"])
            .args(*args)
            .run();
        o.expect_code(2);
        assert!(o.stderr.contains(msg), "{args:?}: {}", o.stderr);
    }
    let notcal = dir.path().join("c.json");
    std::fs::write(&notcal, "{\"x\": 1}").unwrap();
    let o = TestCommand::direct()
        .args(["project", "als", "--webgraph", "in-dense", "--calibration"])
        .arg(&notcal)
        .run();
    o.expect_code(2);
    assert!(o.stderr.contains("not a calibration"), "{}", o.stderr);
    // A node term must be a positive rate too (absent or null: none).
    let cal = |node: &str| {
        format!(
            "{{\"shape\": \"2x2\", \"link_latency\": 1e-5, \"link_bandwidth\": 1e9, {node}\"solve_flops\": 1e10, \"peak_flops\": 4e10, \"memory_bytes\": 1073741824, \"threads\": 1}}"
        )
    };
    for (node, code) in [
        ("", 0),
        ("\"node_bandwidth\": null, ", 0),
        ("\"node_bandwidth\": 2e10, ", 0),
        ("\"node_bandwidth\": -1, ", 2),
        ("\"node_bandwidth\": 0, ", 2),
    ] {
        std::fs::write(&notcal, cal(node)).unwrap();
        let o = TestCommand::direct()
            .args([
                "project",
                "als",
                "--webgraph",
                "in-dense",
                "--chip",
                "here",
                "--shapes",
                "2x2",
                "--calibration",
            ])
            .arg(&notcal)
            .run();
        o.expect_code(code);
        if code == 2 {
            assert!(
                o.stderr.contains("positive and finite"),
                "{node}: {}",
                o.stderr
            );
        }
    }
}

#[test]
fn project_measure_under_mpirun_checks_the_projection_and_calibrates() {
    let dir = util::tempdir();
    let data = util::synthetic_dataset(dir.path(), 900, 9000, 5);
    let cal = dir.path().join("cal.json");
    let out = TestCommand::mpirun(4)
        .args(["--torus", "2x2", "project", "measure", "--data"])
        .arg(&data)
        .args(["--dim", "8", "--epochs", "2", "--threads", "1", "--out"])
        .arg(&cal)
        .run();
    out.expect_code(0);
    for ph in [
        "plan (once)",
        "exchange (per epoch)",
        "gramian (per epoch)",
        "loss (per epoch)",
    ] {
        assert!(
            out.stdout.contains(&format!("| {ph} | equal |")),
            "{ph}: {}",
            out.stdout
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cal).unwrap()).unwrap();
    assert_eq!(v["calibration"]["shape"], "2x2");
    assert!(v["calibration"]["link_bandwidth"].as_f64().unwrap() > 0.0);
    // The node term: fitted (a positive rate, also on the stdout line) or left out.
    let node = &v["calibration"]["node_bandwidth"];
    match node.as_f64() {
        Some(nb) => {
            assert!(nb > 0.0, "{node}");
            assert!(out.stdout.contains("GB/s over all links"), "{}", out.stdout);
        }
        None => assert!(node.is_null(), "{node}"),
    }
    // The calibration drives `--chip here`.
    let here = TestCommand::direct()
        .args(["project", "als", "--data"])
        .arg(&data)
        .args([
            "--chip",
            "here",
            "--shapes",
            "2x2",
            "--dim",
            "8",
            "--calibration",
        ])
        .arg(&cal)
        .run();
    here.expect_code(0);
    assert!(
        here.stdout.contains("this machine (2x2)"),
        "{}",
        here.stdout
    );
    // One rank cannot measure links; an existing --out needs --force.
    let one = TestCommand::direct()
        .args(["project", "measure", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(dir.path().join("c1.json"))
        .run();
    one.expect_code(2);
    assert!(one.stderr.contains("at least 2 ranks"), "{}", one.stderr);
    let again = TestCommand::mpirun(2)
        .args(["project", "measure", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(&cal)
        .run();
    again.expect_code(2);
}

/// `project measure` trains its epochs on the run driver without checkpoints: a
/// preemption signal stops every rank with exit 1 (75 would ask Slurm to requeue a
/// run that saved nothing) and no calibration file is written.
#[test]
fn a_preempted_project_measure_exits_1_on_every_rank_and_writes_nothing() {
    let dir = util::tempdir();
    let data = util::synthetic_dataset(dir.path(), 900, 9000, 5);
    let cal = dir.path().join("cal.json");
    let codes = dir.path().join("codes");
    std::fs::create_dir_all(&codes).unwrap();
    let o = TestCommand::mpirun(2)
        .args(["project", "measure", "--data"])
        .arg(&data)
        .args(["--dim", "8", "--epochs", "2", "--threads", "1", "--out"])
        .arg(&cal)
        .env("TORUSREC_PREEMPT_AT", "1")
        .record_rank_codes(&codes)
        .timeout(std::time::Duration::from_secs(300))
        .run();
    o.expect_code(0); // the rank-recording wrapper exits 0
    let got = util::rank_codes(&codes, 2);
    assert!(got.iter().all(|c| *c == Some(1)), "{got:?}\n{}", o.dump());
    o.stderr_has(&["interrupted", "project measure saves nothing"]);
    assert!(!cal.exists(), "a preempted measure wrote its calibration");
}

#[test]
fn project_embed_plans_every_shape_and_projects_its_step() {
    let out = TestCommand::direct()
        .args([
            "project",
            "embed",
            "--preset",
            "tiny",
            "--chip",
            "v4",
            "--shapes",
            "2x2x1,2x2x2",
            "--batch",
            "256",
        ])
        .run();
    out.expect_code(0);
    assert!(out.stdout.contains("| 2x2x1 | 4 |"), "{}", out.stdout);
    assert!(out.stdout.contains("| 2x2x2 | 8 |"), "{}", out.stdout);
    let o = TestCommand::direct()
        .args(["project", "embed", "--preset", "tiny", "--batch", "0"])
        .run();
    o.expect_code(2);
    assert!(o.stderr.contains("--batch"), "{}", o.stderr);
}

#[test]
fn embed_step_bytes_are_the_planners_exchange_without_self_traffic() {
    use torusrec::embed::tables::placement::{OutputMode, Plan};
    use torusrec::embed::train::batch_stats::synthetic_stats;
    use torusrec::projection::embed::project_step;
    use torusrec::projection::traffic::HEADER_BYTES;
    use torusrec::spec::preset;
    let spec = preset("tiny", 1.0).unwrap();
    let stats = synthetic_stats(&spec, 4, 128);
    let plan = Plan::uniform(&spec, 4, "table")
        .unwrap()
        .with_modes(OutputMode::Rows);
    let proj = project_step(&spec, &stats, &plan, &[2, 2], 128, 0);
    // Payload over links: each pair's bytes once per hop; at 2x2 a message to the
    // diagonal neighbour takes two hops, so compare with the routed hop count.
    let payload = |name: &str| -> f64 {
        let t = &proj.phases.iter().find(|(n, _)| *n == name).unwrap().1;
        let bytes: u64 = t.links.iter().flatten().map(|l| l.bytes).sum();
        // One header per packet and hop: 4 sources x (2 neighbours x 1 hop + the
        // diagonal x 2 hops) = 16 per all-to-all (the lookup has two).
        (bytes - 16 * HEADER_BYTES * if name == "lookup" { 2 } else { 1 }) as f64
    };
    // The planner's model: per table, every other chip's distinct ids once to the
    // owner (4 bytes each), the rows back and the gradients in (4 w each); at 2x2 two
    // of the three sources are one hop from the owner and one is two hops away.
    let mut want_lookup = 0.0;
    let mut want_backward = 0.0;
    for (t, ts) in spec.tables.iter().enumerate() {
        let u = stats.tables[t].unique_per_rank_batch;
        let pairs_hops = 1.0 + 1.0 + 2.0;
        want_lookup += pairs_hops * (4.0 * u + 4.0 * ts.dim as f64 * u);
        want_backward += pairs_hops * 4.0 * ts.dim as f64 * u;
    }
    let (l, b) = (payload("lookup"), payload("backward"));
    assert!(
        (l - want_lookup).abs() <= 4.0 * 64.0,
        "lookup {l} vs {want_lookup}"
    );
    assert!(
        (b - want_backward).abs() <= 4.0 * 64.0,
        "backward {b} vs {want_backward}"
    );
    assert!(proj.flops > 0.0 && proj.memory > 0);
}

/// The projected step seconds of `plan` on `dims` with `chip`, as `project embed`
/// computes them.
fn projected_step_seconds(
    spec: &torusrec::spec::ModelSpec,
    stats: &torusrec::embed::train::batch_stats::BatchStats,
    plan: &torusrec::embed::tables::placement::Plan,
    dims: &[usize],
    chip: &torusrec::projection::chip::Chip,
) -> f64 {
    use torusrec::projection::embed::project_step;
    use torusrec::projection::traffic::Traffic;
    let proj = project_step(spec, stats, plan, dims, 2048, 1);
    let mut t = Traffic::new(dims);
    for (_, ph) in &proj.phases {
        t.add(ph);
    }
    t.seconds(chip.link_latency, chip.link_bandwidth)
        + proj.flops / chip.peak_flops
        + chip
            .memory_bandwidth
            .map_or(0.0, |b| proj.memory_traffic / b)
}

#[test]
fn the_chip_cost_model_takes_its_rates_from_the_torus() {
    use torusrec::embed::planner::CostModel;
    use torusrec::projection::chip::preset;
    use torusrec::projection::embed::{cost_model, CHIP_LOOKUP_S};
    let v4 = preset("v4").unwrap();
    let bw = v4.link_bandwidth;
    // Two chips: every byte crosses the one link once (headers aside).
    let two = cost_model(&v4, &[2]);
    assert!(
        (two.net_bw / bw - 1.0).abs() < 1e-3,
        "{} vs {bw}",
        two.net_bw
    );
    // A ring all-reduce moves 2 (n - 1) / n of the vector per rank; the torus one
    // sends half of it each way, one half after the other: the link's rate.
    let ring = cost_model(&v4, &[8]);
    assert!(
        (ring.allreduce_bw / bw - 1.0).abs() < 1e-3,
        "{}",
        ring.allreduce_bw
    );
    // More hops per byte on larger tori: a chip's all-to-all rate falls.
    let rate = |d: &[usize]| cost_model(&v4, d).net_bw;
    let (a, b, c) = (rate(&[2, 2, 2]), rate(&[4, 4, 4]), rate(&[8, 8, 8]));
    assert!(a > b && b > c, "{a} {b} {c}");
    // Rows at the chip's memory bandwidth; a shard costs a message.
    assert_eq!(ring.mem_bw, v4.memory_bandwidth.unwrap());
    assert_eq!(ring.lookup_s, CHIP_LOOKUP_S);
    assert_eq!(ring.shard_s, v4.link_latency);
    // A chip without a memory bandwidth of its own keeps the default row costs.
    let mut cpu = v4.clone();
    cpu.memory_bandwidth = None;
    let m = cost_model(&cpu, &[2, 2]);
    let d = CostModel::default();
    assert_eq!((m.mem_bw, m.lookup_s), (d.mem_bw, d.lookup_s));
}

#[test]
fn planning_with_the_chip_cost_model_projects_a_faster_step() {
    use torusrec::embed::planner::{plan_auto, PlanOptions};
    use torusrec::embed::train::batch_stats::synthetic_stats;
    use torusrec::projection::embed::cost_model;
    use torusrec::spec::preset;
    let spec = preset("torchrec-peer", 1.0).unwrap();
    let stats = synthetic_stats(&spec, 1, 2048);
    let v4 = torusrec::projection::chip::preset("v4").unwrap();
    let mut faster = 0;
    for dims in [[2, 2, 1], [2, 4, 4]] {
        let p: usize = dims.iter().product();
        let mut opts = PlanOptions::new(p, v4.memory_bytes);
        opts.state_per_row = 1;
        let (default_plan, _) = plan_auto(&spec, &stats, &opts).unwrap();
        opts.model = cost_model(&v4, &dims);
        let (chip_plan, _) = plan_auto(&spec, &stats, &opts).unwrap();
        let before = projected_step_seconds(&spec, &stats, &default_plan, &dims, &v4);
        let after = projected_step_seconds(&spec, &stats, &chip_plan, &dims, &v4);
        eprintln!("{dims:?}: {:.3} ms -> {:.3} ms", before * 1e3, after * 1e3);
        assert!(after <= before * 1.05, "{dims:?}: {before} -> {after}");
        if after < before * 0.9 {
            faster += 1;
        }
    }
    assert!(faster >= 1, "the chip's model made no shape's step faster");
}
