//! Counter-based randomness: every random value is derived from `(seed, stream, id)`,
//! never from the rank, so results do not depend on how work is split across ranks.

/// One round of the SplitMix64 finalizer: a bijective 64-bit mixer.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A well-mixed 64-bit hash of `(seed, stream, id)`.
///
/// `stream` separates independent uses of the same seed (split selection,
/// holdout shuffles, embedding initialization, ...).
#[inline]
pub fn hash3(seed: u64, stream: u64, id: u64) -> u64 {
    mix64(mix64(mix64(seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_add(stream)).wrapping_add(id))
}

/// Named streams, so that two uses of one seed never collide.
pub mod stream {
    pub const TEST_ROWS: u64 = 1;
    pub const HOLDOUT_SHUFFLE: u64 = 2;
    pub const WEBGRAPH_HOSTS: u64 = 3;
    pub const WEBGRAPH_NODE: u64 = 4;
    pub const INIT_ROWS: u64 = 5;
    pub const INIT_COLS: u64 = 6;
    pub const PRESET_TABLES: u64 = 7;
    /// One stream per example of the click generator.
    pub const CLICKS: u64 = 8;
    /// The planted model's hidden per-id weights (id mixed with the table index).
    pub const PLANTED: u64 = 9;
    /// Initial embedding rows (id mixed with the table index).
    pub const EMB_INIT: u64 = 10;
    pub const MLP_INIT: u64 = 11;
    pub const PLAN_RANDOM: u64 = 12;
    /// The sample of test rows that `als --eval-rows N` scores.
    pub const EVAL_ROWS: u64 = 13;
    /// `tune`'s validation rows and the shuffle of their arcs.
    pub const VAL_ROWS: u64 = 14;
    pub const VAL_HOLDOUT_SHUFFLE: u64 = 15;
    /// The copying web-graph model: host sizes, directory starts, a node's row, a
    /// directory's link list, the degree adjustment.
    pub const COPY_HOSTS: u64 = 16;
    pub const COPY_DIRS: u64 = 17;
    pub const COPY_NODE: u64 = 18;
    pub const COPY_LIST: u64 = 19;
    pub const COPY_ADJUST: u64 = 20;
    /// `prepare --matrix user-item --split random`: which interactions are held out.
    pub const USERITEM_RANDOM: u64 = 21;
    /// The click generator's planted factorization machine: a table's factor of one id
    /// (id mixed with the table index).
    pub const PLANTED_FM: u64 = 22;
}

/// SplitMix64: a small, fast, statistically sound sequential generator.
///
/// Seed it from [`hash3`] to get an independent sequence per global id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for `(seed, stream, id)`.
    pub fn for_id(seed: u64, stream: u64, id: u64) -> Self {
        Self::new(hash3(seed, stream, id))
    }

    /// The full internal state, for checkpoints.
    pub fn state(&self) -> u64 {
        self.state
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.state)
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; `n > 0`).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// A standard normal deviate (Box-Muller; one value per call, deterministic).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Fisher-Yates shuffle in place.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = SplitMix64::new(7);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let x = r.below(10);
            assert!(x < 10);
            seen[x as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn same_seed_same_sequence_and_streams_differ() {
        let a: Vec<u64> = (0..5).map(|i| hash3(1, stream::TEST_ROWS, i)).collect();
        let b: Vec<u64> = (0..5).map(|i| hash3(1, stream::TEST_ROWS, i)).collect();
        let c: Vec<u64> = (0..5)
            .map(|i| hash3(1, stream::HOLDOUT_SHUFFLE, i))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = SplitMix64::new(3);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| r.next_normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v: Vec<u32> = (0..100).collect();
        SplitMix64::new(9).shuffle(&mut v);
        let mut s = v.clone();
        s.sort_unstable();
        assert_eq!(s, (0..100).collect::<Vec<_>>());
        assert_ne!(v, s);
    }
}
