//! DLRM's pairwise dot interaction (Naumov et al. 2019): the layer between the bottom
//! MLP, the pooled embeddings and the top MLP. No parameters, no I/O, no communication.
//!
//! Per example the inputs are `F + 1` vectors of width `D`: `v_0`, the bottom MLP's
//! output, and `v_1 .. v_F`, the `F` pooled embeddings in table order. The output is `v_0`
//! followed by the dot product of every pair, lower triangle without the diagonal, row by
//! row:
//!
//! ```text
//! out = [ v_0 (D values) | v_1.v_0 | v_2.v_0, v_2.v_1 | ... | v_F.v_0, ..., v_F.v_{F-1} ]
//! out[D + i (i - 1) / 2 + j] = v_i . v_j        for i in 1..=F, j in 0..i
//! width D + P,   P = (F + 1) F / 2
//! ```
//!
//! This is the order of the MLPerf reference (facebookresearch/dlrm's `interact_features`
//! with `arch_interaction_itself = false`: `li, lj = [(i, j) for i in range(F + 1) for j
//! in range(i)]`). TorchRec's `InteractionArch` computes the same pairs but takes them
//! from `torch.triu_indices(F + 1, F + 1, offset=1)`, ordered by the smaller index first
//! (`v_0.v_1, v_0.v_2, ..., v_0.v_F, v_1.v_2, ...`); the two orders agree only for
//! `F <= 2`, so a top MLP's first weight moves between them by a row permutation
//! ([`Interaction::pairs`] lists this module's order).
//!
//! Shapes, all row-major over a batch of `n` examples: the bottom output `n x D`; the
//! pooled embeddings `n x (F D)`, table `f` in columns `f D .. (f + 1) D`; the output and
//! its gradient `n x (D + P)`. The `*_rows` forms read and write the pooled embeddings as
//! the first `F D` columns of wider rows: today's MLP input (`n x (F D + n_dense)`, the
//! tables' columns first, `exchange::pool`) and its gradient serve in place.
//! The backward pass gives `d v_0 = d out[..D] + sum_j g_{0j} v_j` and
//! `d v_k = sum_j g_{kj} v_j` (`g_{ij} = g_{ji}` the gradient of pair `{i, j}`).
//!
//! MLPerf DLRM's defaults (Criteo 1TB, [`DlrmArch::mlperf`]): 13 dense features, bottom
//! MLP 13-512-256-128, `D = 128`, `F = 26` tables, so `P = 351` and the top MLP
//! 479-1024-1024-512-256-1. Every bottom layer has a ReLU, the last included (in both the
//! MLPerf reference and TorchRec's `DenseArch`); the top MLP ends in one logit.
//!
//! Numerics: each dot product sums `D` products in 16 interleaved lanes (lane `l` takes
//! elements `l, l + 16, ...`), then adds the lanes in a fixed tree and the tail in order;
//! each gradient element adds its terms in pair order. Plain loops, no GEMM: a batch is
//! `n` independent `(F + 1) x D` Gram matrices, too small for the packed kernel. Examples
//! run in parallel blocks (rayon), each example in one thread, so the bits do not depend
//! on the thread count.

use rayon::prelude::*;

use crate::{Error, Result};

/// Examples per parallel block.
const BLOCK: usize = 32;

/// Interleaved accumulators of a dot product.
const LANES: usize = 16;

/// `a . b` in [`LANES`] interleaved lanes, added in a fixed tree, then the tail in order.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let (ac, at) = a.as_chunks::<LANES>();
    let (bc, bt) = b.as_chunks::<LANES>();
    let mut acc = [0.0f32; LANES];
    for (x, y) in ac.iter().zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    let mut s = acc[0];
    for (x, y) in at.iter().zip(bt) {
        s += x * y;
    }
    s
}

/// `y += g x`.
#[inline]
fn axpy(g: f32, x: &[f32], y: &mut [f32]) {
    y.iter_mut().zip(x).for_each(|(y, &x)| *y += g * x);
}

/// The pairwise dot interaction of `F` pooled embeddings and a bottom output, all of
/// width `D` (see the module docs for the order and shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interaction {
    dim: usize,
    n_sparse: usize,
}

impl Interaction {
    /// The interaction of `n_sparse` pooled embeddings (`F`) of width `dim` (`D`).
    ///
    /// # Errors
    /// [`Error::Config`] if `dim` or `n_sparse` is 0, or the output width overflows.
    pub fn new(dim: usize, n_sparse: usize) -> Result<Self> {
        if dim == 0 {
            return Err(Error::Config(
                "DLRM interaction: the embedding width D is 0".into(),
            ));
        }
        if n_sparse == 0 {
            return Err(Error::Config(
                "DLRM interaction: no sparse features (F = 0), so no pairs to interact".into(),
            ));
        }
        let pairs = n_sparse
            .checked_add(1)
            .and_then(|v| v.checked_mul(n_sparse))
            .map(|v| v / 2);
        let width = pairs.and_then(|p| p.checked_add(dim));
        if width.is_none() || n_sparse.checked_mul(dim).is_none() {
            return Err(Error::Config(format!(
                "DLRM interaction: D = {dim} and F = {n_sparse} overflow the output width"
            )));
        }
        Ok(Self { dim, n_sparse })
    }

    /// `D`, the width of every input vector.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// `F`, the number of pooled embeddings.
    pub fn n_sparse(&self) -> usize {
        self.n_sparse
    }

    /// `P = (F + 1) F / 2`, the number of dot products.
    pub fn n_pairs(&self) -> usize {
        (self.n_sparse + 1) * self.n_sparse / 2
    }

    /// `D + P`, the width of the output (the top MLP's input).
    pub fn out_width(&self) -> usize {
        self.dim + self.n_pairs()
    }

    /// The pairs `(i, j)` in output order: `(1, 0), (2, 0), (2, 1), (3, 0), ...`; pair
    /// `p` is output column `D + p`. Vector 0 is the bottom output, vector `k > 0` the
    /// pooled embedding of table `k - 1`.
    pub fn pairs(&self) -> impl Iterator<Item = (usize, usize)> {
        (1..=self.n_sparse).flat_map(|i| (0..i).map(move |j| (i, j)))
    }

    /// Examples in a batch with this bottom output, checking every length.
    fn batch(&self, bottom: &[f32], pooled: &[f32], stride: usize, what: &str) -> usize {
        let (d, f) = (self.dim, self.n_sparse);
        assert_eq!(bottom.len() % d, 0, "{what}: bottom is not n x {d}");
        let n = bottom.len() / d;
        assert!(
            stride >= f * d,
            "{what}: pooled rows of {stride} < F D = {}",
            f * d
        );
        assert_eq!(
            Some(pooled.len()),
            n.checked_mul(stride),
            "{what}: pooled is not {n} rows of {stride}"
        );
        n
    }

    /// The `n x (D + P)` output of the batch `bottom` (`n x D`) and `pooled`
    /// (`n x F D`), written to `out` (OVERWRITTEN).
    ///
    /// # Panics
    /// If the lengths do not describe one batch.
    pub fn forward(&self, bottom: &[f32], pooled: &[f32], out: &mut [f32]) {
        self.forward_rows(bottom, pooled, self.n_sparse * self.dim, out);
    }

    /// [`Self::forward`] with the pooled embeddings in the first `F D` columns of the rows
    /// of `pooled` (`n x stride`, `stride >= F D`; the other columns are not read).
    ///
    /// # Panics
    /// If the lengths do not describe one batch, or `stride < F D`.
    pub fn forward_rows(&self, bottom: &[f32], pooled: &[f32], stride: usize, out: &mut [f32]) {
        let n = self.batch(bottom, pooled, stride, "interaction forward");
        let (d, w) = (self.dim, self.out_width());
        let fd = self.n_sparse * d;
        assert_eq!(
            out.len(),
            n * w,
            "interaction forward: out is not {n} x {w}"
        );
        if n == 0 {
            return;
        }
        let blk = BLOCK.min(n);
        out.par_chunks_mut(blk * w)
            .zip(bottom.par_chunks(blk * d))
            .zip(pooled.par_chunks(blk * stride))
            .for_each(|((out, bottom), pooled)| {
                for ((o, b), e) in out
                    .chunks_exact_mut(w)
                    .zip(bottom.chunks_exact(d))
                    .zip(pooled.chunks_exact(stride))
                {
                    self.forward_one(b, &e[..fd], o);
                }
            });
    }

    /// One example: `b` (`D`), `e` (`F D`) into `o` (`D + P`).
    fn forward_one(&self, b: &[f32], e: &[f32], o: &mut [f32]) {
        let d = self.dim;
        let v = |k: usize| if k == 0 { b } else { &e[(k - 1) * d..k * d] };
        o[..d].copy_from_slice(b);
        for (o, (i, j)) in o[d..].iter_mut().zip(self.pairs()) {
            *o = dot(v(i), v(j));
        }
    }

    /// The gradients of the batch's inputs given `d_out` (`n x (D + P)`), the gradient
    /// of the loss by [`Self::forward`]'s output: `d_bottom` (`n x D`) and `d_pooled`
    /// (`n x F D`), both OVERWRITTEN. `bottom` and `pooled` are the forward's inputs.
    ///
    /// # Panics
    /// If the lengths do not describe one batch.
    pub fn backward(
        &self,
        bottom: &[f32],
        pooled: &[f32],
        d_out: &[f32],
        d_bottom: &mut [f32],
        d_pooled: &mut [f32],
    ) {
        let stride = self.n_sparse * self.dim;
        self.backward_rows(bottom, pooled, stride, d_out, d_bottom, d_pooled);
    }

    /// [`Self::backward`] with the pooled embeddings and their gradients in the first
    /// `F D` columns of rows of `stride` values (`pooled`, `d_pooled`: `n x stride`); the
    /// other columns of `d_pooled` are left as they are.
    ///
    /// # Panics
    /// If the lengths do not describe one batch, or `stride < F D`.
    pub fn backward_rows(
        &self,
        bottom: &[f32],
        pooled: &[f32],
        stride: usize,
        d_out: &[f32],
        d_bottom: &mut [f32],
        d_pooled: &mut [f32],
    ) {
        let n = self.batch(bottom, pooled, stride, "interaction backward");
        let (d, w) = (self.dim, self.out_width());
        let fd = self.n_sparse * d;
        assert_eq!(
            d_out.len(),
            n * w,
            "interaction backward: d_out is not {n} x {w}"
        );
        assert_eq!(
            d_bottom.len(),
            n * d,
            "interaction backward: d_bottom length"
        );
        assert_eq!(
            d_pooled.len(),
            n * stride,
            "interaction backward: d_pooled length"
        );
        if n == 0 {
            return;
        }
        let blk = BLOCK.min(n);
        d_bottom
            .par_chunks_mut(blk * d)
            .zip(d_pooled.par_chunks_mut(blk * stride))
            .zip(d_out.par_chunks(blk * w))
            .zip(bottom.par_chunks(blk * d))
            .zip(pooled.par_chunks(blk * stride))
            .for_each(|((((db, de), g), b), e)| {
                for ((((db, de), g), b), e) in db
                    .chunks_exact_mut(d)
                    .zip(de.chunks_exact_mut(stride))
                    .zip(g.chunks_exact(w))
                    .zip(b.chunks_exact(d))
                    .zip(e.chunks_exact(stride))
                {
                    self.backward_one(b, &e[..fd], g, db, &mut de[..fd]);
                }
            });
    }

    /// One example: `g` (`D + P`) into `db` (`D`) and `de` (`F D`).
    fn backward_one(&self, b: &[f32], e: &[f32], g: &[f32], db: &mut [f32], de: &mut [f32]) {
        let d = self.dim;
        db.copy_from_slice(&g[..d]);
        de.fill(0.0);
        let v = |k: usize| if k == 0 { b } else { &e[(k - 1) * d..k * d] };
        for (&g, (i, j)) in g[d..].iter().zip(self.pairs()) {
            // i > j >= 0: vector i is always a pooled embedding.
            axpy(g, v(j), &mut de[(i - 1) * d..i * d]);
            let dj = if j == 0 {
                &mut *db
            } else {
                &mut de[(j - 1) * d..j * d]
            };
            axpy(g, v(i), dj);
        }
    }
}

/// Slow reference of [`Interaction::forward`] and [`Interaction::backward`] in f64 with
/// plain loops over the full Gram matrix, for tests: returns the output, `d_bottom` and
/// `d_pooled` (shapes as in the module docs).
pub fn interaction_ref(
    dim: usize,
    n_sparse: usize,
    bottom: &[f64],
    pooled: &[f64],
    d_out: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (d, f) = (dim, n_sparse);
    let n = bottom.len() / d;
    let w = d + (f + 1) * f / 2;
    assert_eq!(bottom.len(), n * d);
    assert_eq!(pooled.len(), n * f * d);
    assert_eq!(d_out.len(), n * w);
    let (mut out, mut db, mut de) = (vec![0.0; n * w], vec![0.0; n * d], vec![0.0; n * f * d]);
    for e in 0..n {
        let v: Vec<&[f64]> = std::iter::once(&bottom[e * d..(e + 1) * d])
            .chain((0..f).map(|k| &pooled[(e * f + k) * d..(e * f + k + 1) * d]))
            .collect();
        // The symmetric gradient of the Gram matrix, from the pairs' gradients.
        let mut gram_grad = vec![vec![0.0; f + 1]; f + 1];
        let mut p = d;
        for i in 0..=f {
            for j in 0..i {
                out[e * w + p] = (0..d).map(|c| v[i][c] * v[j][c]).sum();
                gram_grad[i][j] = d_out[e * w + p];
                gram_grad[j][i] = d_out[e * w + p];
                p += 1;
            }
        }
        out[e * w..e * w + d].copy_from_slice(v[0]);
        let mut dv = vec![vec![0.0; d]; f + 1];
        dv[0].copy_from_slice(&d_out[e * w..e * w + d]);
        for (k, dk) in dv.iter_mut().enumerate() {
            for (m, vm) in v.iter().enumerate() {
                for c in 0..d {
                    dk[c] += gram_grad[k][m] * vm[c];
                }
            }
        }
        db[e * d..(e + 1) * d].copy_from_slice(&dv[0]);
        for k in 0..f {
            de[(e * f + k) * d..(e * f + k + 1) * d].copy_from_slice(&dv[k + 1]);
        }
    }
    (out, db, de)
}

/// The shape of a DLRM: bottom MLP widths (dense features first, `D` last), the number of
/// pooled embeddings `F`, and the top MLP's widths after its input (ending in one logit;
/// its input width `D + P` follows from the rest, as in MLPerf's and TorchRec's notation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DlrmArch {
    bottom: Vec<usize>,
    top: Vec<usize>,
    n_sparse: usize,
}

impl DlrmArch {
    /// A DLRM with bottom MLP `bottom` (`[n_dense, hidden..., D]`), `n_sparse` pooled
    /// embeddings of width `D`, and top MLP `top` (`[hidden..., 1]`).
    ///
    /// # Errors
    /// [`Error::Config`] naming the fault: a bottom MLP without input and output widths,
    /// a top MLP that does not end in one logit, a width of 0, no sparse features.
    pub fn new(bottom: &[usize], top: &[usize], n_sparse: usize) -> Result<Self> {
        if bottom.len() < 2 {
            return Err(Error::Config(format!(
                "DLRM bottom MLP needs the dense input width and the embedding width D, \
                 got widths {bottom:?}"
            )));
        }
        if bottom.contains(&0) {
            return Err(Error::Config(format!(
                "DLRM bottom MLP has a layer of width 0 in {bottom:?}"
            )));
        }
        if top.contains(&0) {
            return Err(Error::Config(format!(
                "DLRM top MLP has a layer of width 0 in {top:?}"
            )));
        }
        if top.last() != Some(&1) {
            return Err(Error::Config(format!(
                "DLRM top MLP must end in one logit, got widths {top:?}"
            )));
        }
        let dim = bottom[bottom.len() - 1];
        Interaction::new(dim, n_sparse)?;
        Ok(Self {
            bottom: bottom.to_vec(),
            top: top.to_vec(),
            n_sparse,
        })
    }

    /// MLPerf DLRM's shape on Criteo 1TB: bottom 13-512-256-128, `F = 26` tables of
    /// `D = 128`, top 1024-1024-512-256-1 (input 479).
    pub fn mlperf() -> Self {
        Self::new(&[13, 512, 256, 128], &[1024, 1024, 512, 256, 1], 26)
            .expect("invariant: MLPerf's shape is valid")
    }

    /// `D`, the bottom MLP's output width and every table's width.
    pub fn dim(&self) -> usize {
        self.bottom[self.bottom.len() - 1]
    }

    /// `F`, the number of pooled embeddings.
    pub fn n_sparse(&self) -> usize {
        self.n_sparse
    }

    /// The bottom MLP's widths, from the dense features to `D`.
    pub fn bottom_layers(&self) -> &[usize] {
        &self.bottom
    }

    /// The top MLP's widths, from its input (`D + P`) to the logit.
    pub fn top_layers(&self) -> Vec<usize> {
        std::iter::once(self.interaction().out_width())
            .chain(self.top.iter().copied())
            .collect()
    }

    /// The interaction between them.
    pub fn interaction(&self) -> Interaction {
        Interaction::new(self.dim(), self.n_sparse).expect("invariant: checked in new")
    }

    /// Check the widths of the pooled embeddings (one per table, in order) against the
    /// shape: `F` of them, each `D` wide.
    ///
    /// # Errors
    /// [`Error::Config`] naming the count or the first table of another width.
    pub fn check_pooled_widths(&self, widths: &[usize]) -> Result<()> {
        if widths.len() != self.n_sparse {
            return Err(Error::Config(format!(
                "DLRM expects {} sparse features, the model has {} tables",
                self.n_sparse,
                widths.len()
            )));
        }
        if let Some((t, &w)) = widths.iter().enumerate().find(|(_, &w)| w != self.dim()) {
            return Err(Error::Config(format!(
                "DLRM needs every table as wide as the bottom MLP's output (D = {}), \
                 table {t} has width {w}",
                self.dim()
            )));
        }
        Ok(())
    }
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

    /// Runs forward and backward; returns (out, d_bottom, d_pooled).
    fn run(it: &Interaction, b: &[f32], e: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let n = b.len() / it.dim();
        let mut out = vec![f32::NAN; n * it.out_width()];
        it.forward(b, e, &mut out);
        let (mut db, mut de) = (vec![f32::NAN; b.len()], vec![f32::NAN; e.len()]);
        it.backward(b, e, g, &mut db, &mut de);
        (out, db, de)
    }

    #[test]
    fn forward_and_backward_match_a_hand_computed_case() {
        // D = 2, F = 2, two examples: v_0 the bottom output, v_1 and v_2 the tables.
        let it = Interaction::new(2, 2).unwrap();
        assert_eq!((it.n_pairs(), it.out_width()), (3, 5));
        let bottom = [1.0, 2.0, -2.0, 0.0];
        let pooled = [3.0, -1.0, 0.5, 4.0, 1.0, 1.0, 2.0, -3.0];
        // Example 0: v1.v0 = 3 - 2 = 1, v2.v0 = 0.5 + 8 = 8.5, v2.v1 = 1.5 - 4 = -2.5.
        // Example 1: v1.v0 = -2, v2.v0 = -4, v2.v1 = 2 - 3 = -1.
        let want = [1.0, 2.0, 1.0, 8.5, -2.5, -2.0, 0.0, -2.0, -4.0, -1.0];
        // Example 0: d out = bottom's first element and pair v1.v0, so
        //   d v0 = [1, 0] + v1 = [4, -1], d v1 = v0 = [1, 2], d v2 = 0.
        // Example 1: bottom's second element and twice pair v2.v1, so
        //   d v0 = [0, 1], d v1 = 2 v2 = [4, -6], d v2 = 2 v1 = [2, 2].
        let d_out = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 2.0];
        let (out, db, de) = run(&it, &bottom, &pooled, &d_out);
        assert_eq!(out, want);
        assert_eq!(db, [4.0, -1.0, 0.0, 1.0]);
        assert_eq!(de, [1.0, 2.0, 0.0, 0.0, 4.0, -6.0, 2.0, 2.0]);
    }

    #[test]
    fn pairs_are_in_lower_triangle_row_order() {
        // D = 1, F = 3, v = [2, 3, 5, 7]: v1v0, v2v0, v2v1, v3v0, v3v1, v3v2 (TorchRec's
        // triu order would put v3v0 = 14 before v2v1 = 15).
        let it = Interaction::new(1, 3).unwrap();
        let pairs: Vec<_> = it.pairs().collect();
        assert_eq!(pairs, [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]);
        let mut out = vec![0.0; 7];
        it.forward(&[2.0], &[3.0, 5.0, 7.0], &mut out);
        assert_eq!(out, [2.0, 6.0, 10.0, 15.0, 14.0, 21.0, 35.0]);
        // The index formula of the module docs.
        for (p, (i, j)) in it.pairs().enumerate() {
            assert_eq!(p, i * (i - 1) / 2 + j);
        }
    }

    #[test]
    fn reference_gradient_matches_finite_differences() {
        // loss = sum(out * r) for fixed random r, so d out = r.
        let (d, f, n) = (5, 3, 4);
        let w = d + (f + 1) * f / 2;
        let b = to_f64(&normals(1, n * d));
        let e = to_f64(&normals(2, n * f * d));
        let r = to_f64(&normals(3, n * w));
        let loss = |b: &[f64], e: &[f64]| {
            let (out, _, _) = interaction_ref(d, f, b, e, &r);
            out.iter().zip(&r).map(|(o, r)| o * r).sum::<f64>()
        };
        let (_, db, de) = interaction_ref(d, f, &b, &e, &r);
        // The loss is quadratic in the inputs: central differences are exact but for
        // rounding (about 1e-16 * |loss| / h).
        let (h, tol) = (1e-4, 1e-8);
        for i in 0..b.len() {
            let (mut p, mut m) = (b.clone(), b.clone());
            p[i] += h;
            m[i] -= h;
            let fd = (loss(&p, &e) - loss(&m, &e)) / (2.0 * h);
            assert!((fd - db[i]).abs() < tol, "bottom {i}: fd {fd} vs {}", db[i]);
        }
        for i in 0..e.len() {
            let (mut p, mut m) = (e.clone(), e.clone());
            p[i] += h;
            m[i] -= h;
            let fd = (loss(&b, &p) - loss(&b, &m)) / (2.0 * h);
            assert!((fd - de[i]).abs() < tol, "pooled {i}: fd {fd} vs {}", de[i]);
        }
    }

    #[test]
    fn fast_gradient_matches_finite_differences() {
        // The f32 gradients against central differences of the f64 loss sum(out * r).
        let (d, f, n) = (20, 3, 3);
        let it = Interaction::new(d, f).unwrap();
        let b = normals(21, n * d);
        let e = normals(22, n * f * d);
        let r = normals(23, n * it.out_width());
        let (_, db, de) = run(&it, &b, &e, &r);
        let r64 = to_f64(&r);
        let loss = |b: &[f64], e: &[f64]| {
            let (out, _, _) = interaction_ref(d, f, b, e, &r64);
            out.iter().zip(&r64).map(|(o, r)| o * r).sum::<f64>()
        };
        let (b64, e64) = (to_f64(&b), to_f64(&e));
        let h = 1e-4;
        let fd = |which: usize, i: usize| {
            let (mut bp, mut bm, mut ep, mut em) =
                (b64.clone(), b64.clone(), e64.clone(), e64.clone());
            if which == 0 {
                bp[i] += h;
                bm[i] -= h;
            } else {
                ep[i] += h;
                em[i] -= h;
            }
            (loss(&bp, &ep) - loss(&bm, &em)) / (2.0 * h)
        };
        let fd_b: Vec<f64> = (0..b.len()).map(|i| fd(0, i)).collect();
        let fd_e: Vec<f64> = (0..e.len()).map(|i| fd(1, i)).collect();
        // f32 rounding of sums of about 2 F + 1 terms.
        assert!(max_rel_diff(&db, &fd_b) < 1e-5, "d bottom");
        assert!(max_rel_diff(&de, &fd_e) < 1e-5, "d pooled");
    }

    #[test]
    fn wider_rows_match_contiguous_and_keep_their_other_columns() {
        // Pooled embeddings in the first F D columns of rows of F D + 5 (as in the MLP
        // input, the dense features after the tables).
        let (d, f, n, extra) = (8, 3, 40, 5);
        let it = Interaction::new(d, f).unwrap();
        let (fd, stride) = (f * d, f * d + extra);
        let b = normals(61, n * d);
        let wide = normals(62, n * stride);
        let g = normals(63, n * it.out_width());
        let pooled: Vec<f32> = wide
            .chunks_exact(stride)
            .flat_map(|r| r[..fd].to_vec())
            .collect();
        let (out, db, de) = run(&it, &b, &pooled, &g);

        let mut out_w = vec![f32::NAN; out.len()];
        it.forward_rows(&b, &wide, stride, &mut out_w);
        let mut db_w = vec![f32::NAN; db.len()];
        let mut de_w = vec![7.0f32; n * stride];
        it.backward_rows(&b, &wide, stride, &g, &mut db_w, &mut de_w);
        assert_eq!(bits(&out_w), bits(&out));
        assert_eq!(bits(&db_w), bits(&db));
        for (e, row) in de_w.chunks_exact(stride).enumerate() {
            assert_eq!(bits(&row[..fd]), bits(&de[e * fd..(e + 1) * fd]), "row {e}");
            assert!(
                row[fd..].iter().all(|&v| v == 7.0),
                "row {e}: other columns"
            );
        }
    }

    #[test]
    fn split_batches_give_the_same_bits() {
        // Each example is computed alone: a batch cut anywhere gives the same rows.
        let (d, f, n) = (24, 4, 75);
        let it = Interaction::new(d, f).unwrap();
        let w = it.out_width();
        let b = normals(31, n * d);
        let e = normals(32, n * f * d);
        let g = normals(33, n * w);
        let whole = run(&it, &b, &e, &g);
        let (mut out, mut db, mut de) = (Vec::new(), Vec::new(), Vec::new());
        for (lo, hi) in [(0, 5), (5, 5), (5, 40), (40, n)] {
            let part = run(
                &it,
                &b[lo * d..hi * d],
                &e[lo * f * d..hi * f * d],
                &g[lo * w..hi * w],
            );
            out.extend(part.0);
            db.extend(part.1);
            de.extend(part.2);
        }
        assert_eq!(bits(&out), bits(&whole.0));
        assert_eq!(bits(&db), bits(&whole.1));
        assert_eq!(bits(&de), bits(&whole.2));
    }

    #[test]
    fn fast_matches_reference_across_sizes() {
        // D around the 16 lanes, F from 1; batches across the parallel block of 32.
        for (k, &(d, f)) in [(1, 1), (3, 2), (16, 4), (17, 5), (40, 1), (128, 7)]
            .iter()
            .enumerate()
        {
            let it = Interaction::new(d, f).unwrap();
            for n in [0usize, 1, 31, 33, 70] {
                let seed = 100 * k as u64 + n as u64;
                let b = normals(seed, n * d);
                let e = normals(seed + 1, n * f * d);
                let g = normals(seed + 2, n * it.out_width());
                let (out, db, de) = run(&it, &b, &e, &g);
                let (out64, db64, de64) =
                    interaction_ref(d, f, &to_f64(&b), &to_f64(&e), &to_f64(&g));
                let ctx = format!("D {d} F {f} n {n}");
                if n == 0 {
                    assert!(out.is_empty() && db.is_empty() && de.is_empty(), "{ctx}");
                    continue;
                }
                // f32 sums of up to 128 products of normals (relative to the largest).
                assert!(max_rel_diff(&out, &out64) < 1e-5, "{ctx}: out");
                assert!(max_rel_diff(&db, &db64) < 1e-5, "{ctx}: d bottom");
                assert!(max_rel_diff(&de, &de64) < 1e-5, "{ctx}: d pooled");
            }
        }
    }

    #[test]
    fn same_bits_twice_and_for_any_thread_count() {
        let (d, f, n) = (64, 6, 200);
        let it = Interaction::new(d, f).unwrap();
        let b = normals(7, n * d);
        let e = normals(8, n * f * d);
        let g = normals(9, n * it.out_width());
        let in_pool = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| run(&it, &b, &e, &g))
        };
        let one = in_pool(1);
        for got in [in_pool(1), in_pool(2), run(&it, &b, &e, &g)] {
            assert_eq!(bits(&got.0), bits(&one.0), "out");
            assert_eq!(bits(&got.1), bits(&one.1), "d bottom");
            assert_eq!(bits(&got.2), bits(&one.2), "d pooled");
        }
    }

    #[test]
    fn shapes_are_validated() {
        let msg = |r: Result<Interaction>| r.unwrap_err().to_string();
        assert!(msg(Interaction::new(0, 3)).contains("width D is 0"));
        assert!(msg(Interaction::new(4, 0)).contains("no sparse features"));
        assert!(msg(Interaction::new(usize::MAX, 2)).contains("overflow"));
        assert!(matches!(Interaction::new(4, 0), Err(Error::Config(_))));

        let m = DlrmArch::mlperf();
        assert_eq!((m.dim(), m.n_sparse()), (128, 26));
        assert_eq!(m.interaction().n_pairs(), 351);
        assert_eq!(m.top_layers(), [479, 1024, 1024, 512, 256, 1]);
        assert_eq!(m.bottom_layers(), [13, 512, 256, 128]);
        m.check_pooled_widths(&[128; 26]).unwrap();

        let err = |r: Result<DlrmArch>| r.unwrap_err().to_string();
        assert!(err(DlrmArch::new(&[13], &[1], 2)).contains("bottom MLP needs"));
        assert!(err(DlrmArch::new(&[13, 0, 8], &[1], 2)).contains("bottom MLP has a layer"));
        assert!(err(DlrmArch::new(&[13, 8], &[4, 0, 1], 2)).contains("top MLP has a layer"));
        assert!(err(DlrmArch::new(&[13, 8], &[4, 2], 2)).contains("end in one logit"));
        assert!(err(DlrmArch::new(&[13, 8], &[], 2)).contains("end in one logit"));
        assert!(err(DlrmArch::new(&[13, 8], &[1], 0)).contains("no sparse features"));
        let a = DlrmArch::new(&[13, 8], &[1], 2).unwrap();
        assert_eq!(a.top_layers(), [8 + 3, 1]);
        let e = a.check_pooled_widths(&[8]).unwrap_err().to_string();
        assert!(
            e.contains("expects 2 sparse features") && e.contains("has 1 tables"),
            "{e}"
        );
        let e = a.check_pooled_widths(&[8, 16]).unwrap_err().to_string();
        assert!(e.contains("table 1 has width 16"), "{e}");
    }
}
