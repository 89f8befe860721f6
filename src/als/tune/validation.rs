//! The validation split, carved from each rank's loaded shards (the module doc of
//! `tune`).

use serde::{Deserialize, Serialize};

use crate::als::shard::csr::CsrShard;
use crate::als::shard::read::Shards;
use crate::comm::{prefix_offsets, Comm};
use crate::data::graph::prepare::{global_select_rows_by, split_row_in};
use crate::error::{Error, Result};
use crate::rng::stream;

/// Where `tune`'s validation rows come from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ValSpec {
    /// Fraction of the non-empty training rows, in (0, 1).
    pub fraction: f64,
    pub seed: u64,
}

impl ValSpec {
    pub fn validate(&self) -> Result<()> {
        if !(self.fraction > 0.0 && self.fraction < 1.0) {
            return Err(Error::Config(format!(
                "--val-fraction {}: must be in (0, 1)",
                self.fraction
            )));
        }
        Ok(())
    }
    /// Validation rows among `r` non-empty training rows.
    pub fn count(&self, r: u64) -> u64 {
        (r as f64 * self.fraction).floor() as u64
    }
}

/// The sizes of a validation split (the same at every rank count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValStats {
    pub rows: u64,
    pub visible_arcs: u64,
    pub holdout_arcs: u64,
    /// Training arcs left for the search.
    pub train_arcs: u64,
    /// Wrapping sum of mixes of every validation row and held-out arc (src/als/tune/;
    /// scripts/tune_implicit.py computes the same): equal digests, equal splits.
    pub digest: u64,
}

fn csr_from_rows(lo: u64, rows: &[Vec<u32>]) -> CsrShard {
    let mut indptr = Vec::with_capacity(rows.len() + 1);
    indptr.push(0u64);
    let mut indices = Vec::new();
    for r in rows {
        indices.extend_from_slice(r);
        indptr.push(indices.len() as u64);
    }
    CsrShard {
        lo,
        hi: lo + rows.len() as u64,
        indptr,
        indices,
        on_disk: None,
        weights: Vec::new(),
    }
}

/// Collective: every rank must call. The validation split of the training shards
/// `full` (module doc): shards whose training arcs exclude the validation rows and
/// whose "test" set is the validation rows. The real test rows are not carried over.
pub fn global_validation_shards<C: Comm>(
    comm: &C,
    full: &Shards,
    spec: ValSpec,
) -> Result<(Shards, ValStats)> {
    let rows = &full.rows;
    let nonempty: Vec<bool> = rows.indptr.windows(2).map(|w| w[1] > w[0]).collect();
    let is_val =
        global_select_rows_by(comm, rows.lo, &nonempty, spec.seed, stream::VAL_ROWS, |r| {
            spec.count(r)
        })?;
    let mut train_rows = Vec::with_capacity(rows.num_rows());
    let (mut val_rows, mut folds, mut holds) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &v) in is_val.iter().enumerate() {
        let arcs = &rows.indices[rows.indptr[i] as usize..rows.indptr[i + 1] as usize];
        if !v {
            train_rows.push(arcs.to_vec());
            continue;
        }
        let id = rows.lo + i as u64;
        let (mut fold, mut hold) = split_row_in(arcs, spec.seed, stream::VAL_HOLDOUT_SHUFFLE, id);
        fold.sort_unstable();
        hold.sort_unstable();
        val_rows.push(id as u32);
        folds.push(fold);
        holds.push(hold);
        train_rows.push(Vec::new());
    }
    let gathered = comm.all_gather_v(&val_rows)?;
    let all_val = gathered.data; // increasing: ranks own increasing row blocks
    let val_lo = prefix_offsets(&gathered.counts)[comm.rank()] as u64;
    let is_val_id = |r: u32| all_val.binary_search(&r).is_ok();
    let cols = &full.cols;
    let col_rows: Vec<Vec<u32>> = cols
        .indptr
        .windows(2)
        .map(|w| {
            cols.indices[w[0] as usize..w[1] as usize]
                .iter()
                .copied()
                .filter(|&r| !is_val_id(r))
                .collect()
        })
        .collect();
    let new_rows = csr_from_rows(rows.lo, &train_rows);
    let new_cols = csr_from_rows(cols.lo, &col_rows);
    let fold = csr_from_rows(val_lo, &folds);
    let holdout = csr_from_rows(val_lo, &holds);
    let mut sums = [fold.nnz(), holdout.nnz(), new_rows.nnz(), new_cols.nnz()];
    comm.all_reduce_sum(&mut sums);
    if sums[2] != sums[3] {
        return Err(Error::Comm(format!(
            "validation split: {} arcs left by rows but {} by columns",
            sums[2], sums[3]
        )));
    }
    // Each rank's wrapping sum over its rows and held-out arcs, gathered and summed.
    let mut mine = 0u64;
    for (i, &r) in val_rows.iter().enumerate() {
        mine = mine.wrapping_add(crate::rng::mix64(r as u64 ^ 0x5851_f42d_4c95_7f2d));
        for &c in &holdout.indices[holdout.indptr[i] as usize..holdout.indptr[i + 1] as usize] {
            let arc = ((r as u64) << 32) | c as u64;
            mine = mine.wrapping_add(crate::rng::mix64(arc ^ 0x2545_f491_4f6c_dd1d));
        }
    }
    let digest = comm
        .all_gather_v(&[mine])?
        .data
        .iter()
        .fold(0u64, |a, &x| a.wrapping_add(x));
    let stats = ValStats {
        rows: all_val.len() as u64,
        visible_arcs: sums[0],
        holdout_arcs: sums[1],
        train_arcs: sums[2],
        digest,
    };
    let shards = Shards {
        meta: full.meta.clone(),
        row_bounds: full.row_bounds.clone(),
        col_bounds: full.col_bounds.clone(),
        rows: new_rows,
        cols: new_cols,
        row_imbalance: full.row_imbalance,
        col_imbalance: full.col_imbalance,
        test_lo: val_lo,
        test_rows: val_rows,
        fold,
        holdout,
        num_test: stats.rows,
        layout: full.layout,
        // The dataset's: a validation split is never written into a model.
        arcs_checksum: full.arcs_checksum,
    };
    Ok((shards, stats))
}
