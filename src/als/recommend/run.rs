//! The block loop of `recommend`: each block's query vectors computed by their
//! owners (a trained row of W, a fold-in, or a unit row of H), all-gathered, scored by
//! every rank against its columns and merged on rank 0 (see the module docs).

use super::table::{unit, Table};
use super::MAX_BLOCK_CANDS;
use super::{Cols, Queries, RecBlock, RecSink, RecTimes, Recommender, HISTORY_ROW};
use crate::als::eval::{global_merge_topk, Cand, FoldPlan, ScoreRows};
use crate::als::model::TableScalar;
use crate::als::shard::bounds::owner_of;
use crate::ckpt::signals::Preemption;
use crate::comm::{prefix_offsets, Comm};
use crate::error::{Error, Result};
use std::ops::Range;
use std::time::Instant;

/// One query as its owner computes it.
enum Src<'a> {
    Row(u32),
    History(&'a [u32], &'a [f32]),
    Item(u32),
}

fn src(q: &Queries, i: usize) -> Src<'_> {
    match q {
        Queries::Rows(r) => Src::Row(r[i]),
        Queries::History { cols, conf } => Src::History(cols, conf),
        Queries::Items(c) => Src::Item(c[i]),
    }
}

/// This rank's part of a block: vectors (`rows x d`) and masks, in block order, and
/// the rows' positions in the block.
struct Part {
    x: Vec<f32>,
    mask_lens: Vec<u64>,
    mask: Vec<u32>,
    pos: Vec<u64>,
}

impl<T: TableScalar> Recommender<T> {
    /// Rows per block for `k` candidates per row: at most `block_rows`, and at most
    /// [`MAX_BLOCK_CANDS`] candidates per rank.
    pub fn rows_per_block(&self, k: usize) -> usize {
        self.block_rows.min(MAX_BLOCK_CANDS / k.max(1)).max(1)
    }

    /// The rank that computes query `i`'s vector: for a row, the owner of its test
    /// split (a test row) or of its training arcs; rank 0 for a history; the owner of
    /// the column's row of H for a similar-items query.
    fn query_owner(&self, q: &Queries, i: usize) -> usize {
        match src(q, i) {
            Src::Row(r) => self.owner(r),
            Src::History(..) => 0,
            Src::Item(c) => owner_of(&self.h_bounds, c as u64),
        }
    }

    /// Collective: every rank must call with the same `queries` (from
    /// [`Recommender::global_resolve`]), `cols` and `k`. Computes every query's top
    /// `k` block by block and hands each block to `sink` on rank 0 (`sink` is not
    /// called elsewhere; its errors stop every rank). Columns are those `cols` leaves;
    /// [`Queries::Items`] score by cosine. A preemption flag on any rank stops every
    /// rank between blocks with [`Error::Preempted`].
    pub fn global_run<C: Comm>(
        &self,
        comm: &C,
        queries: &Queries,
        cols: &Cols,
        k: usize,
        preempt: &Preemption,
        sink: &mut dyn RecSink,
    ) -> Result<RecTimes> {
        let mut times = RecTimes::default();
        let cosine = matches!(queries, Queries::Items(_));
        let table = self.local_table(cols, cosine, comm.rank());
        let block = self.rows_per_block(k);
        let total = queries.len();
        for (bi, first) in (0..total).step_by(block).enumerate() {
            if comm.rank() == 0 && crate::ckpt::faults::preempt_at() == Some(bi as u64) {
                preempt.raise();
            }
            if comm.all_reduce_max(u64::from(preempt.is_set())) != 0 {
                return Err(Error::Preempted(format!(
                    "signal received after {first} of {total} rows; nothing was written under the output name"
                )));
            }
            let range = first..(first + block).min(total);
            let out = self.global_block(comm, queries, range, table.as_ref(), k, &mut times)?;
            let t = Instant::now();
            let done = match out {
                Some(mut b) => {
                    b.first = first;
                    sink.block(&b, total)
                }
                None => Ok(()),
            };
            comm.agree(done)?;
            times.sink += t.elapsed().as_secs_f64();
        }
        Ok(times)
    }

    /// Collective: every rank must call. This rank's vectors and masks of the queries
    /// of `range` it owns: test rows and histories folded in ([`FoldPlan`], the solve
    /// evaluation uses), training rows from W, columns as unit rows of H.
    fn global_part<C: Comm>(&self, comm: &C, q: &Queries, range: Range<usize>) -> Result<Part> {
        let d = self.d;
        let me = comm.rank();
        let first = range.start;
        let mine: Vec<usize> = range.filter(|&i| self.query_owner(q, i) == me).collect();
        let mut fold_ip = vec![0u64];
        let mut fold = Vec::new();
        let mut fold_w = Vec::new();
        for &i in &mine {
            let (arcs, w) = match src(q, i) {
                Src::Row(r) => match self.test_pos(r) {
                    Some(pos) => (self.local_fold_arcs(pos), self.local_fold_confidences(pos)),
                    None => continue,
                },
                Src::History(c, w) => (c, w),
                Src::Item(_) => continue,
            };
            fold.extend_from_slice(arcs);
            fold_w.extend_from_slice(w);
            fold_ip.push(fold.len() as u64);
        }
        let plan =
            FoldPlan::global_build(comm, fold_ip, &fold, &self.h_bounds)?.with_weights(fold_w);
        let (folded, _) = plan.global_fold_in(comm, &self.h, d, &self.gram_h, self.params)?;
        drop(fold);
        let mut x = vec![0f32; mine.len() * d];
        let mut mask_lens = Vec::with_capacity(mine.len());
        let mut mask = Vec::new();
        let mut next_fold = 0;
        let w_lo = self.shards.row_bounds[me];
        let h_lo = self.h_bounds[me];
        for (j, &i) in mine.iter().enumerate() {
            let xr = &mut x[j * d..(j + 1) * d];
            let seen_from = mask.len();
            let mut take_fold = |xr: &mut [f32]| {
                xr.copy_from_slice(&folded[next_fold * d..(next_fold + 1) * d]);
                next_fold += 1;
            };
            match src(q, i) {
                Src::Row(row) => match self.test_pos(row) {
                    Some(pos) => {
                        take_fold(xr);
                        mask.extend_from_slice(self.local_fold_arcs(pos));
                        mask[seen_from..].sort_unstable();
                    }
                    None => {
                        let wi = (row as u64 - w_lo) as usize;
                        crate::bf16::widen(&self.w[wi * d..(wi + 1) * d], xr);
                        // Sorted and distinct (checked when the shard was read).
                        mask.extend_from_slice(self.local_train_arcs(row));
                    }
                },
                Src::History(c, _) => {
                    take_fold(xr);
                    mask.extend_from_slice(c);
                    mask[seen_from..].sort_unstable();
                }
                Src::Item(c) => {
                    let hi = (c as u64 - h_lo) as usize;
                    unit(&self.h[hi * d..(hi + 1) * d], xr);
                    // An item is not similar to itself.
                    mask.push(c);
                }
            }
            mask_lens.push((mask.len() - seen_from) as u64);
        }
        let pos = mine.iter().map(|&i| (i - first) as u64).collect();
        Ok(Part {
            x,
            mask_lens,
            mask,
            pos,
        })
    }

    /// Collective: every rank must call. One block: the top `k` of each query of
    /// `range`, on rank 0 (`None` elsewhere).
    fn global_block<C: Comm>(
        &self,
        comm: &C,
        q: &Queries,
        range: Range<usize>,
        table: Option<&Table>,
        k: usize,
        times: &mut RecTimes,
    ) -> Result<Option<RecBlock>> {
        let me = comm.rank();
        let t = Instant::now();
        let n = range.len();
        let ids: Vec<u32> = range
            .clone()
            .map(|i| match src(q, i) {
                Src::Row(r) | Src::Item(r) => r,
                Src::History(..) => HISTORY_ROW,
            })
            .collect();
        let part = self.global_part(comm, q, range)?;
        times.fold_in += t.elapsed().as_secs_f64();

        let t = Instant::now();
        let x_all = comm.all_gather_v(&part.x)?.data;
        let lens = comm.all_gather_v(&part.mask_lens)?;
        let mask_all = comm.all_gather_v(&part.mask)?.data;
        let pos_all = comm.all_gather_v(&part.pos)?.data;
        drop(part);
        times.gather += t.elapsed().as_secs_f64();

        let t = Instant::now();
        let mask_indptr =
            prefix_offsets(&lens.data.iter().map(|&l| l as usize).collect::<Vec<_>>());
        let cands = {
            let _p = comm.stats().phase("eval");
            let rows = ScoreRows {
                x: &x_all,
                mask_indptr: &mask_indptr,
                mask_cols: &mask_all,
            };
            self.local_score(rows, table, me, k)
        };
        drop((x_all, mask_all));
        times.score += t.elapsed().as_secs_f64();

        // Every rank's candidates of every row to rank 0, merged there.
        let t = Instant::now();
        let mut counts = vec![0usize; comm.size()];
        counts[0] = cands.len();
        let merged = {
            let _p = comm.stats().phase("merge");
            global_merge_topk(comm, &cands, &counts, k)?
        };
        times.merge += t.elapsed().as_secs_f64();
        if me != 0 {
            return Ok(None);
        }
        let mut b = RecBlock {
            rows: ids,
            topk: vec![u32::MAX; n * k],
            scores: vec![f32::NAN; n * k],
            first: 0,
        };
        for (g, ranking) in merged.chunks_exact(k).enumerate() {
            let at = pos_all[g] as usize * k;
            for (j, c) in ranking.iter().enumerate() {
                if c.col != Cand::NONE.col {
                    b.topk[at + j] = c.col;
                    b.scores[at + j] = c.score;
                }
            }
        }
        Ok(Some(b))
    }
}
