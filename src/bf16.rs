//! bfloat16 storage for embedding tables (ALX keeps its tables in bf16).
//!
//! A [`Bf16`] is the top half of an IEEE f32: 1 sign bit, 8 exponent bits, 7 mantissa
//! bits. Conversion from f32 rounds to nearest, ties to even; NaN stays NaN (quiet) and
//! infinities stay infinite. Conversion to f32 is exact. Arithmetic never happens in
//! bf16: kernels widen rows to f32 (solves, Gramians and sums in f32/f64) and round once
//! when they store a result.
//!
//! [`TableElem`] lets a kernel read either element type of a table without caring which;
//! it is monomorphized, so the f32 path costs nothing.

use serde::{Deserialize, Serialize};

/// A bfloat16 value (its bit pattern).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl Bf16 {
    pub const ZERO: Bf16 = Bf16(0);

    /// Round an f32 to the nearest bf16, ties to even.
    #[inline(always)]
    pub fn from_f32(x: f32) -> Self {
        let b = x.to_bits();
        if x.is_nan() {
            // Keep the sign, force a quiet NaN (a mantissa bit that survives truncation).
            return Bf16(((b >> 16) as u16) | 0x0040);
        }
        // Round to nearest even on the 16 dropped bits; overflow rounds to infinity as
        // IEEE rounding does.
        let rounding = 0x7fff + ((b >> 16) & 1);
        Bf16((b.wrapping_add(rounding) >> 16) as u16)
    }

    /// The exact f32 value.
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

/// The element type a table is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TableDtype {
    F32,
    Bf16,
}

impl TableDtype {
    pub fn name(self) -> &'static str {
        match self {
            TableDtype::F32 => "f32",
            TableDtype::Bf16 => "bf16",
        }
    }

    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            TableDtype::F32 => 4,
            TableDtype::Bf16 => 2,
        }
    }
}

impl std::fmt::Display for TableDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An element a table can be stored in: widened to f32 for every computation.
pub trait TableElem: Copy + Default + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    const DTYPE: TableDtype;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl TableElem for f32 {
    const DTYPE: TableDtype = TableDtype::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl TableElem for Bf16 {
    const DTYPE: TableDtype = TableDtype::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        Bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        Bf16::from_f32(x)
    }
}

/// Widen `src` into `dst` (same length).
pub fn widen<T: TableElem>(src: &[T], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen: lengths differ");
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// Round `src` into `dst` (same length).
pub fn narrow<T: TableElem>(src: &[f32], dst: &mut [T]) {
    assert_eq!(src.len(), dst.len(), "narrow: lengths differ");
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = T::from_f32(s);
    }
}

/// A table rounded to bf16.
pub fn to_bf16(src: &[f32]) -> Vec<Bf16> {
    src.iter().map(|&x| Bf16::from_f32(x)).collect()
}

/// A table widened to f32.
pub fn to_f32<T: TableElem>(src: &[T]) -> Vec<f32> {
    src.iter().map(|&x| x.to_f32()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference rounding through f64: the nearest bf16 by value, ties to the even
    /// mantissa.
    fn round_ref(x: f32) -> u16 {
        let b = x.to_bits();
        let lo = (b >> 16) as u16;
        let hi = lo.wrapping_add(1);
        let (vl, vh) = (
            f32::from_bits((lo as u32) << 16) as f64,
            f32::from_bits((hi as u32) << 16) as f64,
        );
        let (dl, dh) = ((x as f64 - vl).abs(), (x as f64 - vh).abs());
        if b & 0xffff == 0 {
            lo
        } else if dl < dh || (dl == dh && lo & 1 == 0) {
            lo
        } else {
            hi
        }
    }

    #[test]
    fn round_trip_is_exact_for_bf16_values() {
        for bits in (0u16..=u16::MAX).step_by(7) {
            let v = Bf16(bits);
            if v.to_f32().is_nan() {
                assert!(Bf16::from_f32(v.to_f32()).to_f32().is_nan());
                continue;
            }
            assert_eq!(Bf16::from_f32(v.to_f32()), v, "bits {bits:#06x}");
        }
    }

    #[test]
    fn rounds_to_nearest_even() {
        // 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
        // 1 + 3 * 2^-8 lies between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
        assert_eq!(Bf16::from_f32(1.0 + 3.0 / 256.0).to_f32(), 1.0 + 1.0 / 64.0);
        assert_eq!(Bf16::from_f32(-0.0).0, 0x8000);
        assert_eq!(Bf16::from_f32(f32::INFINITY).to_f32(), f32::INFINITY);
        assert_eq!(Bf16::from_f32(f32::MAX).to_f32(), f32::INFINITY);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        let mut g = crate::rng::SplitMix64::new(7);
        for _ in 0..200_000 {
            let x = f32::from_bits(g.next_u64() as u32);
            if x.is_nan() {
                continue;
            }
            assert_eq!(Bf16::from_f32(x).0, round_ref(x), "x = {x:e}");
        }
    }

    #[test]
    fn relative_error_is_at_most_half_an_ulp() {
        let mut g = crate::rng::SplitMix64::new(3);
        for _ in 0..100_000 {
            let x = (g.next_normal() * 10.0) as f32;
            let y = Bf16::from_f32(x).to_f32();
            assert!((x - y).abs() <= x.abs() * (1.0 / 256.0), "{x} -> {y}");
        }
    }

    #[test]
    fn widen_and_narrow_are_inverse_on_bf16_values() {
        let src: Vec<f32> = (0..100).map(|i| i as f32 * 0.37 - 11.0).collect();
        let b = to_bf16(&src);
        let mut w = vec![0f32; src.len()];
        widen(&b, &mut w);
        let mut b2 = vec![Bf16::ZERO; src.len()];
        narrow(&w, &mut b2);
        assert_eq!(b, b2);
        assert_eq!(to_f32(&b), w);
    }
}
