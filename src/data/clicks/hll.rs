//! HyperLogLog: the number of distinct 64-bit keys of a stream in 2^14 bytes, to size
//! a hash-table vocabulary without a pass that remembers every key.
//!
//! A key is hashed with [`mix64`] (a bijection, so distinct keys never collide before
//! the register index is taken); the top [`HLL_BITS`] bits choose a register, which
//! keeps the largest `1 + leading zeros` of the remaining 50 bits seen. The estimate is
//! Flajolet et al.'s `alpha_m m^2 / sum 2^-reg` with linear counting `m ln(m / zeros)`
//! below `2.5 m` (no large-range correction is needed with 64-bit hashes). The standard
//! error is `1.04 / sqrt(m)`, 0.8 % at `m = 2^14`. Registers merge by maximum, so the
//! estimate of a stream split over ranks, threads or days is the one of the whole
//! stream, bit for bit, whatever the split and order.

use crate::rng::mix64;

/// Register index bits: `2^14` registers (one byte each).
pub const HLL_BITS: u32 = 14;
/// Registers of one sketch.
pub const HLL_REGISTERS: usize = 1 << HLL_BITS;

/// Mixed into every key before hashing (a fixed constant: sketches of one build merge).
const SALT: u64 = 0x2545_f491_4f6c_dd1d;

/// A HyperLogLog sketch of `2^14` registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hll {
    regs: Vec<u8>,
}

impl Default for Hll {
    fn default() -> Self {
        Self::new()
    }
}

impl Hll {
    pub fn new() -> Hll {
        Hll {
            regs: vec![0; HLL_REGISTERS],
        }
    }

    /// A sketch from registers (of [`Hll::registers`]); `None` unless there are
    /// exactly `2^14` of them, each at most 51.
    pub fn from_registers(regs: &[u8]) -> Option<Hll> {
        (regs.len() == HLL_REGISTERS && regs.iter().all(|&r| r <= 64 - HLL_BITS as u8 + 1)).then(
            || Hll {
                regs: regs.to_vec(),
            },
        )
    }

    pub fn registers(&self) -> &[u8] {
        &self.regs
    }

    #[inline]
    pub fn insert(&mut self, key: u64) {
        let h = mix64(key ^ SALT);
        let i = (h >> (64 - HLL_BITS)) as usize;
        // The remaining bits, with a sentinel so that all-zero bits give 51.
        let rest = (h << HLL_BITS) | (1 << (HLL_BITS - 1));
        let rho = rest.leading_zeros() as u8 + 1;
        if rho > self.regs[i] {
            self.regs[i] = rho;
        }
    }

    /// Register-wise maximum: the sketch of both streams.
    pub fn merge(&mut self, other: &Hll) {
        self.merge_registers(&other.regs);
    }

    /// [`Hll::merge`] with another sketch's registers (same length).
    pub fn merge_registers(&mut self, regs: &[u8]) {
        assert_eq!(regs.len(), HLL_REGISTERS, "merging HyperLogLog registers");
        for (a, &b) in self.regs.iter_mut().zip(regs) {
            *a = (*a).max(b);
        }
    }

    /// The estimated number of distinct keys inserted.
    pub fn estimate(&self) -> f64 {
        let m = HLL_REGISTERS as f64;
        let alpha = 0.7213 / (1.0 + 1.079 / m);
        let mut sum = 0.0f64;
        let mut zeros = 0usize;
        for &r in &self.regs {
            sum += f64::powi(2.0, -(r as i32));
            zeros += usize::from(r == 0);
        }
        let raw = alpha * m * m / sum;
        if raw <= 2.5 * m && zeros > 0 {
            m * (m / zeros as f64).ln()
        } else {
            raw
        }
    }

    /// [`Hll::estimate`] rounded to a count (0 for an empty sketch).
    pub fn count(&self) -> u64 {
        self.estimate().round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_are_within_a_few_standard_errors() {
        assert_eq!(Hll::new().count(), 0);
        for n in [1u64, 10, 100, 1000, 10_000, 50_000, 200_000, 1_000_000] {
            let mut h = Hll::new();
            for k in 0..n {
                // Keys as a generator writes them: 32-bit hashes, here of k.
                h.insert(mix64(k) >> 32);
                h.insert(mix64(k) >> 32); // a repeat changes nothing
            }
            let e = h.estimate();
            let rel = (e - n as f64).abs() / n as f64;
            // 4 standard errors of 0.8 %, and exact counts at the small end.
            assert!(rel < 0.035 || (e - n as f64).abs() < 1.0, "n {n}: {e}");
        }
    }

    #[test]
    fn merge_equals_the_sketch_of_the_whole_stream_in_any_split() {
        let keys: Vec<u64> = (0..30_000u64)
            .map(|k| k.wrapping_mul(0x9e37_79b9))
            .collect();
        let mut whole = Hll::new();
        keys.iter().for_each(|&k| whole.insert(k));
        for parts in [2usize, 3, 7] {
            let mut merged = Hll::new();
            for p in 0..parts {
                let mut h = Hll::new();
                keys.iter()
                    .skip(p)
                    .step_by(parts)
                    .rev()
                    .for_each(|&k| h.insert(k));
                merged.merge(&h);
            }
            assert_eq!(merged, whole);
        }
        let back = Hll::from_registers(whole.registers()).unwrap();
        assert_eq!(back, whole);
        assert!(Hll::from_registers(&[0; 10]).is_none());
        assert!(Hll::from_registers(&[52; HLL_REGISTERS]).is_none());
    }

    #[test]
    fn extreme_keys_fit_the_registers() {
        let mut h = Hll::new();
        for k in [0u64, 1, u64::MAX, SALT, SALT ^ 1] {
            h.insert(k);
        }
        assert!(h.registers().iter().all(|&r| r <= 51));
        assert_eq!(h.count(), 5);
    }
}
