//! Recommendations from a trained model: for each asked row, the best `k` columns
//! over all of H, the row's seen arcs excluded, scored and merged exactly as
//! evaluation does ([`super::eval`]). Rows are a graph's nodes or a user x item
//! dataset's users; besides rows, a query may be a history of columns folded in as a
//! new row ([`Which::History`]) or a column whose most similar columns are asked
//! ([`Which::Similar`], cosine on H). Columns may be excluded or restricted to a list
//! ([`ColFilter`]). Ids in and out are the dataset's original ids ([`ids`]).
//!
//! A row's vector: a training row (one with training arcs) uses its trained row of W;
//! a test row is folded in from its visible arcs ([`super::eval::FoldPlan`]: the exact solve
//! against H that evaluation uses). Its seen arcs — the training arcs, or the visible
//! arcs of a test row — are never ranked. Scores are f32 dot products by the same
//! tiled sgemm as evaluation ([`super::eval::local_score_topk`]); ties go to the smaller
//! column id ([`super::eval::Cand::better`]). Rows are renumbered in increasing order of their original id
//! (docs/design.md), so that is also the smaller original id.
//!
//! A history is folded in by the same [`super::eval::FoldPlan`] solve as a test row
//! (its columns in the order given, so the same columns in a test row's order give
//! the test row's bits); its columns are its seen arcs. A similar-items query is a
//! column's row of H scaled to unit length, scored against the unit rows of H (its
//! cosines); the column itself is its one seen arc. An exclude or allow list makes
//! every rank score an f32 copy of its shard of H restricted to the columns left
//! ([`table`]); without one, ranks score their shard as it is.
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

pub mod ids;
mod run;
mod table;

use super::model::{data_checksum_hex, local_read_rows, stored_dtype, TableScalar, DATA_CHECKSUM};
use super::shard::bounds::owner_of;
use super::shard::read::{global_read_shards, Shards};
use super::solve::SolveParams;
use super::train::tables::global_gramian;
use super::{AlsConfig, Confidence};
use crate::bf16::TableDtype;
use crate::comm::Comm;
use ids::resolve_ids;
pub use ids::{parse_id_list, read_id_file, IdMap, IdTok, NodeIds};

use crate::blocks::block_range;
use crate::error::{Error, Result};
use crate::io::h5::open_h5;
use std::path::Path;

/// The `format` attribute of a model written by `als --out`.
pub const MODEL_FORMAT: &str = "torusrec-als-model";

/// Rows per block by default.
pub const DEFAULT_BLOCK_ROWS: usize = 4096;

/// At most this many candidates (`block x k`) per rank and block.
const MAX_BLOCK_CANDS: usize = 1 << 20;

/// How many ids an error message lists before "and N more".
const LIST_IDS: usize = 10;

/// What the dataset's rows and columns are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A graph: rows and columns are the nodes (`/node_ids`).
    Graph,
    /// `prepare --matrix user-item`: rows are users (`/user_ids`), columns items
    /// (`/item_ids`).
    UserItem,
}

/// What to recommend for.
#[derive(Debug, Clone, PartialEq)]
pub enum Which {
    /// These rows by original id (nodes or users), in this order (duplicates dropped).
    Nodes(Vec<IdTok>),
    /// One new row folded in from these columns (original ids) and raw weights (as a
    /// dataset's `weights`; 1 for a binary model), in this order (duplicates dropped).
    History(Vec<(IdTok, f32)>),
    /// For each of these columns (original ids, duplicates dropped), the most similar
    /// other columns by cosine of their rows of H.
    Similar(Vec<IdTok>),
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

/// Columns never recommended ([`ColFilter::exclude`]) and, when given, the only
/// columns recommended ([`ColFilter::allow`]), as original ids.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ColFilter {
    pub exclude: Vec<IdTok>,
    pub allow: Option<Vec<IdTok>>,
}

/// A [`ColFilter`] in internal column ids, increasing and distinct.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cols {
    pub exclude: Vec<u32>,
    pub allow: Option<Vec<u32>>,
}

/// Resolved queries, in internal ids, the same on every rank.
#[derive(Debug, Clone, PartialEq)]
pub enum Queries {
    Rows(Vec<u32>),
    /// One folded-in row: its columns and their confidences (empty: binary).
    History {
        cols: Vec<u32>,
        conf: Vec<f32>,
    },
    Items(Vec<u32>),
}

impl Queries {
    pub fn len(&self) -> usize {
        match self {
            Queries::Rows(r) => r.len(),
            Queries::History { .. } => 1,
            Queries::Items(c) => c.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// [`RecBlock::rows`] of a history query.
pub const HISTORY_ROW: u32 = u32::MAX;

/// One block of results on rank 0, rows in the asked order.
#[derive(Debug, Clone, Default)]
pub struct RecBlock {
    /// The queries' internal ids: rows, or columns for [`Queries::Items`];
    /// [`HISTORY_ROW`] for a history.
    pub rows: Vec<u32>,
    /// `rows.len() x k` internal ids of the recommended columns, best first;
    /// `u32::MAX` pads a row with fewer than `k` columns to recommend.
    pub topk: Vec<u32>,
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
    kind: Kind,
    row_ids: IdMap,
    /// `None`: the rows' (a graph).
    col_ids: Option<IdMap>,
    conf: Confidence,
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
        let kind = comm.agree(local_read_kind(data))?;
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
        } else if kind == Kind::Graph && m.num_rows != m.num_cols {
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
            let (row_ids, col_ids) =
                local_read_ids(data, kind, shards.meta.num_rows, shards.meta.num_cols)?;
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
            Ok((row_ids, col_ids, w, h))
        })();
        let (row_ids, col_ids, w, h) = comm.agree(loaded)?;
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
            kind,
            row_ids,
            col_ids,
            conf,
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
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// The original ids of the rows (nodes or users).
    pub fn row_ids(&self) -> &IdMap {
        &self.row_ids
    }
    /// The original ids of the columns (nodes or items).
    pub fn col_ids(&self) -> &IdMap {
        self.col_ids.as_ref().unwrap_or(&self.row_ids)
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

    /// What a row is called in messages.
    fn row_word(&self) -> &'static str {
        match self.kind {
            Kind::Graph => "node",
            Kind::UserItem => "user",
        }
    }

    /// What a column is called in messages.
    pub fn col_word(&self) -> &'static str {
        match self.kind {
            Kind::Graph => "node",
            Kind::UserItem => "item",
        }
    }

    /// Collective: every rank must call (with the same `which`). The queries in
    /// internal ids, the same on every rank, and (for [`Which::All`]) how many rows
    /// were left out for having nothing to fold in. An id that is not a row (column)
    /// of the dataset, or a row with nothing to fold in (no training arc and not a
    /// test row), fails on every rank with exit 2, naming the ids, or the file and
    /// line of an id read from a file (rank 0 reports: the error is the same
    /// everywhere and [`Comm::agree`] keeps the lowest rank's).
    pub fn global_resolve<C: Comm>(&self, comm: &C, which: &Which) -> Result<(Queries, u64)> {
        match which {
            Which::Test => Ok((Queries::Rows(self.all_test.clone()), 0)),
            Which::All => {
                let s = &self.shards.rows;
                let usable: Vec<u32> = (s.lo as u32..s.hi as u32)
                    .filter(|&r| !self.local_is_empty(r))
                    .collect();
                let rows = comm.all_gather_v(&usable)?.data;
                let left_out = self.num_rows() - rows.len() as u64;
                Ok((Queries::Rows(rows), left_out))
            }
            Which::Nodes(toks) => {
                let ids = comm.agree(resolve_ids(&self.row_ids, toks, self.row_word()))?;
                let rows = dedup_keep_order(&ids);
                self.global_check_nonempty(comm, &rows)?;
                Ok((Queries::Rows(rows), 0))
            }
            Which::History(items) => {
                let toks: Vec<IdTok> = items.iter().map(|(t, _)| t.clone()).collect();
                let ids = comm.agree(resolve_ids(self.col_ids(), &toks, self.col_word()))?;
                let mut seen = std::collections::HashSet::new();
                let (mut cols, mut conf) = (Vec::new(), Vec::new());
                for (&c, &(_, w)) in ids.iter().zip(items) {
                    if seen.insert(c) {
                        cols.push(c);
                        conf.push(self.conf.of(w));
                    }
                }
                if !self.conf.weighted() {
                    conf.clear();
                }
                Ok((Queries::History { cols, conf }, 0))
            }
            Which::Similar(toks) => {
                let ids = comm.agree(resolve_ids(self.col_ids(), toks, self.col_word()))?;
                Ok((Queries::Items(dedup_keep_order(&ids)), 0))
            }
        }
    }

    /// Rank-local, identical on every rank: `filter` in internal ids (unknown ids fail
    /// as in [`Recommender::global_resolve`]; an allow list that leaves no column is
    /// refused).
    pub fn local_resolve_filter(&self, filter: &ColFilter) -> Result<Cols> {
        let sorted = |toks: &[IdTok]| -> Result<Vec<u32>> {
            let mut v = resolve_ids(self.col_ids(), toks, self.col_word())?;
            v.sort_unstable();
            v.dedup();
            Ok(v)
        };
        let exclude = sorted(&filter.exclude)?;
        let allow = filter.allow.as_deref().map(sorted).transpose()?;
        if let Some(a) = &allow {
            if a.iter().all(|c| exclude.binary_search(c).is_ok()) {
                return Err(Error::Config(format!(
                    "--allow: no {} is left to recommend ({} allowed, all excluded)",
                    self.col_word(),
                    a.len()
                )));
            }
        }
        Ok(Cols { exclude, allow })
    }

    /// Whether `row` (held by this rank) has nothing to fold in: no training arc and
    /// not a test row.
    fn local_is_empty(&self, row: u32) -> bool {
        let s = &self.shards.rows;
        self.test_pos(row).is_none() && {
            let i = (row as u64 - s.lo) as usize;
            s.indptr[i] == s.indptr[i + 1]
        }
    }

    /// Collective: refuse (on every rank) the rows of `rows` with nothing to fold in;
    /// each rank checks the rows it holds.
    fn global_check_nonempty<C: Comm>(&self, comm: &C, rows: &[u32]) -> Result<()> {
        let s = &self.shards.rows;
        let mine: Vec<u32> = rows
            .iter()
            .copied()
            .filter(|&r| (r as u64) >= s.lo && (r as u64) < s.hi && self.local_is_empty(r))
            .collect();
        let mut empty = comm.all_gather_v(&mine)?.data;
        empty.sort_unstable();
        let labels: Vec<String> = empty.iter().map(|&r| self.row_ids.label(r)).collect();
        comm.agree(if labels.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "{} {} id(s) have nothing to recommend from (no training arc, not a test row with visible arcs): {}",
                labels.len(),
                self.row_word(),
                list_ids(&labels)
            )))
        })
    }
}

/// `ids` with repeats dropped, first occurrences in order.
fn dedup_keep_order(ids: &[u32]) -> Vec<u32> {
    let mut seen = std::collections::HashSet::new();
    ids.iter().copied().filter(|&i| seen.insert(i)).collect()
}

/// Rank-local: whether `data` is a graph or a user x item dataset (the root attribute
/// `matrix`).
pub fn local_read_kind(data: &Path) -> Result<Kind> {
    let f = open_h5(data)?;
    if f.attr("matrix").is_err() {
        return Ok(Kind::Graph);
    }
    match crate::io::h5::read_str_attr(&f, data, "matrix")?.as_str() {
        "user-item" => Ok(Kind::UserItem),
        other => Err(Error::layout(
            data,
            "/ attribute matrix",
            format!("{other:?}: expected \"user-item\" (or no attribute, for a graph)"),
        )),
    }
}

/// Rank-local: the original ids of the rows and of the columns.
fn local_read_ids(data: &Path, kind: Kind, rows: u64, cols: u64) -> Result<(IdMap, Option<IdMap>)> {
    match kind {
        Kind::Graph => Ok((IdMap::Ints(NodeIds::local_read(data, rows)?), None)),
        Kind::UserItem => Ok((
            IdMap::local_read(data, "user_ids", rows)?,
            Some(IdMap::local_read(data, "item_ids", cols)?),
        )),
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
}
