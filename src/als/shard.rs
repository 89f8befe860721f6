//! Sharding: contiguous ranges balanced by non-zeros, and reading one rank's shard of
//! a prepared dataset (only its rows, never the whole matrix).

pub use super::memory::ShardSizes;
use crate::comm::Comm;
use crate::data::dataset::{open_h5, read_meta, read_range};
use crate::data::graph::block_range;
use crate::data::prepare::SplitMeta;
use crate::error::Result;
use std::path::Path;

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

/// One side's CSR shard: rows `lo..hi` (global) of `/train` or `/train_t`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CsrShard {
    pub lo: u64,
    pub hi: u64,
    /// Local offsets, starting at 0.
    pub indptr: Vec<u64>,
    /// Global ids of the other side.
    pub indices: Vec<u32>,
}

impl CsrShard {
    pub fn num_rows(&self) -> usize {
        (self.hi - self.lo) as usize
    }
    pub fn nnz(&self) -> u64 {
        self.indices.len() as u64
    }
    /// Observed count of each local row.
    pub fn counts(&self) -> Vec<u32> {
        self.indptr
            .windows(2)
            .map(|w| (w[1] - w[0]) as u32)
            .collect()
    }
}

/// This rank's part of a prepared dataset for training and evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Shards {
    pub meta: SplitMeta,
    /// Boundaries of the row (W) and column (H) tables over ranks.
    pub row_bounds: Vec<u64>,
    pub col_bounds: Vec<u64>,
    pub rows: CsrShard,
    pub cols: CsrShard,
    pub row_imbalance: f64,
    pub col_imbalance: f64,
    /// Owned test rows (a contiguous block of `/test/rows`), their visible and held-out arcs.
    pub test_lo: u64,
    pub test_rows: Vec<u32>,
    pub fold: CsrShard,
    pub holdout: CsrShard,
    pub num_test: u64,
}

fn read_csr(
    f: &hdf5::File,
    path: &Path,
    name: &str,
    indptr_all: Option<&[u64]>,
    lo: u64,
    hi: u64,
) -> Result<CsrShard> {
    let ip = match indptr_all {
        Some(all) => all[lo as usize..=hi as usize].to_vec(),
        None => read_range::<u64>(f, path, &format!("{name}/indptr"), lo, hi + 1)?,
    };
    let (a, b) = (ip[0], ip[ip.len() - 1]);
    let indices = read_range::<u32>(f, path, &format!("{name}/indices"), a, b)?;
    Ok(CsrShard {
        lo,
        hi,
        indptr: ip.iter().map(|x| x - a).collect(),
        indices,
    })
}

/// Rank-local: read this rank's shards. Every rank reads the two `indptr` arrays
/// (8 bytes per node) to find the balanced boundaries, then `admit` sees the sizes of
/// its share (to refuse a run that cannot fit) before the large arrays are read.
pub fn local_read_shards(
    path: &Path,
    rank: usize,
    size: usize,
    admit: &dyn Fn(&ShardSizes) -> Result<()>,
) -> Result<Shards> {
    let f = open_h5(path)?;
    let meta = read_meta(&f, path)?;
    let row_ip = read_range::<u64>(&f, path, "train/indptr", 0, meta.num_rows + 1)?;
    let col_ip = read_range::<u64>(&f, path, "train_t/indptr", 0, meta.num_cols + 1)?;
    let row_bounds = balance_by_nnz(&row_ip, size);
    let col_bounds = balance_by_nnz(&col_ip, size);
    let num_test = f
        .dataset("test/rows")
        .map(|d| d.size() as u64)
        .map_err(|_| crate::error::Error::layout(path, "test/rows", "missing"))?;
    let (tlo, thi) = block_range(num_test, size, rank);
    let fold_ends = read_range::<u64>(&f, path, "test/fold/indptr", tlo, thi + 1)?;
    let nnz = |ip: &[u64], b: &[u64]| ip[b[rank + 1] as usize].saturating_sub(ip[b[rank] as usize]);
    admit(&ShardSizes {
        ranks: size,
        num_rows: meta.num_rows,
        num_cols: meta.num_cols,
        rows_local: row_bounds[rank + 1] - row_bounds[rank],
        cols_local: col_bounds[rank + 1] - col_bounds[rank],
        nnz_rows: nnz(&row_ip, &row_bounds),
        nnz_cols: nnz(&col_ip, &col_bounds),
        test_rows: num_test,
        fold_nnz_local: fold_ends[fold_ends.len() - 1].saturating_sub(fold_ends[0]),
        nnz_total: row_ip[row_ip.len() - 1],
    })?;
    let rows = read_csr(
        &f,
        path,
        "train",
        Some(&row_ip),
        row_bounds[rank],
        row_bounds[rank + 1],
    )?;
    let cols = read_csr(
        &f,
        path,
        "train_t",
        Some(&col_ip),
        col_bounds[rank],
        col_bounds[rank + 1],
    )?;
    let test_rows = read_range::<u32>(&f, path, "test/rows", tlo, thi)?;
    let fold = read_csr(&f, path, "test/fold", None, tlo, thi)?;
    let holdout = read_csr(&f, path, "test/holdout", None, tlo, thi)?;
    for (what, csr, bound) in [
        ("train", &rows, meta.num_cols),
        ("train_t", &cols, meta.num_rows),
        ("test/fold", &fold, meta.num_cols),
        ("test/holdout", &holdout, meta.num_cols),
    ] {
        if let Some(&bad) = csr.indices.iter().find(|&&c| c as u64 >= bound) {
            return Err(crate::error::Error::layout(
                path,
                format!("{what}/indices"),
                format!("id {bad} >= {bound}"),
            ));
        }
    }
    Ok(Shards {
        row_imbalance: imbalance(&row_ip, &row_bounds),
        col_imbalance: imbalance(&col_ip, &col_bounds),
        meta,
        row_bounds,
        col_bounds,
        rows,
        cols,
        test_lo: tlo,
        test_rows,
        fold,
        holdout,
        num_test,
    })
}

/// Collective: every rank must call. Reads the shards (after `admit` accepted their
/// sizes) and agrees on success.
pub fn global_read_shards_admitted<C: Comm>(
    comm: &C,
    path: &Path,
    admit: &dyn Fn(&ShardSizes) -> Result<()>,
) -> Result<Shards> {
    let _p = comm.stats().phase("io");
    comm.agree(local_read_shards(path, comm.rank(), comm.size(), admit))
}

/// Collective: every rank must call. Reads the shards, whatever their size.
pub fn global_read_shards<C: Comm>(comm: &C, path: &Path) -> Result<Shards> {
    global_read_shards_admitted(comm, path, &|_| Ok(()))
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
