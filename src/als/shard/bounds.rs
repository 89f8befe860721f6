//! Contiguous ranges of rows balanced by non-zeros (the tables' shards over ranks and
//! a half-epoch's steps over a shard), and which range owns an id.

/// `p + 1` boundaries splitting rows `0..n` into contiguous ranges of about equal
/// non-zeros (`indptr` has `n + 1` entries).
pub fn balance_by_nnz(indptr: &[u64], p: usize) -> Vec<u64> {
    let n = indptr.len() - 1;
    let total = indptr[n];
    let mut b: Vec<u64> = (0..=p)
        .map(|r| {
            if r == p {
                return n as u64;
            }
            let target = (total as u128 * r as u128 / p as u128) as u64;
            indptr.partition_point(|&x| x < target).min(n) as u64
        })
        .collect();
    b[0] = 0;
    b
}

/// Which range of `bounds` holds `id`.
pub fn owner_of(bounds: &[u64], id: u64) -> usize {
    bounds.partition_point(|&b| b <= id) - 1
}

/// `P * max(nnz_i) / sum(nnz_i)` (1 is perfect balance).
pub fn imbalance(indptr: &[u64], bounds: &[u64]) -> f64 {
    let p = bounds.len() - 1;
    let nnz: Vec<u64> = (0..p)
        .map(|r| indptr[bounds[r + 1] as usize] - indptr[bounds[r] as usize])
        .collect();
    let total: u64 = nnz.iter().sum();
    if total == 0 {
        return 1.0;
    }
    p as f64 * *nnz.iter().max().unwrap_or(&0) as f64 / total as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balance_splits_by_nonzeros() {
        // One heavy row then many light ones.
        let mut ip = vec![0u64, 100];
        for _ in 0..100 {
            ip.push(ip.last().unwrap() + 1);
        }
        let b = balance_by_nnz(&ip, 2);
        assert_eq!(b, vec![0, 1, 101]);
        assert!((imbalance(&ip, &b) - 1.0).abs() < 1e-9);
        let b = balance_by_nnz(&ip, 4);
        assert_eq!(b.len(), 5);
        assert!(b.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(owner_of(&b, 0), 0);
        assert_eq!(owner_of(&b, 100), 3);
    }

    #[test]
    fn balance_of_empty_matrix() {
        let ip = vec![0u64; 6];
        let b = balance_by_nnz(&ip, 3);
        assert_eq!(b[0], 0);
        assert_eq!(b[3], 5);
        assert_eq!(imbalance(&ip, &b), 1.0);
    }
}
