//! Single-precision matrix products for the dense MLP, `C = A B` or `C += A B`: an
//! AVX-512 kernel of our own, with OpenBLAS's `sgemm` as the fallback.
//!
//! The MLP is most of a training step, and its three products per layer are large
//! (thousands of rows by hundreds or thousands of columns). OpenBLAS picks its kernels
//! once per process, from the CPU or from `OPENBLAS_CORETYPE`; [`Gemm::auto`] picks
//! this module's kernel on any CPU with AVX-512F, so the step does not depend on how
//! OpenBLAS was told to run (`--dense-gemm openblas` asks for OpenBLAS).
//!
//! The kernel has the BLIS layout: `B` packed in `KC x NR` micro-panels, `A` in
//! `MR x KC` micro-panels, and a `MR x NR` block of `C` held in registers per pair
//! of micro-panels. The summation order is fixed by the blocking, never by threads
//! or timing: each element of `C` sums its products in `k` order within a `KC`
//! block, and adds the blocks in order, so the same inputs give the same bits. The
//! bits differ from OpenBLAS's (another order), by rounding only.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use crate::{Error, Result};

/// Which kernel runs the MLP's matrix products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gemm {
    /// OpenBLAS's `sgemm`, with the kernels it chose for the process.
    Blas,
    /// This module's AVX-512 kernel ([`gemm_avx512`]).
    Avx512,
}

impl Gemm {
    /// The AVX-512 kernel where the CPU has AVX-512F, else OpenBLAS.
    pub fn auto() -> Gemm {
        if crate::cpu::avx512f() {
            Gemm::Avx512
        } else {
            Gemm::Blas
        }
    }

    /// `self`, if this CPU can run it.
    ///
    /// # Errors
    /// [`Error::Config`] for [`Gemm::Avx512`] on a CPU without AVX-512F.
    pub fn available(self) -> Result<Gemm> {
        if self == Gemm::Avx512 && !crate::cpu::avx512f() {
            return Err(Error::Config(
                "this CPU has no AVX-512F, which the AVX-512 GEMM kernel needs".into(),
            ));
        }
        Ok(self)
    }

    /// A short name for logs and benchmark headers.
    pub fn name(self) -> &'static str {
        match self {
            Gemm::Blas => "openblas",
            Gemm::Avx512 => "torusrec-avx512",
        }
    }
}

/// `c = a b` or (`accumulate`) `c += a b`, `c` row-major `a.nrows() x b.ncols()`, with
/// the kernel `gemm` names. Views that are not one block of memory with non-negative
/// strides go to OpenBLAS whatever `gemm` says.
///
/// # Panics
/// If the shapes do not match, or `gemm` is [`Gemm::Avx512`] on a CPU without it.
pub fn matmul(
    gemm: Gemm,
    a: ArrayView2<'_, f32>,
    b: ArrayView2<'_, f32>,
    c: &mut [f32],
    accumulate: bool,
    packs: &mut Packs,
) {
    let (m, n) = (a.nrows(), b.ncols());
    assert_eq!(c.len(), m * n, "matmul: output size");
    if let (Gemm::Avx512, Some(am), Some(bm)) = (gemm, mat_ref(&a), mat_ref(&b)) {
        gemm_avx512(am, bm, c, accumulate, packs);
        return;
    }
    let mut cv = ArrayViewMut2::from_shape((m, n), c).expect("invariant: c is m x n");
    general_mat_mul(1.0, &a, &b, if accumulate { 1.0 } else { 0.0 }, &mut cv);
}

/// `v` as a [`MatRef`] when its elements are one block of memory and its strides are
/// non-negative (row-major, column-major, or a transpose of either).
fn mat_ref<'a>(v: &ArrayView2<'a, f32>) -> Option<MatRef<'a>> {
    let s = v.strides();
    if s[0] < 0 || s[1] < 0 {
        return None;
    }
    let data = v.to_slice_memory_order()?;
    Some(MatRef {
        data,
        rows: v.nrows(),
        cols: v.ncols(),
        rs: s[0] as usize,
        cs: s[1] as usize,
    })
}

/// A read-only strided matrix: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major `rows x cols` matrix.
    #[cfg(test)]
    fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose (a view; nothing is copied).
    pub fn t(self) -> Self {
        MatRef {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// Whether every element lies inside `data`.
    fn in_bounds(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }

    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.rs + j * self.cs]
    }
}

/// Rows of `C` per register block (two vectors of 16 each: 24 accumulators).
const MR: usize = 12;
/// Columns of `C` per register block: two 16-float vectors.
const NR: usize = 32;
/// Depth of a packed block: a `KC x NR` micro-panel of `B` (32 KiB) stays in L1.
const KC: usize = 256;
/// Rows of a packed block of `A` (`MC x KC`, 96 KiB, kept in L2).
const MC: usize = 96;

/// Packing buffers, kept by the caller so that a product allocates nothing once
/// they have grown.
#[derive(Clone, Debug, Default)]
pub struct Packs {
    a: Vec<f32>,
    b: Vec<f32>,
}

/// `c = c + a b` (`accumulate`) or `c = a b`, `c` row-major `a.rows x b.cols`, with
/// the AVX-512 kernel. The caller checks [`avx512`] first.
///
/// # Panics
/// If the shapes do not match or a view reaches outside its slice.
pub fn gemm_avx512(
    a: MatRef<'_>,
    b: MatRef<'_>,
    c: &mut [f32],
    accumulate: bool,
    packs: &mut Packs,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "gemm: inner dimensions");
    assert_eq!(c.len(), m * n, "gemm: output size");
    assert!(
        a.in_bounds() && b.in_bounds(),
        "gemm: a view outside its slice"
    );
    assert!(
        crate::cpu::avx512f(),
        "gemm_avx512 on a CPU without AVX-512F"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return;
    }
    let np = n.div_ceil(NR);
    packs.b.resize(np * NR * KC.min(k), 0.0);
    packs.a.resize(MC.div_ceil(MR) * MR * KC.min(k), 0.0);
    for pc in (0..k).step_by(KC) {
        let kc = KC.min(k - pc);
        pack_b(b, pc, kc, &mut packs.b);
        let first = pc == 0 && !accumulate;
        for ic in (0..m).step_by(MC) {
            let mc = MC.min(m - ic);
            pack_a(a, ic, mc, pc, kc, &mut packs.a);
            for jp in 0..np {
                let j0 = jp * NR;
                let nr = NR.min(n - j0);
                let bp = &packs.b[jp * NR * kc..(jp + 1) * NR * kc];
                for ip in 0..mc.div_ceil(MR) {
                    let i0 = ic + ip * MR;
                    let mr = MR.min(m - i0);
                    let ap = &packs.a[ip * MR * kc..(ip + 1) * MR * kc];
                    let cb = &mut c[i0 * n + j0..];
                    // SAFETY: AVX-512F is present (asserted above); the panels hold
                    // `kc` steps of MR and NR values; the block's `mr` rows of `nr`
                    // values at stride `n` lie inside `cb` (`i0 + mr <= m`,
                    // `j0 + nr <= n`).
                    unsafe { avx512::kernel(kc, ap, bp, cb, n, mr, nr, first) };
                }
            }
        }
    }
}

/// `B[pc..pc + kc, ..]` into `NR`-column micro-panels (`kc` rows of `NR` values each,
/// zero-padded past the last column).
fn pack_b(b: MatRef<'_>, pc: usize, kc: usize, out: &mut [f32]) {
    let n = b.cols;
    for (jp, panel) in out
        .chunks_exact_mut(NR * kc)
        .take(n.div_ceil(NR))
        .enumerate()
    {
        let j0 = jp * NR;
        pack_panel::<NR>(b.t(), j0, NR.min(n - j0), pc, kc, panel);
    }
}

/// `A[ic..ic + mc, pc..pc + kc]` into `MR`-row micro-panels (`kc` steps of `MR`
/// values each, zero-padded past the last row).
fn pack_a(a: MatRef<'_>, ic: usize, mc: usize, pc: usize, kc: usize, out: &mut [f32]) {
    for (ip, panel) in out
        .chunks_exact_mut(MR * kc)
        .take(mc.div_ceil(MR))
        .enumerate()
    {
        let i0 = ic + ip * MR;
        pack_panel::<MR>(a, i0, MR.min(ic + mc - i0), pc, kc, panel);
    }
}

/// One micro-panel: `out[p * W + l] = m[l0 + l, pc + p]` for `l < w`, 0 for
/// `w <= l < W` (past the matrix's edge), `p < kc`. `m` holds the panel's lines as
/// rows: `A` itself, or `B` transposed.
fn pack_panel<const W: usize>(
    m: MatRef<'_>,
    l0: usize,
    w: usize,
    pc: usize,
    kc: usize,
    out: &mut [f32],
) {
    if m.rs == 1 {
        // Neighbouring lines are neighbours in memory: `w` values per step, copied
        // with a fixed size where the panel is full (inlined, unlike a call to
        // `memcpy` per step).
        let (steps, _) = out[..kc * W].as_chunks_mut::<W>();
        for (p, step) in steps.iter_mut().enumerate() {
            let s = (pc + p) * m.cs + l0;
            if w == W {
                *step = m.data[s..s + W].try_into().expect("W values");
            } else {
                step[..w].copy_from_slice(&m.data[s..s + w]);
                step[w..].fill(0.0);
            }
        }
    } else if m.cs == 1 {
        // Each line is contiguous.
        let lines: [&[f32]; W] = std::array::from_fn(|l| {
            let s = (l0 + l.min(w - 1)) * m.rs + pc;
            &m.data[s..s + kc]
        });
        interleave::<W>(&lines[..w], kc, out);
    } else {
        for l in 0..W {
            for p in 0..kc {
                out[p * W + l] = if l < w { m.at(l0 + l, pc + p) } else { 0.0 };
            }
        }
    }
}

/// Interleave `lines` (rows of `A` or columns of `B`, each with at least `kc`
/// values) into a micro-panel of `W` values per step: `out[p * W + l]` is value
/// `p` of line `l`, and 0 for `l >= lines.len()` (past the matrix's edge).
fn interleave<const W: usize>(lines: &[&[f32]], kc: usize, out: &mut [f32]) {
    let zeros = [0.0f32; KC];
    let mut src: [&[f32]; W] = [&zeros[..kc]; W];
    for (s, l) in src.iter_mut().zip(lines) {
        *s = &l[..kc];
    }
    for (p, step) in out[..kc * W].chunks_exact_mut(W).enumerate() {
        for (o, s) in step.iter_mut().zip(&src) {
            // SAFETY: every line in `src` has exactly `kc` values and `p < kc`.
            *o = unsafe { *s.get_unchecked(p) };
        }
    }
}

/// Off x86_64 there is no kernel: [`avx512`] is false, so nothing calls it.
#[cfg(not(target_arch = "x86_64"))]
mod avx512 {
    /// Never called (see [`super::gemm_avx512`]'s assert).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kernel(
        _: usize,
        _: &[f32],
        _: &[f32],
        _: &mut [f32],
        _: usize,
        _: usize,
        _: usize,
        _: bool,
    ) {
        unreachable!("no AVX-512 kernel off x86_64")
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    /// `C[..mr, ..nr] (+)= Apanel Bpanel` over `kc` steps; `c` row-major with stride
    /// `ldc`; `first` overwrites instead of adding.
    ///
    /// # Safety
    /// AVX-512F must be present; `ap` holds `kc * MR` values, `bp` `kc * NR`; `c`
    /// holds `(mr - 1) * ldc + nr` values; `mr <= MR`, `nr <= NR`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kernel(
        kc: usize,
        ap: &[f32],
        bp: &[f32],
        c: &mut [f32],
        ldc: usize,
        mr: usize,
        nr: usize,
        first: bool,
    ) {
        debug_assert!(ap.len() >= kc * MR && bp.len() >= kc * NR);
        debug_assert!((1..=MR).contains(&mr) && (1..=NR).contains(&nr));
        debug_assert!(c.len() >= (mr - 1) * ldc + nr);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let a = ap.as_ptr();
        let b = bp.as_ptr();
        for p in 0..kc {
            let b0 = _mm512_loadu_ps(b.add(p * NR));
            let b1 = _mm512_loadu_ps(b.add(p * NR + 16));
            for (i, acc) in acc.iter_mut().enumerate() {
                let ai = _mm512_set1_ps(*a.add(p * MR + i));
                acc[0] = _mm512_fmadd_ps(ai, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(ai, b1, acc[1]);
            }
        }
        let m0: __mmask16 = if nr >= 16 {
            0xffff
        } else {
            (1u32 << nr) as u16 - 1
        };
        let m1: __mmask16 = if nr >= 32 {
            0xffff
        } else if nr > 16 {
            (1u32 << (nr - 16)) as u16 - 1
        } else {
            0
        };
        let cp = c.as_mut_ptr();
        for (i, acc) in acc.iter().enumerate().take(mr) {
            let r = cp.add(i * ldc);
            if first {
                _mm512_mask_storeu_ps(r, m0, acc[0]);
                _mm512_mask_storeu_ps(r.wrapping_add(16), m1, acc[1]);
            } else {
                let c0 = _mm512_maskz_loadu_ps(m0, r);
                let c1 = _mm512_maskz_loadu_ps(m1, r.wrapping_add(16));
                _mm512_mask_storeu_ps(r, m0, _mm512_add_ps(c0, acc[0]));
                _mm512_mask_storeu_ps(r.wrapping_add(16), m1, _mm512_add_ps(c1, acc[1]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use ndarray::s;

    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut r = SplitMix64::new(seed);
        (0..n).map(|_| r.next_normal() as f32).collect()
    }

    /// `c0 + a b` in f64, and per element the sum of `|a_ip b_pj|` (the scale of
    /// its rounding error).
    fn reference(a: MatRef<'_>, b: MatRef<'_>, c0: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let mut c = vec![0.0; m * n];
        let mut scale = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut z) = (c0[i * n + j] as f64, c0[i * n + j].abs() as f64);
                for p in 0..k {
                    let v = a.at(i, p) as f64 * b.at(p, j) as f64;
                    s += v;
                    z += v.abs();
                }
                c[i * n + j] = s;
                scale[i * n + j] = z;
            }
        }
        (c, scale)
    }

    fn check_close(got: &[f32], want: &[f64], scale: &[f64], ctx: &str) {
        for (e, ((&g, &w), &z)) in got.iter().zip(want).zip(scale).enumerate() {
            assert!(
                (g as f64 - w).abs() <= 1e-5 * z + 1e-30,
                "{ctx}: element {e}: {g} against {w} (scale {z})"
            );
        }
    }

    /// Storage of an `r x c` matrix in the given layout, as a view of it.
    fn stored(seed: u64, r: usize, c: usize, layout: usize) -> (Vec<f32>, usize, usize) {
        match layout {
            // Row-major.
            0 => (values(seed, r * c), c, 1),
            // Column-major (a transposed view).
            1 => (values(seed, r * c), 1, r),
            // Neither: every other element of a row-major matrix twice as wide.
            _ => (values(seed, 2 * r * c), 2 * c, 2),
        }
    }

    #[test]
    fn avx512_kernel_matches_reference_across_shapes_and_layouts() {
        if !crate::cpu::avx512f() {
            eprintln!("no AVX-512F on this CPU: the kernel cannot run here");
            return;
        }
        let mut packs = Packs::default();
        // Edges of every block size: MR = 12, NR = 32, KC = 256, MC = 96.
        let shapes = [
            (1, 1, 1),
            (12, 256, 32),
            (13, 257, 33),
            (5, 3, 70),
            (97, 600, 47),
            (200, 513, 100),
            (3, 0, 4),
        ];
        for (si, &(m, k, n)) in shapes.iter().enumerate() {
            for la in 0..3 {
                for lb in 0..3 {
                    let seed = 100 * si as u64 + 10 * la as u64 + lb as u64;
                    let (av, ars, acs) = stored(seed, m, k, la);
                    let (bv, brs, bcs) = stored(seed + 5000, k, n, lb);
                    let a = MatRef {
                        data: &av,
                        rows: m,
                        cols: k,
                        rs: ars,
                        cs: acs,
                    };
                    let b = MatRef {
                        data: &bv,
                        rows: k,
                        cols: n,
                        rs: brs,
                        cs: bcs,
                    };
                    for accumulate in [false, true] {
                        let c0 = values(seed + 9000, m * n);
                        let mut c = c0.clone();
                        gemm_avx512(a, b, &mut c, accumulate, &mut packs);
                        let zeros = vec![0.0; m * n];
                        let (want, scale) = reference(a, b, if accumulate { &c0 } else { &zeros });
                        let ctx = format!("{m}x{k}x{n} layouts {la}/{lb} accumulate {accumulate}");
                        check_close(&c, &want, &scale, &ctx);
                        // The same inputs, the same bits (the packs are reused).
                        let mut again = c0.clone();
                        gemm_avx512(a, b, &mut again, accumulate, &mut packs);
                        assert_eq!(
                            c.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            again.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{ctx}: bits"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn matmul_agrees_across_kernels_and_falls_back_for_strided_views() {
        let (m, k, n) = (70, 300, 45);
        let av = values(1, m * k);
        let bv = values(2, 2 * k * n);
        let a = ArrayView2::from_shape((m, k), &av[..]).unwrap();
        // Every other column of a k x 2n matrix: not one block of memory.
        let wide = ArrayView2::from_shape((k, 2 * n), &bv[..]).unwrap();
        let b = wide.slice(s![.., ..;2]);
        assert!(mat_ref(&b).is_none());
        let dense: Vec<f32> = b.iter().copied().collect();
        let bd = MatRef::row_major(&dense, k, n);
        let (want, scale) = reference(MatRef::row_major(&av, m, k), bd, &vec![0.0; m * n]);
        let mut packs = Packs::default();
        let kernels = if crate::cpu::avx512f() {
            vec![Gemm::Blas, Gemm::Avx512]
        } else {
            vec![Gemm::Blas]
        };
        for g in kernels {
            let mut c = vec![f32::NAN; m * n];
            matmul(g, a, b, &mut c, false, &mut packs);
            check_close(&c, &want, &scale, &format!("{g:?} strided b"));
            let bv2 = ArrayView2::from_shape((k, n), &dense[..]).unwrap();
            let mut c = vec![f32::NAN; m * n];
            matmul(g, a, bv2, &mut c, false, &mut packs);
            check_close(&c, &want, &scale, &format!("{g:?}"));
            // Transposed views: (b^T a^T)^T = a b.
            let mut ct = vec![0.0; n * m];
            matmul(g, bv2.t(), a.t(), &mut ct, false, &mut packs);
            let back: Vec<f32> = (0..m * n).map(|e| ct[(e % n) * m + e / n]).collect();
            check_close(&back, &want, &scale, &format!("{g:?} transposed"));
        }
    }
}
