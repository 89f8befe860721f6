//! The optimizers of the embedding rows: their update rules, their state per row, and
//! their values at a step of the learning-rate schedule. No communication here.
//!
//! Every update is lazy (sparse): only the rows a step touched are updated, once, with
//! their summed gradient `g`; a row no example looked up keeps its values and state
//! (its moments do not decay and weight decay does not shrink it). Adam's bias
//! correction uses the global step `t` (the number of optimizer steps taken, this one
//! included), as TensorFlow's `LazyAdam` and FBGEMM's fused Adam do, not a count per
//! row: a row first touched at step 100 has its first moment corrected by
//! `1 - beta1^100`. The step is in every checkpoint, so a resume is exact.
//!
//! State layout of one row of width `w` (per-element optimizers refuse column-wise
//! placement, so `w` is the table's `dim`): Adagrad `[G_0 .. G_{w-1}]`; Adam
//! `[m_0, v_0, m_1, v_1, ..]`; row-wise Adam `[m_0 .. m_{w-1}, v]`; FTRL
//! `[z_0, n_0, z_1, n_1, ..]`; row-wise Adagrad `[G]`; SGD none.

fn is_zero(x: &f32) -> bool {
    *x == 0.0
}

fn one() -> f32 {
    1.0
}

/// The optimizer of the embedding rows. `lr` (FTRL's `alpha`) is the base rate: the
/// trainer applies the schedule's multiplier each step ([`TableOpt::at_step`]).
/// Weight decay `wd`: L2 (`g += wd * w` before the update) for SGD and Adagrad;
/// decoupled (`w *= 1 - lr * wd` before the update, AdamW's, FBGEMM's `DECOUPLE`) for
/// row-wise Adagrad, Adam and row-wise Adam, whose row statistic or moments then see
/// the plain gradient; FTRL has its own `l1`/`l2`.
#[derive(Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TableOpt {
    /// `row -= lr * (g + wd * row)`.
    Sgd {
        lr: f32,
        #[serde(default, skip_serializing_if = "is_zero")]
        wd: f32,
    },
    /// FBGEMM's row-wise Adagrad: one accumulator per row,
    /// `G += mean_j(g_j^2)` over the row's full width, `row -= lr * g / (sqrt(G) + eps)`.
    RowWiseAdagrad {
        lr: f32,
        eps: f32,
        #[serde(default, skip_serializing_if = "is_zero")]
        wd: f32,
    },
    /// Adagrad per element: `G_j += g_j^2`, `w_j -= lr * g_j / (sqrt(G_j) + eps)`
    /// (with `g_j += wd * w_j` first).
    Adagrad { lr: f32, eps: f32, wd: f32 },
    /// Adam per element (Kingma and Ba 2015) with decoupled weight decay
    /// (Loshchilov and Hutter 2019): `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`,
    /// `w *= 1 - lr wd`, `w -= lr (m / bc1) / (sqrt(v / bc2) + eps)` with
    /// `bc1 = 1 - b1^t`, `bc2 = 1 - b2^t` at global step `t`.
    Adam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        wd: f32,
        #[serde(skip, default = "one")]
        bc1: f32,
        #[serde(skip, default = "one")]
        bc2: f32,
    },
    /// FBGEMM's partial row-wise Adam (`OptimType.PARTIAL_ROWWISE_ADAM`): the first
    /// moment per element, the second one per row over the mean square of the row's
    /// gradient, `v = b2 v + (1 - b2) mean_j(g_j^2)`; then as [`TableOpt::Adam`] with
    /// `v` for every element.
    RowWiseAdam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        wd: f32,
        #[serde(skip, default = "one")]
        bc1: f32,
        #[serde(skip, default = "one")]
        bc2: f32,
    },
    /// FTRL-proximal per coordinate (McMahan et al. 2013, Algorithm 1):
    /// `s = (sqrt(n + g^2) - sqrt(n)) / alpha`, `z += g - s w`, `n += g^2`,
    /// `w = 0` if `|z| <= l1`, else `-(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)`.
    Ftrl {
        alpha: f32,
        beta: f32,
        l1: f32,
        l2: f32,
    },
}

impl TableOpt {
    /// Adam with PyTorch's defaults for the betas and eps.
    pub fn adam(lr: f32, wd: f32) -> TableOpt {
        TableOpt::Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            wd,
            bc1: 1.0,
            bc2: 1.0,
        }
    }

    /// Row-wise Adam with PyTorch's defaults for the betas and eps.
    pub fn rowwise_adam(lr: f32, wd: f32) -> TableOpt {
        match TableOpt::adam(lr, wd) {
            TableOpt::Adam {
                lr,
                beta1,
                beta2,
                eps,
                wd,
                bc1,
                bc2,
            } => TableOpt::RowWiseAdam {
                lr,
                beta1,
                beta2,
                eps,
                wd,
                bc1,
                bc2,
            },
            _ => unreachable!(),
        }
    }

    /// The optimizer as it updates at 0-based global step `step`: its rate times
    /// `mult` (the schedule's multiplier; 1.0 leaves the bits) and Adam's bias
    /// corrections for `t = step + 1`.
    pub fn at_step(&self, mult: f32, step: u64) -> TableOpt {
        let t = (step + 1) as f64;
        let bc = |b: f32| (1.0 - (b as f64).powf(t)) as f32;
        let mut o = *self;
        match &mut o {
            TableOpt::Sgd { lr, .. }
            | TableOpt::RowWiseAdagrad { lr, .. }
            | TableOpt::Adagrad { lr, .. } => *lr *= mult,
            TableOpt::Adam {
                lr,
                beta1,
                beta2,
                bc1,
                bc2,
                ..
            }
            | TableOpt::RowWiseAdam {
                lr,
                beta1,
                beta2,
                bc1,
                bc2,
                ..
            } => {
                *lr *= mult;
                *bc1 = bc(*beta1);
                *bc2 = bc(*beta2);
            }
            TableOpt::Ftrl { alpha, .. } => *alpha *= mult,
        }
        o
    }

    /// Optimizer floats kept per row of width `w` (see the module doc).
    pub fn state_per_row(&self, w: usize) -> usize {
        match self {
            TableOpt::Sgd { .. } => 0,
            TableOpt::RowWiseAdagrad { .. } => 1,
            TableOpt::Adagrad { .. } => w,
            TableOpt::Adam { .. } | TableOpt::Ftrl { .. } => 2 * w,
            TableOpt::RowWiseAdam { .. } => w + 1,
        }
    }

    /// Optimizer floats kept per element (column) of a row: the part of the state
    /// that a column shard could not share, hence no column-wise placement when > 0.
    pub fn state_per_element(&self) -> usize {
        self.state_per_row(1) - self.state_per_row(0)
    }

    /// Optimizer floats kept per row whatever its width.
    pub fn state_fixed_per_row(&self) -> usize {
        self.state_per_row(0)
    }

    /// Whether the update needs the mean square of the row's full gradient.
    pub fn needs_row_stat(&self) -> bool {
        matches!(
            self,
            TableOpt::RowWiseAdagrad { .. } | TableOpt::RowWiseAdam { .. }
        )
    }

    /// The name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            TableOpt::Sgd { .. } => "sgd",
            TableOpt::RowWiseAdagrad { .. } => "rowwise-adagrad",
            TableOpt::Adagrad { .. } => "adagrad",
            TableOpt::Adam { .. } => "adam",
            TableOpt::RowWiseAdam { .. } => "rowwise-adam",
            TableOpt::Ftrl { .. } => "ftrl",
        }
    }

    /// Update one row (or one column slice of it, row-wise optimizers only). `state`
    /// holds [`TableOpt::state_per_row`] floats; `row_stat` is the mean of the squared
    /// gradient over the row's full width (read by the row-wise optimizers only).
    #[inline]
    pub fn apply(&self, row: &mut [f32], state: &mut [f32], g: &[f32], row_stat: f64) {
        match *self {
            TableOpt::Sgd { lr, wd } => {
                if wd == 0.0 {
                    for (w, &gi) in row.iter_mut().zip(g) {
                        *w -= lr * gi;
                    }
                } else {
                    for (w, &gi) in row.iter_mut().zip(g) {
                        *w -= lr * (gi + wd * *w);
                    }
                }
            }
            TableOpt::RowWiseAdagrad { lr, eps, wd } => {
                let acc = state[0] + row_stat as f32;
                state[0] = acc;
                let mult = lr / (acc.sqrt() + eps);
                decay(row, lr, wd);
                for (w, &gi) in row.iter_mut().zip(g) {
                    *w -= mult * gi;
                }
            }
            TableOpt::Adagrad { lr, eps, wd } => {
                for ((w, &gi), acc) in row.iter_mut().zip(g).zip(state.iter_mut()) {
                    let gi = if wd == 0.0 { gi } else { gi + wd * *w };
                    *acc += gi * gi;
                    *w -= lr * gi / (acc.sqrt() + eps);
                }
            }
            TableOpt::Adam {
                lr,
                beta1,
                beta2,
                eps,
                wd,
                bc1,
                bc2,
            } => {
                decay(row, lr, wd);
                for ((w, &gi), mv) in row.iter_mut().zip(g).zip(state.chunks_exact_mut(2)) {
                    mv[0] = beta1 * mv[0] + (1.0 - beta1) * gi;
                    mv[1] = beta2 * mv[1] + (1.0 - beta2) * gi * gi;
                    *w -= lr * (mv[0] / bc1) / ((mv[1] / bc2).sqrt() + eps);
                }
            }
            TableOpt::RowWiseAdam {
                lr,
                beta1,
                beta2,
                eps,
                wd,
                bc1,
                bc2,
            } => {
                let (m, v) = state.split_at_mut(row.len());
                v[0] = beta2 * v[0] + (1.0 - beta2) * row_stat as f32;
                let denom = (v[0] / bc2).sqrt() + eps;
                decay(row, lr, wd);
                for ((w, &gi), mi) in row.iter_mut().zip(g).zip(m.iter_mut()) {
                    *mi = beta1 * *mi + (1.0 - beta1) * gi;
                    *w -= lr * (*mi / bc1) / denom;
                }
            }
            TableOpt::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => {
                for ((w, &gi), zn) in row.iter_mut().zip(g).zip(state.chunks_exact_mut(2)) {
                    let n_new = zn[1] + gi * gi;
                    let sigma = (n_new.sqrt() - zn[1].sqrt()) / alpha;
                    zn[0] += gi - sigma * *w;
                    zn[1] = n_new;
                    let z = zn[0];
                    *w = if z.abs() <= l1 {
                        0.0
                    } else {
                        -(z - z.signum() * l1) / ((beta + n_new.sqrt()) / alpha + l2)
                    };
                }
            }
        }
    }
}

/// Its settings as `Kind { field: value, .. }`, weight decay only when set and without
/// the per-step bias corrections (the run's header prints it).
impl std::fmt::Debug for TableOpt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let wd = |f: &mut std::fmt::Formatter<'_>, wd: f32| {
            if wd != 0.0 {
                write!(f, ", wd: {wd:?}")
            } else {
                Ok(())
            }
        };
        match *self {
            TableOpt::Sgd { lr, wd: w } => {
                write!(f, "Sgd {{ lr: {lr:?}")?;
                wd(f, w)?;
                write!(f, " }}")
            }
            TableOpt::RowWiseAdagrad { lr, eps, wd: w } => {
                write!(f, "RowWiseAdagrad {{ lr: {lr:?}, eps: {eps:?}")?;
                wd(f, w)?;
                write!(f, " }}")
            }
            TableOpt::Adagrad { lr, eps, wd: w } => {
                write!(f, "Adagrad {{ lr: {lr:?}, eps: {eps:?}")?;
                wd(f, w)?;
                write!(f, " }}")
            }
            TableOpt::Adam {
                lr,
                beta1,
                beta2,
                eps,
                wd: w,
                ..
            }
            | TableOpt::RowWiseAdam {
                lr,
                beta1,
                beta2,
                eps,
                wd: w,
                ..
            } => {
                let kind = if matches!(self, TableOpt::Adam { .. }) {
                    "Adam"
                } else {
                    "RowWiseAdam"
                };
                write!(
                    f,
                    "{kind} {{ lr: {lr:?}, beta1: {beta1:?}, beta2: {beta2:?}, eps: {eps:?}"
                )?;
                wd(f, w)?;
                write!(f, " }}")
            }
            TableOpt::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => write!(
                f,
                "Ftrl {{ alpha: {alpha:?}, beta: {beta:?}, l1: {l1:?}, l2: {l2:?} }}"
            ),
        }
    }
}

/// Decoupled weight decay: `w *= 1 - lr * wd` (nothing when `wd` is 0).
#[inline]
fn decay(row: &mut [f32], lr: f32, wd: f32) {
    if wd != 0.0 {
        let k = 1.0 - lr * wd;
        row.iter_mut().for_each(|w| *w *= k);
    }
}

#[cfg(test)]
mod tests;
