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
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum TableDtype {
    #[default]
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
    /// The slice itself when the element is f32 (so f32 tables are never copied).
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        let _ = s;
        None
    }
    /// As [`TableElem::as_f32`], mutable.
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        let _ = s;
        None
    }
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
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        Some(s)
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

/// An IEEE half-precision (binary16) value (its bit pattern): 1 sign bit, 5 exponent
/// bits, 10 mantissa bits. Conversion from f32 rounds to nearest, ties to even, into
/// the subnormals (down to 2^-24) and to infinity above 65504 (from 65520 up, as IEEE
/// rounding does); NaN stays NaN (quiet). Conversion to f32 is exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F16(pub u16);

impl F16 {
    /// Round an f32 to the nearest f16, ties to even.
    pub fn from_f32(x: f32) -> Self {
        let b = x.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let abs = b & 0x7fff_ffff;
        if abs > 0x7f80_0000 {
            // NaN: keep the top of the payload, force the quiet bit.
            return F16(sign | 0x7e00 | ((abs >> 13) as u16 & 0x03ff));
        }
        if abs >= 0x477f_f000 {
            // 65520 and up (infinity included) round to infinity.
            return F16(sign | 0x7c00);
        }
        if abs >= 0x3880_0000 {
            // Normal: rebias the exponent (127 -> 15), round the 13 dropped bits to
            // nearest even (a carry into the exponent is the right result).
            let m = abs - 0x3800_0000;
            let r = m + 0x0fff + ((m >> 13) & 1);
            return F16(sign | (r >> 13) as u16);
        }
        // Subnormal (or zero): the value in units of 2^-24, rounded to nearest even.
        let e = abs >> 23;
        let shift = 126i32 - e as i32;
        if shift > 24 {
            return F16(sign);
        }
        let mant = (abs & 0x007f_ffff) | 0x0080_0000;
        let (q, rem, half) = (
            mant >> shift,
            mant & ((1 << shift) - 1),
            1u32 << (shift - 1),
        );
        let q = if rem > half || (rem == half && q & 1 == 1) {
            q + 1
        } else {
            q
        };
        F16(sign | q as u16)
    }

    /// The exact f32 value.
    pub fn to_f32(self) -> f32 {
        let h = self.0 as u32;
        let sign = (h & 0x8000) << 16;
        let (exp, mant) = ((h >> 10) & 0x1f, h & 0x03ff);
        let bits = match exp {
            0 => {
                let v = mant as f32 * (1.0 / 16_777_216.0);
                return if sign != 0 { -v } else { v };
            }
            31 => sign | 0x7f80_0000 | (mant << 13),
            _ => sign | ((exp + 112) << 23) | (mant << 13),
        };
        f32::from_bits(bits)
    }
}

/// The element type of the embedding tables (`embed --table-dtype`): rows are stored
/// at this width and widened to f32 for every computation; a 16-bit table's updated
/// row is rounded back to nearest even. Optimizer state stays f32.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum EmbDtype {
    #[default]
    F32,
    Bf16,
    F16,
}

impl EmbDtype {
    pub fn name(self) -> &'static str {
        match self {
            EmbDtype::F32 => "f32",
            EmbDtype::Bf16 => "bf16",
            EmbDtype::F16 => "f16",
        }
    }

    /// The dtype named `s` (`f32`, `bf16` or `f16`).
    pub fn parse(s: &str) -> Option<EmbDtype> {
        [EmbDtype::F32, EmbDtype::Bf16, EmbDtype::F16]
            .into_iter()
            .find(|d| d.name() == s)
    }

    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            EmbDtype::F32 => 4,
            EmbDtype::Bf16 | EmbDtype::F16 => 2,
        }
    }

    pub fn is_f32(&self) -> bool {
        *self == EmbDtype::F32
    }

    /// One 16-bit value widened to f32 (exact). Not for f32 tables.
    #[inline(always)]
    pub fn widen1(self, b: u16) -> f32 {
        match self {
            EmbDtype::F16 => F16(b).to_f32(),
            _ => Bf16(b).to_f32(),
        }
    }

    /// `src` (16-bit values) widened into `dst` (same length). Not for f32 tables.
    #[inline]
    pub fn widen(self, src: &[u16], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "widen: lengths differ");
        match self {
            EmbDtype::F16 => dst
                .iter_mut()
                .zip(src)
                .for_each(|(d, &s)| *d = F16(s).to_f32()),
            _ => dst
                .iter_mut()
                .zip(src)
                .for_each(|(d, &s)| *d = Bf16(s).to_f32()),
        }
    }

    /// `src` rounded (to nearest even) into `dst` (same length). Not for f32 tables.
    #[inline]
    pub fn narrow(self, src: &[f32], dst: &mut [u16]) {
        assert_eq!(src.len(), dst.len(), "narrow: lengths differ");
        match self {
            EmbDtype::F16 => dst
                .iter_mut()
                .zip(src)
                .for_each(|(d, &s)| *d = F16::from_f32(s).0),
            _ => dst
                .iter_mut()
                .zip(src)
                .for_each(|(d, &s)| *d = Bf16::from_f32(s).0),
        }
    }
}

impl std::fmt::Display for EmbDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The bit patterns of a bf16 slice (for storage as u16).
pub fn bits(s: &[Bf16]) -> &[u16] {
    // SAFETY: `Bf16` is `repr(transparent)` over `u16`.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u16>(), s.len()) }
}

/// bf16 values from their bit patterns.
pub fn from_bits(v: Vec<u16>) -> Vec<Bf16> {
    v.into_iter().map(Bf16).collect()
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
        if b & 0xffff == 0 || dl < dh || (dl == dh && lo & 1 == 0) {
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

    /// The nearest f16 to `x` by value (ties to the even mantissa), by bisection over
    /// the ordered magnitudes.
    fn f16_ref(x: f32) -> u16 {
        let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
        let a = x.abs() as f64;
        if a >= 65520.0 {
            return sign | 0x7c00;
        }
        // Largest magnitude with value <= a.
        let (mut lo, mut hi) = (0u16, 0x7bffu16);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if F16(mid).to_f32() as f64 <= a {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let up = lo + 1;
        let (dl, du) = (a - F16(lo).to_f32() as f64, F16(up).to_f32() as f64 - a);
        sign | if dl < du || (dl == du && lo & 1 == 0) {
            lo
        } else {
            up
        }
    }

    #[test]
    fn f16_round_trip_is_exact_for_every_f16_value() {
        for bits in 0..=u16::MAX {
            let v = F16(bits);
            let x = v.to_f32();
            if x.is_nan() {
                assert_eq!(bits & 0x7c00, 0x7c00);
                assert!(F16::from_f32(x).to_f32().is_nan());
                continue;
            }
            assert_eq!(F16::from_f32(x), v, "bits {bits:#06x} = {x:e}");
        }
    }

    #[test]
    fn f16_known_values_ties_subnormals_and_range() {
        assert_eq!(F16::from_f32(1.0).0, 0x3c00);
        assert_eq!(F16::from_f32(-2.0).0, 0xc000);
        assert_eq!(F16::from_f32(65504.0).0, 0x7bff);
        assert_eq!(F16::from_f32(65519.99).0, 0x7bff);
        // 65520 is the tie between 65504 (odd) and 65536 (infinity, even).
        assert_eq!(F16::from_f32(65520.0).0, 0x7c00);
        assert_eq!(F16::from_f32(f32::INFINITY).0, 0x7c00);
        assert_eq!(F16::from_f32(f32::NEG_INFINITY).0, 0xfc00);
        assert_eq!(F16::from_f32(-0.0).0, 0x8000);
        assert!(F16::from_f32(f32::NAN).to_f32().is_nan());
        assert!(F16::from_f32(-f32::NAN).to_f32().is_nan());
        // 1 + 2^-11 lies between 1 and 1 + 2^-10 (odd): ties to even, down.
        assert_eq!(F16::from_f32(1.0 + 1.0 / 2048.0).0, 0x3c00);
        // 1 + 3 * 2^-11: between 1 + 2^-10 (odd) and 1 + 2^-9 (even): up.
        assert_eq!(F16::from_f32(1.0 + 3.0 / 2048.0).0, 0x3c02);
        // Subnormals: 2^-24 is the smallest, 2^-25 ties to zero (even), a bit more
        // rounds up to 2^-24; 2^-14 is the smallest normal.
        let tiny = 2f32.powi(-24);
        assert_eq!(F16::from_f32(tiny).0, 0x0001);
        assert_eq!(F16(0x0001).to_f32(), tiny);
        assert_eq!(F16::from_f32(tiny / 2.0).0, 0x0000);
        assert_eq!(F16::from_f32(tiny * 0.500_001).0, 0x0001);
        assert_eq!(F16::from_f32(tiny * 1.5).0, 0x0002);
        assert_eq!(F16::from_f32(tiny * 2.5).0, 0x0002);
        assert_eq!(F16::from_f32(2f32.powi(-14)).0, 0x0400);
        assert_eq!(F16(0x03ff).to_f32(), 1023.0 * tiny);
        // The largest subnormal plus half a unit rounds up into the normals.
        assert_eq!(F16::from_f32(1023.5 * tiny).0, 0x0400);
        assert_eq!(F16::from_f32(f32::from_bits(1)).0, 0);
    }

    #[test]
    fn f16_matches_the_reference_rounding_on_random_values() {
        let mut g = crate::rng::SplitMix64::new(11);
        for i in 0..200_000 {
            // Half of them in f16's range (exponents 2^-26..2^17), half any f32.
            let x = if i % 2 == 0 {
                let e = (g.next_u64() % 44) as i32 - 26;
                let m = 1.0 + (g.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
                let s = if g.next_u64() & 1 == 1 { -1.0 } else { 1.0 };
                s * m * 2f32.powi(e)
            } else {
                f32::from_bits(g.next_u64() as u32)
            };
            if x.is_nan() {
                continue;
            }
            assert_eq!(F16::from_f32(x).0, f16_ref(x), "x = {x:e}");
        }
    }

    #[test]
    fn emb_dtype_widen_and_narrow_round_trip() {
        let src: Vec<f32> = (0..100).map(|i| i as f32 * 0.37 - 11.0).collect();
        for d in [EmbDtype::Bf16, EmbDtype::F16] {
            let mut h = vec![0u16; src.len()];
            d.narrow(&src, &mut h);
            let mut w = vec![0f32; src.len()];
            d.widen(&h, &mut w);
            let mut h2 = vec![0u16; src.len()];
            d.narrow(&w, &mut h2);
            assert_eq!(h, h2, "{d}");
            for (a, b) in src.iter().zip(&w) {
                assert!((a - b).abs() <= a.abs() / 256.0, "{d}: {a} -> {b}");
            }
            assert_eq!(EmbDtype::parse(d.name()), Some(d));
            assert_eq!(d.bytes(), 2);
        }
        assert_eq!(EmbDtype::F32.bytes(), 4);
    }
}
