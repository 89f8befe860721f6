//! Sharding: contiguous ranges balanced by non-zeros, and reading one rank's shard of
//! a prepared dataset (only its rows, never the whole matrix).

pub use super::memory::{Layout, ShardSizes};
use crate::comm::Comm;
use crate::data::dataset::{
    check_fold_disjoint, check_id_space, check_indptr, check_rows, check_test_rows, dataset_len,
    read_meta, read_range,
};
use crate::data::graph::block_range;
use crate::data::prepare::SplitMeta;
use crate::error::{Error, Result};
use crate::h5::open_h5;
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
    /// Global ids of the other side (empty when `on_disk`).
    pub indices: Vec<u32>,
    /// Not loaded: the training CSR stays in the prepared file (and goes to a spill,
    /// see `spill.rs`); this is the offset of the shard's first index there.
    pub on_disk: Option<u64>,
}

impl CsrShard {
    pub fn num_rows(&self) -> usize {
        (self.hi - self.lo) as usize
    }
    pub fn nnz(&self) -> u64 {
        self.indptr.last().copied().unwrap_or(0)
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
    /// Where the training CSR lives and the gather blocks' size (see `memory::layout`).
    pub layout: Layout,
    /// The checksum of the dataset's `/train` arcs summed over all ranks (`arc_checksum`,
    /// the same at every rank count): what a model records of the dataset it was
    /// trained on, so that `recommend` can refuse another.
    pub arcs_checksum: [u64; 2],
}

/// Read rows `lo..hi` of a CSR pair whose whole `indptr` was read and checked, and
/// check their contents (ids below `bound`, sorted and distinct per row).
fn read_csr(
    f: &hdf5::File,
    path: &Path,
    name: &str,
    indptr_all: &[u64],
    lo: u64,
    hi: u64,
    bound: u64,
) -> Result<CsrShard> {
    let ip = &indptr_all[lo as usize..=hi as usize];
    let (a, b) = (ip[0], ip[ip.len() - 1]);
    let indices = read_range::<u32>(f, path, &format!("{name}/indices"), a, b)?;
    let indptr: Vec<u64> = ip.iter().map(|x| x - a).collect();
    check_rows(path, name, lo, &indptr, &indices, bound)?;
    Ok(CsrShard {
        lo,
        hi,
        indptr,
        indices,
        on_disk: None,
    })
}

/// Rows `lo..hi` of a CSR pair, leaving the indices in the file.
fn lazy_csr(indptr_all: &[u64], lo: u64, hi: u64) -> CsrShard {
    let ip = &indptr_all[lo as usize..=hi as usize];
    CsrShard {
        lo,
        hi,
        indptr: ip.iter().map(|x| x - ip[0]).collect(),
        indices: Vec::new(),
        on_disk: Some(ip[0]),
    }
}

/// Read a whole `indptr` (`rows + 1` entries) and check it against its `indices`.
fn read_indptr(f: &hdf5::File, path: &Path, name: &str, rows: u64) -> Result<Vec<u64>> {
    let ip_name = format!("{name}/indptr");
    let len = dataset_len(f, path, &ip_name)?;
    if len != rows + 1 {
        return Err(Error::layout(
            path,
            ip_name,
            format!("{len} entries, expected {}", rows + 1),
        ));
    }
    let ip = read_range::<u64>(f, path, &ip_name, 0, len)?;
    let nnz = dataset_len(f, path, &format!("{name}/indices"))?;
    check_indptr(path, name, &ip, rows, nnz)?;
    Ok(ip)
}

/// Rank-local: read this rank's shards. Every rank reads the `indptr` arrays (8 bytes
/// per node and per test row) to check them whole and find the balanced boundaries;
/// then `admit` sees the sizes of every rank's share (to refuse a run that cannot fit
/// on this rank) before the large arrays are read, and chooses the layout: whether the
/// training CSR is read into memory (else its indices stay in the file,
/// `CsrShard::on_disk`), the same answer on every rank. Everything read is checked: ids in range, rows sorted
/// and distinct, the test split's rules (see `Dataset::read`). The transpose is
/// checked collectively by [`global_read_shards_admitted`].
pub fn local_read_shards(
    path: &Path,
    rank: usize,
    size: usize,
    admit: &dyn Fn(&[ShardSizes], usize) -> Result<Layout>,
) -> Result<Shards> {
    let f = open_h5(path)?;
    let meta = read_meta(&f, path)?;
    check_id_space(path, &meta)?;
    let row_ip = read_indptr(&f, path, "train", meta.num_rows)?;
    let col_ip = read_indptr(&f, path, "train_t", meta.num_cols)?;
    let (nnz_rows, nnz_cols) = (row_ip[row_ip.len() - 1], col_ip[col_ip.len() - 1]);
    if nnz_rows != nnz_cols {
        return Err(Error::layout(
            path,
            "train_t/indices",
            format!("{nnz_cols} arcs, but /train has {nnz_rows}: not its transpose"),
        ));
    }
    let row_bounds = balance_by_nnz(&row_ip, size);
    let col_bounds = balance_by_nnz(&col_ip, size);
    let num_test = dataset_len(&f, path, "test/rows")?;
    let fold_ip = read_indptr(&f, path, "test/fold", num_test)?;
    let holdout_ip = read_indptr(&f, path, "test/holdout", num_test)?;
    if let Some(i) = holdout_ip.windows(2).position(|w| w[0] == w[1]) {
        return Err(Error::layout(
            path,
            "test/holdout/indptr",
            format!("test row {i} has no held-out arc"),
        ));
    }
    let (tlo, thi) = block_range(num_test, size, rank);
    let max_csr_nnz = (0..size)
        .map(|r| {
            let n = |ip: &[u64], b: &[u64]| ip[b[r + 1] as usize] - ip[b[r] as usize];
            n(&row_ip, &row_bounds) + n(&col_ip, &col_bounds)
        })
        .max()
        .unwrap_or(0);
    let nnz_at = |ip: &[u64], b: &[u64], r: usize| ip[b[r + 1] as usize] - ip[b[r] as usize];
    let max_len_at = |ip: &[u64], b: &[u64], r: usize| {
        ip[b[r] as usize..=b[r + 1] as usize]
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
            .max()
            .unwrap_or(0)
    };
    // Every rank's sizes (every rank can compute them): the layout must be the same
    // on all.
    let all: Vec<ShardSizes> = (0..size)
        .map(|r| {
            let (tl, th) = block_range(num_test, size, r);
            ShardSizes {
                ranks: size,
                num_rows: meta.num_rows,
                num_cols: meta.num_cols,
                rows_local: row_bounds[r + 1] - row_bounds[r],
                cols_local: col_bounds[r + 1] - col_bounds[r],
                nnz_rows: nnz_at(&row_ip, &row_bounds, r),
                nnz_cols: nnz_at(&col_ip, &col_bounds, r),
                test_rows: num_test,
                fold_nnz_local: fold_ip[th as usize] - fold_ip[tl as usize],
                // The test rows' ids and both CSRs, held for the whole run.
                test_bytes_local: (th - tl) * 4
                    + 2 * (th - tl + 1) * 8
                    + (fold_ip[th as usize] - fold_ip[tl as usize] + holdout_ip[th as usize]
                        - holdout_ip[tl as usize])
                        * 4,
                nnz_total: nnz_rows,
                max_row_nnz: max_len_at(&row_ip, &row_bounds, r).max(max_len_at(
                    &col_ip,
                    &col_bounds,
                    r,
                )),
                max_csr_nnz,
            }
        })
        .collect();
    let layout = admit(&all, rank)?;
    let in_memory = layout.csr_in_memory;
    let (r0, r1) = (row_bounds[rank], row_bounds[rank + 1]);
    let (c0, c1) = (col_bounds[rank], col_bounds[rank + 1]);
    let (rows, cols) = if in_memory {
        (
            read_csr(&f, path, "train", &row_ip, r0, r1, meta.num_cols)?,
            read_csr(&f, path, "train_t", &col_ip, c0, c1, meta.num_rows)?,
        )
    } else {
        (lazy_csr(&row_ip, r0, r1), lazy_csr(&col_ip, c0, c1))
    };
    // The owned test rows and the one before them (to check the order across blocks).
    let before = tlo.saturating_sub(1);
    let with_prev = read_range::<u32>(&f, path, "test/rows", before, thi)?;
    let has_arcs = |r: u32| row_ip[r as usize + 1] != row_ip[r as usize];
    check_test_rows(path, &with_prev, tlo > 0, tlo, meta.num_rows, has_arcs)?;
    let test_rows = with_prev[(tlo - before) as usize..].to_vec();
    let fold = read_csr(&f, path, "test/fold", &fold_ip, tlo, thi, meta.num_cols)?;
    let holdout = read_csr(
        &f,
        path,
        "test/holdout",
        &holdout_ip,
        tlo,
        thi,
        meta.num_cols,
    )?;
    for (i, &row) in test_rows.iter().enumerate() {
        let h = &holdout.indices[holdout.indptr[i] as usize..holdout.indptr[i + 1] as usize];
        let v = &fold.indices[fold.indptr[i] as usize..fold.indptr[i + 1] as usize];
        check_fold_disjoint(path, row, v, h)?;
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
        layout,
        // Summed over ranks by `global_read_shards_admitted` (or by the spill).
        arcs_checksum: [0; 2],
    })
}

/// Two independent 64-bit mixes of an arc, summed (wrapping) over every arc of
/// `/train` and of `/train_t`: equal sums say one is the other's transpose (a
/// mismatch goes unnoticed with probability about 2^-128).
/// Shards left on disk add nothing here: the spill adds their arcs as it reads them
/// ([`global_check_transpose`] then compares).
pub fn arc_checksum(csr: &CsrShard, transposed: bool) -> [u64; 2] {
    let mut s = [0u64; 2];
    if csr.on_disk.is_none() {
        super::spill::add_checksum(&mut s, csr.lo, &csr.indptr, &csr.indices, transposed);
    }
    s
}

/// Collective: every rank must call. Compare the summed checksums of `/train`'s arcs
/// (`a`) and `/train_t`'s (`b`); returns `/train`'s sum over ranks.
pub fn global_check_transpose<C: Comm>(
    comm: &C,
    path: &Path,
    a: [u64; 2],
    b: [u64; 2],
) -> Result<[u64; 2]> {
    let mut sums = [a[0], a[1], b[0], b[1]];
    comm.all_reduce_sum(&mut sums);
    if sums[..2] != sums[2..] {
        // Every rank sees the same sums; rank 0 reports, the others name it.
        return Err(if comm.rank() == 0 {
            Error::layout(
                path,
                "train_t/indices",
                "not the transpose of /train (the arcs' checksums differ)",
            )
        } else {
            Error::Remote { rank: 0, code: 2 }
        });
    }
    Ok([sums[0], sums[1]])
}

/// Collective: every rank must call. Reads the shards (after `admit` accepted their
/// sizes) and agrees on success.
pub fn global_read_shards_admitted<C: Comm>(
    comm: &C,
    path: &Path,
    admit: &dyn Fn(&[ShardSizes], usize) -> Result<Layout>,
) -> Result<Shards> {
    let _p = comm.stats().phase("io");
    let mut shards = comm.agree(local_read_shards(path, comm.rank(), comm.size(), admit))?;
    if shards.rows.on_disk.is_none() {
        // Spilled shards are checked (and their checksum kept) as the spill reads them.
        shards.arcs_checksum = global_check_transpose(
            comm,
            path,
            arc_checksum(&shards.rows, false),
            arc_checksum(&shards.cols, true),
        )?;
    }
    Ok(shards)
}

/// Collective: every rank must call. Reads the shards, whatever their size.
pub fn global_read_shards<C: Comm>(comm: &C, path: &Path) -> Result<Shards> {
    global_read_shards_admitted(comm, path, &|_, _| Ok(Layout::in_memory()))
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
