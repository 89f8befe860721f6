//! The dense optimizers over the MLP's flat parameters, as in PyTorch: SGD, Adagrad
//! and Adam, with weight decay (L2 for SGD and Adagrad, `g += wd * p`; decoupled for
//! Adam, AdamW's `p *= 1 - lr * wd`) and the schedule's multiplier of the rate
//! ([`DenseOpt::apply_at`]). Element-wise, blocks in parallel give the same bits. No
//! I/O, no communication here.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Parameters per parallel block of an optimizer step (the update is element-wise).
const OPT_BLOCK: usize = 1 << 14;

/// A dense optimizer over the flat parameters, as in PyTorch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DenseOpt {
    /// `torch.optim.SGD` (no momentum): `p -= lr * g`.
    Sgd { lr: f32 },
    /// `torch.optim.Adagrad` (no lr decay; weight decay L2):
    /// `acc += g^2; p -= lr * g / (sqrt(acc) + eps)`, with `acc` starting at `init_acc`.
    Adagrad { lr: f32, eps: f32, init_acc: f32 },
    /// `torch.optim.Adam` (AdamW with weight decay; no amsgrad), bias-corrected:
    /// `m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;`
    /// `p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`.
    Adam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
    },
}

/// The optimizer's per-parameter state, flat for checkpoints: none for SGD, Adagrad's accumulator
/// (`n_params`), or Adam's first moments followed by its second moments (`2 n_params`);
/// and the number of steps taken.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseOptState {
    state: Vec<f32>,
    step: u64,
}

impl DenseOptState {
    /// A restored state; its length is checked by [`DenseOpt::apply`].
    pub fn from_parts(state: Vec<f32>, step: u64) -> Self {
        Self { state, step }
    }

    pub fn state(&self) -> &[f32] {
        &self.state
    }

    pub fn state_mut(&mut self) -> &mut [f32] {
        &mut self.state
    }

    /// Steps taken so far.
    pub fn step(&self) -> u64 {
        self.step
    }
}

impl DenseOpt {
    /// Adagrad with PyTorch's defaults (`eps = 1e-10`, `init_acc = 0`).
    pub fn adagrad(lr: f32) -> Self {
        DenseOpt::Adagrad {
            lr,
            eps: 1e-10,
            init_acc: 0.0,
        }
    }

    /// Adam with PyTorch's defaults (`betas = (0.9, 0.999)`, `eps = 1e-8`).
    pub fn adam(lr: f32) -> Self {
        DenseOpt::Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }

    /// Length of the flat state for `n_params` parameters.
    pub fn state_len(&self, n_params: usize) -> usize {
        match self {
            DenseOpt::Sgd { .. } => 0,
            DenseOpt::Adagrad { .. } => n_params,
            DenseOpt::Adam { .. } => 2 * n_params,
        }
    }

    /// The state before the first step.
    pub fn new_state(&self, n_params: usize) -> DenseOptState {
        let fill = match *self {
            DenseOpt::Adagrad { init_acc, .. } => init_acc,
            DenseOpt::Sgd { .. } | DenseOpt::Adam { .. } => 0.0,
        };
        DenseOptState {
            state: vec![fill; self.state_len(n_params)],
            step: 0,
        }
    }

    /// One step at the base rate without weight decay (see [`DenseOpt::apply_at`]).
    pub fn apply(&self, params: &mut [f32], grad: &[f32], st: &mut DenseOptState) {
        self.apply_at(params, grad, st, 1.0, 0.0)
    }

    /// One step: update `params` with `grad` and advance `st`, at the rate times
    /// `mult` (1.0 keeps the bits of the base rate) with weight decay `wd` (0: none).
    ///
    /// # Panics
    /// If `grad` or the state do not match `params` in length.
    pub fn apply_at(
        &self,
        params: &mut [f32],
        grad: &[f32],
        st: &mut DenseOptState,
        mult: f32,
        wd: f32,
    ) {
        let np = params.len();
        assert_eq!(grad.len(), np, "optimizer: grad length");
        assert_eq!(
            st.state.len(),
            self.state_len(np),
            "optimizer: state length"
        );
        st.step += 1;
        let l2 = |g: f32, p: f32| if wd == 0.0 { g } else { g + wd * p };
        match *self {
            DenseOpt::Sgd { lr } => {
                let lr = lr * mult;
                params
                    .par_chunks_mut(OPT_BLOCK)
                    .zip(grad.par_chunks(OPT_BLOCK))
                    .for_each(|(p, g)| {
                        for (p, &g) in p.iter_mut().zip(g) {
                            *p -= lr * l2(g, *p);
                        }
                    });
            }
            DenseOpt::Adagrad { lr, eps, .. } => {
                let lr = lr * mult;
                // Element by element: blocks in parallel give the same bits.
                params
                    .par_chunks_mut(OPT_BLOCK)
                    .zip(grad.par_chunks(OPT_BLOCK))
                    .zip(st.state.par_chunks_mut(OPT_BLOCK))
                    .for_each(|((p, g), acc)| {
                        for ((p, &g), acc) in p.iter_mut().zip(g).zip(acc) {
                            let g = l2(g, *p);
                            *acc += g * g;
                            *p -= lr * (g / (acc.sqrt() + eps));
                        }
                    });
            }
            DenseOpt::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                let lr = lr * mult;
                let keep = 1.0 - lr * wd;
                // Bias corrections in f64, as PyTorch computes them on Python floats.
                let t = st.step as f64;
                let bc1 = 1.0 - (beta1 as f64).powf(t);
                let bc2 = 1.0 - (beta2 as f64).powf(t);
                let step_size = (lr as f64 / bc1) as f32;
                let bc2_sqrt = bc2.sqrt() as f32;
                let (m, v) = st.state.split_at_mut(np);
                params
                    .par_chunks_mut(OPT_BLOCK)
                    .zip(grad.par_chunks(OPT_BLOCK))
                    .zip(m.par_chunks_mut(OPT_BLOCK))
                    .zip(v.par_chunks_mut(OPT_BLOCK))
                    .for_each(|(((p, g), m), v)| {
                        for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
                            *m += (1.0 - beta1) * (g - *m);
                            *v = beta2 * *v + (1.0 - beta2) * g * g;
                            let denom = v.sqrt() / bc2_sqrt + eps;
                            if wd != 0.0 {
                                *p *= keep;
                            }
                            *p -= step_size * (*m / denom);
                        }
                    });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgd_and_weight_decay_match_hand_values() {
        let mut p = [1.0f32, -2.0];
        let mut st = DenseOpt::Sgd { lr: 0.5 }.new_state(2);
        DenseOpt::Sgd { lr: 0.5 }.apply_at(&mut p, &[0.5, 1.0], &mut st, 0.5, 0.1);
        // p -= 0.25 * (g + 0.1 p)
        assert_eq!(p, [1.0 - 0.25 * (0.5 + 0.1), -2.0 - 0.25 * (1.0 - 0.2)]);
        assert!(st.state().is_empty());
        // Adagrad's L2 enters the accumulator.
        let opt = DenseOpt::Adagrad {
            lr: 1.0,
            eps: 0.0,
            init_acc: 0.0,
        };
        let mut p = [2.0f32];
        let mut st = opt.new_state(1);
        opt.apply_at(&mut p, &[1.0], &mut st, 1.0, 0.5);
        // g = 1 + 0.5 * 2 = 2, acc = 4, p = 2 - 2 / 2 = 1.
        assert_eq!((p[0], st.state()[0]), (1.0, 4.0));
    }

    #[test]
    fn adamw_decays_then_steps_and_mult_one_keeps_the_bits() {
        let opt = DenseOpt::adam(0.1);
        let g = [0.3f32, -0.7];
        let (mut a, mut b) = ([0.5f32, 0.25], [0.5f32, 0.25]);
        let (mut sa, mut sb) = (opt.new_state(2), opt.new_state(2));
        opt.apply(&mut a, &g, &mut sa);
        opt.apply_at(&mut b, &g, &mut sb, 1.0, 0.0);
        assert_eq!(a, b);
        let mut c = [0.5f32, 0.25];
        let mut sc = opt.new_state(2);
        opt.apply_at(&mut c, &g, &mut sc, 0.5, 0.2);
        // First step: p * (1 - 0.05 * 0.2) - 0.05 * sign(g) (bias corrected).
        for j in 0..2 {
            let want = [0.5f64, 0.25][j] * (1.0 - 0.05 * 0.2) - 0.05 * (g[j] as f64).signum();
            assert!((c[j] as f64 - want).abs() < 1e-6, "{j}: {} vs {want}", c[j]);
        }
    }
}
