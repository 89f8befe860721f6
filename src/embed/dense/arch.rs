//! The dense model on top of the pooled embeddings, one of three architectures
//! (`--arch`), over the MLP input layout of [`super::mlp`]: per example
//! `x = [e_1 | ... | e_F | dense]`, the `F` pooled embeddings in table order, then the
//! `n_dense` dense features. No I/O, no communication here.
//!
//! ```text
//! mlp:    z = MLP(x)                                         (widths x, hidden..., 1)
//! dlrm:   b = Bottom(dense)  (ReLU on every layer, ending in D)
//!         z = Top([b | v_i . v_j for i > j])                 (interaction: [`super::interaction`])
//! dcnv2 stacked:  z = Deep(Cross(x))                         (Deep: d, hidden..., 1)
//! dcnv2 parallel: z = [Cross(x) | Tower(x)] w + c            (Tower: d, hidden... with ReLU)
//! ```
//!
//! with `Cross` the `L` cross layers of [`super::cross`] on `x_0 = x` (`d = F D + n_dense`),
//! as in the DCN-v2 paper (Wang et al. 2021, section 3: the embedding layer's
//! concatenated output is `x_0`; "stacked" feeds `x_L` to the deep network, "parallel"
//! runs both on `x_0` and concatenates their outputs before the logit layer).
//!
//! All dense parameters form one flat vector (for the all-reduce, the optimizer and a
//! checkpoint), the sub-networks in this order: mlp: the MLP; dlrm: bottom, then top;
//! dcnv2: cross, then deep (or tower), then (parallel) the head `[d + h_last, 1]`. Each
//! sub-network's own layout is its module's ([`super::mlp`], [`super::cross`]).
//!
//! Initialization: the plain MLP as [`Mlp::new`] (He-normal, the bits of every earlier
//! run); each sub-network from its own streams ([`Mlp::sub`], ids [`SUB_BOTTOM`] ...)
//! as PyTorch's `nn.Linear` (uniform on `±1 / sqrt(fan_in)`, biases too), the cross
//! weights Xavier-normal (`N(0, 2 / (fan_in + fan_out))`, as TorchRec's `CrossNet` and
//! `LowRankCrossNet`), biases 0.

use ndarray::ArrayView2;

use super::cross::{Cross, CrossArch, CrossWorkspace};
use super::gemm::Gemm;
use super::interaction::{DlrmArch, Interaction};
use super::mlp::{Mlp, Workspace};
use crate::rng::{stream, SplitMix64};
use crate::spec::{ArchKind, DcnStructure, ModelSpec};
use crate::{Error, Result};

/// Sub-network ids of the initialization streams.
pub const SUB_BOTTOM: u64 = 1;
pub const SUB_TOP: u64 = 2;
pub const SUB_CROSS: u64 = 3;
pub const SUB_DEEP: u64 = 4;
pub const SUB_HEAD: u64 = 5;

/// A row-major `rows x cols` view of `v`.
fn view2(v: &[f32], rows: usize, cols: usize) -> ArrayView2<'_, f32> {
    ArrayView2::from_shape((rows, cols), v).expect("invariant: a slice of rows * cols")
}

/// The dense model with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum DenseModel {
    Mlp(Mlp),
    Dlrm {
        bottom: Mlp,
        top: Mlp,
        inter: Interaction,
        n_dense: usize,
    },
    Dcn {
        cross: Cross,
        /// Stacked: `d, hidden..., 1`; parallel: the tower `d, hidden...`.
        deep: Mlp,
        /// Parallel: `[d + h_last, 1]`.
        head: Option<Mlp>,
    },
}

/// Scratch of [`DenseModel`]'s passes; reuse one across calls.
#[derive(Clone, Debug, Default)]
pub struct DenseWorkspace {
    m0: Workspace,
    m1: Workspace,
    cross: CrossWorkspace,
    /// The dense features (DLRM), then their gradient.
    dense: Vec<f32>,
    ddense: Vec<f32>,
    /// DLRM: the bottom output; DCN-v2 parallel: the cross output (stacked reads it in
    /// `cross`, where the forward left it).
    b: Vec<f32>,
    db: Vec<f32>,
    /// The top's or the head's input, and its gradient.
    z: Vec<f32>,
    dz: Vec<f32>,
    /// DCN parallel: the parts of the head's input gradient, the tower's dx.
    dc: Vec<f32>,
    dh: Vec<f32>,
    tmp: Vec<f32>,
}

impl DenseWorkspace {
    pub fn new() -> Self {
        Self::default()
    }
}

/// Xavier-normal cross weights, zero biases, from `SplitMix64::for_id(seed, MLP_INIT,
/// SUB_CROSS << 32 | 2 l + m)` (`m` 0 for `W` or `U`, 1 for `V`).
fn cross_init(arch: CrossArch, seed: u64) -> Result<Cross> {
    let d = arch.dim();
    let mut p = Vec::with_capacity(arch.n_params());
    let draw = |count: usize, fan: usize, id: u64, p: &mut Vec<f32>| {
        let scale = (2.0 / fan as f64).sqrt();
        let mut rng = SplitMix64::for_id(seed, stream::MLP_INIT, (SUB_CROSS << 32) | id);
        p.extend((0..count).map(|_| (rng.next_normal() * scale) as f32));
    };
    for l in 0..arch.n_layers() as u64 {
        match arch.rank() {
            None => draw(d * d, 2 * d, 2 * l, &mut p),
            Some(r) => {
                draw(d * r, d + r, 2 * l, &mut p);
                draw(d * r, d + r, 2 * l + 1, &mut p);
            }
        }
        p.extend(std::iter::repeat_n(0.0f32, d));
    }
    Cross::from_params(arch, p)
}

/// A sub-network's parameters for the model file: name, widths (MLP) and values.
pub struct SubNet<'a> {
    pub name: &'static str,
    pub params: &'a [f32],
    /// An MLP's widths (input first); empty for the cross layers.
    pub layers: Vec<usize>,
    /// An MLP with a ReLU on its last layer too.
    pub tower: bool,
}

impl DenseModel {
    /// A fresh model of `spec`'s architecture (checked by `spec.validate`), initialized
    /// from `seed` (module docs).
    ///
    /// # Errors
    /// [`Error::Config`] for a shape the sub-networks refuse (a cross rank not below `d`,
    /// DCN-v2 parallel without hidden widths).
    pub fn new(spec: &ModelSpec, seed: u64) -> Result<Self> {
        let a = &spec.arch;
        match a.kind {
            ArchKind::Mlp => Ok(DenseModel::Mlp(Mlp::new(&spec.mlp_layers(), seed)?)),
            ArchKind::Dlrm => {
                let (bottom_l, top_l, inter) = dlrm_shape(spec)?;
                Ok(DenseModel::Dlrm {
                    bottom: Mlp::sub(&bottom_l, seed, SUB_BOTTOM, true)?,
                    top: Mlp::sub(&top_l, seed, SUB_TOP, false)?,
                    inter,
                    n_dense: spec.n_dense,
                })
            }
            ArchKind::Dcnv2 => {
                let (arch, deep_l, head_l) = dcn_shape(spec)?;
                let parallel = head_l.is_some();
                Ok(DenseModel::Dcn {
                    cross: cross_init(arch, seed)?,
                    deep: Mlp::sub(&deep_l, seed, SUB_DEEP, parallel)?,
                    head: head_l
                        .map(|h| Mlp::sub(&h, seed, SUB_HEAD, false))
                        .transpose()?,
                })
            }
        }
    }

    /// A model of `spec`'s architecture with the flat parameters `flat`.
    ///
    /// # Errors
    /// [`Error::Config`] if `flat` has the wrong length.
    pub fn from_flat(spec: &ModelSpec, flat: &[f32]) -> Result<Self> {
        let mut m = Self::new(spec, 0)?;
        if flat.len() != m.n_params() {
            return Err(Error::Config(format!(
                "the {} model has {} dense parameters, got {}",
                spec.arch.kind.name(),
                m.n_params(),
                flat.len()
            )));
        }
        m.set_flat(flat);
        Ok(m)
    }

    /// Run every matrix product with `gemm`.
    pub fn set_gemm(&mut self, gemm: Gemm) -> Result<()> {
        match self {
            DenseModel::Mlp(m) => m.set_gemm(gemm),
            DenseModel::Dlrm { bottom, top, .. } => {
                bottom.set_gemm(gemm)?;
                top.set_gemm(gemm)
            }
            DenseModel::Dcn { cross, deep, head } => {
                cross.set_gemm(gemm)?;
                deep.set_gemm(gemm)?;
                head.as_mut().map_or(Ok(()), |h| h.set_gemm(gemm))
            }
        }
    }

    /// The architecture's name (`--arch`).
    pub fn kind(&self) -> ArchKind {
        match self {
            DenseModel::Mlp(_) => ArchKind::Mlp,
            DenseModel::Dlrm { .. } => ArchKind::Dlrm,
            DenseModel::Dcn { .. } => ArchKind::Dcnv2,
        }
    }

    /// The sub-networks in flat order.
    pub fn subnets(&self) -> Vec<SubNet<'_>> {
        fn mlp<'m>(name: &'static str, m: &'m Mlp) -> SubNet<'m> {
            SubNet {
                name,
                params: m.params(),
                layers: m.layers().to_vec(),
                tower: m.is_tower(),
            }
        }
        match self {
            DenseModel::Mlp(m) => vec![mlp("mlp", m)],
            DenseModel::Dlrm { bottom, top, .. } => vec![mlp("bottom", bottom), mlp("top", top)],
            DenseModel::Dcn { cross, deep, head } => {
                let mut v = vec![SubNet {
                    name: "cross",
                    params: cross.params(),
                    layers: Vec::new(),
                    tower: false,
                }];
                v.push(mlp("deep", deep));
                if let Some(h) = head {
                    v.push(mlp("head", h));
                }
                v
            }
        }
    }

    fn subnets_mut(&mut self) -> Vec<&mut [f32]> {
        match self {
            DenseModel::Mlp(m) => vec![m.params_mut()],
            DenseModel::Dlrm { bottom, top, .. } => vec![bottom.params_mut(), top.params_mut()],
            DenseModel::Dcn { cross, deep, head } => {
                let mut v = vec![cross.params_mut(), deep.params_mut()];
                if let Some(h) = head {
                    v.push(h.params_mut());
                }
                v
            }
        }
    }

    /// Sizes of the sub-networks' parameters in flat order.
    fn sizes(&self) -> Vec<usize> {
        self.subnets().iter().map(|s| s.params.len()).collect()
    }

    pub fn n_params(&self) -> usize {
        self.sizes().iter().sum()
    }

    /// Width of the input (`F D + n_dense`).
    pub fn n_in(&self) -> usize {
        match self {
            DenseModel::Mlp(m) => m.n_in(),
            DenseModel::Dlrm { inter, n_dense, .. } => inter.n_sparse() * inter.dim() + n_dense,
            DenseModel::Dcn { cross, .. } => cross.arch().dim(),
        }
    }

    /// All parameters, flat (module docs), copied.
    pub fn flat(&self) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.n_params());
        for s in self.subnets() {
            v.extend_from_slice(s.params);
        }
        v
    }

    /// Set every parameter from the flat vector.
    ///
    /// # Panics
    /// If `flat` does not have [`Self::n_params`] values.
    pub fn set_flat(&mut self, flat: &[f32]) {
        assert_eq!(flat.len(), self.n_params(), "set_flat: length");
        let mut off = 0;
        for p in self.subnets_mut() {
            p.copy_from_slice(&flat[off..off + p.len()]);
            off += p.len();
        }
    }

    /// Run `f` on the flat parameters (in place for the plain MLP; through `scratch`,
    /// gathered and scattered back, otherwise). The optimizer's update goes here.
    pub fn with_flat_mut(&mut self, scratch: &mut Vec<f32>, f: impl FnOnce(&mut [f32])) {
        if let DenseModel::Mlp(m) = self {
            f(m.params_mut());
            return;
        }
        scratch.clear();
        for s in self.subnets() {
            scratch.extend_from_slice(s.params);
        }
        f(scratch);
        self.set_flat(scratch);
    }

    /// Forward and backward of `weight * sum_e logloss` over the `n x n_in` batch `x`,
    /// as [`Mlp::forward_backward`]: the parameter gradient (flat) is ADDED to `grad`,
    /// `dx` (`n x n_in`) is OVERWRITTEN with `d loss / d x` (the pooled embeddings'
    /// gradient in its first `F D` columns); returns the unweighted sum of the losses.
    ///
    /// # Panics
    /// If the lengths do not match.
    pub fn forward_backward(
        &self,
        x: ArrayView2<'_, f32>,
        labels: &[f32],
        weight: f32,
        grad: &mut [f32],
        dx: &mut [f32],
        ws: &mut DenseWorkspace,
    ) -> f64 {
        let n = x.nrows();
        let w = self.n_in();
        assert_eq!(x.ncols(), w, "forward_backward: input width");
        assert_eq!(labels.len(), n, "forward_backward: labels");
        assert_eq!(grad.len(), self.n_params(), "forward_backward: grad length");
        assert_eq!(dx.len(), n * w, "forward_backward: dx length");
        if n == 0 {
            return 0.0;
        }
        let xs = x.as_slice().expect("the MLP input is contiguous");
        match self {
            DenseModel::Mlp(m) => m.forward_backward(x, labels, weight, grad, dx, &mut ws.m0),
            DenseModel::Dlrm {
                bottom,
                top,
                inter,
                n_dense,
            } => {
                let (gb, gt) = grad.split_at_mut(bottom.n_params());
                let fd = w - n_dense;
                dlrm_forward(bottom, inter, *n_dense, xs, n, ws);
                let tw = inter.out_width();
                ws.dz.resize(n * tw, 0.0);
                let loss = top.forward_backward(
                    view2(&ws.z, n, tw),
                    labels,
                    weight,
                    gt,
                    &mut ws.dz,
                    &mut ws.m1,
                );
                ws.db.resize(n * inter.dim(), 0.0);
                inter.backward_rows(&ws.b, xs, w, &ws.dz, &mut ws.db, dx);
                ws.ddense.resize(n * n_dense, 0.0);
                bottom.backward(
                    view2(&ws.dense, n, *n_dense),
                    &ws.db,
                    gb,
                    &mut ws.ddense,
                    &mut ws.m0,
                );
                for (row, d) in dx.chunks_exact_mut(w).zip(ws.ddense.chunks_exact(*n_dense)) {
                    row[fd..].copy_from_slice(d);
                }
                loss
            }
            DenseModel::Dcn { cross, deep, head } => {
                let (gc, rest) = grad.split_at_mut(cross.n_params());
                let (gd, gh) = rest.split_at_mut(deep.n_params());
                match head {
                    None => {
                        // The deep network reads the cross output where it lies.
                        let c = cross.forward(xs, &mut ws.cross);
                        ws.db.resize(n * w, 0.0);
                        let loss = deep.forward_backward(
                            view2(c, n, w),
                            labels,
                            weight,
                            gd,
                            &mut ws.db,
                            &mut ws.m0,
                        );
                        cross.backward(xs, &ws.db, gc, dx, &mut ws.cross);
                        loss
                    }
                    Some(h) => {
                        let hw = deep.n_out();
                        ws.b.clear();
                        ws.b.extend_from_slice(cross.forward(xs, &mut ws.cross));
                        parallel_concat(deep, x, n, w, ws);
                        ws.dz.resize(n * (w + hw), 0.0);
                        let loss = h.forward_backward(
                            view2(&ws.z, n, w + hw),
                            labels,
                            weight,
                            gh,
                            &mut ws.dz,
                            &mut ws.m1,
                        );
                        ws.dc.clear();
                        ws.dh.clear();
                        for row in ws.dz.chunks_exact(w + hw) {
                            ws.dc.extend_from_slice(&row[..w]);
                            ws.dh.extend_from_slice(&row[w..]);
                        }
                        cross.backward(xs, &ws.dc, gc, dx, &mut ws.cross);
                        ws.tmp.resize(n * w, 0.0);
                        deep.backward(x, &ws.dh, gd, &mut ws.tmp, &mut ws.m0);
                        dx.iter_mut().zip(&ws.tmp).for_each(|(d, t)| *d += t);
                        loss
                    }
                }
            }
        }
    }

    /// The logits of the `n x n_in` batch `x`.
    ///
    /// # Panics
    /// If `x` does not have [`Self::n_in`] columns.
    pub fn predict(&self, x: ArrayView2<'_, f32>, ws: &mut DenseWorkspace) -> Vec<f32> {
        let n = x.nrows();
        let w = self.n_in();
        assert_eq!(x.ncols(), w, "predict: input width");
        if n == 0 {
            return Vec::new();
        }
        let xs = x.as_slice().expect("the MLP input is contiguous");
        match self {
            DenseModel::Mlp(m) => m.predict(x, &mut ws.m0),
            DenseModel::Dlrm {
                bottom,
                top,
                inter,
                n_dense,
            } => {
                dlrm_forward(bottom, inter, *n_dense, xs, n, ws);
                top.predict(view2(&ws.z, n, inter.out_width()), &mut ws.m1)
            }
            DenseModel::Dcn { cross, deep, head } => {
                let c = cross.forward(xs, &mut ws.cross);
                match head {
                    None => deep.predict(view2(c, n, w), &mut ws.m0),
                    Some(h) => {
                        ws.b.clear();
                        ws.b.extend_from_slice(c);
                        parallel_concat(deep, x, n, w, ws);
                        h.predict(view2(&ws.z, n, w + deep.n_out()), &mut ws.m1)
                    }
                }
            }
        }
    }
}

/// DLRM's forward to the top MLP's input: the dense features into `ws.dense`, the bottom
/// output into `ws.b`, the interaction into `ws.z`.
fn dlrm_forward(
    bottom: &Mlp,
    inter: &Interaction,
    n_dense: usize,
    xs: &[f32],
    n: usize,
    ws: &mut DenseWorkspace,
) {
    let fd = inter.n_sparse() * inter.dim();
    let w = fd + n_dense;
    ws.dense.clear();
    for row in xs.chunks_exact(w) {
        ws.dense.extend_from_slice(&row[fd..]);
    }
    ws.b.clear();
    let out = bottom.forward_keep(view2(&ws.dense, n, n_dense), &mut ws.m0);
    ws.b.extend_from_slice(out);
    ws.z.resize(n * inter.out_width(), 0.0);
    inter.forward_rows(&ws.b, xs, w, &mut ws.z);
}

/// DCN-v2 parallel: the tower on `x` and `[cross output (ws.b) | tower output]` into
/// `ws.z`.
fn parallel_concat(
    deep: &Mlp,
    x: ArrayView2<'_, f32>,
    n: usize,
    w: usize,
    ws: &mut DenseWorkspace,
) {
    let hw = deep.n_out();
    let h = deep.forward_keep(x, &mut ws.m0);
    ws.z.clear();
    ws.z.reserve(n * (w + hw));
    for (c, t) in ws.b.chunks_exact(w).zip(h.chunks_exact(hw)) {
        ws.z.extend_from_slice(c);
        ws.z.extend_from_slice(t);
    }
}

/// DLRM's widths: bottom `[n_dense, bottom...]` (a tower), top `[D + P, top..., 1]`, and
/// the interaction.
pub fn dlrm_shape(spec: &ModelSpec) -> Result<(Vec<usize>, Vec<usize>, Interaction)> {
    let dim = spec.tables[0].dim;
    let mut bottom = vec![spec.n_dense];
    bottom.extend(spec.arch.bottom(dim));
    let mut top = spec.arch.top();
    top.push(1);
    if spec.n_dense == 0 {
        return Err(Error::Config(
            "arch dlrm needs dense features for its bottom MLP (n_dense is 0)".into(),
        ));
    }
    let arch = DlrmArch::new(&bottom, &top, spec.tables.len())?;
    let widths: Vec<usize> = spec.tables.iter().map(|t| t.dim).collect();
    arch.check_pooled_widths(&widths)?;
    Ok((bottom, arch.top_layers(), arch.interaction()))
}

/// What the planner, the projection and the memory estimate need of a dense model,
/// computed from its spec without building it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenseShape {
    /// Every matrix product of the forward pass as `(in, out)`, per example.
    pub gemms: Vec<(usize, usize)>,
    /// Parameters (weights and biases), as [`DenseModel::n_params`].
    pub params: usize,
    /// Floats of activations per example (the input, every layer's output, the
    /// interaction's), as the forward and backward keep them.
    pub activations: usize,
}

impl DenseShape {
    /// The shape of `spec`'s dense model (checked by `spec.validate`).
    ///
    /// # Errors
    /// As [`DenseModel::new`] for a shape the sub-networks refuse.
    pub fn of(spec: &ModelSpec) -> Result<Self> {
        let mut sh = DenseShape {
            gemms: Vec::new(),
            params: 0,
            activations: 0,
        };
        let mlp = |layers: &[usize], sh: &mut DenseShape| {
            for w in layers.windows(2) {
                sh.gemms.push((w[0], w[1]));
                sh.params += (w[0] + 1) * w[1];
            }
            sh.activations += layers.iter().sum::<usize>();
        };
        match spec.arch.kind {
            ArchKind::Mlp => mlp(&spec.mlp_layers(), &mut sh),
            ArchKind::Dlrm => {
                let (bottom, top, inter) = dlrm_shape(spec)?;
                mlp(&bottom, &mut sh);
                sh.activations += inter.n_sparse() * inter.dim() + inter.out_width();
                mlp(&top, &mut sh);
            }
            ArchKind::Dcnv2 => {
                let (arch, deep, head) = dcn_shape(spec)?;
                let d = arch.dim();
                for _ in 0..arch.n_layers() {
                    match arch.rank() {
                        Some(r) => sh.gemms.extend([(d, r), (r, d)]),
                        None => sh.gemms.push((d, d)),
                    }
                }
                sh.params += arch.n_params();
                sh.activations += d * (1 + 2 * arch.n_layers());
                mlp(&deep, &mut sh);
                if let Some(h) = head {
                    mlp(&h, &mut sh);
                }
            }
        }
        Ok(sh)
    }

    /// Floating-point operations of a training step (forward and backward: three
    /// products per matrix) over `batch` examples.
    pub fn step_flops(&self, batch: usize) -> f64 {
        let per: f64 = self.gemms.iter().map(|&(i, o)| (i * o) as f64).sum();
        6.0 * per * batch as f64
    }
}

/// DCN-v2's shapes: the cross layers, the deep MLP (stacked: `d, hidden..., 1`;
/// parallel: the tower `d, hidden...`) and the parallel head `[d + h_last, 1]`.
pub fn dcn_shape(spec: &ModelSpec) -> Result<(CrossArch, Vec<usize>, Option<Vec<usize>>)> {
    let a = &spec.arch;
    let d = spec.mlp_input();
    let cross = CrossArch::new(d, a.cross_layers(), a.cross_rank)?;
    let mut deep = vec![d];
    deep.extend(&spec.hidden);
    match a.structure() {
        DcnStructure::Stacked => {
            deep.push(1);
            Ok((cross, deep, None))
        }
        DcnStructure::Parallel => {
            let Some(&h) = spec.hidden.last() else {
                return Err(Error::Config(
                    "dcnv2 parallel needs a deep network: hidden widths are empty".into(),
                ));
            };
            Ok((cross, deep, Some(vec![d + h, 1])))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(toml_text: &str) -> ModelSpec {
        let s: ModelSpec = toml::from_str(toml_text).unwrap();
        s.validate("test").unwrap();
        s
    }

    fn normals(seed: u64, n: usize) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| r.next_normal() as f32).collect()
    }

    /// Two tables of width 3, two dense features.
    fn two_tables(arch: &str, hidden: &str) -> ModelSpec {
        spec(&format!(
            "n_dense = 2\nhidden = [{hidden}]\n{arch}\n[[table]]\nname = \"a\"\nvocab = 10\ndim = 3\n\
             [[table]]\nname = \"b\"\nvocab = 10\ndim = 3\n"
        ))
    }

    /// The loss, every dense gradient and d loss / d x against central differences
    /// (the loss weighted, so the gradient is of `weight * sum loss`).
    fn check_fd(spec: &ModelSpec) {
        let mut m = DenseModel::new(spec, 7).unwrap();
        m.set_gemm(Gemm::Blas).unwrap();
        // Biases away from 0 and weights perturbed, so every gradient is exercised.
        let mut p = m.flat();
        let noise = normals(3, p.len());
        p.iter_mut().zip(noise).for_each(|(v, r)| *v += 0.1 * r);
        m.set_flat(&p);
        let n = 5;
        let w = m.n_in();
        let x = normals(4, n * w);
        let y: Vec<f32> = (0..n).map(|e| (e % 2) as f32).collect();
        let weight = 1.0 / n as f32;
        let mut ws = DenseWorkspace::new();
        let (mut g, mut dx) = (vec![0.0; m.n_params()], vec![0.0; n * w]);
        let loss = m.forward_backward(view2(&x, n, w), &y, weight, &mut g, &mut dx, &mut ws);
        assert!(loss.is_finite() && loss > 0.0);
        let f = |m: &DenseModel, x: &[f32]| {
            let (mut g, mut dx) = (vec![0.0; m.n_params()], vec![0.0; n * w]);
            let mut ws = DenseWorkspace::new();
            weight as f64 * m.forward_backward(view2(x, n, w), &y, weight, &mut g, &mut dx, &mut ws)
        };
        // The predicted logits give the same loss.
        let z = m.predict(view2(&x, n, w), &mut ws);
        let l2: f64 = z
            .iter()
            .zip(&y)
            .map(|(&z, &y)| super::super::auc::bce_with_logits(z as f64, y as f64))
            .sum();
        assert!((l2 - loss).abs() < 1e-9 * loss.max(1.0), "{l2} vs {loss}");
        let h = 2e-3f32;
        let close = |fd: f64, an: f32, what: String| {
            let tol = 2e-3 + 2e-2 * fd.abs().max(an.abs() as f64);
            assert!((fd - an as f64).abs() < tol, "{what}: fd {fd} vs {an}");
        };
        let mut mp = m.clone();
        let mut fd_param = |i: usize, h: f32| {
            let mut q = p.clone();
            q[i] = p[i] + h;
            mp.set_flat(&q);
            let lp = f(&mp, &x);
            q[i] = p[i] - h;
            mp.set_flat(&q);
            let lm = f(&mp, &x);
            (lp - lm) / (2.0 * h as f64)
        };
        for (i, &gi) in g.iter().enumerate() {
            let mut fd = fd_param(i, h);
            // A ReLU kink inside [p - h, p + h] spoils a central difference: the
            // derivative there is one-sided. A step a quarter as long then decides.
            let tol = 2e-3 + 2e-2 * fd.abs().max(gi.abs() as f64);
            if (fd - gi as f64).abs() >= tol {
                fd = fd_param(i, h / 4.0);
            }
            close(fd, gi, format!("param {i}"));
        }
        for i in 0..x.len() {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[i] += h;
            xm[i] -= h;
            close(
                (f(&m, &xp) - f(&m, &xm)) / (2.0 * h as f64),
                dx[i],
                format!("x {i}"),
            );
        }
        // Every sub-network gets a gradient (the checks above are not vacuous).
        let mut off = 0;
        for s in m.subnets() {
            let part = &g[off..off + s.params.len()];
            assert!(part.iter().any(|v| *v != 0.0), "{}: no gradient", s.name);
            off += s.params.len();
        }
        assert!(dx.iter().filter(|v| **v != 0.0).count() > dx.len() / 2);
    }

    #[test]
    fn dlrm_step_gradients_match_finite_differences() {
        let s = two_tables(
            "[arch]\nkind = \"dlrm\"\nbottom_mlp = [4, 3]\ntop_mlp = [4]",
            "",
        );
        check_fd(&s);
    }

    #[test]
    fn dcnv2_step_gradients_match_finite_differences() {
        for arch in [
            "[arch]\nkind = \"dcnv2\"\ncross_layers = 2",
            "[arch]\nkind = \"dcnv2\"\ncross_layers = 2\ncross_rank = 3",
            "[arch]\nkind = \"dcnv2\"\ncross_layers = 2\ndcn_structure = \"parallel\"",
            "[arch]\nkind = \"dcnv2\"\ncross_layers = 3\ncross_rank = 2\ndcn_structure = \"parallel\"",
        ] {
            check_fd(&two_tables(arch, "5, 4"));
        }
    }

    #[test]
    fn plain_mlp_step_gradients_match_finite_differences() {
        check_fd(&two_tables("", "5, 4"));
    }

    #[test]
    fn plain_mlp_is_todays_mlp_bit_for_bit() {
        let s = two_tables("", "5, 4");
        let DenseModel::Mlp(m) = DenseModel::new(&s, 9).unwrap() else {
            panic!("not the MLP")
        };
        assert_eq!(m, Mlp::new(&s.mlp_layers(), 9).unwrap());
        assert!(s.arch.is_mlp());
    }

    /// The initialization's statistics on bench_ctr's shape (26 tables of width 64, 13
    /// dense features, bottom 512-256-64, top 512-256-1): every tower layer uniform on
    /// `±1/sqrt(fan_in)` (variance `1 / (3 fan_in)`), and the fresh model's log loss at
    /// chance (He-normal towers started it at 2.5 and more, far above TorchRec's 0.79).
    #[test]
    fn dlrm_init_is_nn_linear_and_starts_at_chance() {
        let mut t = String::from("n_dense = 13\n[arch]\nkind = \"dlrm\"\nbottom_mlp = [512, 256, 64]\ntop_mlp = [512, 256]\n");
        for i in 0..26 {
            t += &format!("[[table]]\nname = \"t{i}\"\nvocab = 1000\ndim = 64\n");
        }
        let m = DenseModel::new(&spec(&t), 1).unwrap();
        for s in m.subnets() {
            let mut off = 0;
            for w in s.layers.windows(2) {
                let (fan, count) = (w[0] as f64, (w[0] + 1) * w[1]);
                let part = &s.params[off..off + count];
                off += count;
                let bound = 1.0 / fan.sqrt();
                assert!(
                    part.iter().all(|v| (*v as f64).abs() <= bound),
                    "{}",
                    s.name
                );
                let var = part.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / count as f64;
                let want = bound * bound / 3.0;
                assert!(
                    (var / want - 1.0).abs() < 0.1,
                    "{} {w:?}: {var} vs {want}",
                    s.name
                );
            }
        }
        // Pooled rows as the tables start them (uniform on ±sqrt(1/vocab)), N(0, 1)
        // dense features.
        let (n, w) = (512, m.n_in());
        let mut r = SplitMix64::new(5);
        let a = (1.0f64 / 1000.0).sqrt();
        let x: Vec<f32> = (0..n * w)
            .map(|i| match i % w < 26 * 64 {
                true => ((2.0 * r.next_f64() - 1.0) * a) as f32,
                false => r.next_normal() as f32,
            })
            .collect();
        let z = m.predict(view2(&x, n, w), &mut DenseWorkspace::new());
        let loss: f64 = z
            .iter()
            .enumerate()
            .map(|(e, &z)| super::super::auc::bce_with_logits(z as f64, (e % 2) as f64))
            .sum::<f64>()
            / n as f64;
        assert!(
            (loss - std::f64::consts::LN_2).abs() < 0.05,
            "initial loss {loss}"
        );
    }

    #[test]
    fn dlrm_forward_matches_a_hand_computed_case() {
        // 1 dense feature, bottom [1 -> 2] with ReLU, 2 tables of width 2,
        // top [2 + 3 -> 1].
        let s = spec(
            "n_dense = 1\narch = { kind = \"dlrm\", bottom_mlp = [2], top_mlp = [] }\n\
             [[table]]\nname = \"a\"\nvocab = 4\ndim = 2\n[[table]]\nname = \"b\"\nvocab = 4\ndim = 2\n",
        );
        let mut m = DenseModel::new(&s, 1).unwrap();
        // Bottom: W = [1, -2], b = [0.5, 0.5]; top: W = [1, 2, 3, 4, 5]^T, b = 0.25.
        m.set_flat(&[1.0, -2.0, 0.5, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 0.25]);
        // dense 2: bottom relu([2.5, -3.5]) = [2.5, 0]; e1 = [1, 2], e2 = [3, -1].
        let x = [1.0, 2.0, 3.0, -1.0, 2.0];
        // Pairs (1,0): e1.b = 2.5, (2,0): e2.b = 7.5, (2,1): e2.e1 = 1.
        // z = 1 * 2.5 + 2 * 0 + 3 * 2.5 + 4 * 7.5 + 5 * 1 + 0.25 = 45.25.
        let z = m.predict(view2(&x, 1, 5), &mut DenseWorkspace::new());
        assert_eq!(z, vec![45.25]);
    }

    #[test]
    fn dcnv2_forward_matches_hand_computed_cases() {
        // One table of width 1 and 1 dense feature: d = 2; one full-rank cross layer.
        let base = "n_dense = 1\nhidden = [{h}]\n[arch]\nkind = \"dcnv2\"\ncross_layers = 1\n\
                    dcn_structure = \"{st}\"\n[[table]]\nname = \"a\"\nvocab = 4\ndim = 1\n";
        let x = [2.0f32, -1.0];
        // W = [[1, 2], [0, 1]], b = [1, 0]: W x + b = [1, -1];
        // x1 = x0 * [1, -1] + x0 = [2 + 2, 1 - 1] = [4, 0].
        let cross = [1.0f32, 2.0, 0.0, 1.0, 1.0, 0.0];
        // Stacked, deep [2 -> 1]: w = [0.5, 3], c = -1: z = 2 + 0 - 1 = 1.
        let s = spec(&base.replace("{h}", "").replace("{st}", "stacked"));
        let mut m = DenseModel::new(&s, 1).unwrap();
        let mut p = cross.to_vec();
        p.extend([0.5, 3.0, -1.0]);
        m.set_flat(&p);
        assert_eq!(
            m.predict(view2(&x, 1, 2), &mut DenseWorkspace::new()),
            vec![1.0]
        );
        // Parallel, tower [2 -> 1] w = [1, 1], c = 0: relu(1) = 1; head [3 -> 1]
        // w = [1, 1, 10], c = 0.5: z = 4 + 0 + 10 + 0.5 = 14.5.
        let s = spec(&base.replace("{h}", "1").replace("{st}", "parallel"));
        let mut m = DenseModel::new(&s, 1).unwrap();
        let mut p = cross.to_vec();
        p.extend([1.0, 1.0, 0.0, 1.0, 1.0, 10.0, 0.5]);
        m.set_flat(&p);
        assert_eq!(
            m.predict(view2(&x, 1, 2), &mut DenseWorkspace::new()),
            vec![14.5]
        );
    }

    #[test]
    fn bad_shapes_are_refused_naming_the_fault() {
        let bad = |t: &str| {
            let s: ModelSpec = toml::from_str(t).unwrap();
            s.validate("m.toml").unwrap_err().to_string()
        };
        let tables = "[[table]]\nname = \"a\"\nvocab = 4\ndim = 2\n[[table]]\nname = \"b\"\nvocab = 4\ndim = 3\n";
        let e = bad(&format!("arch = \"dlrm\"\n{tables}"));
        assert!(e.contains("\"b\" (dim 3)") && e.contains("D = 2"), "{e}");
        let e = bad(&format!(
            "[arch]\nkind = \"mlp\"\ncross_layers = 2\n{tables}"
        ));
        assert!(e.contains("cross_layers") && e.contains("dcnv2"), "{e}");
        let e = bad(&format!(
            "[arch]\nkind = \"dcnv2\"\ntop_mlp = [2]\n{tables}"
        ));
        assert!(e.contains("top_mlp") && e.contains("dlrm"), "{e}");
        let s = spec("hidden = []\n[arch]\nkind = \"dcnv2\"\ndcn_structure = \"parallel\"\n[[table]]\nname = \"a\"\nvocab = 4\ndim = 2\n");
        let e = DenseModel::new(&s, 1).unwrap_err().to_string();
        assert!(e.contains("parallel"), "{e}");
    }
}
