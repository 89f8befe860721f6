//! `--table-dtype bf16|f16`: tables stored at 2 bytes a value train (the loss falls),
//! hold half the row memory (the store, the plan's memory per rank and so the memory
//! check count 2 bytes a value), send about half the bytes of the `rows` lookup, resume
//! bitwise, refuse a resume at another dtype, and write a model file whose f32 rows
//! `predict` scores as the trainer evaluated them; `--table-dtype f32` is the default's
//! bits.

use crate::util;

use std::path::Path;

use torusrec::bf16::EmbDtype;
use torusrec::comm::threads::run;
use torusrec::comm::Comm;
use torusrec::data::clicks::gen::ClickGen;
use torusrec::data::clicks::source::Source;
use torusrec::embed::tables::placement::Plan;
use torusrec::embed::tables::store::TableOpt;
use torusrec::embed::train::trainer::{EmbedTrainer, IntervalReport, StepStatus};
use torusrec::spec::{preset, ModelSpec};
use util::{serial, tempdir, Output, TestCommand};

/// What a thread run of `spec` on 2 ranks (row-wise, `rows` output mode) measured.
struct Run {
    /// Per reporting interval (5 steps each).
    reports: Vec<IntervalReport>,
    /// Bytes of rows and state each rank's store holds.
    store_bytes: Vec<u64>,
    /// Table values each rank holds at 2 bytes and at 4.
    half_values: usize,
    f32_values: usize,
    /// Every table value of rank 0, widened.
    values: Vec<f32>,
}

fn train_threads(spec: &ModelSpec, steps: u64) -> Run {
    let opt = TableOpt::RowWiseAdagrad {
        lr: 0.05,
        eps: 1e-8,
        wd: 0.0,
    };
    let mut cfg = util::embed_config(spec, opt, 256, 1, steps);
    cfg.log_every = 5;
    let parts = run(2, |c| {
        let plan = Plan::uniform(&cfg.spec, c.size(), "row_block").unwrap();
        let src = Source::Generated(ClickGen::new(&cfg.spec, cfg.seed));
        let mut tr = EmbedTrainer::new(cfg.clone(), src, &plan, c.rank()).unwrap();
        let mut reports = Vec::new();
        while tr.step < cfg.steps {
            assert_eq!(tr.global_step(&c, false).unwrap(), StepStatus::Done);
            if tr.step.is_multiple_of(5) {
                reports.push(tr.global_interval(&c).unwrap());
            }
        }
        let values: Vec<f32> = tr
            .store
            .local
            .iter()
            .flat_map(|l| l.rows_f32().to_vec())
            .collect();
        let half: usize = tr.store.local.iter().map(|l| l.half.len()).sum();
        let full: usize = tr.store.local.iter().map(|l| l.data.len()).sum();
        (reports, tr.store.bytes(), half, full, values)
    });
    Run {
        reports: parts[0].0.clone(),
        store_bytes: parts.iter().map(|p| p.1).collect(),
        half_values: parts[0].2,
        f32_values: parts[0].3,
        values: parts[0].4.clone(),
    }
}

fn with_dtype(d: EmbDtype) -> ModelSpec {
    let mut s = preset("tiny", 1.0).unwrap();
    s.table_dtype = d;
    s.validate("test").unwrap();
    s
}

#[test]
fn bf16_and_f16_tables_train_with_half_the_row_memory_and_lookup_bytes() {
    let steps = 30;
    let f32_run = train_threads(&with_dtype(EmbDtype::F32), steps);
    let spec32 = with_dtype(EmbDtype::F32);
    let plan = Plan::uniform(&spec32, 2, "row_block").unwrap();
    for d in [EmbDtype::Bf16, EmbDtype::F16] {
        let spec = with_dtype(d);
        let r = train_threads(&spec, steps);
        // The rows are stored at 2 bytes a value, none at f32.
        assert_eq!(r.f32_values, 0, "{d}");
        assert_eq!(r.half_values, f32_run.f32_values, "{d}");
        // Memory: rows at 2 bytes, the row-wise Adagrad state (1 f32 a row) unchanged;
        // the plan (the memory check's and --mem-per-rank's count) says the same.
        let state = |spec: &ModelSpec| plan.bytes_per_rank(spec, 1);
        assert_eq!(r.store_bytes, state(&spec), "{d}: the store and the plan");
        assert_eq!(f32_run.store_bytes, state(&spec32));
        let rows32: u64 = spec32
            .tables
            .iter()
            .map(|t| t.vocab * t.dim as u64 * 4)
            .sum();
        let total = |v: &[u64]| v.iter().sum::<u64>();
        assert_eq!(
            total(&f32_run.store_bytes) - total(&r.store_bytes),
            rows32 / 2,
            "{d}: half of the f32 rows' bytes saved"
        );
        assert_eq!(spec.total_bytes() * 2, spec32.total_bytes());
        // The loss falls (first interval against the last).
        let (first, last) = (r.reports[0].loss, r.reports.last().unwrap().loss);
        assert!(last < first - 0.01, "{d}: loss {first} -> {last}");
        let (first32, last32) = (
            f32_run.reports[0].loss,
            f32_run.reports.last().unwrap().loss,
        );
        assert!(
            (last - last32).abs() < 0.02,
            "{d}: final loss {last} against f32's {last32} (first {first} / {first32})"
        );
        // The same ids travel (the data does not depend on the model): the lookup's
        // bytes are the ids plus the rows, the rows at half the width. The tiny
        // preset's tables are 16 wide: 4 + 64 bytes per id at f32, 4 + 32 at 2 bytes.
        for (a, b) in r.reports.iter().zip(&f32_run.reports) {
            let ratio = a.lookup_bytes_per_step / b.lookup_bytes_per_step;
            assert!(
                (0.45..0.6).contains(&ratio),
                "{d}: lookup bytes ratio {ratio}"
            );
            // Gradients stay f32.
            assert_eq!(a.backward_bytes_per_step, b.backward_bytes_per_step, "{d}");
        }
        // Every value is finite; the tables are not f32's (rounded at every update:
        // the runs drift apart through the MLP too) but of their scale.
        assert!(r.values.iter().all(|v| v.is_finite()), "{d}");
        let diff = util::max_rel_diff(&r.values, &f32_run.values);
        assert!(
            diff > 0.0 && diff < 0.5,
            "{d}: tables differ from f32's by {diff}"
        );
    }
}

#[test]
fn a_hash_table_at_bf16_is_refused() {
    let mut s = with_dtype(EmbDtype::F32);
    s.tables[0].vocab_kind = torusrec::spec::VocabKind::Hash;
    s.table_dtype = EmbDtype::Bf16;
    let e = s.validate("test").unwrap_err().to_string();
    assert!(e.contains("hash table") && e.contains("bf16"), "{e}");
}

/// `embed` of the tiny preset on 1 rank for `steps` steps (checkpoint dir `ck`).
fn tiny(steps: &str, extra: &[&str]) -> Output {
    TestCommand::direct()
        .args([
            "embed",
            "--preset",
            "tiny",
            "--global-batch",
            "128",
            "--steps",
            steps,
            "--log-every",
            "5",
            "--eval-examples",
            "1024",
            "--threads",
            "1",
            "--output-mode",
            "rows",
        ])
        .args(extra)
        .run()
}

fn ckpt_args(dir: &Path) -> Vec<String> {
    vec![
        "--checkpoint-dir".into(),
        dir.display().to_string(),
        "--checkpoint-every".into(),
        "5".into(),
    ]
}

#[test]
fn bf16_resumes_bitwise_and_refuses_another_dtype() {
    let _serial = serial();
    let d = tempdir();
    let bf = ["--table-dtype", "bf16"];
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    let whole = tiny(
        "20",
        &[
            &bf[..],
            &ckpt_args(&a).iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        ]
        .concat(),
    );
    whole.expect_code(0).stdout_has(&["of bf16"]);
    let cb: Vec<String> = ckpt_args(&b);
    let cb: Vec<&str> = cb.iter().map(|s| s.as_str()).collect();
    tiny("10", &[&bf[..], &cb].concat()).expect_code(0);
    // At f32 the bf16 checkpoint is refused, naming both dtypes.
    let refused = tiny("20", &[&["--resume", "auto"][..], &cb].concat());
    refused
        .expect_code(2)
        .stderr_has(&["bf16", "f32", "--table-dtype"]);
    let resumed = tiny("20", &[&bf[..], &["--resume", "auto"], &cb].concat());
    resumed.expect_code(0);
    assert_eq!(
        resumed.final_checksum(),
        whole.final_checksum(),
        "{}",
        resumed.dump()
    );
    // Not the f32 run's bits.
    let f32_run = tiny("20", &[]);
    assert_ne!(f32_run.final_checksum(), whole.final_checksum());
}

#[test]
fn table_dtype_f32_is_the_default_and_the_toml_key_sets_bf16() {
    let _serial = serial();
    let d = tempdir();
    let default = tiny("10", &[]);
    default.expect_code(0).stdout_has(&["of f32"]);
    let f32_run = tiny("10", &["--table-dtype", "f32"]);
    assert_eq!(default.final_checksum(), f32_run.final_checksum());
    // The same model in a tables file with `table_dtype = "bf16"`: the flag's run.
    let spec = with_dtype(EmbDtype::Bf16);
    let toml_path = d.path().join("t.toml");
    std::fs::write(&toml_path, toml::to_string(&spec).unwrap()).unwrap();
    let text = std::fs::read_to_string(&toml_path).unwrap();
    assert!(text.contains("table_dtype = \"bf16\""), "{text}");
    let flag = tiny("10", &["--table-dtype", "bf16"]);
    let from_toml = TestCommand::direct()
        .args(["embed", "--tables"])
        .arg(&toml_path)
        .args([
            "--global-batch",
            "128",
            "--steps",
            "10",
            "--log-every",
            "5",
            "--eval-examples",
            "1024",
            "--threads",
            "1",
            "--output-mode",
            "rows",
        ])
        .run();
    from_toml.expect_code(0).stdout_has(&["of bf16"]);
    assert_eq!(from_toml.final_checksum(), flag.final_checksum());
    // The f32 model file digest is what it was: no table_dtype key written.
    let spec32 = with_dtype(EmbDtype::F32);
    assert!(!toml::to_string(&spec32).unwrap().contains("table_dtype"));
}

#[test]
fn predict_scores_a_bf16_model_as_the_trainer_evaluated_it() {
    let _serial = serial();
    let d = tempdir();
    let log = d.path().join("log.h5");
    TestCommand::direct()
        .args([
            "generate",
            "clicks",
            "--preset",
            "tiny",
            "--examples",
            "3000",
        ])
        .arg("--out")
        .arg(&log)
        .run()
        .expect_code(0);
    let model = d.path().join("m.h5");
    let trained = TestCommand::direct()
        .args(["embed", "--data"])
        .arg(&log)
        .args([
            "--global-batch",
            "128",
            "--steps",
            "15",
            "--eval-examples",
            "500",
            "--threads",
            "1",
            "--table-dtype",
            "bf16",
            "--out",
        ])
        .arg(&model)
        .run();
    trained.expect_code(0);
    // The file's rows are f32 holding bf16 values, and it says so.
    let rows: Vec<f32> = util::h5_read(&model, "/tables/0/rows");
    assert!(!rows.is_empty());
    for v in &rows {
        assert_eq!(v.to_bits() & 0xffff, 0, "{v} is not a bf16 value");
    }
    let f = hdf5::File::open(&model).unwrap();
    let a: hdf5::types::VarLenUnicode = f.attr("table_dtype").unwrap().read_scalar().unwrap();
    assert_eq!(a.as_str(), "bf16");
    let tail = d.path().join("tail.tsv");
    let o = TestCommand::direct()
        .args(["predict", "--model"])
        .arg(&model)
        .arg("--data")
        .arg(&log)
        .arg("--out")
        .arg(&tail)
        .args(["--threads", "1", "--eval-examples", "500"])
        .run();
    o.expect_code(0);
    super::predict::assert_scores_as_trained(&trained.stdout, &o.stdout);
}
