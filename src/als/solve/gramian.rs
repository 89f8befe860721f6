//! Gramian.

use rayon::prelude::*;

use crate::bf16::TableElem;

/// Rows per block of the Gramian (the unit of work and of the fixed summation order).
pub(super) const GRAM_BLOCK: usize = 4096;
/// Blocks computed in parallel before their partial sums are added (bounds memory).
pub(super) const GRAM_WAVE: usize = 16;

/// Gramian `T^T T` of a row-major table (`n x d`, f32 or bf16): `d * d`, row-major,
/// exactly symmetric.
///
/// Blocks of [`GRAM_BLOCK`] rows are converted to f64 and multiplied with f64 gemm,
/// in parallel; the block sums are added in block order, so the result does not
/// depend on the thread count. Panics if `table.len()` is not a multiple of `d`.
pub fn gramian<T: TableElem>(table: &[T], d: usize) -> Vec<f64> {
    crate::blas_single_thread();
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
            .for_each_init(Vec::new, |buf, (out, block)| {
                block_gramian(block, d, buf, out)
            });
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

/// `out = B^T B` (f64) for one block `B` of rows, through an f64 copy in `buf`.
fn block_gramian<T: TableElem>(block: &[T], d: usize, buf: &mut Vec<f64>, out: &mut [f64]) {
    let nb = block.len() / d;
    buf.clear();
    buf.extend(block.iter().map(|&v| f64::from(v.to_f32())));
    if nb == 0 {
        out.fill(0.0);
        return;
    }
    // Symmetric rank-k update: half the flops of a general product. OpenBLAS is kept
    // single-threaded (crate::blas_single_thread), so the result is deterministic.
    let (n, k) = (d as c_int, nb as c_int);
    // SAFETY: `buf` holds nb x d row-major f64 (lda = d) and `out` d x d (ldc = d), as
    // cblas_dsyrk reads and writes them.
    unsafe {
        cblas_dsyrk(
            CBLAS_ROW_MAJOR,
            CBLAS_UPPER,
            CBLAS_TRANS,
            n,
            k,
            1.0,
            buf.as_ptr(),
            n,
            0.0,
            out.as_mut_ptr(),
            n,
        );
    }
    for i in 0..d {
        for j in 0..i {
            out[i * d + j] = out[j * d + i];
        }
    }
}

use std::os::raw::c_int;
const CBLAS_ROW_MAJOR: c_int = 101;
const CBLAS_UPPER: c_int = 121;
const CBLAS_TRANS: c_int = 112;
extern "C" {
    fn cblas_dsyrk(
        order: c_int,
        uplo: c_int,
        trans: c_int,
        n: c_int,
        k: c_int,
        alpha: f64,
        a: *const f64,
        lda: c_int,
        beta: f64,
        c: *mut f64,
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
