//! Block partitions: the contiguous part of an index range `0..n` that each of `p`
//! ranks owns, the one split every row, byte and example range of the crate uses.

/// The contiguous block of `0..n` that rank `r` of `p` owns (sizes differ by at most one).
pub fn block_range(n: u64, p: usize, r: usize) -> (u64, u64) {
    let p = p as u64;
    let r = r as u64;
    let base = n / p;
    let extra = n % p;
    let lo = r * base + r.min(extra);
    let hi = lo + base + u64::from(r < extra);
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_ranges_tile_the_range() {
        for n in [0u64, 1, 5, 17, 100] {
            for p in 1..6 {
                let mut next = 0;
                for r in 0..p {
                    let (lo, hi) = block_range(n, p, r);
                    assert_eq!(lo, next);
                    assert!(hi >= lo && hi - lo <= n / p as u64 + 1);
                    next = hi;
                }
                assert_eq!(next, n);
            }
        }
    }
}
