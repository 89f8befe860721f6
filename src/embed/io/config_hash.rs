//! The configuration hash of an embedding run: the settings a resume must keep, as
//! canonical JSON ([`resume_key`]), hashed. Checkpoints check it on restore; model
//! files record it.

use crate::ckpt;
use crate::embed::dense::mlp::DenseOpt;
use crate::embed::tables::store::TableOpt;
use crate::embed::train::trainer::{EmbedConfig, EmbedTrainer};

/// The configuration hash of a run: model, seed, the global batch schedule (so a
/// run resumed on another rank count must keep `--global-batch`), optimizers, and the
/// click log's identity ([`resume_key`], hashed).
pub fn config_hash(tr: &EmbedTrainer) -> String {
    config_hash_of(&tr.cfg, &tr.source.identity())
}

/// [`config_hash`] of a config and the identity of its data (`Source::identity`).
pub fn config_hash_of(c: &EmbedConfig, data: &str) -> String {
    format!("{:016x}", ckpt::hash_str(&resume_key(c, data)))
}

/// The settings a resume must keep, as explicit JSON: every field is named here, never
/// taken from a `Debug` or `Serialize` derive, so that a change of a derive cannot
/// silently change the hash (and refuse every checkpoint). Floats are written as the
/// hex of their bits (exact). The match over each optimizer lists every variant: a new
/// one does not compile until it is given its fields here.
pub fn resume_key(c: &EmbedConfig, data: &str) -> String {
    let bits = |x: f32| format!("{:08x}", x.to_bits());
    let mut table_opt = match c.table_opt {
        TableOpt::Sgd { lr, wd: _ } => serde_json::json!({"kind": "sgd", "lr": bits(lr)}),
        TableOpt::RowWiseAdagrad { lr, eps, wd: _ } => {
            serde_json::json!({"kind": "rowwise_adagrad", "lr": bits(lr), "eps": bits(eps)})
        }
        TableOpt::Adagrad { lr, eps, wd: _ } => {
            serde_json::json!({"kind": "adagrad", "lr": bits(lr), "eps": bits(eps)})
        }
        // bc1, bc2: set each step from the step (not settings).
        TableOpt::Adam {
            lr,
            beta1,
            beta2,
            eps,
            wd: _,
            bc1: _,
            bc2: _,
        } => serde_json::json!({
            "kind": "adam", "lr": bits(lr), "beta1": bits(beta1), "beta2": bits(beta2),
            "eps": bits(eps)
        }),
        TableOpt::RowWiseAdam {
            lr,
            beta1,
            beta2,
            eps,
            wd: _,
            bc1: _,
            bc2: _,
        } => serde_json::json!({
            "kind": "rowwise_adam", "lr": bits(lr), "beta1": bits(beta1),
            "beta2": bits(beta2), "eps": bits(eps)
        }),
        TableOpt::Ftrl {
            alpha,
            beta,
            l1,
            l2,
        } => serde_json::json!({
            "kind": "ftrl", "alpha": bits(alpha), "beta": bits(beta), "l1": bits(l1),
            "l2": bits(l2)
        }),
    };
    // Weight decay only when set, so that runs without it keep their hash.
    let wd = match c.table_opt {
        TableOpt::Sgd { wd, .. }
        | TableOpt::RowWiseAdagrad { wd, .. }
        | TableOpt::Adagrad { wd, .. }
        | TableOpt::Adam { wd, .. }
        | TableOpt::RowWiseAdam { wd, .. } => wd,
        TableOpt::Ftrl { .. } => 0.0,
    };
    if wd != 0.0 {
        table_opt["wd"] = bits(wd).into();
    }
    let mut dense_opt = match c.dense_opt {
        DenseOpt::Sgd { lr } => serde_json::json!({"kind": "sgd", "lr": bits(lr)}),
        DenseOpt::Adagrad { lr, eps, init_acc } => serde_json::json!({
            "kind": "adagrad", "lr": bits(lr), "eps": bits(eps), "init_acc": bits(init_acc)
        }),
        DenseOpt::Adam {
            lr,
            beta1,
            beta2,
            eps,
        } => serde_json::json!({
            "kind": "adam", "lr": bits(lr), "beta1": bits(beta1), "beta2": bits(beta2),
            "eps": bits(eps)
        }),
    };
    if c.dense_wd != 0.0 {
        dense_opt["wd"] = bits(c.dense_wd).into();
    }
    // serde_json's objects keep their keys sorted: the text is canonical.
    let mut key = serde_json::json!({
        "spec_digest": c.spec.digest(),
        "seed": c.seed,
        "micro": c.micro,
        "accumulate": c.accumulate,
        "table_opt": table_opt,
        "dense_opt": dense_opt,
        "pipeline": c.pipeline,
        "data": data,
    });
    // The tables' element type only when not f32, so that f32 runs keep their hash
    // (the spec digest names it too).
    if !c.spec.table_dtype.is_f32() {
        key["table_dtype"] = c.spec.table_dtype.name().into();
    }
    if let Some(s) = c.lr_schedule.resume_key() {
        key["lr_schedule"] = s;
    }
    key.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::dense::gemm::Gemm;
    use crate::spec::preset;

    fn config() -> EmbedConfig {
        EmbedConfig {
            spec: preset("tiny", 1.0).unwrap(),
            seed: 5,
            micro: 64,
            accumulate: 2,
            steps: 10,
            table_opt: TableOpt::RowWiseAdagrad {
                lr: 0.1,
                eps: 1e-8,
                wd: 0.0,
            },
            dense_opt: DenseOpt::adagrad(0.01),
            dense_wd: 0.0,
            lr_schedule: Default::default(),
            dense_gemm: Gemm::auto(),
            dedup: true,
            pipeline: false,
            eval_examples: 64,
            eval_every: 0,
            log_every: 1,
            mem_per_rank: None,
            ids: Default::default(),
        }
    }

    /// The key is the explicit text below (field names, float bits), not a derive's
    /// output: a change of it is a change of every checkpoint's hash, made on purpose.
    #[test]
    fn resume_key_is_explicit_canonical_json() {
        let c = config();
        let want = format!(
            concat!(
                r#"{{"accumulate":2,"data":"generated","#,
                r#""dense_opt":{{"eps":"2edbe6ff","init_acc":"00000000","kind":"adagrad","lr":"3c23d70a"}},"#,
                r#""micro":64,"pipeline":false,"seed":5,"spec_digest":"{}","#,
                r#""table_opt":{{"eps":"322bcc77","kind":"rowwise_adagrad","lr":"3dcccccd"}}}}"#
            ),
            c.spec.digest()
        );
        assert_eq!(resume_key(&c, "generated"), want);
    }

    /// Every setting a resume must keep changes the hash; the others do not.
    #[test]
    fn each_resume_field_changes_the_hash() {
        let base = config();
        let h = |c: &EmbedConfig| config_hash_of(c, "generated");
        let variants: Vec<(&str, EmbedConfig)> = vec![
            ("spec", {
                let mut c = config();
                c.spec.tables[0].dim += 1;
                c
            }),
            (
                "seed",
                EmbedConfig {
                    seed: 6,
                    ..config()
                },
            ),
            (
                "micro",
                EmbedConfig {
                    micro: 32,
                    ..config()
                },
            ),
            (
                "accumulate",
                EmbedConfig {
                    accumulate: 4,
                    ..config()
                },
            ),
            (
                "pipeline",
                EmbedConfig {
                    pipeline: true,
                    ..config()
                },
            ),
            (
                "table_opt kind",
                EmbedConfig {
                    table_opt: TableOpt::Sgd { lr: 0.1, wd: 0.0 },
                    ..config()
                },
            ),
            (
                "table_opt lr",
                EmbedConfig {
                    table_opt: TableOpt::RowWiseAdagrad {
                        lr: 0.2,
                        eps: 1e-8,
                        wd: 0.0,
                    },
                    ..config()
                },
            ),
            (
                "table_opt eps",
                EmbedConfig {
                    table_opt: TableOpt::RowWiseAdagrad {
                        lr: 0.1,
                        eps: 1e-7,
                        wd: 0.0,
                    },
                    ..config()
                },
            ),
            (
                "sgd lr",
                EmbedConfig {
                    table_opt: TableOpt::Sgd { lr: 0.2, wd: 0.0 },
                    ..config()
                },
            ),
            (
                "dense_opt kind",
                EmbedConfig {
                    dense_opt: DenseOpt::adam(0.01),
                    ..config()
                },
            ),
            (
                "dense_opt lr",
                EmbedConfig {
                    dense_opt: DenseOpt::adagrad(0.02),
                    ..config()
                },
            ),
            (
                "dense_opt eps",
                EmbedConfig {
                    dense_opt: DenseOpt::Adagrad {
                        lr: 0.01,
                        eps: 1e-9,
                        init_acc: 0.0,
                    },
                    ..config()
                },
            ),
            (
                "dense_opt init_acc",
                EmbedConfig {
                    dense_opt: DenseOpt::Adagrad {
                        lr: 0.01,
                        eps: 1e-10,
                        init_acc: 0.1,
                    },
                    ..config()
                },
            ),
        ];
        let adam = |lr, beta1, beta2, eps| EmbedConfig {
            dense_opt: DenseOpt::Adam {
                lr,
                beta1,
                beta2,
                eps,
            },
            ..config()
        };
        // Each differs from "dense_opt kind" (Adam with PyTorch's defaults) in one field.
        let adams = [
            ("adam lr", adam(0.02, 0.9, 0.999, 1e-8)),
            ("adam beta1", adam(0.01, 0.8, 0.999, 1e-8)),
            ("adam beta2", adam(0.01, 0.9, 0.99, 1e-8)),
            ("adam eps", adam(0.01, 0.9, 0.999, 1e-7)),
        ];
        use crate::embed::train::schedule::{Decay, LrSchedule};
        let tab = |table_opt| EmbedConfig {
            table_opt,
            ..config()
        };
        let sched = |warmup, decay| EmbedConfig {
            lr_schedule: LrSchedule { warmup, decay },
            ..config()
        };
        let ftrl = |l1| {
            tab(TableOpt::Ftrl {
                alpha: 0.1,
                beta: 1.0,
                l1,
                l2: 0.0,
            })
        };
        let poly = |steps, power, end| Decay::Poly { steps, power, end };
        let optims = [
            (
                "table adagrad",
                tab(TableOpt::Adagrad {
                    lr: 0.1,
                    eps: 1e-8,
                    wd: 0.0,
                }),
            ),
            ("table adam", tab(TableOpt::adam(0.1, 0.0))),
            ("table adam wd", tab(TableOpt::adam(0.1, 0.01))),
            ("table rowwise adam", tab(TableOpt::rowwise_adam(0.1, 0.0))),
            ("table ftrl", ftrl(0.0)),
            ("table ftrl l1", ftrl(0.5)),
            (
                "table rowwise wd",
                tab(TableOpt::RowWiseAdagrad {
                    lr: 0.1,
                    eps: 1e-8,
                    wd: 0.1,
                }),
            ),
            (
                "dense sgd",
                EmbedConfig {
                    dense_opt: DenseOpt::Sgd { lr: 0.01 },
                    ..config()
                },
            ),
            (
                "dense wd",
                EmbedConfig {
                    dense_wd: 0.01,
                    ..config()
                },
            ),
            ("warmup", sched(10, Decay::None)),
            ("poly", sched(0, poly(100, 1.0, 0.0))),
            ("poly power", sched(0, poly(100, 2.0, 0.0))),
            ("poly end", sched(0, poly(100, 1.0, 0.1))),
            (
                "step",
                sched(
                    0,
                    Decay::Step {
                        every: 10,
                        factor: 0.5,
                    },
                ),
            ),
        ];
        let mut seen = vec![("base", h(&base))];
        for (name, c) in variants.iter().chain(adams.iter()).chain(optims.iter()) {
            seen.push((name, h(c)));
        }
        seen.push((
            "data",
            config_hash_of(&base, "log seed 1 examples 10 eval 2"),
        ));
        for (i, (a, ha)) in seen.iter().enumerate() {
            for (b, hb) in &seen[..i] {
                assert_ne!(ha, hb, "{a} and {b} hash alike");
            }
        }
        // Settings that do not change the trained bits (or are checked elsewhere).
        let same = [
            EmbedConfig {
                steps: 99,
                ..config()
            },
            EmbedConfig {
                dedup: false,
                ..config()
            },
            EmbedConfig {
                eval_examples: 7,
                eval_every: 3,
                log_every: 9,
                ..config()
            },
            EmbedConfig {
                mem_per_rank: Some(1 << 30),
                ..config()
            },
        ];
        for c in &same {
            assert_eq!(h(c), h(&base));
        }
    }
}
