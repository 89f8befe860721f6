//! `torusrec calibrate` and the planner on measured costs: a quick calibration under
//! mpirun writes a file every reader accepts; a file with a bad field is refused
//! (exit 2, naming the field); a table made expensive in the file moves; `embed
//! --costs` predicts its step at the start and reports the measured one at the end.

use crate::util;

use serde_json::Value;
use std::path::{Path, PathBuf};
use util::{tempdir, TestCommand};

/// A quick calibration at 2 ranks into `dir/costs.json`.
fn calibrate(dir: &Path) -> PathBuf {
    let out = dir.join("costs.json");
    TestCommand::mpirun(2)
        .args(["calibrate", "--quick", "--out"])
        .arg(&out)
        .run()
        .expect_code(0)
        .stdout_has(&[
            "calibrate: 2 rank(s)",
            "fit: ",
            "fit: pooled pieces ",
            "wrote ",
        ]);
    out
}

/// A change to a costs file.
type Edit = Box<dyn Fn(&mut Value)>;

fn read(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn write(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

/// Three tables of width 8 and one ("wide") of width 32, small enough to place whole.
const SPEC: &str = "n_dense = 4\nhidden = [8]\n\
[[table]]\nname = \"a\"\nvocab = 4000\ndim = 8\nvalency = 4.0\n\
[[table]]\nname = \"b\"\nvocab = 4000\ndim = 8\nvalency = 4.0\n\
[[table]]\nname = \"wide\"\nvocab = 4000\ndim = 32\nvalency = 4.0\n\
[[table]]\nname = \"c\"\nvocab = 4000\ndim = 8\nvalency = 4.0\n";

/// `plan` of SPEC at 2 ranks with `costs`; the plan's placements as JSON.
fn plan(dir: &Path, name: &str, costs: &Path) -> (Vec<Value>, String) {
    let spec = dir.join("spec.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let out = dir.join(format!("{name}.json"));
    let run = TestCommand::direct()
        .args(["plan", "--tables"])
        .arg(&spec)
        .args(["--ranks", "2", "--batch", "256", "--estimate", "--force"])
        .arg("--costs")
        .arg(costs)
        .arg("--out")
        .arg(&out)
        .run();
    run.expect_code(0)
        .stdout_has(&["costs: ", "predicted planner", "step "]);
    let v = read(&out);
    (v["tables"].as_array().unwrap().clone(), run.stdout)
}

#[test]
fn calibrate_writes_a_file_that_plans_and_refuses_bad_ones_naming_the_field() {
    let d = tempdir();
    let costs = calibrate(d.path());
    let v = read(&costs);
    assert_eq!(v["schema"], "torusrec-costs-v1");
    let c = &v["conditions"];
    assert_eq!(c["ranks"], 2);
    assert_eq!(c["quick"], true);
    assert!(c["cpu"].as_str().is_some_and(|s| !s.is_empty()), "{c}");
    assert!(c["avx2"].is_boolean() && c["avx512"].is_boolean(), "{c}");
    assert!(c["commit"].as_str().is_some_and(|s| !s.is_empty()), "{c}");
    for k in ["gather", "scatter", "mlp", "all_to_all", "all_reduce"] {
        let a = v[k].as_array().unwrap();
        assert!(!a.is_empty(), "{k}");
        assert!(
            a.iter().all(|p| p["seconds"].as_f64().unwrap() > 0.0),
            "{k}: {a:?}"
        );
    }
    // Both id distributions, one table and several together.
    let g = v["gather"].as_array().unwrap();
    assert!(g.iter().any(|p| p["dist"] == "zipf"));
    assert!(g.iter().any(|p| p["tables"].as_u64() > Some(1)));
    // Pooled training steps: each placement at the reference size, and a whole
    // table of another size; the fit prices the pooled mode with them.
    let pooled = v["pooled"].as_array().unwrap();
    for pl in ["table", "column", "row_block"] {
        assert!(
            pooled.iter().any(|p| p["placement"] == pl),
            "{pl}: {pooled:?}"
        );
    }
    let rows: std::collections::BTreeSet<u64> = pooled
        .iter()
        .filter(|p| p["dim"] == 8)
        .map(|p| p["rows"].as_u64().unwrap())
        .collect();
    assert!(rows.len() >= 2, "{pooled:?}");
    assert!(pooled.iter().all(|p| p["seconds"].as_f64().unwrap() > 0.0));
    assert_eq!(v["fit"]["model"]["pooled_measured"], true, "{}", v["fit"]);
    // An untouched file plans.
    plan(d.path(), "ok", &costs);

    // Each bad file: exit 2 on `plan`, the field named, nothing written.
    let cases: Vec<(&str, Edit)> = vec![
        (
            "gather[1].seconds",
            Box::new(|w| w["gather"][1]["seconds"] = (-1.0).into()),
        ),
        (
            "scatter[0].dim",
            Box::new(|w| w["scatter"][0]["dim"] = 0.into()),
        ),
        (
            "conditions.threads",
            Box::new(|w| {
                w["conditions"].as_object_mut().unwrap().remove("threads");
            }),
        ),
        (
            "all_to_all[0].bytes",
            Box::new(|w| w["all_to_all"][0]["bytes"] = "many".into()),
        ),
        (
            "mlp[0].layers",
            Box::new(|w| w["mlp"][0]["layers"] = serde_json::json!([])),
        ),
        (
            "fit.model.mem_bw",
            Box::new(|w| w["fit"]["model"]["mem_bw"] = (-5.0).into()),
        ),
        (
            "gather[0].colour",
            Box::new(|w| w["gather"][0]["colour"] = "red".into()),
        ),
        (
            "schema",
            Box::new(|w| w["schema"] = "torusrec-costs-v0".into()),
        ),
        (
            "pooled[0].placement",
            Box::new(|w| w["pooled"][0]["placement"] = "diagonal".into()),
        ),
    ];
    let spec = d.path().join("spec.toml");
    for (field, edit) in cases {
        let mut w = v.clone();
        edit(&mut w);
        let bad = write(d.path(), "bad.json", &w);
        let out = d.path().join("never.json");
        TestCommand::direct()
            .args(["plan", "--tables"])
            .arg(&spec)
            .args(["--ranks", "2", "--estimate", "--costs"])
            .arg(&bad)
            .arg("--out")
            .arg(&out)
            .run()
            .expect_code(2)
            .stderr_has(&[field, "bad.json"]);
        assert!(!out.exists(), "{field}");
    }
    // Not JSON at all.
    std::fs::write(d.path().join("bad.json"), "{ not json").unwrap();
    TestCommand::direct()
        .args(["plan", "--tables"])
        .arg(&spec)
        .args(["--ranks", "2", "--estimate", "--costs"])
        .arg(d.path().join("bad.json"))
        .run()
        .expect_code(2)
        .stderr_has(&["bad.json", "JSON"]);
}

#[test]
fn a_table_made_expensive_in_the_costs_file_moves() {
    let d = tempdir();
    let mut v = read(&calibrate(d.path()));
    // Without the pooled steps, which price the pooled mode by occurrences and
    // examples whatever the kernels' widths (a wide table could stay whole in it).
    v.as_object_mut().unwrap().remove("pooled");
    let costs = write(d.path(), "kernels.json", &v);
    // The same measurements but every kernel point of width 32 a thousand times
    // slower: the fit's factor for width 32 (the table "wide") grows a thousandfold.
    let mut w = v.clone();
    for k in ["gather", "scatter"] {
        for p in w[k].as_array_mut().unwrap() {
            if p["dim"] == 32 {
                let s = p["seconds"].as_f64().unwrap();
                p["seconds"] = (s * 1000.0).into();
            }
        }
    }
    let slow = write(d.path(), "slow.json", &w);
    let (before, _) = plan(d.path(), "before", &costs);
    let (after, stdout) = plan(d.path(), "after", &slow);
    let wide = 2;
    assert_ne!(before[wide], after[wide], "{before:?}\n{after:?}\n{stdout}");
    // Alone on a rank it would be that rank's whole cost: the planner splits it.
    assert_ne!(after[wide]["kind"], "table", "{after:?}\n{stdout}");
}

#[test]
fn embed_with_costs_predicts_its_step_and_reports_the_measured_one() {
    let d = tempdir();
    let costs = calibrate(d.path());
    let metrics = d.path().join("m.jsonl");
    let run = TestCommand::mpirun(2)
        .args([
            "embed",
            "--preset",
            "tiny",
            "--steps",
            "6",
            "--log-every",
            "2",
            "--batch",
            "64",
            "--eval-examples",
            "256",
            "--threads",
            "1",
            "--costs",
        ])
        .arg(&costs)
        .arg("--metrics")
        .arg(&metrics)
        .run();
    run.expect_code(0).stdout_has(&[
        "plan: predicted step ",
        "measured: ",
        "busy seconds per step",
    ]);
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("plan: predicted step "))
        .unwrap();
    let s: f64 = line["plan: predicted step ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(s.is_finite() && s > 0.0, "{line}");
    let last: Value = serde_json::from_str(
        std::fs::read_to_string(&metrics)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(last["final"], true);
    // The line has four significant digits.
    let step = last["predicted"]["step"].as_f64().unwrap();
    assert!((step - s).abs() <= 1e-3 * step, "{line} vs {step}");
    let m = &last["measured"];
    assert_eq!(m["busy_per_rank"].as_array().unwrap().len(), 2, "{m}");
    // The same in CPU seconds: both ranks worked, so each is positive, and the
    // ratio is theirs.
    let cpu: Vec<f64> = m["busy_cpu_per_rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(cpu.len(), 2, "{m}");
    assert!(cpu.iter().all(|&c| c > 0.0 && c.is_finite()), "{m}");
    let ratio =
        cpu.iter().copied().fold(0.0, f64::max) / cpu.iter().copied().fold(f64::INFINITY, f64::min);
    let got = m["busy_cpu_max_over_min"].as_f64().unwrap();
    assert!((got - ratio).abs() <= 1e-9 * ratio, "{m}");
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("measured: ") && l.contains("in CPU seconds [")),
        "{}",
        run.stdout
    );
    // Three intervals of two steps: the first (warm-up) is left out.
    assert_eq!(m["steps"], 4, "{m}");
    assert!(m["seconds_per_step"].as_f64().unwrap() > 0.0, "{m}");
    // Every interval record carries the busy seconds of both ranks.
    let intervals = std::fs::read_to_string(&metrics).unwrap();
    let n = intervals
        .lines()
        .filter(|l| l.contains("\"busy_per_rank\"") && l.contains("\"busy_cpu_per_rank\""))
        .count();
    assert!(n >= 3, "{intervals}");

    // Without --costs: no prediction and no measured line.
    TestCommand::mpirun(2)
        .args([
            "embed",
            "--preset",
            "tiny",
            "--steps",
            "2",
            "--batch",
            "64",
            "--eval-examples",
            "256",
            "--threads",
            "1",
        ])
        .run()
        .expect_code(0)
        .occurs("predicted step", 0)
        .occurs("measured: ", 0);
}

#[test]
fn project_states_alxs_published_points_beside_its_own() {
    let d = tempdir();
    let costs = calibrate(d.path());
    let run = TestCommand::direct()
        .args(["project", "als", "--webgraph", "sparse", "--chip", "v3"])
        .arg("--costs")
        .arg(&costs)
        .run();
    run.expect_code(0).stdout_has(&[
        "anchor: WebGraph-sparse (published: ALX, Mehta et al. 2021): about 20 min per epoch on 256 TPU v3 cores",
        "anchor: ALX's scheme (allgather) projected at ",
        "(128 chips, 256 cores)",
        "published 1200 s per epoch",
        "anchor: gap by term: ",
        "anchor: at the efficiencies measured here (2 ranks",
    ]);
    // The dense point, without --costs: no measured line.
    let run = TestCommand::direct()
        .args(["project", "als", "--webgraph", "dense", "--chip", "v3"])
        .run();
    run.expect_code(0)
        .stdout_has(&[
            "anchor: WebGraph-dense (published: ALX, Mehta et al. 2021): trained in less than a day on 8 TPU v3 cores",
            "(4 chips, 8 cores)",
        ])
        .occurs("efficiencies measured here", 0);
    // Another scale is not compared with the published point.
    TestCommand::direct()
        .args([
            "project",
            "als",
            "--webgraph",
            "sparse",
            "--scale",
            "0.001",
            "--chip",
            "v3",
        ])
        .run()
        .expect_code(0)
        .stdout_has(&["not compared"])
        .occurs("ALX's scheme (allgather) projected", 0);
    // --costs needs a WebGraph preset.
    TestCommand::direct()
        .args(["project", "als", "--data", "x.h5", "--costs"])
        .arg(&costs)
        .run()
        .expect_code(2);
}
