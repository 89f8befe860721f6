//! How an incremental checkpoint stores its rows (`--ckpt-delta-dtype`): f32, exact;
//! bf16, rounded to nearest even (half the bytes); or int8, each row quantised
//! uniformly between its minimum and maximum as Check-N-Run does (Eisenman et al.,
//! NSDI'22, section 5: a quarter of the bytes plus 8 per row). The optimizer state
//! always stays f32.
//!
//! On disk a delta's `rows` dataset is f32, u16 (bf16 bit patterns) or u8 (codes),
//! and int8 adds `qparams`, f32 [2 x rows]: per row its minimum `lo` and step `scale`,
//! the row restored as `lo + q * scale` (error at most `scale / 2` per element, one
//! float rounding aside; a constant row is restored exactly).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::bf16::Bf16;
use crate::ckpt::commit::corrupt;
use crate::io::h5::ctx as h5;
use crate::Result;

/// The dtype of a delta's rows (`--ckpt-delta-dtype`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeltaDtype {
    /// Exact: a chain restores bit for bit.
    #[default]
    F32,
    /// Lossy: rows rounded to bfloat16 (half the bytes); a resume from such a chain
    /// is inexact.
    Bf16,
    /// Lossy: each row quantised to 8 bits between its minimum and maximum (a quarter
    /// of the bytes plus 8 per row); a resume from such a chain is inexact.
    Int8,
}

impl DeltaDtype {
    /// The option's value (`f32`, `bf16`, `int8`).
    pub fn name(self) -> &'static str {
        match self {
            DeltaDtype::F32 => "f32",
            DeltaDtype::Bf16 => "bf16",
            DeltaDtype::Int8 => "int8",
        }
    }

    /// Whether a restore from rows of this dtype is inexact.
    pub fn is_lossy(self) -> bool {
        self != DeltaDtype::F32
    }
}

/// Quantise one row `x` into `q` (same length): returns `[lo, scale]`.
pub fn quantize_row(x: &[f32], q: &mut [u8]) -> [f32; 2] {
    let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let scale = (hi - lo) / 255.0;
    if x.is_empty() || !lo.is_finite() || !(scale.is_finite() && scale > 0.0) {
        q.fill(0);
        return [if lo.is_finite() { lo } else { 0.0 }, 0.0];
    }
    for (d, &v) in q.iter_mut().zip(x) {
        *d = ((v - lo) / scale).round().clamp(0.0, 255.0) as u8;
    }
    [lo, scale]
}

/// The row `q` quantised with `[lo, scale]`, into `out` (same length).
pub fn dequantize_row(q: &[u8], [lo, scale]: [f32; 2], out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(q) {
        *o = lo + f32::from(c) * scale;
    }
}

/// Rank 0: create `<group>/rows` for `values` elements in `rows` rows coded as
/// `dtype` (int8: and `<group>/qparams`).
pub(crate) fn create_rows(
    g: &hdf5::Group,
    tmp: &Path,
    group: &str,
    dtype: DeltaDtype,
    (values, rows): (usize, usize),
) -> Result<()> {
    let at = format!("{group}/rows");
    let ds = match dtype {
        DeltaDtype::F32 => g.new_dataset::<f32>().shape(values).create("rows"),
        DeltaDtype::Bf16 => g.new_dataset::<u16>().shape(values).create("rows"),
        DeltaDtype::Int8 => g.new_dataset::<u8>().shape(values).create("rows"),
    };
    h5(tmp, at, ds)?;
    if dtype == DeltaDtype::Int8 {
        let at = format!("{group}/qparams");
        h5(
            tmp,
            at,
            g.new_dataset::<f32>().shape(2 * rows).create("qparams"),
        )?;
    }
    Ok(())
}

/// Write `x`, rows of width `w`, coded as `dtype`, at element `value_at` of
/// `<group>/rows` (and row `row_at` of `<group>/qparams`) in the open file `f`.
pub(crate) fn write_rows(
    f: &hdf5::File,
    tmp: &Path,
    group: &str,
    dtype: DeltaDtype,
    (x, w): (&[f32], usize),
    (value_at, row_at): (usize, usize),
) -> Result<()> {
    let at = format!("{group}/rows");
    let ds = h5(tmp, &at, f.dataset(&at))?;
    let r = value_at..value_at + x.len();
    match dtype {
        DeltaDtype::F32 => h5(tmp, &at, ds.write_slice(x, r)),
        DeltaDtype::Bf16 => {
            let b: Vec<u16> = x.iter().map(|&v| Bf16::from_f32(v).0).collect();
            h5(tmp, &at, ds.write_slice(&b, r))
        }
        DeltaDtype::Int8 => {
            let n = x.len() / w.max(1);
            let mut q = vec![0u8; x.len()];
            let mut params = Vec::with_capacity(2 * n);
            for (xr, qr) in x.chunks_exact(w.max(1)).zip(q.chunks_exact_mut(w.max(1))) {
                params.extend_from_slice(&quantize_row(xr, qr));
            }
            h5(tmp, &at, ds.write_slice(&q, r))?;
            let pat = format!("{group}/qparams");
            let pds = h5(tmp, &pat, f.dataset(&pat))?;
            h5(
                tmp,
                &pat,
                pds.write_slice(&params, 2 * row_at..2 * (row_at + n)),
            )
        }
    }
}

/// Read the rows of widths `widths` (one entry per row, in order) starting at element
/// `value_at` and row `row_at` of `<group>/rows` in `f` (at `path`), as f32.
pub(crate) fn read_rows(
    f: &hdf5::File,
    path: &Path,
    group: &str,
    dtype: DeltaDtype,
    widths: &[usize],
    (value_at, row_at): (usize, usize),
) -> Result<Vec<f32>> {
    let at = format!("{group}/rows");
    let total: usize = widths.iter().sum();
    let (lo, hi) = (value_at as u64, (value_at + total) as u64);
    let bad = |e: crate::Error| corrupt(path, e.to_string());
    match dtype {
        DeltaDtype::F32 => crate::io::h5::read_range(f, path, &at, lo, hi).map_err(bad),
        DeltaDtype::Bf16 => {
            let b: Vec<u16> = crate::io::h5::read_range(f, path, &at, lo, hi).map_err(bad)?;
            Ok(b.into_iter().map(|x| Bf16(x).to_f32()).collect())
        }
        DeltaDtype::Int8 => {
            let q: Vec<u8> = crate::io::h5::read_range(f, path, &at, lo, hi).map_err(bad)?;
            let pat = format!("{group}/qparams");
            let n = widths.len();
            let (plo, phi) = ((2 * row_at) as u64, (2 * (row_at + n)) as u64);
            let params: Vec<f32> =
                crate::io::h5::read_range(f, path, &pat, plo, phi).map_err(bad)?;
            let mut out = vec![0f32; total];
            let mut a = 0;
            for (k, &w) in widths.iter().enumerate() {
                let p = [params[2 * k], params[2 * k + 1]];
                dequantize_row(&q[a..a + w], p, &mut out[a..a + w]);
                a += w;
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element within half a step of its value (one float rounding aside), the
    /// extremes kept, a constant row exact, an empty row harmless.
    #[test]
    fn int8_rows_are_within_half_a_step() {
        let mut state = 12345u64;
        for w in [1usize, 3, 16, 64] {
            for spread in [1e-4f32, 0.05, 3.0] {
                let x: Vec<f32> = (0..w)
                    .map(|_| {
                        state = crate::rng::mix64(state);
                        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread
                    })
                    .collect();
                let mut q = vec![0u8; w];
                let p = quantize_row(&x, &mut q);
                let mut y = vec![0f32; w];
                dequantize_row(&q, p, &mut y);
                let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
                assert_eq!(p[0], lo);
                for (a, b) in x.iter().zip(&y) {
                    let tol = p[1] * 0.5 + 4.0 * f32::EPSILON * a.abs().max(lo.abs());
                    assert!((a - b).abs() <= tol, "w {w} spread {spread}: {a} vs {b}");
                }
            }
        }
        let c = vec![0.25f32; 8];
        let mut q = vec![7u8; 8];
        let p = quantize_row(&c, &mut q);
        assert_eq!(p, [0.25, 0.0]);
        let mut y = vec![0f32; 8];
        dequantize_row(&q, p, &mut y);
        assert_eq!(y, c);
        assert_eq!(quantize_row(&[], &mut []), [0.0, 0.0]);
    }

    #[test]
    fn names_and_lossiness() {
        assert_eq!(DeltaDtype::Int8.name(), "int8");
        assert!(!DeltaDtype::F32.is_lossy());
        assert!(DeltaDtype::Bf16.is_lossy() && DeltaDtype::Int8.is_lossy());
    }
}
