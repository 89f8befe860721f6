//! A non-finite embedding gradient (loss and MLP gradients finite) stops the step
//! on every rank before anything is applied. The fault is planted through the
//! environment (`TORUSREC_INJECT_NAN_GRAD=STEP@RANK`).

use crate::util;
use crate::EnvVar;

use torusrec::comm::threads::run;
use torusrec::comm::Comm;
use torusrec::data::clicks::gen::ClickGen;
use torusrec::data::clicks::source::Source;
use torusrec::embed::tables::placement::{OutputMode, Plan};
use torusrec::embed::tables::store::TableOpt;
use torusrec::embed::train::trainer::{EmbedTrainer, StepStatus};
use torusrec::spec::preset;

/// Every local row and its optimizer state, then the MLP parameters.
fn snapshot(tr: &EmbedTrainer) -> (Vec<Vec<f32>>, Vec<f32>) {
    let v: Vec<Vec<f32>> = tr
        .store
        .local
        .iter()
        .flat_map(|ls| [ls.data.clone(), ls.state.clone()])
        .collect();
    (v, tr.mlp.flat())
}

#[test]
fn a_non_finite_embedding_gradient_refuses_the_step_and_applies_nothing() {
    // Step 2, rank 1: a NaN in that rank's embedding gradient, after the backward
    // expanded it (the loss and the MLP's gradients are finite).
    let _serial = util::serial();
    let _nan = EnvVar::set("TORUSREC_INJECT_NAN_GRAD", "2@1");
    let spec = preset("tiny", 1.0).unwrap();
    let opt = TableOpt::RowWiseAdagrad {
        lr: 0.1,
        eps: 1e-8,
        wd: 0.0,
    };
    let cfg = util::embed_config(&spec, opt, 24, 1, 3);
    for kind in ["table", "row_cyclic", "column", "data_parallel"] {
        for mode in [OutputMode::Rows, OutputMode::Pooled] {
            let statuses = run(2, |c| {
                let plan = Plan::uniform(&spec, c.size(), kind)
                    .unwrap()
                    .with_modes(mode);
                let src = Source::Generated(ClickGen::new(&cfg.spec, cfg.seed));
                let mut tr = EmbedTrainer::new(cfg.clone(), src, &plan, c.rank()).unwrap();
                assert_eq!(tr.global_step(&c, false).unwrap(), StepStatus::Done);
                let before = snapshot(&tr);
                let status = tr.global_step(&c, false).unwrap();
                assert_eq!(tr.step, 1, "{kind} {mode:?}: the refused step counted");
                let after = snapshot(&tr);
                // Bitwise: NaN rows would differ from the finite ones before.
                let bits = |s: &(Vec<Vec<f32>>, Vec<f32>)| -> Vec<Vec<u32>> {
                    s.0.iter()
                        .chain(std::iter::once(&s.1))
                        .map(|v| v.iter().map(|x| x.to_bits()).collect())
                        .collect()
                };
                assert!(
                    bits(&before) == bits(&after),
                    "{kind} {mode:?}: rank {} changed its tables or MLP in a refused step",
                    c.rank()
                );
                status
            });
            for s in statuses {
                assert_eq!(s, StepStatus::NonFinite { rank: 1 }, "{kind} {mode:?}");
            }
        }
    }
}
