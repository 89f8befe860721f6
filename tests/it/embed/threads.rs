//! The sharded embedding model under the thread communicator: every placement and
//! both table optimizers equal the unsharded model at P = 1..4, dedup on and off
//! give the same bits, K micro-batches equal one big batch, uneven and empty
//! per-rank batches do not hang.

use crate::util;

use torusrec::comm::threads::run;
use torusrec::comm::Comm;
use torusrec::data::clicks::gen::ClickGen;
use torusrec::data::clicks::source::Source;
use torusrec::embed::tables::placement::{OutputMode, Plan};
use torusrec::embed::tables::store::TableOpt;
use torusrec::embed::train::trainer::{EmbedConfig, EmbedTrainer, StepStatus};
use torusrec::spec::{preset, ModelSpec};

/// The whole model after training: per table `vocab x dim` rows and per-row
/// optimizer state, then the MLP parameters.
#[derive(Debug, Clone, PartialEq)]
struct Model {
    tables: Vec<Vec<f32>>,
    state: Vec<Vec<f32>>,
    mlp: Vec<f32>,
}

fn config(spec: &ModelSpec, opt: TableOpt, micro: usize, k: usize, steps: u64) -> EmbedConfig {
    util::embed_config(spec, opt, micro, k, steps)
}

/// Train on `p` thread ranks with `plan(p)`; gather the model by global id.
fn train(p: usize, cfg: &EmbedConfig, plan: impl Fn(usize) -> Plan + Sync) -> Model {
    let spec = cfg.spec.clone();
    let parts = run(p, |c| {
        let plan = plan(c.size());
        let src = Source::Generated(ClickGen::new(&cfg.spec, cfg.seed));
        let mut tr = EmbedTrainer::new(cfg.clone(), src, &plan, c.rank()).unwrap();
        while tr.step < cfg.steps {
            assert_eq!(tr.global_step(&c, false).unwrap(), StepStatus::Done);
        }
        let mut pieces = Vec::new();
        for ls in &tr.store.local {
            for r in 0..ls.rows {
                let sp = tr.store.state_per_row(ls.shard.table);
                pieces.push((
                    ls.shard.table,
                    ls.shard.rows.global(r),
                    ls.shard.cols.clone(),
                    ls.row(r).to_vec(),
                    ls.state[r as usize * sp..(r as usize + 1) * sp].to_vec(),
                ));
            }
        }
        (pieces, tr.mlp.flat())
    });
    let mut m = Model {
        tables: spec
            .tables
            .iter()
            .map(|t| vec![f32::NAN; t.vocab as usize * t.dim])
            .collect(),
        // Row statistics (row-wise Adagrad only; SGD keeps none).
        state: spec
            .tables
            .iter()
            .map(|t| vec![f32::NAN; t.vocab as usize * cfg.table_opt.state_per_row(t.dim)])
            .collect(),
        mlp: parts[0].1.clone(),
    };
    for (rank, (pieces, mlp)) in parts.into_iter().enumerate() {
        assert_eq!(mlp, m.mlp, "rank {rank}'s MLP differs from rank 0's");
        for (t, id, cols, row, st) in pieces {
            let dim = spec.tables[t].dim;
            let o = id as usize * dim;
            let dst = &mut m.tables[t][o + cols.start..o + cols.end];
            // Replicas and column shards of one row must agree.
            if dst.iter().all(|v| !v.is_nan()) {
                assert_eq!(dst, &row[..], "table {t} row {id}: replicas differ");
            }
            dst.copy_from_slice(&row);
            if let Some(&s) = st.first() {
                let have = m.state[t][id as usize];
                assert!(
                    have.is_nan() || have == s,
                    "table {t} row {id}: the row statistic differs between its shards"
                );
                m.state[t][id as usize] = s;
            }
        }
    }
    for (t, tab) in m.tables.iter().enumerate() {
        assert!(
            tab.iter().all(|v| v.is_finite()),
            "table {t} not fully covered"
        );
    }
    m
}

fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().map(|v| v.abs() as f64).fold(1e-12, f64::max);
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.is_nan() && y.is_nan() {
                0.0
            } else {
                (*x as f64 - *y as f64).abs() / scale
            }
        })
        .fold(0.0, f64::max)
}

fn assert_close(a: &Model, b: &Model, tol: f64, what: &str) {
    for t in 0..a.tables.len() {
        let d = max_rel(&a.tables[t], &b.tables[t]);
        assert!(d < tol, "{what}: table {t} differs by {d:e}");
        let d = max_rel(&a.state[t], &b.state[t]);
        assert!(
            d < tol,
            "{what}: optimizer state of table {t} differs by {d:e}"
        );
    }
    let d = max_rel(&a.mlp, &b.mlp);
    assert!(d < tol, "{what}: MLP differs by {d:e}");
}

const KINDS: [&str; 5] = [
    "table",
    "row_block",
    "row_cyclic",
    "column",
    "data_parallel",
];

fn opts() -> [TableOpt; 2] {
    [
        TableOpt::Sgd { lr: 0.5, wd: 0.0 },
        TableOpt::RowWiseAdagrad {
            lr: 0.1,
            eps: 1e-8,
            wd: 0.0,
        },
    ]
}

#[test]
fn every_placement_equals_the_unsharded_model_at_p_1_to_4() {
    let spec = preset("tiny", 1.0).unwrap();
    for opt in opts() {
        let cfg = config(&spec, opt, 24, 1, 4);
        let reference = train(1, &cfg, |p| Plan::uniform(&spec, p, "table").unwrap());
        // The tables moved: the comparison is not between two untouched inits.
        let fresh = train(1, &config(&spec, opt, 24, 1, 0), |p| {
            Plan::uniform(&spec, p, "table").unwrap()
        });
        assert!(max_rel(&reference.tables[0], &fresh.tables[0]) > 1e-3);
        for kind in KINDS {
            for p in 1..=4 {
                let m = train(p, &cfg, |p| Plan::uniform(&spec, p, kind).unwrap());
                assert_close(&m, &reference, 2e-5, &format!("{opt:?} {kind} P={p}"));
            }
        }
    }
}

#[test]
fn a_mixed_plan_equals_the_unsharded_model() {
    let spec = preset("tiny", 1.0).unwrap();
    let mixed = |p: usize| {
        let mut plan = Plan::uniform(&spec, p, "table").unwrap();
        for (t, kind) in [
            "column",
            "row_cyclic",
            "row_block",
            "data_parallel",
            "table",
        ]
        .iter()
        .enumerate()
        {
            plan.tables[t] = Plan::uniform(&spec, p, kind).unwrap().tables[t].clone();
        }
        plan
    };
    for opt in opts() {
        let cfg = config(&spec, opt, 30, 2, 3);
        let reference = train(1, &cfg, |p| Plan::uniform(&spec, p, "table").unwrap());
        for p in [2, 3] {
            assert_close(
                &train(p, &cfg, mixed),
                &reference,
                2e-5,
                &format!("{opt:?} P={p}"),
            );
        }
    }
}

#[test]
fn dedup_on_and_off_give_the_same_bits() {
    let spec = preset("tiny", 1.0).unwrap();
    for opt in opts() {
        for kind in ["row_block", "column", "table"] {
            for p in [1, 3] {
                let mut cfg = config(&spec, opt, 30, 2, 3);
                let on = train(p, &cfg, |p| Plan::uniform(&spec, p, kind).unwrap());
                cfg.dedup = false;
                let off = train(p, &cfg, |p| Plan::uniform(&spec, p, kind).unwrap());
                assert_eq!(on, off, "{opt:?} {kind} P={p}");
            }
        }
    }
}

#[test]
fn k_micro_batches_equal_one_big_batch() {
    let spec = preset("tiny", 1.0).unwrap();
    for opt in opts() {
        for p in [1, 2, 4] {
            let big = train(p, &config(&spec, opt, 36, 1, 3), |p| {
                Plan::uniform(&spec, p, "row_cyclic").unwrap()
            });
            let acc = train(p, &config(&spec, opt, 12, 3, 3), |p| {
                Plan::uniform(&spec, p, "row_cyclic").unwrap()
            });
            assert_close(&acc, &big, 2e-5, &format!("{opt:?} P={p}"));
        }
    }
}

#[test]
fn uneven_and_empty_rank_batches_finish_and_match() {
    let spec = preset("tiny", 1.0).unwrap();
    let opt = TableOpt::RowWiseAdagrad {
        lr: 0.1,
        eps: 1e-8,
        wd: 0.0,
    };
    // 3 examples per micro-batch on 4 ranks: one rank has none; 5 on 4: uneven.
    for micro in [3, 5] {
        let cfg = config(&spec, opt, micro, 2, 4);
        let reference = train(1, &cfg, |p| Plan::uniform(&spec, p, "table").unwrap());
        for kind in ["column", "row_block", "data_parallel"] {
            let m = train(4, &cfg, |p| Plan::uniform(&spec, p, kind).unwrap());
            assert_close(&m, &reference, 2e-5, &format!("micro {micro} {kind}"));
        }
    }
}

#[test]
fn pipelining_runs_and_stays_close_to_the_exact_run() {
    let spec = preset("tiny", 1.0).unwrap();
    let opt = TableOpt::Sgd { lr: 0.5, wd: 0.0 };
    let mut cfg = config(&spec, opt, 24, 2, 4);
    let exact = train(2, &cfg, |p| Plan::uniform(&spec, p, "row_block").unwrap());
    cfg.pipeline = true;
    let piped = train(2, &cfg, |p| Plan::uniform(&spec, p, "row_block").unwrap());
    // One-step-stale lookups change the bits but not the picture.
    assert_ne!(exact, piped);
    for t in 0..exact.tables.len() {
        assert!(max_rel(&exact.tables[t], &piped.tables[t]) < 0.2);
    }
}

/// `plan(p)` of one kind with every sharded table in `mode`.
fn with_mode<'a>(
    spec: &'a ModelSpec,
    kind: &str,
    mode: OutputMode,
) -> impl Fn(usize) -> Plan + Sync + 'a {
    let kind = kind.to_string();
    move |p| Plan::uniform(spec, p, &kind).unwrap().with_modes(mode)
}

#[test]
fn pooled_and_rows_output_modes_give_the_same_model() {
    let spec = preset("tiny", 1.0).unwrap();
    for opt in opts() {
        // K = 2 micro-batches per step: one lookup, one backward for both.
        let cfg = config(&spec, opt, 24, 2, 4);
        for kind in KINDS {
            for p in 1..=4 {
                let rows = train(p, &cfg, with_mode(&spec, kind, OutputMode::Rows));
                let pooled = train(p, &cfg, with_mode(&spec, kind, OutputMode::Pooled));
                let what = format!("{opt:?} {kind} P={p}");
                // A bag's rows are summed in one place unless a row-wise table is
                // cut over several ranks: then the owners' partial sums are added.
                let split = p > 1 && kind.starts_with("row_");
                if split {
                    assert_ne!(rows, pooled, "{what}: expected other summation orders");
                    assert_close(&pooled, &rows, 1e-6, &what);
                } else {
                    assert_eq!(rows, pooled, "{what}: pooled changed the bits");
                }
            }
        }
    }
}

#[test]
fn pooled_mode_handles_mixed_plans_empty_batches_and_no_dedup() {
    let spec = preset("tiny", 1.0).unwrap();
    let opt = TableOpt::RowWiseAdagrad {
        lr: 0.1,
        eps: 1e-8,
        wd: 0.0,
    };
    // A mixed plan, modes mixed too: column pooled, row_cyclic rows, row_block pooled,
    // data_parallel (always rows), table pooled.
    let mixed = |p: usize| {
        let mut plan = Plan::uniform(&spec, p, "table").unwrap();
        let kinds = [
            "column",
            "row_cyclic",
            "row_block",
            "data_parallel",
            "table",
        ];
        for (t, kind) in kinds.iter().enumerate() {
            plan.tables[t] = Plan::uniform(&spec, p, kind).unwrap().tables[t].clone();
        }
        let modes = [
            OutputMode::Pooled,
            OutputMode::Rows,
            OutputMode::Pooled,
            OutputMode::Rows,
            OutputMode::Pooled,
        ];
        plan.modes = (0..plan.tables.len()).map(|t| modes[t % 5]).collect();
        plan
    };
    let cfg = config(&spec, opt, 30, 2, 3);
    let reference = train(1, &cfg, |p| Plan::uniform(&spec, p, "table").unwrap());
    for p in [2, 3] {
        assert_close(
            &train(p, &cfg, mixed),
            &reference,
            2e-5,
            &format!("mixed P={p}"),
        );
    }
    // 3 examples on 4 ranks (one rank has none) and 5 on 4 (uneven).
    for micro in [3, 5] {
        let cfg = config(&spec, opt, micro, 2, 4);
        for kind in ["table", "column", "row_block"] {
            let rows = train(4, &cfg, with_mode(&spec, kind, OutputMode::Rows));
            let pooled = train(4, &cfg, with_mode(&spec, kind, OutputMode::Pooled));
            assert_close(&pooled, &rows, 1e-6, &format!("micro {micro} {kind}"));
        }
    }
    // Dedup off sends every occurrence: the same bits as dedup on.
    for kind in ["table", "column", "row_block"] {
        let mut cfg = config(&spec, opt, 30, 2, 3);
        let on = train(3, &cfg, with_mode(&spec, kind, OutputMode::Pooled));
        cfg.dedup = false;
        let off = train(3, &cfg, with_mode(&spec, kind, OutputMode::Pooled));
        assert_eq!(on, off, "pooled {kind}: dedup changed the bits");
    }
}

#[test]
fn pipelining_works_with_pooled_tables() {
    let spec = preset("tiny", 1.0).unwrap();
    let opt = TableOpt::Sgd { lr: 0.5, wd: 0.0 };
    let mut cfg = config(&spec, opt, 24, 2, 4);
    let exact = train(2, &cfg, with_mode(&spec, "row_block", OutputMode::Pooled));
    cfg.pipeline = true;
    let piped = train(2, &cfg, with_mode(&spec, "row_block", OutputMode::Pooled));
    let piped_rows = train(2, &cfg, with_mode(&spec, "row_block", OutputMode::Rows));
    // One-step-stale lookups change the bits but not the picture; pooled and rows see
    // the same stale tables.
    assert_ne!(exact, piped);
    for t in 0..exact.tables.len() {
        assert!(max_rel(&exact.tables[t], &piped.tables[t]) < 0.2);
    }
    assert_close(&piped, &piped_rows, 1e-6, "pipelined pooled vs rows");
}
