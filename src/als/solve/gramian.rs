//! Gramian.

use rayon::prelude::*;

use super::kernels::{as_f32, Isa};
use crate::bf16::TableElem;

/// Rows per block of the Gramian (the unit of work and of the fixed summation order;
/// 512 KiB of f32 at d = 128, so a block stays in L2 while it is multiplied).
pub(super) const GRAM_BLOCK: usize = 1024;
/// Blocks computed in parallel before their partial sums are added (bounds memory).
pub(super) const GRAM_WAVE: usize = 16;

/// Gramian `T^T T` of a row-major table (`n x d`, f32 or bf16): `d * d`, row-major,
/// exactly symmetric.
///
/// Each block of [`GRAM_BLOCK`] rows is multiplied in f32 (on the table in place, or on
/// a widened copy of a bf16 block; [`block_upper`]), in parallel; the block
/// products are widened to f64 and added in block order, so the result does not depend
/// on the thread count. An element's error is at most `(GRAM_BLOCK + 1) * 2^-24` times
/// the sum of its products' magnitudes (f32 within a block, f64 across blocks): about
/// 1e-6 relative in practice, at half the cost of an f64 product. Panics if
/// `table.len()` is not a multiple of `d`.
pub fn gramian<T: TableElem>(table: &[T], d: usize) -> Vec<f64> {
    crate::cpu::blas_single_thread();
    if d == 0 {
        assert!(table.is_empty(), "gramian: d = 0 with a non-empty table");
        return Vec::new();
    }
    assert_eq!(
        table.len() % d,
        0,
        "gramian: table length is not a multiple of d"
    );
    let mut g = vec![0.0f64; d * d];
    let blocks: Vec<&[T]> = table.chunks(GRAM_BLOCK * d).collect();
    let mut parts = vec![0.0f64; GRAM_WAVE.min(blocks.len()) * d * d];
    for wave in blocks.chunks(GRAM_WAVE) {
        let parts = &mut parts[..wave.len() * d * d];
        parts
            .par_chunks_mut(d * d)
            .zip(wave.par_iter())
            .for_each_init(
                || (Vec::new(), Vec::new()),
                |(buf, g32), (out, block)| block_gramian(block, d, buf, g32, out),
            );
        for part in parts.chunks_exact(d * d) {
            for (a, b) in g.iter_mut().zip(part) {
                *a += *b;
            }
        }
    }
    // Exact symmetry: mirror the upper triangle.
    for k in 0..d {
        for l in 0..k {
            g[k * d + l] = g[l * d + k];
        }
    }
    g
}

/// `out = B^T B` (f32 products widened to f64) for one block `B` of rows: read in
/// place when `T` is f32, else through a widened f32 copy in `buf`; `g32` is the f32
/// product's scratch.
fn block_gramian<T: TableElem>(
    block: &[T],
    d: usize,
    buf: &mut Vec<f32>,
    g32: &mut Vec<f32>,
    out: &mut [f64],
) {
    let nb = block.len() / d;
    if nb == 0 {
        out.fill(0.0);
        return;
    }
    let rows: &[f32] = match as_f32(block) {
        Some(b) => b,
        None => {
            buf.clear();
            buf.extend(block.iter().map(|&v| v.to_f32()));
            buf
        }
    };
    g32.resize(d * d, 0.0);
    if !block_upper(rows, nb, d, g32) {
        ssyrk_upper(rows, nb, d, g32);
    }
    for i in 0..d {
        for j in i..d {
            let v = f64::from(g32[i * d + j]);
            out[i * d + j] = v;
            out[j * d + i] = v;
        }
    }
}

/// The upper triangle of `g = B^T B` for `nb` rows `B` by OpenBLAS `ssyrk` (symmetric
/// rank-k update: half the flops of a general product; OpenBLAS is kept single-threaded
/// by crate::cpu::blas_single_thread, so the result is deterministic).
fn ssyrk_upper(rows: &[f32], nb: usize, d: usize, g32: &mut [f32]) {
    let (n, k) = (d as c_int, nb as c_int);
    // SAFETY: `rows` holds nb x d row-major f32 (lda = d) and `g32` d x d (ldc = d), as
    // cblas_ssyrk reads and writes them.
    unsafe {
        cblas_ssyrk(
            CBLAS_ROW_MAJOR,
            CBLAS_UPPER,
            CBLAS_TRANS,
            n,
            k,
            1.0,
            rows.as_ptr(),
            n,
            0.0,
            g32.as_mut_ptr(),
            n,
        );
    }
}

use std::os::raw::c_int;
const CBLAS_ROW_MAJOR: c_int = 101;
const CBLAS_UPPER: c_int = 121;
const CBLAS_TRANS: c_int = 112;
extern "C" {
    fn cblas_ssyrk(
        order: c_int,
        uplo: c_int,
        trans: c_int,
        n: c_int,
        k: c_int,
        alpha: f32,
        a: *const f32,
        lda: c_int,
        beta: f32,
        c: *mut f32,
        ldc: c_int,
    );
}

/// Reference Gramian: a naive triple loop in f64.
pub fn gramian_ref<T: TableElem>(table: &[T], d: usize) -> Vec<f64> {
    let mut g = vec![0.0f64; d * d];
    if d == 0 {
        return g;
    }
    for row in table.chunks_exact(d) {
        for k in 0..d {
            for l in 0..d {
                g[k * d + l] += f64::from(row[k].to_f32()) * f64::from(row[l].to_f32());
            }
        }
    }
    g
}

/// Rows of `G` per register block of the AVX-512 Gramian kernel.
const UP512_ROWS: usize = 8;
/// Columns per register block of the AVX-512 Gramian kernel (two 16-float vectors).
const UP512_COLS: usize = 32;
/// Rows of `G` per register block of the AVX2 Gramian kernel.
const UP2_ROWS: usize = 4;
/// Columns per register block of the AVX2 Gramian kernel (two 8-float vectors).
const UP2_COLS: usize = 16;

/// The upper triangle (`i <= j`, and the rest of the register blocks the diagonal
/// crosses) of `g = B^T B` for `nb` rows `B` (`nb x d`, row-major), where a vector
/// kernel applies: `g[i, j]` is the fused multiply-add chain `s = B[r, i] * B[r, j] + s`
/// over `r = 0..nb` in order, the same bits with AVX-512 (blocks of 8 x 32) and AVX2
/// (4 x 16); only the blocks that meet the upper triangle are computed (at d = 128,
/// 40 of 64). Returns false, touching nothing, where neither applies (no AVX2, or `d`
/// not a multiple of the block's columns): the caller uses `syrk` then.
pub(super) fn block_upper(b: &[f32], nb: usize, d: usize, g: &mut [f32]) -> bool {
    assert!(b.len() >= nb * d && g.len() >= d * d);
    match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Fma if d.is_multiple_of(UP512_COLS) => {
            // SAFETY: the features were detected; the lengths are checked above.
            unsafe { block_upper_avx512(b, nb, d, g) };
            true
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Fma | Isa::Avx2Fma if d.is_multiple_of(UP2_COLS) => {
            // SAFETY: avx2 and fma were detected; the lengths are checked above.
            unsafe { block_upper_avx2(b, nb, d, g) };
            true
        }
        _ => false,
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::incompatible_msrv)]
unsafe fn block_upper_avx512(b: &[f32], nb: usize, d: usize, g: &mut [f32]) {
    use std::arch::x86_64::*;
    let bp = b.as_ptr();
    for i0 in (0..d).step_by(UP512_ROWS) {
        // Column blocks that reach the diagonal or beyond.
        for c0 in (i0 / UP512_COLS * UP512_COLS..d).step_by(UP512_COLS) {
            let mut acc = [[_mm512_setzero_ps(); 2]; UP512_ROWS];
            for r in 0..nb {
                let row = bp.add(r * d);
                let b0 = _mm512_loadu_ps(row.add(c0));
                let b1 = _mm512_loadu_ps(row.add(c0 + 16));
                for (i, a) in acc.iter_mut().enumerate() {
                    let s = _mm512_set1_ps(*row.add(i0 + i));
                    a[0] = _mm512_fmadd_ps(s, b0, a[0]);
                    a[1] = _mm512_fmadd_ps(s, b1, a[1]);
                }
            }
            let gp = g.as_mut_ptr();
            for (i, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(gp.add((i0 + i) * d + c0), a[0]);
                _mm512_storeu_ps(gp.add((i0 + i) * d + c0 + 16), a[1]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn block_upper_avx2(b: &[f32], nb: usize, d: usize, g: &mut [f32]) {
    use std::arch::x86_64::*;
    let bp = b.as_ptr();
    // d is a multiple of 16, so of UP2_ROWS.
    for i0 in (0..d).step_by(UP2_ROWS) {
        for c0 in (i0 / UP2_COLS * UP2_COLS..d).step_by(UP2_COLS) {
            let mut acc = [[_mm256_setzero_ps(); 2]; UP2_ROWS];
            for r in 0..nb {
                let row = bp.add(r * d);
                let b0 = _mm256_loadu_ps(row.add(c0));
                let b1 = _mm256_loadu_ps(row.add(c0 + 8));
                for (i, a) in acc.iter_mut().enumerate() {
                    let s = _mm256_broadcast_ss(&*row.add(i0 + i));
                    a[0] = _mm256_fmadd_ps(s, b0, a[0]);
                    a[1] = _mm256_fmadd_ps(s, b1, a[1]);
                }
            }
            let gp = g.as_mut_ptr();
            for (i, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(gp.add((i0 + i) * d + c0), a[0]);
                _mm256_storeu_ps(gp.add((i0 + i) * d + c0 + 8), a[1]);
            }
        }
    }
}
