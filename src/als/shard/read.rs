//! Reading one rank's shard of a prepared dataset (only its rows, never the whole
//! matrix): the `indptr` arrays checked whole, the layout admitted from every rank's
//! sizes, then the owned training rows (or their offsets in the file) and test rows.

use super::bounds::{balance_by_nnz, imbalance};
use super::csr::{arc_checksum, global_check_transpose, CsrShard};
use super::memory::{Layout, ShardSizes};
use crate::blocks::block_range;
use crate::comm::Comm;
use crate::data::graph::dataset::{
    check_fold_disjoint, check_id_space, check_indptr, check_rows, check_test_rows, read_meta,
};
use crate::data::graph::prepare::SplitMeta;
use crate::error::{Error, Result};
use crate::io::h5::dataset_len;
use crate::io::h5::open_h5;
use crate::io::h5::read_range;
use std::path::Path;

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
        weights: Vec::new(),
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
        weights: Vec::new(),
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

/// What every rank of `size` would hold (the sizes [`local_read_shards`]'s `admit`
/// sees), from the whole `indptr` arrays of both training sides and of the test
/// split's visible (`fold`) and held-out arcs, and the balanced boundaries.
fn shard_sizes(
    meta: &SplitMeta,
    num_test: u64,
    [row_ip, col_ip]: [&[u64]; 2],
    [row_bounds, col_bounds]: [&[u64]; 2],
    [fold_ip, holdout_ip]: [&[u64]; 2],
) -> Vec<ShardSizes> {
    let size = row_bounds.len() - 1;
    let nnz_rows = row_ip[row_ip.len() - 1];
    let max_csr_nnz = (0..size)
        .map(|r| {
            let n = |ip: &[u64], b: &[u64]| ip[b[r + 1] as usize] - ip[b[r] as usize];
            n(row_ip, row_bounds) + n(col_ip, col_bounds)
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
    (0..size)
        .map(|r| {
            let (tl, th) = block_range(num_test, size, r);
            ShardSizes {
                ranks: size,
                num_rows: meta.num_rows,
                num_cols: meta.num_cols,
                rows_local: row_bounds[r + 1] - row_bounds[r],
                cols_local: col_bounds[r + 1] - col_bounds[r],
                nnz_rows: nnz_at(row_ip, row_bounds, r),
                nnz_cols: nnz_at(col_ip, col_bounds, r),
                test_rows: num_test,
                fold_nnz_local: fold_ip[th as usize] - fold_ip[tl as usize],
                // The test rows' ids and both CSRs, held for the whole run.
                test_bytes_local: (th - tl) * 4
                    + 2 * (th - tl + 1) * 8
                    + (fold_ip[th as usize] - fold_ip[tl as usize] + holdout_ip[th as usize]
                        - holdout_ip[tl as usize])
                        * 4,
                nnz_total: nnz_rows,
                max_row_nnz: max_len_at(row_ip, row_bounds, r)
                    .max(max_len_at(col_ip, col_bounds, r)),
                max_csr_nnz,
            }
        })
        .collect()
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
    // Every rank's sizes (every rank can compute them): the layout must be the same
    // on all.
    let all = shard_sizes(
        &meta,
        num_test,
        [&row_ip, &col_ip],
        [&row_bounds, &col_bounds],
        [&fold_ip, &holdout_ip],
    );
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
    let trained_tests = crate::data::graph::dataset::trains_test_rows(&f, path)?;
    let has_arcs = |r: u32| !trained_tests && row_ip[r as usize + 1] != row_ip[r as usize];
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

/// Rank-local: read the stored weights beside this rank's training rows (`/train`),
/// columns (`/train_t`) and test rows' visible arcs (`/test/fold`) and turn them into
/// confidences (`conf`, see `docs/als.md`). Refuses (exit 2) a dataset whose root
/// attribute `weighted` is absent or 0 (every square graph, and user-item data
/// prepared without a weight column), a spilled training CSR (confidences are kept
/// in memory only), and a weight that is negative or not finite.
pub fn local_read_confidences(
    path: &Path,
    s: &mut Shards,
    conf: crate::als::Confidence,
) -> Result<()> {
    let f = open_h5(path)?;
    let weighted = f
        .attr("weighted")
        .and_then(|a| a.read_scalar::<u64>())
        .unwrap_or(0);
    if weighted == 0 {
        return Err(Error::layout(
            path,
            "/ attribute weighted",
            format!(
                "absent or 0: the dataset has no weights, so --confidence {conf} has nothing to read (use --confidence binary, or prepare --matrix user-item from a file with a weight column)"
            ),
        ));
    }
    if s.rows.on_disk.is_some() {
        return Err(Error::Config(format!(
            "--confidence {conf}: the training CSR of {} does not fit in memory and is spilled; confidences are only supported in memory (raise --mem-per-rank, add ranks, or use --confidence binary)",
            path.display()
        )));
    }
    for (name, csr) in [
        ("train", &mut s.rows),
        ("train_t", &mut s.cols),
        ("test/fold", &mut s.fold),
    ] {
        let lo = if name == "test/fold" {
            s.test_lo
        } else {
            csr.lo
        };
        let a = read_range::<u64>(&f, path, &format!("{name}/indptr"), lo, lo + 1)?[0];
        let ds = format!("{name}/weights");
        let nnz = dataset_len(&f, path, &format!("{name}/indices"))?;
        let have = dataset_len(&f, path, &ds)?;
        if have != nnz {
            return Err(Error::layout(
                path,
                ds,
                format!("{have} weights beside {nnz} indices"),
            ));
        }
        let w = read_range::<f32>(&f, path, &ds, a, a + csr.nnz())?;
        if let Some(k) = w.iter().position(|r| !(r.is_finite() && *r >= 0.0)) {
            return Err(Error::layout(
                path,
                ds,
                format!(
                    "weight {} at position {} is not a finite number >= 0",
                    w[k],
                    a + k as u64
                ),
            ));
        }
        csr.weights = w.into_iter().map(|r| conf.of(r)).collect();
    }
    Ok(())
}
