//! `torusrec project`: the projected per-link bytes and messages of every training
//! phase equal what a run with the torus collectives counts, rank by rank and link by
//! link (thread backend at 2x2, 2x4, 2x2x2, 4x1, 3x3; f32 and bf16; dedup in one and,
//! with `TORUSREC_FETCH_ROUND_BYTES`, several rounds, and ALX's all-gather). The rest
//! of the `project` tests: `project` of `tests/it`.

use crate::util;
use crate::EnvVar;

use std::path::Path;
use torusrec::als::model::TableScalar;
use torusrec::als::train::run::{global_train_unsaved, EvalAt};
use torusrec::als::train::trainer::Trainer;
use torusrec::als::{AlsConfig, ExchangeKind};
use torusrec::bf16::{Bf16, TableDtype};
use torusrec::ckpt::signals::Preemption;
use torusrec::comm::threads::run_on;
use torusrec::comm::{Collectives, Comm, Links};
use torusrec::projection::als::AlsParams;
use torusrec::projection::measure::local_read_model;

fn config(data: &Path, dim: usize, exchange: ExchangeKind, dtype: TableDtype) -> AlsConfig {
    AlsConfig {
        dim,
        epochs: 2,
        reg: 0.05,
        unobserved_weight: 0.05,
        cg_steps: 2,
        exchange,
        eval_rows: torusrec::als::eval::EvalRows::All,
        seed: 3,
        hub_chunk: 64,
        step_nnz: 5000,
        table_dtype: dtype,
        ..AlsConfig::new(data)
    }
}

const PHASES: [&str; 4] = ["plan", "exchange", "gramian", "loss"];

fn phase_links(all: &[(String, Links)], name: &str) -> Links {
    all.iter()
        .find(|(n, _)| n == name)
        .map(|(_, l)| *l)
        .unwrap_or_default()
}

/// Per rank: the links of each phase in PHASES (the plan over the set-up, the others
/// over `cfg.epochs` epochs after it), from a run with the torus collectives.
fn measured<T: TableScalar>(dims: &[usize], cfg: &AlsConfig) -> Vec<Vec<Links>> {
    run_on(dims, |c| {
        c.stats().set_collectives(Collectives::Torus);
        let before = c.stats().links();
        let tr = Trainer::<T>::global_new(&c, cfg, Preemption::default()).unwrap();
        let setup = c.stats().links();
        global_train_unsaved(&c, tr, EvalAt::Never).unwrap();
        let after = c.stats().links();
        PHASES
            .iter()
            .map(|&ph| {
                let (a, b) = if ph == "plan" {
                    (&before, &setup)
                } else {
                    (&setup, &after)
                };
                let (a, b) = (phase_links(a, ph), phase_links(b, ph));
                let mut d = Links::default();
                for k in 0..d.len() {
                    d[k].bytes = b[k].bytes - a[k].bytes;
                    d[k].messages = b[k].messages - a[k].messages;
                }
                d
            })
            .collect()
    })
}

fn check_shape<T: TableScalar>(data: &Path, dims: &[usize], cfg: &AlsConfig, round_bytes: u64) {
    let p: usize = dims.iter().product();
    let got = measured::<T>(dims, cfg);
    let model = local_read_model(data, p).unwrap();
    let params = AlsParams {
        dim: cfg.dim,
        elem: std::mem::size_of::<T>() as u64,
        exchange: cfg.exchange,
        cg_steps: cfg.cg_steps,
        step_nnz: cfg.step_nnz,
        round_bytes,
    };
    let proj = model.project(dims, &params);
    for (i, ph) in PHASES.iter().enumerate() {
        let times = if *ph == "plan" { 1 } else { cfg.epochs as u64 };
        let want = proj.phase(ph).unwrap().times(times);
        let total: u64 = want.links.iter().flatten().map(|l| l.bytes).sum();
        assert!(total > 0 || (*ph == "plan" && cfg.exchange == ExchangeKind::Allgather));
        assert_eq!(got.len(), p);
        for (r, (mine, want)) in got.iter().zip(&want.links).enumerate() {
            assert_eq!(
                mine[i],
                *want,
                "{dims:?} {:?} {} phase {ph}, rank {r}",
                cfg.exchange,
                T::DTYPE
            );
        }
    }
}

#[test]
fn projected_link_traffic_equals_the_measured_counters() {
    let _serial = util::serial();
    let dir = util::tempdir();
    let data = util::synthetic_dataset(dir.path(), 900, 9000, 5);
    let f32s = config(&data, 8, ExchangeKind::Dedup, TableDtype::F32);
    let rb = torusrec::als::shard::exchange::FETCH_ROUND_BYTES as u64;
    for dims in [&[2usize, 2][..], &[2, 4], &[2, 2, 2], &[4, 1], &[3, 3]] {
        check_shape::<f32>(&data, dims, &f32s, rb);
    }
    let bf = config(&data, 8, ExchangeKind::Dedup, TableDtype::Bf16);
    check_shape::<Bf16>(&data, &[2, 4], &bf, rb);
    let ag = config(&data, 8, ExchangeKind::Allgather, TableDtype::F32);
    check_shape::<f32>(&data, &[2, 2, 2], &ag, rb);
    // Many rounds: at most 4 KiB per rank and round.
    let _rounds = EnvVar::set("TORUSREC_FETCH_ROUND_BYTES", "4096");
    assert_eq!(torusrec::als::shard::exchange::round_bytes(), 4096);
    check_shape::<f32>(&data, &[2, 2], &f32s, 4096);
}
