//! DCN-v2's cross network (Wang et al. 2021, "DCN V2: Improved Deep & Cross Network"):
//! `L` cross layers on an input `x_0` of width `d`, each full rank or low rank. No I/O,
//! no communication here.
//!
//! ```text
//! x_{l+1} = x_0 ⊙ (W_l x_l + b_l) + x_l        l = 0 .. L-1,   output x_L (width d)
//! W_l = U_l V_l^T                              (low rank r: U_l, V_l are d x r)
//! ```
//!
//! Over a batch the vectors are the rows of `n x d` row-major matrices: `Y_l = X_l W_l^T
//! + b_l`, `X_{l+1} = X_0 ⊙ Y_l + X_l`. The backward pass, from `G_L = d loss / d X_L`:
//!
//! ```text
//! G_Y = X_0 ⊙ G_{l+1}
//! d b_l += colsum(G_Y)
//! full:  d W_l += G_Y^T X_l,                 G_l = G_{l+1} + G_Y W_l
//! low:   d U_l += G_Y^T (X_l V_l),  G_T = G_Y U_l,  d V_l += X_l^T G_T,  G_l = G_{l+1} + G_T V_l^T
//! d X_0 = G_0 + sum_l Y_l ⊙ G_{l+1}
//! ```
//!
//! All parameters are one flat `Vec<f32>` (one all-reduce, one checkpoint slice). Per layer
//! `l`, in order: full rank, `W_l` (`d x d`, row-major, `W_l[i][k]` the weight of input
//! `k` in output `i`: TorchRec's `CrossNet.kernels[l]`), then `b_l` (`d`); low rank, `U_l`
//! (`d x r`, row-major: TorchRec's `LowRankCrossNet.W_kernels[l]`), then `V_l` (`d x r`,
//! row-major; TorchRec's `V_kernels[l]` is its transpose, `r x d`), then `b_l` (`d`).
//!
//! MLPerf's DLRM-DCNv2 (MLPerf Training v3.0 on, [`CrossArch::mlperf`]) puts 3 low-rank
//! layers of rank 512 on the concatenated bottom output and 26 pooled embeddings,
//! `d = 27 x 128 = 3456`, between the 13-512-256-128 bottom MLP and the
//! 1024-1024-512-256-1 top MLP.
//!
//! Numerics: the matrix products (`n x d` by `d x d`, or by `d x r`) go through
//! [`super::gemm::matmul`] with the kernel of [`Cross::set_gemm`], as the MLP's do; the
//! element-wise products, the residual sums and the bias gradient (rows added in order)
//! are plain loops. Nothing runs on rayon and every sum has a fixed order (the GEMM's is
//! fixed by its blocking; OpenBLAS runs on one thread, [`crate::cpu::blas_single_thread`]),
//! so the same inputs give the same bits for any thread count.

use std::ops::Range;

use ndarray::ArrayView2;

use super::gemm::{matmul, Gemm, Packs};
use crate::{Error, Result};

/// A row-major `rows x cols` view of `v` (`v.len() == rows * cols`).
fn view2(v: &[f32], rows: usize, cols: usize) -> ArrayView2<'_, f32> {
    ArrayView2::from_shape((rows, cols), v).expect("invariant: a slice of rows * cols")
}

/// The shape of a cross network: input width `d`, `L` layers, and a rank `r` for low-rank
/// layers (`None`: full rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrossArch {
    dim: usize,
    n_layers: usize,
    rank: Option<usize>,
}

impl CrossArch {
    /// `n_layers` cross layers of width `dim`, full rank (`rank` `None`) or of rank `r`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the fault: a width of 0, no layers, a rank of 0 or not
    /// below the width, or more parameters than memory can index.
    pub fn new(dim: usize, n_layers: usize, rank: Option<usize>) -> Result<Self> {
        if dim == 0 {
            return Err(Error::Config(
                "DCN-v2 cross layers: the input width d is 0".into(),
            ));
        }
        if n_layers == 0 {
            return Err(Error::Config(
                "DCN-v2 needs at least one cross layer, got 0".into(),
            ));
        }
        match rank {
            Some(0) => {
                return Err(Error::Config(
                    "DCN-v2 low rank r is 0 (leave the rank unset for full-rank layers)".into(),
                ))
            }
            Some(r) if r >= dim => {
                return Err(Error::Config(format!(
                    "DCN-v2 low rank r = {r} is not below the input width d = {dim} \
                     (leave the rank unset for full-rank layers)"
                )))
            }
            _ => {}
        }
        let per_layer = match rank {
            None => dim.checked_mul(dim),
            Some(r) => dim.checked_mul(r).and_then(|v| v.checked_mul(2)),
        }
        .and_then(|v| v.checked_add(dim));
        if per_layer.and_then(|v| v.checked_mul(n_layers)).is_none() {
            return Err(Error::Config(format!(
                "DCN-v2 with d = {dim}, {n_layers} layers and rank {rank:?}: too many parameters"
            )));
        }
        Ok(Self {
            dim,
            n_layers,
            rank,
        })
    }

    /// MLPerf DLRM-DCNv2's cross network: `d = 3456` (27 vectors of 128), 3 layers of
    /// rank 512.
    pub fn mlperf() -> Self {
        Self::new(27 * 128, 3, Some(512)).expect("invariant: MLPerf's shape is valid")
    }

    /// `d`, the width of the input and of every layer's output.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// `L`, the number of cross layers.
    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    /// `r` of low-rank layers; `None` for full rank.
    pub fn rank(&self) -> Option<usize> {
        self.rank
    }

    /// Parameters of one layer (weights, then the bias).
    fn layer_params(&self) -> usize {
        let d = self.dim;
        match self.rank {
            None => d * d + d,
            Some(r) => 2 * d * r + d,
        }
    }

    /// A layer's weights in its slice of the flat parameters.
    fn weights(&self) -> Weights {
        let d = self.dim;
        match self.rank {
            None => Weights::Full { w: 0..d * d },
            Some(r) => Weights::Low {
                u: 0..d * r,
                v: d * r..2 * d * r,
            },
        }
    }

    /// A layer's bias in its slice of the flat parameters.
    fn bias_range(&self) -> Range<usize> {
        let lp = self.layer_params();
        lp - self.dim..lp
    }

    /// Parameters of all layers.
    pub fn n_params(&self) -> usize {
        self.n_layers * self.layer_params()
    }
}

/// Where a layer's weights lie in its slice of the flat parameters (its bias is last,
/// [`CrossArch::bias_range`]).
enum Weights {
    Full { w: Range<usize> },
    Low { u: Range<usize>, v: Range<usize> },
}

/// The cross layers with their parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Cross {
    arch: CrossArch,
    /// Per layer: `W` or `U, V`, then `b` (module docs).
    params: Vec<f32>,
    gemm: Gemm,
}

/// Scratch of [`Cross::forward`] and [`Cross::backward`]: the activations the backward
/// pass needs and its buffers. Reuse one across calls; it grows to the largest batch seen.
#[derive(Clone, Debug, Default)]
pub struct CrossWorkspace {
    /// Examples of the last forward pass.
    n: usize,
    /// `xs[l] = X_{l+1}` (`n x d`); the last is the output.
    xs: Vec<Vec<f32>>,
    /// `ys[l] = Y_l = X_l W_l^T + b_l` (`n x d`).
    ys: Vec<Vec<f32>>,
    /// Low rank: `ts[l] = X_l V_l` (`n x r`).
    ts: Vec<Vec<f32>>,
    /// `d loss / d X_l`, updated in place from `l = L` down to 0.
    g: Vec<f32>,
    /// `G_Y` of the current layer (`n x d`).
    gy: Vec<f32>,
    /// Low rank: `G_T` of the current layer (`n x r`).
    gt: Vec<f32>,
    /// The matrix products' packing buffers.
    packs: Packs,
}

impl CrossWorkspace {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Cross {
    /// Cross layers with given parameters (flat, in the layout of the module docs).
    ///
    /// # Errors
    /// [`Error::Config`] if `params` does not have [`CrossArch::n_params`] values.
    pub fn from_params(arch: CrossArch, params: Vec<f32>) -> Result<Self> {
        if params.len() != arch.n_params() {
            return Err(Error::Config(format!(
                "DCN-v2 cross layers {arch:?} have {} parameters, got {}",
                arch.n_params(),
                params.len()
            )));
        }
        Ok(Self {
            arch,
            params,
            gemm: Gemm::auto(),
        })
    }

    /// Run the matrix products with `gemm` (the default is [`Gemm::auto`]).
    ///
    /// # Errors
    /// [`Error::Config`] for [`Gemm::Avx512`] on a CPU without AVX-512F.
    pub fn set_gemm(&mut self, gemm: Gemm) -> Result<()> {
        self.gemm = gemm.available()?;
        Ok(())
    }

    pub fn arch(&self) -> &CrossArch {
        &self.arch
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

    /// Layer `l`'s slice of a flat parameter (or gradient) vector.
    fn layer_range(&self, l: usize) -> Range<usize> {
        let lp = self.arch.layer_params();
        l * lp..(l + 1) * lp
    }

    /// The output `X_L` (`n x d`, in `ws`) of the `n x d` row-major batch `x0`. Keeps in
    /// `ws` what [`Self::backward`] needs.
    ///
    /// # Panics
    /// If `x0.len()` is not a multiple of `d`.
    pub fn forward<'w>(&self, x0: &[f32], ws: &'w mut CrossWorkspace) -> &'w [f32] {
        let d = self.arch.dim;
        assert_eq!(x0.len() % d, 0, "cross forward: x0 is not n x {d}");
        let n = x0.len() / d;
        let nl = self.arch.n_layers;
        ws.n = n;
        ws.xs.resize_with(nl, Vec::new);
        ws.ys.resize_with(nl, Vec::new);
        ws.ts.resize_with(nl, Vec::new);
        if n == 0 {
            ws.xs[nl - 1].clear();
            return &ws.xs[nl - 1];
        }
        for l in 0..nl {
            let p = &self.params[self.layer_range(l)];
            let (before, rest) = ws.xs.split_at_mut(l);
            let xl = if l == 0 { x0 } else { &before[l - 1][..] };
            let xlv = view2(xl, n, d);
            let y = &mut ws.ys[l];
            let b = &p[self.arch.bias_range()];
            y.clear();
            for _ in 0..n {
                y.extend_from_slice(b);
            }
            match self.arch.weights() {
                Weights::Full { w } => {
                    // Y = b + X_l W^T.
                    let w = view2(&p[w], d, d);
                    matmul(self.gemm, xlv, w.t(), y, true, &mut ws.packs);
                }
                Weights::Low { u, v } => {
                    // T = X_l V, Y = b + T U^T.
                    let r = self.arch.rank.expect("invariant: low rank");
                    let t = &mut ws.ts[l];
                    t.resize(n * r, 0.0);
                    let (u, v) = (view2(&p[u], d, r), view2(&p[v], d, r));
                    matmul(self.gemm, xlv, v, t, false, &mut ws.packs);
                    matmul(self.gemm, view2(t, n, r), u.t(), y, true, &mut ws.packs);
                }
            }
            // X_{l+1} = X_0 ⊙ Y + X_l.
            let out = &mut rest[0];
            out.clear();
            out.extend(
                x0.iter()
                    .zip(y.iter())
                    .zip(xl)
                    .map(|((&x0, &y), &xl)| x0 * y + xl),
            );
        }
        &ws.xs[nl - 1]
    }

    /// Backward pass of the last [`Self::forward`] on `ws`, whose input was `x0`, given
    /// `d_out = d loss / d X_L` (`n x d`). The parameter gradient is ADDED to `grad`
    /// (length [`Self::n_params`], the flat layout), so that micro-batches accumulate;
    /// `dx0` (`n x d`) is OVERWRITTEN with `d loss / d x_0`.
    ///
    /// # Panics
    /// If the lengths do not match, or `x0` is not the batch of the last forward pass.
    pub fn backward(
        &self,
        x0: &[f32],
        d_out: &[f32],
        grad: &mut [f32],
        dx0: &mut [f32],
        ws: &mut CrossWorkspace,
    ) {
        let d = self.arch.dim;
        let n = ws.n;
        assert_eq!(
            x0.len(),
            n * d,
            "cross backward: x0 is not the forward's batch"
        );
        assert_eq!(d_out.len(), n * d, "cross backward: d_out length");
        assert_eq!(dx0.len(), n * d, "cross backward: dx0 length");
        assert_eq!(grad.len(), self.n_params(), "cross backward: grad length");
        if n == 0 {
            return;
        }
        ws.g.clear();
        ws.g.extend_from_slice(d_out);
        ws.gy.resize(n * d, 0.0);
        let last = self.arch.n_layers - 1;
        for l in (0..self.arch.n_layers).rev() {
            let range = self.layer_range(l);
            let p = &self.params[range.clone()];
            let gl = &mut grad[range];
            let xl = if l == 0 { x0 } else { &ws.xs[l - 1][..] };
            let xlv = view2(xl, n, d);
            let gb = &mut gl[self.arch.bias_range()];
            backward_elementwise(x0, &ws.ys[l], &ws.g, &mut ws.gy, dx0, gb, l == last);
            let gyv = view2(&ws.gy, n, d);
            match self.arch.weights() {
                Weights::Full { w } => {
                    // d W += G_Y^T X_l, G += G_Y W.
                    matmul(
                        self.gemm,
                        gyv.t(),
                        xlv,
                        &mut gl[w.clone()],
                        true,
                        &mut ws.packs,
                    );
                    let wv = view2(&p[w], d, d);
                    matmul(self.gemm, gyv, wv, &mut ws.g, true, &mut ws.packs);
                }
                Weights::Low { u, v } => {
                    let r = self.arch.rank.expect("invariant: low rank");
                    let tv = view2(&ws.ts[l], n, r);
                    let (uv, vv) = (view2(&p[u.clone()], d, r), view2(&p[v.clone()], d, r));
                    // d U += G_Y^T T, G_T = G_Y U, d V += X_l^T G_T, G += G_T V^T.
                    matmul(self.gemm, gyv.t(), tv, &mut gl[u], true, &mut ws.packs);
                    ws.gt.resize(n * r, 0.0);
                    matmul(self.gemm, gyv, uv, &mut ws.gt, false, &mut ws.packs);
                    let gtv = view2(&ws.gt, n, r);
                    matmul(self.gemm, xlv.t(), gtv, &mut gl[v], true, &mut ws.packs);
                    matmul(self.gemm, gtv, vv.t(), &mut ws.g, true, &mut ws.packs);
                }
            }
        }
        dx0.iter_mut().zip(&ws.g).for_each(|(dx, &g)| *dx += g);
    }
}

/// One pass over the rows of a layer's backward before its products: `G_Y = X_0 ⊙ G`,
/// the direct path `d X_0 += Y ⊙ G` (`first`: `d X_0 = 0 + Y ⊙ G`, the bits of adding
/// to zeros) and `d b += colsum(G_Y)` (rows in order), each element as the separate
/// loops computed it, so the bits are theirs.
fn backward_elementwise(
    x0: &[f32],
    y: &[f32],
    g: &[f32],
    gy: &mut [f32],
    dx0: &mut [f32],
    gb: &mut [f32],
    first: bool,
) {
    let d = gb.len();
    let rows = x0
        .chunks_exact(d)
        .zip(y.chunks_exact(d))
        .zip(g.chunks_exact(d))
        .zip(gy.chunks_exact_mut(d).zip(dx0.chunks_exact_mut(d)));
    for (((x0, y), g), (gy, dx)) in rows {
        let (y, g, gy, dx, gb) = (&y[..d], &g[..d], &mut gy[..d], &mut dx[..d], &mut gb[..d]);
        for j in 0..d {
            let v = x0[j] * g[j];
            gy[j] = v;
            gb[j] += v;
            dx[j] = if first { 0.0 } else { dx[j] } + y[j] * g[j];
        }
    }
}

/// Slow reference of [`Cross::forward`] and [`Cross::backward`] in f64 with plain loops,
/// example by example, for tests: returns the output `X_L`, the parameter gradient (flat
/// layout) and `d x_0`, given `d_out` (all `n x d` row-major).
pub fn cross_ref(
    arch: &CrossArch,
    params: &[f64],
    x0: &[f64],
    d_out: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (d, nl) = (arch.dim, arch.n_layers);
    let lp = arch.layer_params();
    assert_eq!(params.len(), arch.n_params());
    assert_eq!(x0.len() % d, 0);
    assert_eq!(d_out.len(), x0.len());
    let n = x0.len() / d;
    let (mut out, mut grad, mut dx0) =
        (vec![0.0; n * d], vec![0.0; params.len()], vec![0.0; n * d]);
    // The dense W_l (d x d) of each layer, U V^T for low rank.
    let dense_w = |l: usize| -> Vec<f64> {
        let p = &params[l * lp..(l + 1) * lp];
        match arch.rank {
            None => p[..d * d].to_vec(),
            Some(r) => {
                let mut w = vec![0.0; d * d];
                for i in 0..d {
                    for k in 0..d {
                        w[i * d + k] = (0..r).map(|q| p[i * r + q] * p[d * r + k * r + q]).sum();
                    }
                }
                w
            }
        }
    };
    let ws: Vec<Vec<f64>> = (0..nl).map(dense_w).collect();
    let bias = |l: usize| &params[l * lp + lp - d..(l + 1) * lp];
    for e in 0..n {
        let x0e = &x0[e * d..(e + 1) * d];
        // Forward: xs[l] = x_l, ys[l] = W_l x_l + b_l.
        let mut xs = vec![x0e.to_vec()];
        let mut ys = Vec::new();
        for l in 0..nl {
            let y: Vec<f64> = (0..d)
                .map(|i| bias(l)[i] + (0..d).map(|k| ws[l][i * d + k] * xs[l][k]).sum::<f64>())
                .collect();
            let next = (0..d).map(|i| x0e[i] * y[i] + xs[l][i]).collect();
            ys.push(y);
            xs.push(next);
        }
        out[e * d..(e + 1) * d].copy_from_slice(&xs[nl]);

        // Backward.
        let mut g = d_out[e * d..(e + 1) * d].to_vec();
        let mut dx = vec![0.0; d];
        for l in (0..nl).rev() {
            let gp = &mut grad[l * lp..(l + 1) * lp];
            let gy: Vec<f64> = (0..d).map(|i| x0e[i] * g[i]).collect();
            for i in 0..d {
                dx[i] += ys[l][i] * g[i];
                gp[lp - d + i] += gy[i];
            }
            // d W_l[i][k] = gy_i x_l[k], and d x_l = g + W_l^T gy.
            let mut below = g.clone();
            for i in 0..d {
                for k in 0..d {
                    below[k] += ws[l][i * d + k] * gy[i];
                }
            }
            match arch.rank {
                None => {
                    for i in 0..d {
                        for k in 0..d {
                            gp[i * d + k] += gy[i] * xs[l][k];
                        }
                    }
                }
                Some(r) => {
                    // W = U V^T: d U[i][q] = sum_k dW[i][k] V[k][q], d V[k][q] = sum_i dW[i][k] U[i][q].
                    let p = &params[l * lp..(l + 1) * lp];
                    for i in 0..d {
                        for k in 0..d {
                            let dw = gy[i] * xs[l][k];
                            for q in 0..r {
                                gp[i * r + q] += dw * p[d * r + k * r + q];
                                gp[d * r + k * r + q] += dw * p[i * r + q];
                            }
                        }
                    }
                }
            }
            g = below;
        }
        for i in 0..d {
            dx0[e * d + i] = dx[i] + g[i];
        }
    }
    (out, grad, dx0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn normals(seed: u64, n: usize) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| r.next_normal() as f32).collect()
    }

    fn to_f64(v: &[f32]) -> Vec<f64> {
        v.iter().map(|&x| x as f64).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
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

    /// Parameters of a usable scale: weights `N(0, 1) / sqrt(d)`, biases `N(0, 0.1^2)`.
    fn random_params(arch: &CrossArch, seed: u64) -> Vec<f32> {
        let d = arch.dim();
        let lp = arch.layer_params();
        let mut p = normals(seed, arch.n_params());
        for (i, v) in p.iter_mut().enumerate() {
            *v *= if i % lp >= lp - d {
                0.1
            } else {
                1.0 / (d as f32).sqrt()
            };
        }
        p
    }

    /// Forward and backward with fresh buffers: (out, grad added to zeros, dx0).
    fn run(
        c: &Cross,
        x0: &[f32],
        g: &[f32],
        ws: &mut CrossWorkspace,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let out = c.forward(x0, ws).to_vec();
        let (mut grad, mut dx0) = (vec![0.0f32; c.n_params()], vec![f32::NAN; x0.len()]);
        c.backward(x0, g, &mut grad, &mut dx0, ws);
        (out, grad, dx0)
    }

    #[test]
    fn forward_matches_a_hand_computed_case() {
        // Full rank, d = 2, two layers, two examples.
        //   W_0 = [[1, 2], [0, -1]], b_0 = [0.5, -1];  W_1 = [[0, 1], [1, 0]], b_1 = 0.
        // x_0 = [1, 3]: W_0 x_0 + b_0 = [7.5, -4], x_1 = [7.5, -12] + [1, 3] = [8.5, -9];
        //   W_1 x_1 = [-9, 8.5], x_2 = [-9, 25.5] + [8.5, -9] = [-0.5, 16.5].
        // x_0 = [-1, 0]: W_0 x_0 + b_0 = [-0.5, -1], x_1 = [0.5, 0] + [-1, 0] = [-0.5, 0];
        //   W_1 x_1 = [0, -0.5], x_2 = [0, 0] + [-0.5, 0] = [-0.5, 0].
        let arch = CrossArch::new(2, 2, None).unwrap();
        let p = vec![1.0, 2.0, 0.0, -1.0, 0.5, -1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0];
        let c = Cross::from_params(arch, p).unwrap();
        let mut ws = CrossWorkspace::new();
        assert_eq!(
            c.forward(&[1.0, 3.0, -1.0, 0.0], &mut ws),
            [-0.5, 16.5, -0.5, 0.0]
        );

        // Low rank, d = 2, r = 1, one layer: U = [1, 2]^T, V = [3, -1]^T, b = [0, 1].
        // x_0 = [2, 1]: V^T x_0 = 5, U 5 + b = [5, 11], x_1 = [10, 11] + [2, 1] = [12, 12].
        let arch = CrossArch::new(2, 1, Some(1)).unwrap();
        let c = Cross::from_params(arch, vec![1.0, 2.0, 3.0, -1.0, 0.0, 1.0]).unwrap();
        assert_eq!(c.forward(&[2.0, 1.0], &mut ws), [12.0, 12.0]);
    }

    #[test]
    fn reference_gradient_matches_finite_differences() {
        // loss = sum(out * r) for fixed random r, so d out = r.
        for rank in [None, Some(2)] {
            let arch = CrossArch::new(5, 3, rank).unwrap();
            let n = 3;
            let p = to_f64(&random_params(&arch, 1));
            let x0 = to_f64(&normals(2, n * 5));
            let r = to_f64(&normals(3, n * 5));
            let loss = |p: &[f64], x0: &[f64]| {
                let (out, _, _) = cross_ref(&arch, p, x0, &r);
                out.iter().zip(&r).map(|(o, r)| o * r).sum::<f64>()
            };
            let (_, grad, dx0) = cross_ref(&arch, &p, &x0, &r);
            // A polynomial of degree 2^L: the truncation error is O(h^2) times a third
            // derivative of order 1 here, rounding about 1e-16 / h.
            let (h, tol) = (1e-5, 1e-7);
            let check = |i: usize, fd: f64, an: f64, what: &str| {
                assert!(
                    (fd - an).abs() < tol * an.abs().max(1.0),
                    "{rank:?} {what} {i}: fd {fd} vs {an}"
                );
            };
            for i in 0..p.len() {
                let (mut pp, mut pm) = (p.clone(), p.clone());
                pp[i] += h;
                pm[i] -= h;
                check(
                    i,
                    (loss(&pp, &x0) - loss(&pm, &x0)) / (2.0 * h),
                    grad[i],
                    "param",
                );
            }
            for i in 0..x0.len() {
                let (mut xp, mut xm) = (x0.clone(), x0.clone());
                xp[i] += h;
                xm[i] -= h;
                check(i, (loss(&p, &xp) - loss(&p, &xm)) / (2.0 * h), dx0[i], "x0");
            }
            assert!(grad.iter().all(|v| *v != 0.0), "{rank:?}: a zero gradient");
        }
    }

    #[test]
    fn fast_gradient_matches_finite_differences() {
        // The f32 gradients against central differences of the f64 loss sum(out * r).
        for rank in [None, Some(3)] {
            let arch = CrossArch::new(12, 2, rank).unwrap();
            let n = 4;
            let p = random_params(&arch, 41);
            let x0 = normals(42, n * 12);
            let r = normals(43, n * 12);
            let c = Cross::from_params(arch, p.clone()).unwrap();
            let (_, grad, dx0) = run(&c, &x0, &r, &mut CrossWorkspace::new());
            let r64 = to_f64(&r);
            let loss = |p: &[f64], x0: &[f64]| {
                let (out, _, _) = cross_ref(&arch, p, x0, &r64);
                out.iter().zip(&r64).map(|(o, r)| o * r).sum::<f64>()
            };
            let (p64, x64) = (to_f64(&p), to_f64(&x0));
            let h = 1e-5;
            let fd_p: Vec<f64> = (0..p.len())
                .map(|i| {
                    let (mut pp, mut pm) = (p64.clone(), p64.clone());
                    pp[i] += h;
                    pm[i] -= h;
                    (loss(&pp, &x64) - loss(&pm, &x64)) / (2.0 * h)
                })
                .collect();
            let fd_x: Vec<f64> = (0..x0.len())
                .map(|i| {
                    let (mut xp, mut xm) = (x64.clone(), x64.clone());
                    xp[i] += h;
                    xm[i] -= h;
                    (loss(&p64, &xp) - loss(&p64, &xm)) / (2.0 * h)
                })
                .collect();
            // f32 rounding through two layers, relative to the largest gradient.
            assert!(max_rel_diff(&grad, &fd_p) < 1e-5, "{rank:?}: grad");
            assert!(max_rel_diff(&dx0, &fd_x) < 1e-5, "{rank:?}: dx0");
        }
    }

    #[test]
    fn gradients_accumulate_over_micro_batches() {
        let arch = CrossArch::new(24, 3, Some(4)).unwrap();
        let c = Cross::from_params(arch, random_params(&arch, 51)).unwrap();
        let n = 50;
        let x0 = normals(52, n * 24);
        let g = normals(53, n * 24);
        let mut ws = CrossWorkspace::new();
        let (out_all, grad_all, dx_all) = run(&c, &x0, &g, &mut ws);
        let mut grad = vec![0.0f32; c.n_params()];
        let (mut out, mut dx) = (Vec::new(), Vec::new());
        for (lo, hi) in [(0, 20), (20, 20), (20, n)] {
            let (x, gp) = (&x0[lo * 24..hi * 24], &g[lo * 24..hi * 24]);
            out.extend_from_slice(c.forward(x, &mut ws));
            let mut part = vec![0.0f32; x.len()];
            c.backward(x, gp, &mut grad, &mut part, &mut ws);
            dx.extend(part);
        }
        assert!(max_rel_diff(&out, &to_f64(&out_all)) < 1e-6);
        assert!(max_rel_diff(&grad, &to_f64(&grad_all)) < 1e-5);
        assert!(max_rel_diff(&dx, &to_f64(&dx_all)) < 1e-6);
    }

    #[test]
    fn fast_matches_reference_across_sizes() {
        let mut ws = CrossWorkspace::new();
        let kernels = [Gemm::Blas, Gemm::auto()];
        let shapes = [
            (1, 1, None),
            (5, 3, Some(2)),
            (33, 2, None),
            (40, 3, Some(8)),
            (70, 1, Some(1)),
            (16, 4, None),
        ];
        for (k, &(d, nl, rank)) in shapes.iter().enumerate() {
            let arch = CrossArch::new(d, nl, rank).unwrap();
            let p = random_params(&arch, 10 + k as u64);
            for gemm in kernels {
                let mut c = Cross::from_params(arch, p.clone()).unwrap();
                c.set_gemm(gemm).unwrap();
                // Larger batches first, so the workspace is reused shrunk.
                for n in [50usize, 17, 1, 0, 33] {
                    let seed = 1000 * k as u64 + n as u64;
                    let x0 = normals(seed, n * d);
                    let g = normals(seed + 1, n * d);
                    let out = c.forward(&x0, &mut ws).to_vec();
                    // The gradient is added: start from ones.
                    let (mut grad, mut dx0) = (vec![1.0f32; c.n_params()], vec![f32::NAN; n * d]);
                    c.backward(&x0, &g, &mut grad, &mut dx0, &mut ws);
                    grad.iter_mut().for_each(|v| *v -= 1.0);
                    let ctx = format!("d {d} L {nl} rank {rank:?} n {n} {gemm:?}");
                    if n == 0 {
                        assert!(out.is_empty(), "{ctx}");
                        assert!(grad.iter().all(|&v| v == 0.0), "{ctx}");
                        continue;
                    }
                    let (out64, grad64, dx64) =
                        cross_ref(&arch, &to_f64(&p), &to_f64(&x0), &to_f64(&g));
                    // f32 sums of up to d products, through up to 4 layers.
                    assert!(max_rel_diff(&out, &out64) < 1e-5, "{ctx}: out");
                    assert!(max_rel_diff(&grad, &grad64) < 1e-4, "{ctx}: grad");
                    assert!(max_rel_diff(&dx0, &dx64) < 1e-5, "{ctx}: dx0");
                }
            }
        }
    }

    #[test]
    fn same_bits_twice() {
        for rank in [None, Some(16)] {
            let arch = CrossArch::new(96, 3, rank).unwrap();
            let c = Cross::from_params(arch, random_params(&arch, 5)).unwrap();
            let n = 120;
            let x0 = normals(6, n * 96);
            let g = normals(7, n * 96);
            let mut ws = CrossWorkspace::new();
            let one = run(&c, &x0, &g, &mut ws);
            // A reused workspace, a fresh one, and a pool of 2 threads.
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap();
            for got in [
                run(&c, &x0, &g, &mut ws),
                run(&c, &x0, &g, &mut CrossWorkspace::new()),
                pool.install(|| run(&c, &x0, &g, &mut CrossWorkspace::new())),
            ] {
                assert_eq!(bits(&got.0), bits(&one.0), "{rank:?}: out");
                assert_eq!(bits(&got.1), bits(&one.1), "{rank:?}: grad");
                assert_eq!(bits(&got.2), bits(&one.2), "{rank:?}: dx0");
            }
        }
    }

    #[test]
    fn shapes_are_validated() {
        let msg = |r: Result<CrossArch>| r.unwrap_err().to_string();
        assert!(msg(CrossArch::new(0, 2, None)).contains("input width d is 0"));
        assert!(msg(CrossArch::new(8, 0, None)).contains("at least one cross layer"));
        assert!(msg(CrossArch::new(8, 2, Some(0))).contains("low rank r is 0"));
        assert!(
            msg(CrossArch::new(8, 2, Some(8))).contains("r = 8 is not below the input width d = 8")
        );
        assert!(msg(CrossArch::new(usize::MAX / 2, 2, None)).contains("too many parameters"));
        assert!(matches!(CrossArch::new(8, 0, None), Err(Error::Config(_))));

        assert_eq!(CrossArch::new(4, 3, None).unwrap().n_params(), 3 * (16 + 4));
        assert_eq!(
            CrossArch::new(4, 2, Some(1)).unwrap().n_params(),
            2 * (8 + 4)
        );
        let m = CrossArch::mlperf();
        assert_eq!((m.dim(), m.n_layers(), m.rank()), (3456, 3, Some(512)));

        let arch = CrossArch::new(4, 1, None).unwrap();
        let e = Cross::from_params(arch, vec![0.0; 19])
            .unwrap_err()
            .to_string();
        assert!(e.contains("have 20 parameters, got 19"), "{e}");
    }
}
