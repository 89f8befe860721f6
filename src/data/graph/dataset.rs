//! The prepared-dataset HDF5 file, version 1 (docs/design.md): writing it from every
//! rank's part, reading it back, and validating a file against the layout.

use super::prepare::{LocalSplit, SplitMeta};
use super::rows::LocalRows;
use crate::comm::{prefix_offsets, Comm};
use crate::error::{Error, Result};
use crate::io::h5::read_range;
use crate::io::h5::{ctx as h5, open_h5, read_str_attr, read_u64_attr, write_attrs, Attr};
use crate::io::positional::{create_allocated, NO_OFFSET};
use hdf5::H5Type;
use std::path::Path;

pub const FORMAT: &str = "torusrec-dataset";
pub const VERSION: u64 = 1;

/// Every dataset of the layout with its element type, in writing order.
pub const U64_DATASETS: [&str; 5] = [
    "train/indptr",
    "train_t/indptr",
    "test/fold/indptr",
    "test/holdout/indptr",
    "node_ids",
];
pub const U32_DATASETS: [&str; 5] = [
    "train/indices",
    "train_t/indices",
    "test/rows",
    "test/fold/indices",
    "test/holdout/indices",
];

/// Sizes of one rank's part: rows, train nnz, cols, train_t nnz, tests, fold nnz, holdout nnz.
const PART_FIELDS: usize = 7;

fn part_sizes(s: &LocalSplit) -> [u64; PART_FIELDS] {
    [
        s.train.num_rows() as u64,
        s.train.num_arcs(),
        s.train_t.num_rows() as u64,
        s.train_t.num_arcs(),
        s.test_rows.len() as u64,
        s.fold.num_arcs(),
        s.holdout.num_arcs(),
    ]
}

/// Collective: every rank must call. Writes the dataset to `out` through a temporary
/// file ([`crate::ckpt::commit::global_write_atomic`]): rank 0 creates it with the
/// global shapes, then every rank writes its part in rank order, then rank 0 renames it
/// into place. On any failure every rank returns an error and the temporary is
/// removed; an existing `out` is untouched.
pub fn global_write_dataset<C: Comm>(
    comm: &C,
    out: &Path,
    meta: &SplitMeta,
    part: &LocalSplit,
) -> Result<()> {
    let _phase = comm.stats().phase("write");
    let sizes = comm.all_gather_v(&part_sizes(part))?.data;
    let p = comm.size();
    let field = |f: usize| -> Vec<usize> {
        (0..p)
            .map(|r| sizes[r * PART_FIELDS + f] as usize)
            .collect()
    };
    let offs: Vec<Vec<usize>> = (0..PART_FIELDS)
        .map(|f| prefix_offsets(&field(f)))
        .collect();
    let total = |f: usize| offs[f][p];
    let me = comm.rank();

    let (rows, cols, t) = (meta.num_rows as usize, meta.num_cols as usize, total(4));
    let shapes = [
        rows + 1,
        cols + 1,
        t + 1,
        t + 1,
        rows,
        total(1),
        total(3),
        t,
        total(5),
        total(6),
    ];

    // Serial HDF5: ranks take turns, each opening, writing and closing the file.
    crate::ckpt::commit::global_write_atomic(
        comm,
        out,
        |tmp| create_layout(tmp, meta, &shapes, Storage::OnWrite).map(|_| ()),
        |tmp| write_part(tmp, part, &|f| offs[f][me], meta.num_rows),
    )
}

/// The root attributes of a prepared dataset (see [`read_meta`]).
pub(crate) fn meta_attrs(meta: &SplitMeta) -> Vec<(&'static str, Attr)> {
    vec![
        ("format", Attr::Str(FORMAT.into())),
        ("version", Attr::U64(VERSION)),
        ("num_rows", Attr::U64(meta.num_rows)),
        ("num_cols", Attr::U64(meta.num_cols)),
        ("min_links", Attr::U64(meta.min_links)),
        ("seed", Attr::U64(meta.seed)),
        ("source", Attr::Str(meta.source.clone())),
        ("source_nodes", Attr::U64(meta.source_nodes)),
        ("source_arcs", Attr::U64(meta.source_arcs)),
    ]
}

/// The datasets of the layout: [`U64_DATASETS`] then [`U32_DATASETS`].
pub(crate) const NUM_DATASETS: usize = 10;

/// Dataset `i` of the layout, in the order of [`U64_DATASETS`] then [`U32_DATASETS`].
pub(crate) fn dataset_name(i: usize) -> &'static str {
    if i < 5 {
        U64_DATASETS[i]
    } else {
        U32_DATASETS[i - 5]
    }
}

/// How [`create_layout`] allocates the datasets' storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Storage {
    /// HDF5's default: allocated when written (the writers through HDF5).
    OnWrite,
    /// Contiguous and allocated at creation, at a byte offset for positional writes
    /// ([`crate::io::positional`]).
    Early,
}

/// Create the layout of docs/design.md in `tmp`: its groups, every dataset with
/// `shapes[i]` elements (in the order of [`U64_DATASETS`] then [`U32_DATASETS`]) and
/// the root attributes of `meta`. Returns the byte offset of each dataset with
/// [`Storage::Early`] (`NO_OFFSET` when it is empty, and always with
/// [`Storage::OnWrite`]).
pub(crate) fn create_layout(
    tmp: &Path,
    meta: &SplitMeta,
    shapes: &[usize; NUM_DATASETS],
    storage: Storage,
) -> Result<[u64; NUM_DATASETS]> {
    let f = h5(tmp, "create", crate::io::h5::create(tmp))?;
    for g in ["train", "train_t", "test", "test/fold", "test/holdout"] {
        h5(tmp, format!("group {g}"), f.create_group(g))?;
    }
    let mut offs = [NO_OFFSET; NUM_DATASETS];
    for (i, &n) in shapes.iter().enumerate() {
        let name = dataset_name(i);
        offs[i] = if i < 5 {
            create_dataset::<u64>(&f, tmp, name, n, storage)?
        } else {
            create_dataset::<u32>(&f, tmp, name, n, storage)?
        };
    }
    write_attrs(&f, tmp, &meta_attrs(meta))?;
    h5(tmp, "close", f.close())?;
    Ok(offs)
}

/// One dataset of [`create_layout`], with its byte offset (`NO_OFFSET` unless
/// allocated now and not empty).
fn create_dataset<T: H5Type>(
    f: &hdf5::File,
    tmp: &Path,
    name: &str,
    n: usize,
    storage: Storage,
) -> Result<u64> {
    match storage {
        Storage::OnWrite => {
            h5(tmp, name, f.new_dataset::<T>().shape(n).create(name))?;
            Ok(NO_OFFSET)
        }
        Storage::Early => Ok(create_allocated::<T>(f, tmp, name, name, n)?.1),
    }
}

fn write_slice<T: H5Type>(
    f: &hdf5::File,
    path: &Path,
    name: &str,
    at: usize,
    data: &[T],
) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let ds = h5(path, name, f.dataset(name))?;
    h5(path, name, ds.write_slice(data, at..at + data.len()))
}

/// `indptr` shifted to the global offset of this rank's first element.
fn shifted(indptr: &[u64], by: usize) -> Vec<u64> {
    indptr.iter().map(|&x| x + by as u64).collect()
}

pub(crate) fn write_part(
    tmp: &Path,
    s: &LocalSplit,
    off: &dyn Fn(usize) -> usize,
    num_rows: u64,
) -> Result<()> {
    let f = h5(tmp, "open for writing", crate::io::h5::open_rw(tmp))?;
    // Each rank writes its indptr including its closing entry; neighbours agree on
    // the shared boundary value, so the overlap is harmless.
    write_slice(
        &f,
        tmp,
        "train/indptr",
        s.train.lo as usize,
        &shifted(&s.train.indptr, off(1)),
    )?;
    write_slice(&f, tmp, "train/indices", off(1), &s.train.targets)?;
    write_slice(
        &f,
        tmp,
        "train_t/indptr",
        s.train_t.lo as usize,
        &shifted(&s.train_t.indptr, off(3)),
    )?;
    write_slice(&f, tmp, "train_t/indices", off(3), &s.train_t.targets)?;
    write_slice(&f, tmp, "test/rows", off(4), &s.test_rows)?;
    write_slice(
        &f,
        tmp,
        "test/fold/indptr",
        off(4),
        &shifted(&s.fold.indptr, off(5)),
    )?;
    write_slice(&f, tmp, "test/fold/indices", off(5), &s.fold.targets)?;
    write_slice(
        &f,
        tmp,
        "test/holdout/indptr",
        off(4),
        &shifted(&s.holdout.indptr, off(6)),
    )?;
    write_slice(&f, tmp, "test/holdout/indices", off(6), &s.holdout.targets)?;
    write_slice(&f, tmp, "node_ids", s.train.lo as usize, &s.node_ids)?;
    debug_assert!(s.train.lo + s.train.num_rows() as u64 <= num_rows);
    h5(tmp, "close", f.close())
}

/// A prepared dataset read whole into memory (for `inspect` and tests).
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub meta: SplitMeta,
    pub train: LocalRows,
    pub train_t: LocalRows,
    pub test_rows: Vec<u32>,
    pub fold: LocalRows,
    pub holdout: LocalRows,
    pub node_ids: Vec<u64>,
}

fn read_vec<T: H5Type>(f: &hdf5::File, path: &Path, name: &str) -> Result<Vec<T>> {
    let len = f
        .dataset(name)
        .map_err(|_| Error::layout(path, name, "missing"))?
        .size() as u64;
    read_range(f, path, name, 0, len)
}

/// Read and check the root attributes: the file must be a torusrec dataset, version 1.
pub fn read_meta(f: &hdf5::File, path: &Path) -> Result<SplitMeta> {
    let format = read_str_attr(f, path, "format")?;
    if format != FORMAT {
        return Err(Error::layout(
            path,
            "/ attribute format",
            format!("{format:?}, expected {FORMAT:?}"),
        ));
    }
    let version = read_u64_attr(f, path, "version")?;
    if version != VERSION {
        return Err(Error::layout(
            path,
            "/ attribute version",
            format!("{version}, this build reads version {VERSION}"),
        ));
    }
    Ok(SplitMeta {
        num_rows: read_u64_attr(f, path, "num_rows")?,
        num_cols: read_u64_attr(f, path, "num_cols")?,
        min_links: read_u64_attr(f, path, "min_links")?,
        seed: read_u64_attr(f, path, "seed")?,
        source: read_str_attr(f, path, "source")?,
        source_nodes: read_u64_attr(f, path, "source_nodes")?,
        source_arcs: read_u64_attr(f, path, "source_arcs")?,
    })
}

/// Check a whole `indptr` array of `rows + 1` entries: it starts at 0, never
/// decreases and ends at `nnz` (the length of the matching `indices`).
pub fn check_indptr(path: &Path, name: &str, indptr: &[u64], rows: u64, nnz: u64) -> Result<()> {
    let ip = format!("{name}/indptr");
    if indptr.len() as u64 != rows.saturating_add(1) {
        return Err(Error::layout(
            path,
            &ip,
            format!(
                "{} entries, expected {}",
                indptr.len(),
                rows.saturating_add(1)
            ),
        ));
    }
    if indptr[0] != 0 {
        return Err(Error::layout(
            path,
            &ip,
            format!("starts at {}, expected 0", indptr[0]),
        ));
    }
    if let Some(i) = indptr.windows(2).position(|w| w[0] > w[1]) {
        return Err(Error::layout(
            path,
            &ip,
            format!(
                "decreases at entry {} ({} after {})",
                i + 1,
                indptr[i + 1],
                indptr[i]
            ),
        ));
    }
    let end = indptr[indptr.len() - 1];
    if end != nnz {
        return Err(Error::layout(
            path,
            &ip,
            format!("ends at {end}, but {name}/indices has {nnz} entries"),
        ));
    }
    Ok(())
}

/// Check the rows of a CSR block whose `indptr` was checked (local offsets from 0):
/// ids below `bound`, sorted and distinct within each row. `first_row` is the global
/// index of the block's first row (for the message).
pub fn check_rows(
    path: &Path,
    name: &str,
    first_row: u64,
    indptr: &[u64],
    indices: &[u32],
    bound: u64,
) -> Result<()> {
    for (i, w) in indptr.windows(2).enumerate() {
        let r = &indices[w[0] as usize..w[1] as usize];
        let row = first_row + i as u64;
        if let Some(&c) = r.iter().find(|&&c| c as u64 >= bound) {
            return Err(Error::layout(
                path,
                format!("{name}/indices"),
                format!("row {row} has id {c} >= {bound}"),
            ));
        }
        if let Some(k) = r.windows(2).position(|w| w[0] >= w[1]) {
            return Err(Error::layout(
                path,
                format!("{name}/indices"),
                format!(
                    "row {row} is not sorted and distinct ({} then {})",
                    r[k],
                    r[k + 1]
                ),
            ));
        }
    }
    Ok(())
}

/// Check a CSR pair (`indptr` of `rows + 1`, `indices` < `cols`, sorted and distinct
/// within a row).
fn check_csr(
    path: &Path,
    name: &str,
    indptr: &[u64],
    indices: &[u32],
    rows: usize,
    cols: u64,
) -> Result<()> {
    check_indptr(path, name, indptr, rows as u64, indices.len() as u64)?;
    check_rows(path, name, 0, indptr, indices, cols)
}

/// The id spaces a dataset may declare: ids are stored as u32, so at most 2^32 rows
/// and columns.
pub fn check_id_space(path: &Path, meta: &SplitMeta) -> Result<()> {
    const MAX: u64 = 1 << 32;
    for (name, n) in [("num_rows", meta.num_rows), ("num_cols", meta.num_cols)] {
        if n > MAX {
            return Err(Error::layout(
                path,
                format!("/ attribute {name}"),
                format!("{n} exceeds the 2^32 ids a u32 index can name"),
            ));
        }
    }
    Ok(())
}

/// Test rows (`rows[0]` is the previous block's last one when `has_prev`): strictly
/// increasing, below `num_rows`, with no training arcs.
pub fn check_test_rows(
    path: &Path,
    rows: &[u32],
    has_prev: bool,
    tlo: u64,
    num_rows: u64,
    has_training_arcs: impl Fn(u32) -> bool,
) -> Result<()> {
    let first = tlo - has_prev as u64;
    if let Some(k) = rows.windows(2).position(|w| w[0] >= w[1]) {
        return Err(Error::layout(
            path,
            "test/rows",
            format!(
                "not increasing at entry {} ({} after {})",
                first + k as u64 + 1,
                rows[k + 1],
                rows[k]
            ),
        ));
    }
    for &r in &rows[has_prev as usize..] {
        if r as u64 >= num_rows {
            return Err(Error::layout(
                path,
                "test/rows",
                format!("row {r} >= num_rows {num_rows}"),
            ));
        }
        if has_training_arcs(r) {
            return Err(Error::layout(
                path,
                "train/indices",
                format!("test row {r} has training arcs"),
            ));
        }
    }
    Ok(())
}

/// Whether the test rows are also training rows: a user-item dataset split `last` or
/// `random` (root attribute `split`; absent or `strong`: no, as for every graph).
pub fn trains_test_rows(f: &hdf5::File, path: &Path) -> Result<bool> {
    if !f.attr_names().is_ok_and(|n| n.iter().any(|a| a == "split")) {
        return Ok(false);
    }
    match read_str_attr(f, path, "split")?.as_str() {
        "strong" => Ok(false),
        "last" | "random" => Ok(true),
        other => Err(Error::layout(
            path,
            "/ attribute split",
            format!("{other:?}, expected strong, last or random"),
        )),
    }
}

/// A test row's visible (`fold`) and held-out arcs share no column (both sorted).
pub fn check_fold_disjoint(path: &Path, row: u32, fold: &[u32], holdout: &[u32]) -> Result<()> {
    match holdout.iter().find(|c| fold.binary_search(c).is_ok()) {
        Some(c) => Err(Error::layout(
            path,
            "test/fold/indices",
            format!("test row {row}: arc to {c} is both visible and held out"),
        )),
        None => Ok(()),
    }
}

impl Dataset {
    /// Read the whole file and validate it against the layout.
    pub fn read(path: &Path) -> Result<Self> {
        let f = open_h5(path)?;
        let meta = read_meta(&f, path)?;
        check_id_space(path, &meta)?;
        let rows = usize::try_from(meta.num_rows)
            .map_err(|_| Error::layout(path, "/ attribute num_rows", "too large"))?;
        let cols = usize::try_from(meta.num_cols)
            .map_err(|_| Error::layout(path, "/ attribute num_cols", "too large"))?;
        let csr = |name: &str, lo: u64| -> Result<LocalRows> {
            Ok(LocalRows {
                lo,
                indptr: read_vec::<u64>(&f, path, &format!("{name}/indptr"))?,
                targets: read_vec::<u32>(&f, path, &format!("{name}/indices"))?,
            })
        };
        let train = csr("train", 0)?;
        check_csr(
            path,
            "train",
            &train.indptr,
            &train.targets,
            rows,
            meta.num_cols,
        )?;
        let train_t = csr("train_t", 0)?;
        check_csr(
            path,
            "train_t",
            &train_t.indptr,
            &train_t.targets,
            cols,
            meta.num_rows,
        )?;
        let test_rows = read_vec::<u32>(&f, path, "test/rows")?;
        let t = test_rows.len();
        let fold = csr("test/fold", 0)?;
        check_csr(
            path,
            "test/fold",
            &fold.indptr,
            &fold.targets,
            t,
            meta.num_cols,
        )?;
        let holdout = csr("test/holdout", 0)?;
        check_csr(
            path,
            "test/holdout",
            &holdout.indptr,
            &holdout.targets,
            t,
            meta.num_cols,
        )?;
        let node_ids = read_vec::<u64>(&f, path, "node_ids")?;
        let ds = Dataset {
            meta,
            train,
            train_t,
            test_rows,
            fold,
            holdout,
            node_ids,
        };
        ds.check_consistency(path, trains_test_rows(&f, path)?)?;
        Ok(ds)
    }

    /// Cross-dataset rules: the transpose mirrors `/train`, test rows are increasing
    /// with empty training rows and a non-empty holdout disjoint from the fold, and
    /// node ids increase.
    fn check_consistency(&self, path: &Path, trained_tests: bool) -> Result<()> {
        let rows = self.meta.num_rows as usize;
        if self.node_ids.len() != rows {
            return Err(Error::layout(
                path,
                "node_ids",
                format!("{} entries, expected {rows}", self.node_ids.len()),
            ));
        }
        if self.node_ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::layout(path, "node_ids", "not increasing"));
        }
        if let Some(&m) = self.node_ids.last() {
            if m >= self.meta.source_nodes {
                return Err(Error::layout(
                    path,
                    "node_ids",
                    format!("id {m} >= source_nodes {}", self.meta.source_nodes),
                ));
            }
        }
        // Transpose: the column counts of /train equal /train_t's row lengths and
        // every arc appears in both.
        let mut col_count = vec![0u64; self.meta.num_cols as usize];
        for &c in &self.train.targets {
            col_count[c as usize] += 1;
        }
        for (c, &n) in col_count.iter().enumerate() {
            if self.train_t.indptr[c + 1] - self.train_t.indptr[c] != n {
                return Err(Error::layout(
                    path,
                    "train_t/indptr",
                    format!(
                        "column {c} has {} rows, /train has {n} arcs into it",
                        self.train_t.indptr[c + 1] - self.train_t.indptr[c]
                    ),
                ));
            }
        }
        for c in 0..self.train_t.num_rows() {
            for &r in self.train_t.row(c) {
                if self
                    .train
                    .row(r as usize)
                    .binary_search(&(c as u32))
                    .is_err()
                {
                    return Err(Error::layout(
                        path,
                        "train_t/indices",
                        format!("arc {r} -> {c} is not in /train"),
                    ));
                }
            }
        }
        check_test_rows(path, &self.test_rows, false, 0, rows as u64, |r| {
            !trained_tests && !self.train.row(r as usize).is_empty()
        })?;
        for (i, &r) in self.test_rows.iter().enumerate() {
            let h = self.holdout.row(i);
            if h.is_empty() {
                return Err(Error::layout(
                    path,
                    "test/holdout/indices",
                    format!("test row {r} has no held-out arc"),
                ));
            }
            check_fold_disjoint(path, r, self.fold.row(i), h)?;
        }
        Ok(())
    }

    /// All arcs of the kept graph: training, fold-in and held out.
    pub fn num_arcs(&self) -> u64 {
        self.train.num_arcs() + self.fold.num_arcs() + self.holdout.num_arcs()
    }
}
