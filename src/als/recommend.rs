//! Recommendations from a trained model: for each asked row, the best `k` columns
//! over all of H, the row's seen arcs excluded, scored and merged exactly as
//! evaluation does ([`super::eval`]).
//!
//! A row's vector: a training row (one with training arcs) uses its trained row of W;
//! a test row is folded in from its visible arcs ([`FoldPlan`]: the exact solve
//! against H that evaluation uses). Its seen arcs — the training arcs, or the visible
//! arcs of a test row — are never ranked. Scores are f32 dot products by the same
//! tiled sgemm as evaluation ([`local_score_topk`]); ties go to the smaller column id
//! ([`Cand::better`]). Rows are renumbered in increasing order of their original id
//! (docs/design.md), so that is also the smaller original id.
//!
//! Distribution and memory: the asked rows are taken in blocks of at most
//! [`Recommender::block_rows`]. For each block, every row's owner (the rank holding
//! its training arcs or its test split) computes its vector and mask; the vectors and
//! masks are all-gathered; every rank scores the block against its own shard of H
//! (H is read in equal column ranges, so that every rank scores as many columns)
//! and keeps `k` candidates per row; rank 0 merges the `k` candidates of every rank
//! into each row's exact top `k` and hands the block, in the asked order and in
//! original ids, to a [`RecSink`]. Memory per rank is bounded by the block
//! (`block x d` vectors, `block x k x P` candidates on rank 0, the block's masks),
//! never by rows x columns. Between blocks the ranks agree on the preemption flag.

use super::eval::{global_merge_topk, local_score_topk, Cand, FoldPlan, ScoreRows};
use super::model::{data_checksum_hex, local_read_rows, stored_dtype, TableScalar, DATA_CHECKSUM};
use super::shard::bounds::owner_of;
use super::shard::read::{global_read_shards, Shards};
use super::solve::SolveParams;
use super::train::tables::global_gramian;
use super::AlsConfig;
use crate::bf16::TableDtype;
use crate::ckpt::signals::Preemption;
use crate::comm::{prefix_offsets, Comm};
use crate::io::h5::read_range;

use crate::blocks::block_range;
use crate::error::{Error, Result};
use crate::io::h5::open_h5;
use std::path::Path;
use std::time::Instant;

/// The `format` attribute of a model written by `als --out`.
pub const MODEL_FORMAT: &str = "torusrec-als-model";

/// Rows per block by default.
pub const DEFAULT_BLOCK_ROWS: usize = 4096;

/// At most this many candidates (`block x k`) per rank and block.
const MAX_BLOCK_CANDS: usize = 1 << 20;

/// How many ids an error message lists before "and N more".
const LIST_IDS: usize = 10;

/// Which rows to recommend for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Which {
    /// These original node ids, in this order (duplicates dropped).
    Nodes(Vec<u64>),
    /// Every test row, in increasing id order.
    Test,
    /// Every row that has training arcs or is a test row, in increasing id order
    /// (rows with nothing to fold in are left out and counted).
    All,
}

/// What a model file says about itself.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub config: AlsConfig,
    pub dim: usize,
    pub dtype: TableDtype,
    pub num_rows: u64,
    pub num_cols: u64,
    /// The checksum of the dataset the model was trained on ([`DATA_CHECKSUM`]; `None`
    /// in a model written before it was recorded).
    pub data_checksum: Option<String>,
}

/// `a, b, c (and N more)`: the first ids of a list for an error message.
pub fn list_ids<T: std::fmt::Display>(ids: &[T]) -> String {
    let mut s = ids
        .iter()
        .take(LIST_IDS)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if ids.len() > LIST_IDS {
        s.push_str(&format!(" (and {} more)", ids.len() - LIST_IDS));
    }
    s
}

/// Rank-local: read and check a model's header: the format, the training config, and
/// `/W`, `/H` as 2-D tables of the config's width and element type.
pub fn local_read_model_info(path: &Path) -> Result<ModelInfo> {
    use crate::io::h5::read_str_attr;
    let f = open_h5(path)?;
    let format = read_str_attr(&f, path, "format").map_err(|_| {
        Error::input(
            path,
            "not a model written by `als --out` (no format attribute)",
        )
    })?;
    if format != MODEL_FORMAT {
        return Err(Error::input(
            path,
            format!("format {format:?}: not a model written by `als --out` ({MODEL_FORMAT:?})"),
        ));
    }
    let config: AlsConfig = serde_json::from_str(&read_str_attr(&f, path, "config")?)
        .map_err(|e| Error::layout(path, "/ attribute config", format!("not a config: {e}")))?;
    let dim = config.dim;
    let mut shapes = [0u64; 2];
    for (i, name) in ["W", "H"].into_iter().enumerate() {
        let ds = f
            .dataset(name)
            .map_err(|_| Error::layout(path, name, "missing"))?;
        let shape = ds.shape();
        if shape.len() != 2 || shape[1] != dim {
            return Err(Error::layout(
                path,
                name,
                format!("shape {shape:?}, but the model's config has dim {dim}"),
            ));
        }
        let stored = stored_dtype(&ds);
        if stored != config.table_dtype {
            return Err(Error::layout(
                path,
                name,
                format!(
                    "holds {stored} values, but the model's config has table dtype {}",
                    config.table_dtype
                ),
            ));
        }
        shapes[i] = shape[0] as u64;
    }
    let data_checksum = if f.attr(DATA_CHECKSUM).is_ok() {
        Some(read_str_attr(&f, path, DATA_CHECKSUM)?)
    } else {
        None
    };
    Ok(ModelInfo {
        data_checksum,
        dtype: config.table_dtype,
        config,
        dim,
        num_rows: shapes[0],
        num_cols: shapes[1],
    })
}

/// Original node ids of the internal ids `0..n` (`/node_ids`; the identity when the
/// dataset has none).
#[derive(Debug, Clone)]
pub struct NodeIds {
    ids: Option<Vec<u64>>,
    /// `(original, internal)` sorted, when `ids` is not increasing.
    by_original: Option<Vec<(u64, u32)>>,
    n: u64,
}

impl NodeIds {
    /// Rank-local: read `/node_ids` of a dataset with `n` rows.
    pub fn local_read(path: &Path, n: u64) -> Result<Self> {
        let f = open_h5(path)?;
        if f.dataset("node_ids").is_err() {
            return Ok(Self {
                ids: None,
                by_original: None,
                n,
            });
        }
        let ids = read_range::<u64>(&f, path, "node_ids", 0, n)?;
        let len = crate::io::h5::dataset_len(&f, path, "node_ids")?;
        if len != n {
            return Err(Error::layout(
                path,
                "node_ids",
                format!("{len} entries, expected num_rows = {n}"),
            ));
        }
        Self::from_ids(ids).map_err(|dup| {
            Error::layout(path, "node_ids", format!("original id {dup} appears twice"))
        })
    }

    /// The map of `ids` (the original id of each internal id); a repeated original
    /// id is returned as the error.
    pub fn from_ids(ids: Vec<u64>) -> std::result::Result<Self, u64> {
        let by_original = if ids.windows(2).all(|w| w[0] < w[1]) {
            None
        } else {
            let mut v: Vec<(u64, u32)> = ids
                .iter()
                .enumerate()
                .map(|(i, &o)| (o, i as u32))
                .collect();
            v.sort_unstable();
            if let Some(w) = v.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(w[0].0);
            }
            Some(v)
        };
        Ok(Self {
            n: ids.len() as u64,
            ids: Some(ids),
            by_original,
        })
    }

    /// The original id of internal id `i`.
    pub fn original(&self, i: u32) -> u64 {
        match &self.ids {
            Some(ids) => ids[i as usize],
            None => i as u64,
        }
    }

    /// The internal id of an original id, if it is a node.
    pub fn internal(&self, orig: u64) -> Option<u32> {
        match (&self.ids, &self.by_original) {
            (None, _) => (orig < self.n).then_some(orig as u32),
            (Some(_), Some(v)) => v.binary_search_by_key(&orig, |p| p.0).ok().map(|i| v[i].1),
            (Some(ids), None) => ids.binary_search(&orig).ok().map(|i| i as u32),
        }
    }
}

/// One block of results on rank 0, rows in the asked order.
#[derive(Debug, Clone, Default)]
pub struct RecBlock {
    /// The rows' original node ids.
    pub nodes: Vec<u64>,
    /// `nodes.len() x k` original ids of the recommended columns, best first;
    /// `u64::MAX` pads a row with fewer than `k` unseen columns.
    pub topk: Vec<u64>,
    /// The matching scores (NaN where `topk` pads).
    pub scores: Vec<f32>,
    /// Position of the block's first row among all asked rows.
    pub first: usize,
}

/// Where rank 0 puts each finished block.
pub trait RecSink {
    fn block(&mut self, b: &RecBlock, total: usize) -> Result<()>;
}

/// This rank's seconds per part.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecTimes {
    pub fold_in: f64,
    pub gather: f64,
    pub score: f64,
    pub merge: f64,
    pub sink: f64,
}

/// A model and a dataset distributed over the ranks, ready to recommend.
pub struct Recommender<T: TableScalar> {
    d: usize,
    params: SolveParams,
    shards: Shards,
    /// Every test row id, increasing, and the ranks' blocks of them.
    all_test: Vec<u32>,
    test_bounds: Vec<u64>,
    ids: NodeIds,
    /// Boundaries of H over ranks: equal column counts (scoring costs the same per
    /// column whatever its non-zeros, unlike training's `col_bounds`).
    h_bounds: Vec<u64>,
    /// This rank's rows of W (`row_bounds`) and of H (`h_bounds`).
    w: Vec<T>,
    h: Vec<T>,
    gram_h: Vec<f64>,
    /// Rows per block.
    pub block_rows: usize,
}

impl<T: TableScalar> Recommender<T> {
    /// Collective: every rank must call. Reads this rank's shard of the dataset and of
    /// the model's tables (`info` from [`local_read_model_info`], the same on every
    /// rank) and the Gramian of H. A model of another dataset (other row or column
    /// counts, or another checksum of the training arcs, [`ModelInfo::data_checksum`])
    /// is refused (exit 2) naming both values.
    pub fn global_load<C: Comm>(
        comm: &C,
        model: &Path,
        info: &ModelInfo,
        data: &Path,
    ) -> Result<Self> {
        if T::DTYPE != info.dtype {
            return Err(Error::Config(format!(
                "internal: tables read as {} from a {} model",
                T::DTYPE,
                info.dtype
            )));
        }
        let mut shards = global_read_shards(comm, data)?;
        // A model trained with confidences folds its test rows in with them too.
        let conf = info.config.confidence;
        if conf.weighted() {
            let read = super::shard::read::local_read_confidences(data, &mut shards, conf);
            comm.agree(read)?;
        }
        // The column CSR is not needed: scoring reads H only.
        shards.cols = Default::default();
        let m = &shards.meta;
        let check = if m.num_rows != info.num_rows || m.num_cols != info.num_cols {
            Err(Error::input(
                model,
                format!(
                    "a model of {} rows x {} columns (/W, /H), but {} has {} rows x {} columns: a model of another dataset",
                    info.num_rows,
                    info.num_cols,
                    crate::error::short_path(data),
                    m.num_rows,
                    m.num_cols
                ),
            ))
        } else if let Some(c) = info
            .data_checksum
            .as_ref()
            .filter(|&c| *c != data_checksum_hex(shards.arcs_checksum))
        {
            Err(Error::input(
                model,
                format!(
                    "trained on {} (training arcs checksum {c}), but {} has checksum {}: a model of another dataset",
                    crate::error::short_path(&info.config.data),
                    crate::error::short_path(data),
                    data_checksum_hex(shards.arcs_checksum)
                ),
            ))
        } else if m.num_rows != m.num_cols {
            Err(Error::layout(
                data,
                "/",
                format!(
                    "{} rows but {} columns: recommendations need the nodes as both",
                    m.num_rows, m.num_cols
                ),
            ))
        } else {
            Ok(())
        };
        // Identical on every rank: `agree` leaves the message to rank 0 alone.
        comm.agree(check)?;
        let (r, d, p) = (comm.rank(), info.dim, comm.size());
        let bounds = |n: u64| -> Vec<u64> {
            (0..=p)
                .map(|q| if q == p { n } else { block_range(n, p, q).0 })
                .collect()
        };
        let h_bounds = bounds(shards.meta.num_cols);
        let loaded = (|| -> Result<_> {
            let ids = NodeIds::local_read(data, shards.meta.num_rows)?;
            let f = open_h5(model)?;
            let (w0, w1) = (shards.row_bounds[r], shards.row_bounds[r + 1]);
            let (h0, h1) = (h_bounds[r], h_bounds[r + 1]);
            let w = local_read_rows::<T>(&f, model, "W", w0, w1, d)?;
            let h = local_read_rows::<T>(&f, model, "H", h0, h1, d)?;
            // A NaN or Inf would score nothing (or everything): refuse the model.
            for (name, t, lo) in [("W", &w, w0), ("H", &h, h0)] {
                if let Some(i) = t.iter().position(|x| !x.to_f32().is_finite()) {
                    return Err(Error::layout(
                        model,
                        name,
                        format!(
                            "row {} holds a non-finite value",
                            lo + (i / d.max(1)) as u64
                        ),
                    ));
                }
            }
            Ok((ids, w, h))
        })();
        let (ids, w, h) = comm.agree(loaded)?;
        let all_test = comm.all_gather_v(&shards.test_rows)?.data;
        let test_bounds = bounds(shards.num_test);
        let gram_h = global_gramian(comm, &h, d);
        let params = SolveParams {
            reg: info.config.reg,
            alpha0: info.config.unobserved_weight,
            n_other: shards.meta.num_cols as f64,
        };
        Ok(Self {
            d,
            params,
            shards,
            all_test,
            test_bounds,
            h_bounds,
            ids,
            w,
            h,
            gram_h,
            block_rows: DEFAULT_BLOCK_ROWS,
        })
    }

    pub fn num_rows(&self) -> u64 {
        self.shards.meta.num_rows
    }
    pub fn num_cols(&self) -> u64 {
        self.shards.meta.num_cols
    }
    pub fn num_test(&self) -> u64 {
        self.shards.num_test
    }

    /// The position of `row` among the test rows, if it is one.
    fn test_pos(&self, row: u32) -> Option<usize> {
        self.all_test.binary_search(&row).ok()
    }

    /// This rank's training arcs of `row` (which it must own by `row_bounds`).
    fn local_train_arcs(&self, row: u32) -> &[u32] {
        let s = &self.shards.rows;
        let i = (row as u64 - s.lo) as usize;
        &s.indices[s.indptr[i] as usize..s.indptr[i + 1] as usize]
    }

    /// The visible arcs of the test row at position `pos` (owned by this rank).
    fn local_fold_arcs(&self, pos: usize) -> &[u32] {
        let f = &self.shards.fold;
        let i = pos - self.shards.test_lo as usize;
        &f.indices[f.indptr[i] as usize..f.indptr[i + 1] as usize]
    }

    /// The confidences beside [`Self::local_fold_arcs`] (empty for a binary model).
    fn local_fold_confidences(&self, pos: usize) -> &[f32] {
        let f = &self.shards.fold;
        let i = pos - self.shards.test_lo as usize;
        match f.weights() {
            Some(w) => &w[f.indptr[i] as usize..f.indptr[i + 1] as usize],
            None => &[],
        }
    }

    /// The rank that computes `row`'s vector: the owner of its test split for a test
    /// row, else the owner of its training arcs.
    fn owner(&self, row: u32) -> usize {
        match self.test_pos(row) {
            Some(pos) => owner_of(&self.test_bounds, pos as u64),
            None => owner_of(&self.shards.row_bounds, row as u64),
        }
    }

    /// Collective: every rank must call (with the same `which`). The asked rows as
    /// internal ids, the same on every rank, and (for [`Which::All`]) how many rows
    /// were left out for having nothing to fold in. An id that is not a node, or a
    /// row with nothing to fold in (no training arc and not a test row), fails on
    /// every rank with exit 2, naming the ids (rank 0 reports: the error is the same
    /// everywhere and [`Comm::agree`] keeps the lowest rank's).
    pub fn global_resolve<C: Comm>(&self, comm: &C, which: &Which) -> Result<(Vec<u32>, u64)> {
        let s = &self.shards.rows;
        let empty_here = |row: u32| -> bool {
            self.test_pos(row).is_none() && {
                let i = (row as u64 - s.lo) as usize;
                s.indptr[i] == s.indptr[i + 1]
            }
        };
        match which {
            Which::Test => Ok((self.all_test.clone(), 0)),
            Which::All => {
                let usable: Vec<u32> = (s.lo as u32..s.hi as u32)
                    .filter(|&r| !empty_here(r))
                    .collect();
                let rows = comm.all_gather_v(&usable)?.data;
                let left_out = self.num_rows() - rows.len() as u64;
                Ok((rows, left_out))
            }
            Which::Nodes(nodes) => {
                let mut seen = std::collections::HashSet::new();
                let mut rows = Vec::with_capacity(nodes.len());
                let mut unknown = Vec::new();
                for &n in nodes {
                    if !seen.insert(n) {
                        continue;
                    }
                    match self.ids.internal(n) {
                        Some(r) => rows.push(r),
                        None => unknown.push(n),
                    }
                }
                let bad = if unknown.is_empty() {
                    Ok(())
                } else {
                    Err(Error::Config(format!(
                        "{} node id(s) are not nodes of the dataset: {}",
                        unknown.len(),
                        list_ids(&unknown)
                    )))
                };
                comm.agree(bad)?;
                // Rows with nothing to fold in: each rank checks the rows it holds.
                let mine: Vec<u64> = rows
                    .iter()
                    .filter(|&&r| (r as u64) >= s.lo && (r as u64) < s.hi && empty_here(r))
                    .map(|&r| self.ids.original(r))
                    .collect();
                let mut empty = comm.all_gather_v(&mine)?.data;
                empty.sort_unstable();
                let bad = if empty.is_empty() {
                    Ok(())
                } else {
                    Err(Error::Config(format!(
                        "{} node id(s) have nothing to recommend from (no training arc, not a test row with visible arcs): {}",
                        empty.len(),
                        list_ids(&empty)
                    )))
                };
                comm.agree(bad)?;
                Ok((rows, 0))
            }
        }
    }

    /// Rows per block for `k` candidates per row: at most `block_rows`, and at most
    /// [`MAX_BLOCK_CANDS`] candidates per rank.
    pub fn rows_per_block(&self, k: usize) -> usize {
        self.block_rows.min(MAX_BLOCK_CANDS / k.max(1)).max(1)
    }

    /// Collective: every rank must call with the same `rows` (from
    /// [`Recommender::global_resolve`]) and `k`. Computes every row's top `k` block by
    /// block and hands each block to `sink` on rank 0 (`sink` is not called
    /// elsewhere; its errors stop every rank). A preemption flag on any rank stops
    /// every rank between blocks with [`Error::Preempted`].
    pub fn global_run<C: Comm>(
        &self,
        comm: &C,
        rows: &[u32],
        k: usize,
        preempt: &Preemption,
        sink: &mut dyn RecSink,
    ) -> Result<RecTimes> {
        let mut times = RecTimes::default();
        let block = self.rows_per_block(k);
        let total = rows.len();
        for (bi, chunk) in rows.chunks(block).enumerate() {
            let first = bi * block;
            if comm.rank() == 0 && crate::ckpt::faults::preempt_at() == Some(bi as u64) {
                preempt.raise();
            }
            if comm.all_reduce_max(u64::from(preempt.is_set())) != 0 {
                return Err(Error::Preempted(format!(
                    "signal received after {first} of {total} rows; nothing was written under the output name"
                )));
            }
            let out = self.global_block(comm, chunk, k, &mut times)?;
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

    /// Collective: every rank must call. One block: the top `k` of each row of
    /// `chunk`, on rank 0 (`None` elsewhere).
    fn global_block<C: Comm>(
        &self,
        comm: &C,
        chunk: &[u32],
        k: usize,
        times: &mut RecTimes,
    ) -> Result<Option<RecBlock>> {
        let d = self.d;
        let me = comm.rank();
        let t = Instant::now();
        // This rank's rows of the block, in block order.
        let mine: Vec<usize> = (0..chunk.len())
            .filter(|&i| self.owner(chunk[i]) == me)
            .collect();
        // Fold in the test rows among them.
        let mut fold_ip = vec![0u64];
        let mut fold = Vec::new();
        let mut fold_w = Vec::new();
        for &i in &mine {
            if let Some(pos) = self.test_pos(chunk[i]) {
                fold.extend_from_slice(self.local_fold_arcs(pos));
                fold_w.extend_from_slice(self.local_fold_confidences(pos));
                fold_ip.push(fold.len() as u64);
            }
        }
        let plan =
            FoldPlan::global_build(comm, fold_ip, &fold, &self.h_bounds)?.with_weights(fold_w);
        let (folded, _) = plan.global_fold_in(comm, &self.h, d, &self.gram_h, self.params)?;
        drop(fold);
        // Vectors and masks (seen arcs, increasing) in block order.
        let mut x = vec![0f32; mine.len() * d];
        let mut mask_lens = Vec::with_capacity(mine.len());
        let mut mask = Vec::new();
        let mut next_fold = 0;
        let w_lo = self.shards.row_bounds[me];
        for (j, &i) in mine.iter().enumerate() {
            let row = chunk[i];
            let xr = &mut x[j * d..(j + 1) * d];
            let seen_from = mask.len();
            match self.test_pos(row) {
                Some(pos) => {
                    xr.copy_from_slice(&folded[next_fold * d..(next_fold + 1) * d]);
                    next_fold += 1;
                    mask.extend_from_slice(self.local_fold_arcs(pos));
                    mask[seen_from..].sort_unstable();
                }
                None => {
                    let wi = (row as u64 - w_lo) as usize;
                    crate::bf16::widen(&self.w[wi * d..(wi + 1) * d], xr);
                    // Sorted and distinct (checked when the shard was read).
                    mask.extend_from_slice(self.local_train_arcs(row));
                }
            }
            mask_lens.push((mask.len() - seen_from) as u64);
        }
        drop(folded);
        times.fold_in += t.elapsed().as_secs_f64();

        let t = Instant::now();
        let x_all = comm.all_gather_v(&x)?.data;
        let lens = comm.all_gather_v(&mask_lens)?;
        let mask_all = comm.all_gather_v(&mask)?.data;
        let pos: Vec<u64> = mine.iter().map(|&i| i as u64).collect();
        let pos_all = comm.all_gather_v(&pos)?.data;
        drop((x, mask));
        times.gather += t.elapsed().as_secs_f64();

        let t = Instant::now();
        let mask_indptr =
            prefix_offsets(&lens.data.iter().map(|&l| l as usize).collect::<Vec<_>>());
        let cands = {
            let _p = comm.stats().phase("eval");
            local_score_topk(
                ScoreRows {
                    x: &x_all,
                    mask_indptr: &mask_indptr,
                    mask_cols: &mask_all,
                },
                &self.h,
                self.h_bounds[me],
                d,
                k,
            )
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
        let n = chunk.len();
        let mut b = RecBlock {
            nodes: chunk.iter().map(|&r| self.ids.original(r)).collect(),
            topk: vec![u64::MAX; n * k],
            scores: vec![f32::NAN; n * k],
            first: 0,
        };
        for (g, ranking) in merged.chunks_exact(k).enumerate() {
            let at = pos_all[g] as usize * k;
            for (j, c) in ranking.iter().enumerate() {
                if c.col != Cand::NONE.col {
                    b.topk[at + j] = self.ids.original(c.col);
                    b.scores[at + j] = c.score;
                }
            }
        }
        Ok(Some(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_ids_cuts_at_ten_with_a_count() {
        assert_eq!(list_ids(&[3, 1]), "3, 1");
        let many: Vec<u32> = (0..13).collect();
        assert_eq!(list_ids(&many), "0, 1, 2, 3, 4, 5, 6, 7, 8, 9 (and 3 more)");
    }

    #[test]
    fn node_ids_map_both_ways_sorted_or_not() {
        for ids in [vec![7u64, 1007, 2007, 9000], vec![2007, 7, 9000, 1007]] {
            let m = NodeIds::from_ids(ids.clone()).unwrap();
            for (i, &o) in ids.iter().enumerate() {
                assert_eq!(m.original(i as u32), o);
                assert_eq!(m.internal(o), Some(i as u32));
            }
            assert_eq!(m.internal(8), None);
            assert_eq!(m.internal(u64::MAX), None);
        }
        assert_eq!(NodeIds::from_ids(vec![5, 3, 5]).err(), Some(5));
        let identity = NodeIds {
            ids: None,
            by_original: None,
            n: 4,
        };
        assert_eq!(identity.internal(3), Some(3));
        assert_eq!(identity.internal(4), None);
        assert_eq!(identity.original(2), 2);
    }
}
