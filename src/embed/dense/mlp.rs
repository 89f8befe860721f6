//! The dense part of the click model: a ReLU MLP ending in one logit, its
//! forward/backward pass under the log loss (its optimizers are [`super::optim`]'s).
//!
//! All parameters live in one flat `Vec<f32>` so that the data-parallel gradient is one
//! all-reduce and a checkpoint is one slice. For each layer `l`, in order: the weight
//! `W_l` (`in_l x out_l`, row-major), then the bias `b_l` (`out_l`).
//!
//! ```text
//! h_0 = x,   h_{l+1} = relu(h_l W_l + b_l)   (l < L-1),   z = h_{L-1} W_{L-1} + b_{L-1}
//! loss = weight * sum_e [max(z_e, 0) - z_e y_e + ln(1 + exp(-|z_e|))]
//! ```
//!
//! Matrix products go through [`super::gemm::matmul`]: this crate's AVX-512 kernel where
//! the CPU has it ([`Gemm::auto`], or as set by [`Mlp::set_gemm`]), else OpenBLAS's
//! `cblas_sgemm`, which callers keep single-threaded ([`crate::cpu::blas_single_thread`]) so
//! it does not fight the ranks for cores. No I/O, no communication here.

use ndarray::ArrayView2;

use super::auc::{bce_with_logits, sigmoid};
use super::gemm::{matmul, Gemm, Packs};
use crate::rng::{stream, SplitMix64};
use crate::{Error, Result};

pub use super::optim::{DenseOpt, DenseOptState};

/// A row-major `rows x cols` view of `v` (`v.len() == rows * cols`).
fn view2(v: &[f32], rows: usize, cols: usize) -> ArrayView2<'_, f32> {
    ArrayView2::from_shape((rows, cols), v).expect("invariant: a slice of rows * cols")
}

/// Parameters of an MLP with these layer widths.
fn param_count(layers: &[usize]) -> usize {
    layers.windows(2).map(|w| w[0] * w[1] + w[1]).sum()
}

/// Offset in the flat parameters of layer `l`'s weight (its bias follows it).
fn weight_offset(layers: &[usize], l: usize) -> usize {
    param_count(&layers[..=l])
}

/// A ReLU MLP with a single output logit.
#[derive(Clone, Debug, PartialEq)]
pub struct Mlp {
    /// Widths: input, hidden..., 1.
    layers: Vec<usize>,
    /// Per layer: weight `[in x out]` row-major, then bias `[out]`.
    params: Vec<f32>,
    /// The kernel of the matrix products.
    gemm: Gemm,
    /// A tower ([`Mlp::tower`]): every layer has a ReLU, the last included, and the
    /// output is any width (DLRM's bottom MLP, DCN-v2's parallel deep network).
    relu_last: bool,
}

/// Scratch space of [`Mlp::forward_backward`] and [`Mlp::predict`]: the activations kept
/// for the backward pass and the back-propagated deltas. Reuse one across calls; it
/// grows to the largest batch seen and never shrinks.
#[derive(Clone, Debug, Default)]
pub struct Workspace {
    /// `acts[l]`: the output of layer `l` (`n x out_l`), after ReLU for hidden layers;
    /// the last holds the logits.
    acts: Vec<Vec<f32>>,
    /// Ping-pong buffers of `d loss / d (pre-activation)` of the current layer.
    delta: [Vec<f32>; 2],
    /// Column sums of a delta (the bias gradient of one call).
    colsum: Vec<f32>,
    /// The matrix products' packing buffers.
    packs: Packs,
}

impl Workspace {
    pub fn new() -> Self {
        Self::default()
    }
}

/// Check widths: an input, any hidden layers, and one output (one logit unless a
/// tower); none empty.
fn check_layers(layers: &[usize], tower: bool) -> Result<()> {
    if layers.len() < 2 {
        return Err(Error::Config(format!(
            "MLP needs an input and an output layer, got widths {layers:?}"
        )));
    }
    if layers.contains(&0) {
        return Err(Error::Config(format!("MLP layer of width 0 in {layers:?}")));
    }
    if !tower && layers.last() != Some(&1) {
        return Err(Error::Config(format!(
            "MLP must end in one logit, got widths {layers:?}"
        )));
    }
    Ok(())
}

impl Mlp {
    /// He-initialized weights (`N(0, 1) * sqrt(2 / in_l)`, layer `l` drawn in row-major
    /// order from `SplitMix64::for_id(seed, MLP_INIT, l)`) and zero biases: the same bits
    /// on every rank and for every thread count.
    pub fn new(layers: &[usize], seed: u64) -> Result<Self> {
        Self::init(layers, seed, 0, false)
    }

    /// Sub-network `sub` (>= 1) of a model: an MLP ending in one logit (`tower` false)
    /// or a tower of ReLU layers ending in any width (`tower` true). Initialized as
    /// PyTorch's `nn.Linear` (what TorchRec's DLRM and DCN-v2 models use): weights and
    /// biases uniform on `±1 / sqrt(in_l)`, the weights in row-major order, then the
    /// biases, layer `l` from `SplitMix64::for_id(seed, MLP_INIT, sub << 32 | l)`: its
    /// own streams, apart from every other sub-network's and from [`Self::new`]'s.
    /// (He-normal weights, [`Self::new`]'s, start deep DLRM towers at logits several
    /// times larger than TorchRec's and their loss far above it.)
    pub fn sub(layers: &[usize], seed: u64, sub: u64, tower: bool) -> Result<Self> {
        assert!(sub >= 1, "sub-network 0 is Mlp::new's");
        Self::init(layers, seed, sub << 32, tower)
    }

    fn init(layers: &[usize], seed: u64, id0: u64, tower: bool) -> Result<Self> {
        check_layers(layers, tower)?;
        let mut params = Vec::with_capacity(param_count(layers));
        for (l, w) in layers.windows(2).enumerate() {
            let (din, dout) = (w[0], w[1]);
            let mut rng = SplitMix64::for_id(seed, stream::MLP_INIT, id0 | l as u64);
            if id0 == 0 {
                let scale = (2.0 / din as f64).sqrt();
                params.extend((0..din * dout).map(|_| (rng.next_normal() * scale) as f32));
                params.extend(std::iter::repeat_n(0.0f32, dout));
            } else {
                let bound = 1.0 / (din as f64).sqrt();
                let mut u = move || ((2.0 * rng.next_f64() - 1.0) * bound) as f32;
                params.extend((0..(din + 1) * dout).map(|_| u()));
            }
        }
        Ok(Self {
            layers: layers.to_vec(),
            params,
            gemm: Gemm::auto(),
            relu_last: tower,
        })
    }

    /// An MLP with given parameters (a restored checkpoint, say).
    pub fn from_params(layers: &[usize], params: Vec<f32>) -> Result<Self> {
        Self::from_params_as(layers, params, false)
    }

    /// [`Self::from_params`] of a tower (`tower` true: a ReLU on every layer) or not.
    pub fn from_params_as(layers: &[usize], params: Vec<f32>, tower: bool) -> Result<Self> {
        check_layers(layers, tower)?;
        let want = param_count(layers);
        if params.len() != want {
            return Err(Error::Config(format!(
                "MLP {layers:?} has {want} parameters, got {}",
                params.len()
            )));
        }
        Ok(Self {
            layers: layers.to_vec(),
            params,
            gemm: Gemm::auto(),
            relu_last: tower,
        })
    }

    /// A tower: a ReLU on every layer, the last included.
    pub fn is_tower(&self) -> bool {
        self.relu_last
    }

    /// Width of the output (1 unless a tower).
    pub fn n_out(&self) -> usize {
        self.layers[self.layers.len() - 1]
    }

    /// Run the matrix products with `gemm` (the default is [`Gemm::auto`]).
    ///
    /// # Errors
    /// [`Error::Config`] for [`Gemm::Avx512`] on a CPU without AVX-512F.
    pub fn set_gemm(&mut self, gemm: Gemm) -> Result<()> {
        self.gemm = gemm.available()?;
        Ok(())
    }

    /// Widths: input, hidden..., 1.
    pub fn layers(&self) -> &[usize] {
        &self.layers
    }

    pub fn n_params(&self) -> usize {
        self.params.len()
    }

    /// All parameters, flat (see the module docs for the layout).
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    pub fn params_mut(&mut self) -> &mut [f32] {
        &mut self.params
    }

    /// Width of the input.
    pub fn n_in(&self) -> usize {
        self.layers[0]
    }

    /// Fill `ws.acts` with every layer's output for the `n x in` batch `x` (`n > 0`).
    fn forward(&self, x: ArrayView2<'_, f32>, ws: &mut Workspace) {
        let n = x.nrows();
        let nl = self.layers.len() - 1;
        ws.acts.resize_with(nl, Vec::new);
        let mut off = 0;
        for l in 0..nl {
            let (din, dout) = (self.layers[l], self.layers[l + 1]);
            let w = view2(&self.params[off..off + din * dout], din, dout);
            let b = &self.params[off + din * dout..off + din * dout + dout];
            off += din * dout + dout;

            let (before, rest) = ws.acts.split_at_mut(l);
            let out = &mut rest[0];
            out.clear();
            for _ in 0..n {
                out.extend_from_slice(b);
            }
            let h = if l == 0 {
                x.view()
            } else {
                view2(&before[l - 1], n, din)
            };
            matmul(self.gemm, h, w, out, true, &mut ws.packs);
            if l + 1 < nl || self.relu_last {
                out.iter_mut().for_each(|v| *v = v.max(0.0));
            }
        }
    }

    /// The logits of the `n x in` batch `x`.
    ///
    /// # Panics
    /// If `x` does not have `layers()[0]` columns.
    pub fn predict(&self, x: ArrayView2<'_, f32>, ws: &mut Workspace) -> Vec<f32> {
        assert_eq!(x.ncols(), self.n_in(), "predict: input width");
        if x.nrows() == 0 {
            return Vec::new();
        }
        self.forward(x, ws);
        ws.acts[self.layers.len() - 2].clone()
    }

    /// Forward and backward pass of `weight * sum_e logloss(sigmoid(z_e), y_e)` over the
    /// `n x in` batch `x` with labels `labels` (length `n`).
    ///
    /// The parameter gradient is ADDED to `grad` (length [`Self::n_params`]), so that
    /// micro-batches accumulate; `dx` (`n x in`, row-major, length `n * in`) is
    /// OVERWRITTEN with `d loss / d x`, the gradient that flows back to the embeddings.
    /// Pass `weight = 1 / (examples in the whole optimizer step, all ranks)`: the sum of
    /// the gradients over micro-batches and ranks is then the gradient of the mean loss.
    ///
    /// Returns the unweighted sum over the `n` examples of their log loss (f64). With
    /// `n == 0` it returns 0 and touches nothing.
    ///
    /// # Panics
    /// If the lengths of `labels`, `grad` or `dx`, or the width of `x`, do not match.
    pub fn forward_backward(
        &self,
        x: ArrayView2<'_, f32>,
        labels: &[f32],
        weight: f32,
        grad: &mut [f32],
        dx: &mut [f32],
        ws: &mut Workspace,
    ) -> f64 {
        let n = x.nrows();
        let n_in = self.n_in();
        assert_eq!(x.ncols(), n_in, "forward_backward: input width");
        assert_eq!(labels.len(), n, "forward_backward: labels for {n} examples");
        assert_eq!(grad.len(), self.n_params(), "forward_backward: grad length");
        assert_eq!(dx.len(), n * n_in, "forward_backward: dx length");
        if n == 0 {
            return 0.0;
        }
        self.forward(x, ws);
        let nl = self.layers.len() - 1;

        // Loss and d loss / d z.
        let mut loss = 0.0f64;
        let logits = &ws.acts[nl - 1];
        let dz = &mut ws.delta[0];
        dz.clear();
        for (&z, &y) in logits.iter().zip(labels) {
            let (z, y) = (z as f64, y as f64);
            loss += bce_with_logits(z, y);
            dz.push((weight as f64 * (sigmoid(z) - y)) as f32);
        }

        self.backward_delta(x, grad, dx, ws);
        loss
    }

    /// The output (`n x n_out`, after the last ReLU for a tower) of the `n x in` batch
    /// `x`, keeping in `ws` what [`Self::backward`] needs. `n == 0` gives an empty slice.
    ///
    /// # Panics
    /// If `x` does not have `layers()[0]` columns.
    pub fn forward_keep<'w>(&self, x: ArrayView2<'_, f32>, ws: &'w mut Workspace) -> &'w [f32] {
        assert_eq!(x.ncols(), self.n_in(), "forward: input width");
        let nl = self.layers.len() - 1;
        if x.nrows() == 0 {
            ws.acts.resize_with(nl, Vec::new);
            ws.acts[nl - 1].clear();
            return &ws.acts[nl - 1];
        }
        self.forward(x, ws);
        &ws.acts[nl - 1]
    }

    /// Backward pass of the last [`Self::forward_keep`] on `ws` (whose input was `x`)
    /// given `d_out = d loss / d output` (`n x n_out`). The parameter gradient is ADDED
    /// to `grad`; `dx` (`n x in`) is OVERWRITTEN with `d loss / d x`.
    ///
    /// # Panics
    /// If the lengths do not match.
    pub fn backward(
        &self,
        x: ArrayView2<'_, f32>,
        d_out: &[f32],
        grad: &mut [f32],
        dx: &mut [f32],
        ws: &mut Workspace,
    ) {
        let n = x.nrows();
        assert_eq!(d_out.len(), n * self.n_out(), "backward: d_out length");
        assert_eq!(grad.len(), self.n_params(), "backward: grad length");
        assert_eq!(dx.len(), n * self.n_in(), "backward: dx length");
        if n == 0 {
            return;
        }
        let nl = self.layers.len() - 1;
        let d = &mut ws.delta[0];
        d.clear();
        d.extend_from_slice(d_out);
        if self.relu_last {
            d.iter_mut()
                .zip(&ws.acts[nl - 1])
                .for_each(|(v, &a)| *v = if a > 0.0 { *v } else { 0.0 });
        }
        self.backward_delta(x, grad, dx, ws);
    }

    /// The backward pass from `ws.delta[0]`, the gradient by the last layer's
    /// pre-activation: adds the parameter gradient to `grad`, overwrites `dx`.
    fn backward_delta(
        &self,
        x: ArrayView2<'_, f32>,
        grad: &mut [f32],
        dx: &mut [f32],
        ws: &mut Workspace,
    ) {
        // Backward, last layer first; `cur` indexes the delta of layer l's output.
        let n = x.nrows();
        let nl = self.layers.len() - 1;
        let mut cur = 0;
        for l in (0..nl).rev() {
            let (din, dout) = (self.layers[l], self.layers[l + 1]);
            let woff = weight_offset(&self.layers, l);
            let boff = woff + din * dout;
            let [d0, d1] = &mut ws.delta;
            let (d, next) = if cur == 0 { (d0, d1) } else { (d1, d0) };
            let dv = view2(d, n, dout);

            // grad W_l += h_l^T delta.
            let h = if l == 0 {
                x.view()
            } else {
                view2(&ws.acts[l - 1], n, din)
            };
            matmul(
                self.gemm,
                h.t(),
                dv,
                &mut grad[woff..boff],
                true,
                &mut ws.packs,
            );

            // grad b_l += column sums of delta.
            ws.colsum.clear();
            ws.colsum.resize(dout, 0.0);
            for row in d.chunks_exact(dout) {
                ws.colsum.iter_mut().zip(row).for_each(|(s, v)| *s += v);
            }
            grad[boff..boff + dout]
                .iter_mut()
                .zip(&ws.colsum)
                .for_each(|(g, s)| *g += s);

            // delta of the layer below: (delta W_l^T), masked by ReLU; or dx.
            let w = view2(&self.params[woff..boff], din, dout);
            if l == 0 {
                matmul(self.gemm, dv, w.t(), dx, false, &mut ws.packs);
            } else {
                next.resize(n * din, 0.0);
                matmul(self.gemm, dv, w.t(), next, false, &mut ws.packs);
                // Branch-free (a select the compiler vectorises): about half the
                // activations are zero, so a branch would mispredict half the time.
                next.iter_mut()
                    .zip(&ws.acts[l - 1])
                    .for_each(|(v, &a)| *v = if a > 0.0 { *v } else { 0.0 });
                cur = 1 - cur;
            }
        }
    }
}

/// Slow reference of [`Mlp::forward_backward`] in f64 with plain loops, for tests.
///
/// `x` is `n x layers[0]` row-major with `n = labels.len()`; the gradient is added to
/// `grad`, `dx` is overwritten; returns the unweighted sum of the log losses.
pub fn forward_backward_ref(
    layers: &[usize],
    params: &[f64],
    x: &[f64],
    labels: &[f64],
    weight: f64,
    grad: &mut [f64],
    dx: &mut [f64],
) -> f64 {
    let n = labels.len();
    let nl = layers.len() - 1;
    assert_eq!(params.len(), param_count(layers));
    assert_eq!(grad.len(), params.len());
    assert_eq!(x.len(), n * layers[0]);
    assert_eq!(dx.len(), x.len());
    let mut loss = 0.0;
    for e in 0..n {
        // Forward, keeping every layer's output.
        let mut hs: Vec<Vec<f64>> = vec![x[e * layers[0]..(e + 1) * layers[0]].to_vec()];
        for l in 0..nl {
            let (din, dout) = (layers[l], layers[l + 1]);
            let off = weight_offset(layers, l);
            let h = &hs[l];
            let mut out: Vec<f64> = params[off + din * dout..off + din * dout + dout].to_vec();
            for (j, o) in out.iter_mut().enumerate() {
                for (i, hi) in h.iter().enumerate() {
                    *o += hi * params[off + i * dout + j];
                }
                if l + 1 < nl {
                    *o = o.max(0.0);
                }
            }
            hs.push(out);
        }
        let z = hs[nl][0];
        loss += bce_with_logits(z, labels[e]);

        // Backward.
        let mut delta = vec![weight * (sigmoid(z) - labels[e])];
        for l in (0..nl).rev() {
            let (din, dout) = (layers[l], layers[l + 1]);
            let off = weight_offset(layers, l);
            let h = &hs[l];
            let mut below = vec![0.0; din];
            for i in 0..din {
                for j in 0..dout {
                    grad[off + i * dout + j] += h[i] * delta[j];
                    below[i] += params[off + i * dout + j] * delta[j];
                }
            }
            for j in 0..dout {
                grad[off + din * dout + j] += delta[j];
            }
            if l > 0 {
                for (b, &hi) in below.iter_mut().zip(h) {
                    if hi <= 0.0 {
                        *b = 0.0;
                    }
                }
            }
            delta = below;
        }
        dx[e * layers[0]..(e + 1) * layers[0]].copy_from_slice(&delta);
    }
    loss
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normals(seed: u64, n: usize) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| r.next_normal() as f32).collect()
    }

    fn coin_labels(seed: u64, n: usize) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| r.below(2) as f32).collect()
    }

    fn to_f64(v: &[f32]) -> Vec<f64> {
        v.iter().map(|&x| x as f64).collect()
    }

    /// Largest absolute difference relative to the largest magnitude of `want`.
    fn max_rel_diff(got: &[f32], want: &[f64]) -> f64 {
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
        got.iter()
            .zip(want)
            .map(|(&g, w)| (g as f64 - w).abs())
            .fold(0.0, f64::max)
            / scale
    }

    #[test]
    fn layers_are_validated() {
        assert!(Mlp::new(&[4], 1).is_err());
        assert!(Mlp::new(&[4, 0, 1], 1).is_err());
        assert!(Mlp::new(&[4, 3, 2], 1).is_err());
        assert!(Mlp::from_params(&[2, 1], vec![0.0; 2]).is_err());
        let m = Mlp::from_params(&[2, 1], vec![0.0; 3]).unwrap();
        assert_eq!(m.n_params(), 3);
        assert_eq!(Mlp::new(&[7, 5, 3, 1], 0).unwrap().n_params(), 40 + 18 + 4);
    }

    #[test]
    fn init_is_deterministic_and_he_scaled() {
        let a = Mlp::new(&[256, 128, 1], 9).unwrap();
        let b = Mlp::new(&[256, 128, 1], 9).unwrap();
        let c = Mlp::new(&[256, 128, 1], 10).unwrap();
        let bits = |m: &Mlp| m.params().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b));
        assert_ne!(bits(&a), bits(&c));
        // A layer's draws depend only on (seed, layer): a different tail leaves layer 0.
        let d = Mlp::new(&[256, 64, 1], 9).unwrap();
        let w0 = &a.params()[..256 * 64];
        assert_eq!(w0, &d.params()[..256 * 64]);

        let w = &a.params()[..256 * 128];
        let bias = &a.params()[256 * 128..256 * 128 + 128];
        assert!(bias.iter().all(|&v| v == 0.0));
        let var = w.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / w.len() as f64;
        assert!((var / (2.0 / 256.0) - 1.0).abs() < 0.03, "var {var}");
    }

    #[test]
    fn reference_gradient_matches_finite_differences() {
        let layers = [7, 5, 3, 1];
        let n = 6;
        let mlp = Mlp::new(&layers, 3).unwrap();
        // Non-zero biases, so that the bias gradients are tested away from the init.
        let mut p = to_f64(mlp.params());
        let noise = normals(4, p.len());
        p.iter_mut()
            .zip(noise)
            .for_each(|(v, r)| *v += 0.1 * r as f64);
        let x = to_f64(&normals(5, n * 7));
        let y = to_f64(&coin_labels(6, n));
        let weight = 1.0 / n as f64;

        let loss = |p: &[f64], x: &[f64]| {
            let (mut g, mut dx) = (vec![0.0; p.len()], vec![0.0; x.len()]);
            weight * forward_backward_ref(&layers, p, x, &y, weight, &mut g, &mut dx)
        };
        let (mut g, mut dx) = (vec![0.0; p.len()], vec![0.0; x.len()]);
        forward_backward_ref(&layers, &p, &x, &y, weight, &mut g, &mut dx);

        let h = 1e-6;
        for i in 0..p.len() {
            let (mut pp, mut pm) = (p.clone(), p.clone());
            pp[i] += h;
            pm[i] -= h;
            let fd = (loss(&pp, &x) - loss(&pm, &x)) / (2.0 * h);
            assert!((fd - g[i]).abs() < 1e-7, "param {i}: fd {fd} vs {}", g[i]);
        }
        for i in 0..x.len() {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[i] += h;
            xm[i] -= h;
            let fd = (loss(&p, &xp) - loss(&p, &xm)) / (2.0 * h);
            assert!((fd - dx[i]).abs() < 1e-7, "x {i}: fd {fd} vs {}", dx[i]);
        }
        assert!(g.iter().filter(|v| **v != 0.0).count() > p.len() / 2);
    }

    #[test]
    fn fast_matches_reference_across_sizes() {
        let mut ws = Workspace::new();
        let shapes: [&[usize]; 5] = [
            &[7, 5, 3, 1],
            &[4, 1],
            &[33, 64, 16, 1],
            &[20, 9, 1],
            &[300, 40, 1],
        ];
        // Both kernels where the CPU has AVX-512 (OpenBLAS alone otherwise).
        let kernels = [Gemm::Blas, Gemm::auto()];
        for (k, (layers, gemm)) in shapes
            .iter()
            .flat_map(|l| kernels.iter().map(move |g| (l, *g)))
            .enumerate()
        {
            let mut mlp = Mlp::new(layers, 100 + k as u64).unwrap();
            mlp.set_gemm(gemm).unwrap();
            let p64 = to_f64(mlp.params());
            // Larger batches first, then smaller ones, so the workspace is reused shrunk.
            for n in [100usize, 17, 2, 1, 0, 33] {
                let seed = 1000 * k as u64 + n as u64;
                let x = normals(seed, n * layers[0]);
                let y = coin_labels(seed + 1, n);
                let weight = 1.0 / n.max(1) as f32;
                let xv = view2(&x, n, layers[0]);

                let (mut g, mut dx) = (vec![0.0f32; mlp.n_params()], vec![f32::NAN; x.len()]);
                let loss = mlp.forward_backward(xv, &y, weight, &mut g, &mut dx, &mut ws);
                let (mut g64, mut dx64) = (vec![0.0; g.len()], vec![0.0; x.len()]);
                let loss64 = forward_backward_ref(
                    layers,
                    &p64,
                    &to_f64(&x),
                    &to_f64(&y),
                    weight as f64,
                    &mut g64,
                    &mut dx64,
                );
                let ctx = format!("layers {layers:?} n {n} {gemm:?}");
                if n == 0 {
                    assert_eq!(loss, 0.0);
                    assert!(g.iter().all(|&v| v == 0.0), "{ctx}");
                    assert!(mlp.predict(xv, &mut ws).is_empty());
                    continue;
                }
                assert!((loss - loss64).abs() <= 1e-5 * loss64.abs(), "{ctx}: loss");
                assert!(max_rel_diff(&g, &g64) < 1e-5, "{ctx}: grad");
                assert!(max_rel_diff(&dx, &dx64) < 1e-5, "{ctx}: dx");

                let logits = mlp.predict(xv, &mut ws);
                let loss_p: f64 = logits
                    .iter()
                    .zip(&y)
                    .map(|(&z, &y)| bce_with_logits(z as f64, y as f64))
                    .sum();
                assert_eq!(loss_p, loss, "{ctx}: predict");
            }
        }
    }

    #[test]
    fn non_contiguous_input_matches_contiguous() {
        let layers = [12, 8, 1];
        let mlp = Mlp::new(&layers, 1).unwrap();
        let n = 10;
        let x = normals(2, n * 12);
        let y = coin_labels(3, n);
        let xv = view2(&x, n, 12);
        // The same matrix stored column-major.
        let xt: Vec<f32> = xv.t().iter().copied().collect();
        let xf = view2(&xt, 12, n).reversed_axes();
        let mut ws = Workspace::new();
        let run = |xv: ArrayView2<'_, f32>, ws: &mut Workspace| {
            let (mut g, mut dx) = (vec![0.0f32; mlp.n_params()], vec![0.0f32; n * 12]);
            let l = mlp.forward_backward(xv, &y, 0.1, &mut g, &mut dx, ws);
            (l, g, dx)
        };
        let (l1, g1, dx1) = run(xv, &mut ws);
        let (l2, g2, dx2) = run(xf, &mut ws);
        assert!((l1 - l2).abs() < 1e-5 * l1);
        assert!(max_rel_diff(&g2, &to_f64(&g1)) < 1e-5);
        assert!(max_rel_diff(&dx2, &to_f64(&dx1)) < 1e-5);
    }

    #[test]
    fn gradients_accumulate_over_micro_batches() {
        let layers = [24, 16, 8, 1];
        let mlp = Mlp::new(&layers, 8).unwrap();
        let n = 50;
        let x = normals(11, n * 24);
        let y = coin_labels(12, n);
        let w = 1.0 / n as f32;
        let mut ws = Workspace::new();

        let (mut g_all, mut dx_all) = (vec![0.0f32; mlp.n_params()], vec![0.0f32; n * 24]);
        let l_all = mlp.forward_backward(view2(&x, n, 24), &y, w, &mut g_all, &mut dx_all, &mut ws);

        let mut g_sum = vec![0.0f32; mlp.n_params()];
        let mut l_sum = 0.0;
        let mut dx_parts = Vec::new();
        for (lo, hi) in [(0, 20), (20, 20), (20, n)] {
            let mut dx = vec![0.0f32; (hi - lo) * 24];
            let xv = view2(&x[lo * 24..hi * 24], hi - lo, 24);
            l_sum += mlp.forward_backward(xv, &y[lo..hi], w, &mut g_sum, &mut dx, &mut ws);
            dx_parts.extend(dx);
        }
        assert!((l_sum - l_all).abs() <= 1e-6 * l_all, "{l_sum} vs {l_all}");
        assert!(max_rel_diff(&g_sum, &to_f64(&g_all)) < 1e-5);
        assert!(max_rel_diff(&dx_parts, &to_f64(&dx_all)) < 1e-6);
    }

    #[test]
    fn adagrad_steps_match_hand_computation() {
        let opt = DenseOpt::adagrad(0.1);
        let mut p = [1.0f32, -2.0, 0.5];
        let mut st = opt.new_state(3);
        opt.apply(&mut p, &[0.5, -1.0, 0.0], &mut st);
        // acc = [0.25, 1, 0]: each step is lr * sign(g); a zero gradient moves nothing.
        assert_eq!(p, [0.9, -1.9, 0.5]);
        assert_eq!(st.state(), &[0.25, 1.0, 0.0]);
        opt.apply(&mut p, &[1.0, 1.0, 2.0], &mut st);
        // acc = [1.25, 2, 4].
        let want = [0.9 - 0.1 / 1.25f64.sqrt(), -1.9 - 0.1 / 2f64.sqrt(), 0.4];
        for (g, w) in p.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{g} vs {w}");
        }
        assert_eq!(st.step(), 2);

        // A non-zero initial accumulator.
        let opt = DenseOpt::Adagrad {
            lr: 1.0,
            eps: 0.0,
            init_acc: 3.0,
        };
        let mut st = opt.new_state(1);
        let mut p = [0.0f32];
        opt.apply(&mut p, &[1.0], &mut st);
        assert_eq!(p, [-0.5]);
    }

    #[test]
    fn adam_steps_match_hand_computation() {
        let opt = DenseOpt::adam(0.1);
        let mut p = [1.0f32, -2.0, 0.5];
        let mut st = opt.new_state(3);
        assert_eq!(st.state().len(), 6);
        opt.apply(&mut p, &[0.5, -1.0, 0.0], &mut st);
        // The first bias-corrected step is lr * g / (|g| + eps).
        for (g, w) in p.iter().zip([0.9f64, -1.9, 0.5]) {
            assert!((*g as f64 - w).abs() < 1e-6, "{g} vs {w}");
        }
        opt.apply(&mut p, &[1.0, 1.0, 2.0], &mut st);
        // m = [0.145, 0.01, 0.2], v = [0.00124975, 0.001999, 0.004],
        // bias corrections 0.19 and 0.001999.
        let want = [0.803_481_800_6, -1.905_263_158_8, 0.425_586_318_2];
        for (g, w) in p.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{g} vs {w}");
        }
        let m_want = [0.145f64, 0.01, 0.2, 0.001_249_75, 0.001_999, 0.004];
        for (s, w) in st.state().iter().zip(m_want) {
            assert!((*s as f64 - w).abs() < 1e-7 * w.max(1.0), "{s} vs {w}");
        }
        assert_eq!(st.step(), 2);

        // Restoring the state from its flat parts continues identically.
        let mut st2 = DenseOptState::from_parts(st.state().to_vec(), st.step());
        let (mut p1, mut p2) = (p, p);
        opt.apply(&mut p1, &[0.3, -0.2, 0.1], &mut st);
        opt.apply(&mut p2, &[0.3, -0.2, 0.1], &mut st2);
        assert_eq!(p1, p2);
        assert_eq!(st, st2);
    }

    #[test]
    fn optimizer_config_round_trips_through_json() {
        for opt in [DenseOpt::adagrad(0.01), DenseOpt::adam(0.001)] {
            let s = serde_json::to_string(&opt).unwrap();
            assert_eq!(serde_json::from_str::<DenseOpt>(&s).unwrap(), opt);
        }
    }
}
