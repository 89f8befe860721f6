//! The WebGraph variant protocol of docs/design.md, distributed over the ranks.
//!
//! Each rank owns a contiguous block of source nodes. Steps:
//! 1. drop self-loops and duplicate arcs (rank-local, rows are whole on one rank);
//! 2. in-degrees all-reduced, out-degrees local;
//! 3. keep nodes with out-degree >= K and in-degree >= K (one pass); the kept mask is
//!    all-gathered so every rank can renumber targets;
//! 4. keep arcs whose both ends are kept;
//! 5. renumber kept nodes 0..n-1 in increasing original id (a prefix sum of the mask).
//!
//! Split: among the r non-empty rows, the floor(r/10) rows with the smallest
//! `hash(seed, row)` are test rows — found exactly with an all-reduced histogram of
//! the hash's top bits and a gather of the one boundary bucket, so the choice does not
//! depend on the number of ranks. A test row's arcs are shuffled with a generator
//! seeded by `(seed, row)`; the first `max(1, floor(n/4))` are held out.
//! The training transpose is built with one all-to-all-v of (column, row) pairs.
//!
//! [`global_prepare`] holds a rank's whole block in memory (several copies) and is the
//! reference the streaming path (`super::stream`, used by `prepare` and
//! `generate webgraph`) is tested against; the split helpers here serve both.

use super::readers::SourceInfo;
use super::rows::LocalRows;
use crate::blocks::block_range;
use crate::comm::{prefix_offsets, Comm};
use crate::error::{Error, Result};
use crate::rng::{hash3, stream, SplitMix64};
use rayon::prelude::*;

/// A rank's part of a prepared dataset, in the new (kept) numbering.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalSplit {
    /// Training arcs of the owned rows (test rows are empty); `train.lo` is the first row.
    pub train: LocalRows,
    /// The transpose for the owned block of columns; `train_t.lo` is the first column.
    pub train_t: LocalRows,
    /// Owned test rows (global ids, increasing).
    pub test_rows: Vec<u32>,
    /// Visible (fold-in) arcs of each owned test row.
    pub fold: LocalRows,
    /// Held-out arcs of each owned test row.
    pub holdout: LocalRows,
    /// Original id of each owned row.
    pub node_ids: Vec<u64>,
}

/// Global facts of the prepared dataset (the root attributes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMeta {
    pub num_rows: u64,
    pub num_cols: u64,
    pub min_links: u64,
    pub seed: u64,
    pub source: String,
    pub source_nodes: u64,
    pub source_arcs: u64,
}

/// Collective: every rank must call, with the kept mask of its block of rows (blocks
/// in rank order cover the `n` nodes). Steps 3 and 5: the mask is all-gathered and
/// turned into the renumbering, `new_id[u]` = the number of kept nodes before `u`
/// (`u32::MAX` for a removed node), returned with the number of kept nodes. A filter
/// that keeps no node is an input error of `name`, the same on every rank.
pub(super) fn global_renumber<C: Comm>(
    comm: &C,
    local_kept: Vec<u8>,
    n: usize,
    name: &str,
    min_links: u64,
) -> Result<(Vec<u32>, u64)> {
    let kept = comm.all_gather_v(&local_kept)?.data;
    drop(local_kept);
    debug_assert_eq!(kept.len(), n);
    let mut new_id = vec![u32::MAX; n];
    let mut next: u64 = 0;
    for (u, &k) in kept.iter().enumerate() {
        if k != 0 {
            new_id[u] = next as u32;
            next += 1;
        }
    }
    drop(kept);
    let num_kept = next;
    // The same on every rank; agreeing prints it once.
    let nonempty = if num_kept == 0 {
        Err(Error::Input {
            path: name.into(),
            msg: format!(
                "no node has at least {min_links} in-links and {min_links} out-links: the filter leaves an empty graph"
            ),
        })
    } else {
        Ok(())
    };
    comm.agree(nonempty)?;
    Ok((new_id, num_kept))
}

/// Collective: every rank must call, with its block of the cleaned-or-not input.
/// Applies the variant filter and the split. Errors (such as a filter that empties
/// the graph) are returned identically on every rank.
pub fn global_prepare<C: Comm>(
    comm: &C,
    info: &SourceInfo,
    mut rows: LocalRows,
    min_links: u64,
    seed: u64,
) -> Result<(SplitMeta, LocalSplit)> {
    let _phase = comm.stats().phase("prepare");
    let n = info.nodes as usize;
    rows.local_clean();

    // 2. Degrees.
    let mut in_deg = vec![0u64; n];
    for &t in &rows.targets {
        in_deg[t as usize] += 1;
    }
    comm.all_reduce_sum(&mut in_deg);

    // 3. Kept mask for the owned block, then for everyone.
    let local_kept: Vec<u8> = (0..rows.num_rows())
        .map(|i| {
            let u = rows.lo as usize + i;
            let out = rows.indptr[i + 1] - rows.indptr[i];
            u8::from(out >= min_links && in_deg[u] >= min_links)
        })
        .collect();
    drop(in_deg);
    // 5. Renumbering.
    let (new_id, num_kept) = global_renumber(comm, local_kept, n, &info.name, min_links)?;

    // 4. Filter and renumber the owned rows.
    let block_lo = rows.lo as usize;
    let mut node_ids = Vec::new();
    let mut kept_rows: Vec<Vec<u32>> = Vec::new();
    for i in 0..rows.num_rows() {
        let u = rows.lo as usize + i;
        if new_id[u] == u32::MAX {
            continue;
        }
        node_ids.push(u as u64);
        kept_rows.push(
            rows.row(i)
                .iter()
                .filter_map(|&t| Some(new_id[t as usize]).filter(|&v| v != u32::MAX))
                .collect(),
        );
    }
    drop(rows);
    // Our rows keep their order, so they start at the first kept id in our block.
    let row_lo = new_id[block_lo..]
        .iter()
        .find(|&&v| v != u32::MAX)
        .map_or(num_kept, |&v| v as u64);
    drop(new_id);
    let filtered = LocalRows::from_rows(row_lo, kept_rows);
    let num_arcs = {
        let mut a = [filtered.num_arcs()];
        comm.all_reduce_sum(&mut a);
        a[0]
    };
    let has_arcs = if num_arcs == 0 {
        Err(Error::Input {
            path: info.name.clone().into(),
            msg: format!("the filter with K = {min_links} keeps {num_kept} nodes but no arcs"),
        })
    } else {
        Ok(())
    };
    comm.agree(has_arcs)?;

    // Split.
    let is_test = global_select_test_rows(comm, &filtered, seed)?;
    let mut train_rows = Vec::with_capacity(filtered.num_rows());
    let mut test_rows = Vec::new();
    let mut fold_rows = Vec::new();
    let mut holdout_rows = Vec::new();
    for (i, &test) in is_test.iter().enumerate() {
        let row = filtered.row(i);
        if !test {
            train_rows.push(row.to_vec());
            continue;
        }
        let id = filtered.lo + i as u64;
        let (mut fold, mut holdout) = split_test_row(row, seed, id);
        fold.sort_unstable();
        holdout.sort_unstable();
        test_rows.push(id as u32);
        fold_rows.push(fold);
        holdout_rows.push(holdout);
        train_rows.push(Vec::new());
    }
    let train = LocalRows::from_rows(row_lo, train_rows);
    let train_t = global_transpose(comm, &train, num_kept)?;
    let meta = SplitMeta {
        num_rows: num_kept,
        num_cols: num_kept,
        min_links,
        seed,
        source: info.name.clone(),
        source_nodes: info.nodes,
        source_arcs: info.arcs,
    };
    Ok((
        meta,
        LocalSplit {
            train,
            train_t,
            test_rows,
            fold: LocalRows::from_rows(0, fold_rows),
            holdout: LocalRows::from_rows(0, holdout_rows),
            node_ids,
        },
    ))
}

/// Split one test row's arcs into (visible fold-in, held out): shuffle with the
/// generator of `(seed, row)`, hold out the first `max(1, floor(n/4))`.
pub fn split_test_row(arcs: &[u32], seed: u64, row: u64) -> (Vec<u32>, Vec<u32>) {
    split_row_in(arcs, seed, stream::HOLDOUT_SHUFFLE, row)
}

/// [`split_test_row`] with the shuffle drawn from another stream (the validation
/// split of `tune` uses its own, so it never repeats the test split's draws).
pub fn split_row_in(
    arcs: &[u32],
    seed: u64,
    shuffle_stream: u64,
    row: u64,
) -> (Vec<u32>, Vec<u32>) {
    let mut a = arcs.to_vec();
    SplitMix64::for_id(seed, shuffle_stream, row).shuffle(&mut a);
    let h = (a.len() / 4).max(1).min(a.len());
    let fold = a.split_off(h);
    (fold, a)
}

const HIST_BITS: u32 = 16;

/// Collective: every rank must call. Marks the test rows among the owned rows:
/// the `floor(r / 10)` non-empty rows (globally) with the smallest `(hash, row)`.
pub fn global_select_test_rows<C: Comm>(
    comm: &C,
    rows: &LocalRows,
    seed: u64,
) -> Result<Vec<bool>> {
    let nonempty: Vec<bool> = rows.indptr.windows(2).map(|w| w[1] > w[0]).collect();
    global_select_test_rows_by(comm, rows.lo, &nonempty, seed)
}

/// Collective: every rank must call. [`global_select_test_rows`] given only which of
/// the owned rows `lo, lo + 1, ..` are non-empty.
pub fn global_select_test_rows_by<C: Comm>(
    comm: &C,
    lo: u64,
    nonempty: &[bool],
    seed: u64,
) -> Result<Vec<bool>> {
    global_select_rows_by(comm, lo, nonempty, seed, stream::TEST_ROWS, |r| r / 10)
}

/// Collective: every rank must call. Marks, among the owned rows `lo, lo + 1, ..`, the
/// `count(r)` non-empty rows (of the r non-empty rows globally) with the smallest
/// `(hash3(seed, key_stream, row), row)`: the test split's rule with another stream
/// and count (`tune`'s validation split). The same rows at any rank count.
pub fn global_select_rows_by<C: Comm>(
    comm: &C,
    lo: u64,
    nonempty: &[bool],
    seed: u64,
    key_stream: u64,
    count: impl Fn(u64) -> u64,
) -> Result<Vec<bool>> {
    let key = |i: usize| hash3(seed, key_stream, lo + i as u64);
    let num_rows = nonempty.len();
    let mut hist = vec![0u64; 1 << HIST_BITS];
    for (i, _) in nonempty.iter().enumerate().filter(|(_, &ne)| ne) {
        hist[(key(i) >> (64 - HIST_BITS)) as usize] += 1;
    }
    comm.all_reduce_sum(&mut hist);
    let r: u64 = hist.iter().sum();
    let k = count(r).min(r);
    // Bucket b where the k-th smallest key lies: all of buckets < b are test rows.
    let mut below = 0u64;
    let mut b = hist.len();
    for (i, &c) in hist.iter().enumerate() {
        if below + c > k {
            b = i;
            break;
        }
        below += c;
    }
    // Gather the (key, row) pairs of bucket b and take the first k - below of them.
    let mut mine = Vec::new();
    if b < hist.len() {
        for (i, _) in nonempty.iter().enumerate().filter(|(_, &ne)| ne) {
            if (key(i) >> (64 - HIST_BITS)) as usize == b {
                mine.extend_from_slice(&[key(i), lo + i as u64]);
            }
        }
    }
    let all = comm.all_gather_v(&mine)?.data;
    let mut pairs: Vec<(u64, u64)> = all.chunks_exact(2).map(|c| (c[0], c[1])).collect();
    pairs.sort_unstable();
    let need = (k - below) as usize;
    let threshold = if need == 0 {
        None
    } else {
        Some(pairs[need - 1])
    };
    Ok((0..num_rows)
        .map(|i| {
            if !nonempty[i] {
                return false;
            }
            let kk = key(i);
            let bucket = (kk >> (64 - HIST_BITS)) as usize;
            bucket < b || (bucket == b && threshold.is_some_and(|t| (kk, lo + i as u64) <= t))
        })
        .collect())
}

/// Collective: every rank must call. The transpose of the distributed CSR `rows`
/// (rows of `0..n` in contiguous blocks, columns `0..n`): rank r receives the
/// columns of `block_range(n, P, r)`, each column's rows sorted.
pub fn global_transpose<C: Comm>(comm: &C, rows: &LocalRows, n: u64) -> Result<LocalRows> {
    let p = comm.size();
    let owner_lo: Vec<u64> = (0..=p)
        .map(|r| if r == p { n } else { block_range(n, p, r).0 })
        .collect();
    let owner = |c: u32| owner_lo.partition_point(|&lo| lo <= c as u64) - 1;
    let mut counts = vec![0usize; p];
    for &c in &rows.targets {
        counts[owner(c)] += 2;
    }
    let offsets = prefix_offsets(&counts);
    let mut fill = offsets[..p].to_vec();
    let mut send = vec![0u32; rows.targets.len() * 2];
    for i in 0..rows.num_rows() {
        let row = (rows.lo + i as u64) as u32;
        for &c in rows.row(i) {
            let o = owner(c);
            send[fill[o]] = c;
            send[fill[o] + 1] = row;
            fill[o] += 2;
        }
    }
    let recv = comm.all_to_all_v(&send, &counts)?;
    drop(send);
    let (lo, hi) = block_range(n, p, comm.rank());
    // Pairs arrive by source rank (increasing row blocks), rows increasing within,
    // so a stable counting sort by column leaves each column's rows sorted.
    let pairs: Vec<(u32, u32)> = recv
        .data
        .par_chunks_exact(2)
        .map(|c| (c[0], c[1]))
        .collect();
    Ok(LocalRows::from_pairs(lo, hi, &pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holdout_is_a_quarter_at_least_one() {
        for n in [1usize, 2, 3, 4, 7, 8, 100] {
            let arcs: Vec<u32> = (0..n as u32).collect();
            let (fold, hold) = split_test_row(&arcs, 5, 9);
            assert_eq!(hold.len(), (n / 4).max(1));
            assert_eq!(fold.len() + hold.len(), n);
            let mut all = [fold, hold].concat();
            all.sort_unstable();
            assert_eq!(all, arcs);
        }
        assert_eq!(
            split_test_row(&[1, 2, 3, 4, 5, 6, 7, 8], 5, 9),
            split_test_row(&[1, 2, 3, 4, 5, 6, 7, 8], 5, 9)
        );
    }
}
