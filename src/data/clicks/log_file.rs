//! A click log file (HDF5), written by `torusrec generate clicks` (v1) or by
//! `torusrec prepare clicks` and `generate clicks --format criteo` (v2, keyed), and
//! read back in example ranges.
//!
//! Layout, schema `torusrec-clicks-v1` (N examples, T tables):
//!
//! | object | type | shape | content |
//! |---|---|---|---|
//! | `/` attribute `schema` | string | scalar | `"torusrec-clicks-v1"` |
//! | `/` attribute `spec_json` | string | scalar | the [`ModelSpec`], serde_json |
//! | `/` attribute `seed` | u64 | scalar | the generator's seed |
//! | `/` attribute `examples` | u64 | scalar | N |
//! | `/` attribute `planted` | string | scalar | only for labels of `--planted fm`: the planted model, `fm:RANK:SCALE` ([`Planted`](super::gen::Planted)) |
//! | `/dense` | f32 | [N, n_dense] | dense features, row per example |
//! | `/labels` | f32 | [N] | 0.0 or 1.0 |
//! | `/tables/<t>/offsets` | u64 | [N + 1] | example e's ids are `ids[offsets[e]..offsets[e+1]]`; `offsets[0] = 0`, `offsets[N] = nnz_t` |
//! | `/tables/<t>/ids` | u32 | [nnz_t] | ids in `0..vocab_t`, chunked |
//!
//! `<t>` is the table's index in the spec (0, 1, ...). The file holds exactly
//! [`ClickGen::batch`] of `(spec, seed)` (and the planted model) over `0..N`; it is written in chunks of
//! examples (never whole in memory) under `<path>.partial` and renamed into place
//! once complete.
//!
//! Schema `torusrec-clicks-v2` (a *keyed* log, written by [`super::ingest`]) has the
//! same layout but for:
//!
//! | object | type | shape | content |
//! |---|---|---|---|
//! | `/` attribute `schema` | string | scalar | `"torusrec-clicks-v2"` |
//! | `/` attribute `spec_json` | string | scalar | the [`ModelSpec`]: every table a hash-table vocabulary (`vocab_kind = "hash"`) whose `vocab` is the estimate of its distinct keys |
//! | `/` attribute `seed` | u64 | scalar | 0 for a log prepared from files, the generator's seed for a generated one |
//! | `/` attribute `source` | string | scalar | JSON array: the input file of each day, as given |
//! | `/` attribute `format` | string | scalar | the input format (`"criteo"`, `"tsv"`, `"csv"`) |
//! | `/` attribute `columns` | string | scalar | `tsv` only: the column layout |
//! | `/day_offsets` | u64 | [D + 1] | the first example of each day (input file); `day_offsets[D] = N` |
//! | `/tables/<t>` attribute `distinct_estimate` | u64 | scalar | HyperLogLog estimate of the table's distinct keys |
//! | `/tables/<t>/ids` | u64 | [nnz_t] | raw 64-bit keys (any value), contiguous |
//!
//! Reading a v2 log gives each table's keys in [`Batch::keys`] and empty
//! [`Batch::bags`] (offsets all 0): the model maps keys to rows.

use crate::io::h5::read_range;
use std::path::{Path, PathBuf};

use hdf5::H5Type;
use ndarray::ArrayView2;

use super::batch::{Bags, Batch, KeyBags};
use super::gen::{ClickGen, Planted};

use crate::io::h5::open_h5;
use crate::io::h5::{check_elem_type, ctx as h5, read_str_attr, read_u64_attr, write_attrs, Attr};
use crate::io::outfile::{check_output, temp_path};
use crate::spec::ModelSpec;
use crate::{Error, Result};

/// The value of the `schema` attribute.
pub const SCHEMA: &str = "torusrec-clicks-v1";
/// The `schema` of a keyed log.
pub const SCHEMA_V2: &str = "torusrec-clicks-v2";
/// Elements per HDF5 chunk of an `ids` dataset (256 KiB).
const IDS_CHUNK: usize = 1 << 16;

pub(crate) fn offsets_name(t: usize) -> String {
    format!("/tables/{t}/offsets")
}

pub(crate) fn ids_name(t: usize) -> String {
    format!("/tables/{t}/ids")
}

/// Table `t`'s per-id weights (f32, one per id; only in a weighted log).
pub(crate) fn weights_name(t: usize) -> String {
    format!("/tables/{t}/weights")
}

/// What [`write_click_log`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct LogSummary {
    pub examples: u64,
    /// Ids of each table over the whole log.
    pub ids_per_table: Vec<u64>,
    /// Fraction of labels that are 1.
    pub positive_rate: f64,
    /// Size of the file.
    pub bytes: u64,
}

/// Generate examples `0..examples` of `(spec, seed)` into the click log `path`,
/// `chunk` examples at a time. Refuses an existing `path` unless `force`; on any
/// failure the temporary file is removed and an existing `path` is untouched.
pub fn write_click_log(
    path: &Path,
    spec: &ModelSpec,
    seed: u64,
    examples: u64,
    force: bool,
    chunk: usize,
) -> Result<LogSummary> {
    write_planted_log(path, spec, seed, Planted::Linear, examples, force, chunk)
}

/// [`write_click_log`] with the planted model `planted` (a log of [`Planted::Fm`] has the
/// `/` attribute `planted`, its [`Planted::describe`]; a linear log has none).
pub fn write_planted_log(
    path: &Path,
    spec: &ModelSpec,
    seed: u64,
    planted: Planted,
    examples: u64,
    force: bool,
    chunk: usize,
) -> Result<LogSummary> {
    check_output(path, force)?;
    spec.validate("click log model")?;
    if chunk == 0 {
        return Err(Error::Config("click log: chunk must be at least 1".into()));
    }
    let n = usize::try_from(examples)
        .ok()
        .and_then(|n| n.checked_add(1))
        .ok_or_else(|| Error::Config(format!("click log: {examples} examples is too many")))?
        - 1;
    let tmp = temp_path(path);
    let gen = ClickGen::with_planted(spec, seed, planted);
    let written = write_into(&tmp, spec, &gen, n, chunk);
    let done = written.and_then(|s| {
        // Durable before it is visible (the file is closed by now).
        crate::io::outfile::commit(&tmp, path)?;
        Ok(s)
    });
    match done {
        Ok(mut s) => {
            s.bytes = std::fs::metadata(path)
                .map_err(|e| Error::io(path, e))?
                .len();
            Ok(s)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

fn write_into(
    tmp: &Path,
    spec: &ModelSpec,
    gen: &ClickGen,
    n: usize,
    chunk: usize,
) -> Result<LogSummary> {
    let f = h5(tmp, "create", crate::io::h5::create(tmp))?;
    let json = serde_json::to_string(spec)
        .map_err(|e| Error::Config(format!("click log: spec to JSON: {e}")))?;
    write_attrs(
        &f,
        tmp,
        &[
            ("schema", Attr::Str(SCHEMA.into())),
            ("spec_json", Attr::Str(json)),
            ("seed", Attr::U64(gen.seed())),
            ("examples", Attr::U64(n as u64)),
        ],
    )?;
    if gen.planted() != Planted::Linear {
        let p = gen.planted().describe(spec.tables.len());
        write_attrs(&f, tmp, &[("planted", Attr::Str(p))])?;
    }

    let nd = spec.n_dense;
    let dense = h5(
        tmp,
        "/dense",
        f.new_dataset::<f32>().shape((n, nd)).create("dense"),
    )?;
    let labels = h5(
        tmp,
        "/labels",
        f.new_dataset::<f32>().shape(n).create("labels"),
    )?;
    h5(tmp, "/tables", f.create_group("tables"))?;
    let mut offsets = Vec::with_capacity(spec.tables.len());
    let mut ids = Vec::with_capacity(spec.tables.len());
    for t in 0..spec.tables.len() {
        h5(
            tmp,
            format!("/tables/{t}"),
            f.create_group(&format!("tables/{t}")),
        )?;
        offsets.push(h5(
            tmp,
            offsets_name(t),
            f.new_dataset::<u64>()
                .shape(n + 1)
                .create(offsets_name(t).as_str()),
        )?);
        ids.push(h5(
            tmp,
            ids_name(t),
            f.new_dataset::<u32>()
                .chunk(IDS_CHUNK)
                .shape(0..)
                .create(ids_name(t).as_str()),
        )?);
    }

    let mut nnz = vec![0u64; spec.tables.len()];
    let mut positives = 0u64;
    if n == 0 {
        for (t, ds) in offsets.iter().enumerate() {
            h5(tmp, offsets_name(t), ds.write_slice(&[0u64], 0..1))?;
        }
    }
    let mut lo = 0;
    while lo < n {
        let m = chunk.min(n - lo);
        let b = gen.batch(lo as u64, m);
        if nd > 0 {
            let view = ArrayView2::from_shape((m, nd), &b.dense)
                .map_err(|e| Error::Config(format!("click log: dense block: {e}")))?;
            h5(tmp, "/dense", dense.write_slice(view, (lo..lo + m, ..)))?;
        }
        h5(tmp, "/labels", labels.write_slice(&b.labels, lo..lo + m))?;
        positives += b.labels.iter().filter(|&&l| l == 1.0).count() as u64;
        for (t, bags) in b.bags.iter().enumerate() {
            // Each chunk writes its closing offset too; the next chunk rewrites it
            // with the same value.
            let shifted: Vec<u64> = bags.offsets.iter().map(|&o| nnz[t] + o as u64).collect();
            h5(
                tmp,
                offsets_name(t),
                offsets[t].write_slice(&shifted, lo..lo + m + 1),
            )?;
            let k = bags.ids.len();
            if k > 0 {
                let at = nnz[t] as usize;
                h5(tmp, ids_name(t), ids[t].resize(at + k))?;
                h5(tmp, ids_name(t), ids[t].write_slice(&bags.ids, at..at + k))?;
            }
            nnz[t] += k as u64;
        }
        lo += m;
    }
    drop((dense, labels, offsets, ids));
    h5(tmp, "close", f.close())?;
    Ok(LogSummary {
        examples: n as u64,
        ids_per_table: nnz,
        positive_rate: if n == 0 {
            0.0
        } else {
            positives as f64 / n as f64
        },
        bytes: 0,
    })
}

/// An open click log: its spec and seed, read in example ranges.
#[derive(Debug)]
pub struct ClickLog {
    path: PathBuf,
    file: hdf5::File,
    spec: ModelSpec,
    seed: u64,
    examples: u64,
    /// Ids of each table.
    nnz: Vec<u64>,
    /// Schema v2: u64 keys, days and sources.
    keyed: bool,
    days: Vec<u64>,
    source: Vec<String>,
    /// Per table: whether it has `/tables/<t>/weights` (per-id weights).
    weighted: Vec<bool>,
}

/// Whether table `t` of a log (`len` ids) has per-id weights: `/tables/<t>/weights`,
/// f32, one per id, if present.
fn open_weights(f: &hdf5::File, path: &Path, t: usize, len: u64) -> Result<bool> {
    let wn = weights_name(t);
    if f.dataset(&wn).is_err() {
        return Ok(false);
    }
    let n = dataset::<f32>(f, path, &wn, None)?.size() as u64;
    if n != len {
        return Err(Error::layout(
            path,
            &wn,
            format!("{n} weights for the {len} ids of {}", ids_name(t)),
        ));
    }
    Ok(true)
}

/// The dataset `name`, checked for element type and shape.
fn dataset<T: H5Type>(
    f: &hdf5::File,
    path: &Path,
    name: &str,
    shape: Option<&[usize]>,
) -> Result<hdf5::Dataset> {
    let ds = f
        .dataset(name)
        .map_err(|_| Error::layout(path, name, "missing"))?;
    check_elem_type::<T>(&ds, path, name)?;
    match shape {
        Some(s) if ds.shape() != s => Err(Error::layout(
            path,
            name,
            format!("shape {:?}, expected {s:?}", ds.shape()),
        )),
        None if ds.ndim() != 1 => Err(Error::layout(
            path,
            name,
            format!("expected 1 dimension, found {}", ds.ndim()),
        )),
        _ => Ok(ds),
    }
}

/// The days and sources of a v2 log: `/day_offsets` from 0 to `examples`,
/// non-decreasing, and the `source` attribute, one file per day.
fn open_v2(f: &hdf5::File, path: &Path, examples: u64) -> Result<(Vec<u64>, Vec<String>)> {
    let name = "/day_offsets";
    let ds = dataset::<u64>(f, path, name, None)?;
    let len = ds.size() as u64;
    if len < 2 {
        return Err(Error::layout(
            path,
            name,
            format!("{len} entries, expected at least 2 (one day)"),
        ));
    }
    let days = read_range::<u64>(f, path, name, 0, len)?;
    if days[0] != 0 || days[days.len() - 1] != examples {
        return Err(Error::layout(
            path,
            name,
            format!(
                "runs from {} to {}, expected 0 to the {examples} examples",
                days[0],
                days[days.len() - 1]
            ),
        ));
    }
    if let Some(d) = (1..days.len()).find(|&d| days[d - 1] > days[d]) {
        return Err(Error::layout(
            path,
            name,
            format!("decreases at day {d}: {} > {}", days[d - 1], days[d]),
        ));
    }
    let json = read_str_attr(f, path, "source")?;
    let source: Vec<String> = serde_json::from_str(&json)
        .map_err(|e| Error::layout(path, "/ attribute source", e.to_string()))?;
    if source.len() != days.len() - 1 {
        return Err(Error::layout(
            path,
            "/ attribute source",
            format!("{} files for {} days", source.len(), days.len() - 1),
        ));
    }
    Ok((days, source))
}

impl ClickLog {
    /// Open and check a click log: schema, spec, and the shapes of every dataset
    /// (the values are checked by [`ClickLog::read`], range by range).
    pub fn open(path: &Path) -> Result<ClickLog> {
        let file = open_h5(path)?;
        let f = &file;
        let schema = read_str_attr(f, path, "schema")?;
        if schema != SCHEMA && schema != SCHEMA_V2 {
            return Err(Error::layout(
                path,
                "/ attribute schema",
                format!(
                    "{schema:?}, expected {SCHEMA:?} or {SCHEMA_V2:?} (not a click log, or another version)"
                ),
            ));
        }
        let keyed = schema == SCHEMA_V2;
        let json = read_str_attr(f, path, "spec_json")?;
        let spec: ModelSpec = serde_json::from_str(&json)
            .map_err(|e| Error::layout(path, "/ attribute spec_json", e.to_string()))?;
        spec.validate("model")
            .map_err(|e| Error::layout(path, "/ attribute spec_json", e.to_string()))?;
        let seed = read_u64_attr(f, path, "seed")?;
        let examples = read_u64_attr(f, path, "examples")?;
        let n = usize::try_from(examples)
            .ok()
            .filter(|&n| n < usize::MAX)
            .ok_or_else(|| Error::layout(path, "/ attribute examples", "too large"))?;

        dataset::<f32>(f, path, "/dense", Some(&[n, spec.n_dense]))?;
        dataset::<f32>(f, path, "/labels", Some(&[n]))?;
        let mut nnz = Vec::with_capacity(spec.tables.len());
        let mut weighted = Vec::with_capacity(spec.tables.len());
        for t in 0..spec.tables.len() {
            let (on, idn) = (offsets_name(t), ids_name(t));
            dataset::<u64>(f, path, &on, Some(&[n + 1]))?;
            let len = if keyed {
                dataset::<u64>(f, path, &idn, None)?.size() as u64
            } else {
                dataset::<u32>(f, path, &idn, None)?.size() as u64
            };
            let first = read_range::<u64>(f, path, &on, 0, 1)?[0];
            if first != 0 {
                return Err(Error::layout(
                    path,
                    &on,
                    format!("starts at {first}, expected 0"),
                ));
            }
            let last = read_range::<u64>(f, path, &on, n as u64, n as u64 + 1)?[0];
            if last != len {
                return Err(Error::layout(
                    path,
                    &on,
                    format!("ends at {last}, but {idn} has {len} entries"),
                ));
            }
            nnz.push(len);
            weighted.push(open_weights(f, path, t, len)?);
        }
        let (days, source) = if keyed {
            open_v2(f, path, examples)?
        } else {
            (vec![0, examples], Vec::new())
        };
        Ok(ClickLog {
            path: path.to_path_buf(),
            file,
            spec,
            seed,
            examples,
            nnz,
            keyed,
            days,
            source,
            weighted,
        })
    }

    /// Per table: whether the log carries per-id weights for it.
    pub fn weighted(&self) -> &[bool] {
        &self.weighted
    }

    /// Whether the log holds raw 64-bit keys (schema v2).
    pub fn keyed(&self) -> bool {
        self.keyed
    }

    /// Where each day (input file) starts, and the example count last: `[0, N]` for a
    /// v1 log.
    pub fn days(&self) -> &[u64] {
        &self.days
    }

    /// The input file of each day, as given to `prepare clicks` (v1: none).
    pub fn source_files(&self) -> &[String] {
        &self.source
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn examples(&self) -> u64 {
        self.examples
    }

    /// Ids of each table over the whole log.
    pub fn ids_per_table(&self) -> &[u64] {
        &self.nnz
    }

    /// Examples `first..first + n`, checked: offsets non-decreasing, ids below their
    /// table's vocabulary, labels 0 or 1, dense values finite. Errors name the
    /// dataset and the example. Offsets of the batch start at 0. A keyed (v2) log
    /// gives every table's keys in `keys[t]` (any value) and an empty `bags[t]`
    /// (`n + 1` zero offsets). Read in turn: `Self::read_dense`,
    /// `Self::read_labels` and each table's `Self::read_table`.
    pub fn read(&self, first: u64, n: usize) -> Result<Batch> {
        let path = self.path.as_path();
        let hi = first
            .checked_add(n as u64)
            .filter(|&h| h <= self.examples)
            .ok_or_else(|| {
                Error::input(
                    path,
                    format!(
                        "examples {first}..{}: outside the log's {} examples",
                        first as u128 + n as u128,
                        self.examples
                    ),
                )
            })?;
        let nd = self.spec.n_dense;
        let mut b = Batch::empty(&self.spec);
        b.n = n;
        if self.keyed {
            b.keys = vec![KeyBags::default(); self.spec.tables.len()];
        }
        if self.weighted.contains(&true) {
            b.weights = vec![Vec::new(); self.spec.tables.len()];
        }

        if n > 0 && nd > 0 {
            b.dense = self.read_dense(first, n)?;
        }
        b.labels = self.read_labels(first, hi)?;
        for t in 0..self.spec.tables.len() {
            self.read_table(t, first, hi, &mut b)?;
        }
        Ok(b)
    }

    /// `/dense` of examples `first..first + n` (`n > 0`), row-major, checked finite.
    fn read_dense(&self, first: u64, n: usize) -> Result<Vec<f32>> {
        let (path, nd) = (self.path.as_path(), self.spec.n_dense);
        let lo = first as usize;
        let dense: Vec<f32> = self
            .file
            .dataset("/dense")
            .and_then(|ds| ds.read_slice_2d::<f32, _>((lo..lo + n, ..)))
            .map(|a| a.as_standard_layout().iter().copied().collect())
            .map_err(|e| Error::layout(path, "/dense", format!("unreadable: {e}")))?;
        if let Some(i) = dense.iter().position(|x| !x.is_finite()) {
            return Err(Error::layout(
                path,
                "/dense",
                format!(
                    "example {}, feature {}: {} is not finite",
                    first + (i / nd) as u64,
                    i % nd,
                    dense[i]
                ),
            ));
        }
        Ok(dense)
    }

    /// `/labels` of examples `first..hi`, checked 0 or 1.
    fn read_labels(&self, first: u64, hi: u64) -> Result<Vec<f32>> {
        let path = self.path.as_path();
        let labels = read_range::<f32>(&self.file, path, "/labels", first, hi)?;
        if let Some(i) = labels.iter().position(|&l| l != 0.0 && l != 1.0) {
            return Err(Error::layout(
                path,
                "/labels",
                format!(
                    "example {}: label {} is not 0 or 1",
                    first + i as u64,
                    labels[i]
                ),
            ));
        }
        Ok(labels)
    }

    /// Table `t`'s weights `lo..hi` (of the examples from `first`), checked finite.
    fn read_weights(&self, t: usize, first: u64, lo: u64, hi: u64) -> Result<Vec<f32>> {
        let (path, wn) = (self.path.as_path(), weights_name(t));
        let w = read_range::<f32>(&self.file, path, &wn, lo, hi)?;
        if let Some(i) = w.iter().position(|x| !x.is_finite()) {
            return Err(Error::layout(
                path,
                &wn,
                format!(
                    "weight {} (examples from {first}): {} is not finite",
                    lo + i as u64,
                    w[i]
                ),
            ));
        }
        Ok(w)
    }

    /// Table `t`'s bags of examples `first..hi` into `b` (its keys for a keyed log),
    /// the offsets checked non-decreasing and within the table, the ids (of an
    /// unkeyed log) below its vocabulary.
    fn read_table(&self, t: usize, first: u64, hi: u64, b: &mut Batch) -> Result<()> {
        let (path, f) = (self.path.as_path(), &self.file);
        let table = &self.spec.tables[t];
        let n = b.n;
        let (on, idn) = (offsets_name(t), ids_name(t));
        let offs = read_range::<u64>(f, path, &on, first, hi + 1)?;
        if let Some(i) = (0..n).find(|&i| offs[i] > offs[i + 1]) {
            return Err(Error::layout(
                path,
                &on,
                format!(
                    "decreases at example {}: {} > {}",
                    first + i as u64,
                    offs[i],
                    offs[i + 1]
                ),
            ));
        }
        if offs[n] > self.nnz[t] {
            return Err(Error::layout(
                path,
                &on,
                format!(
                    "example {} ends at {}, beyond the {} entries of {idn}",
                    hi - 1,
                    offs[n],
                    self.nnz[t]
                ),
            ));
        }
        let base = offs[0];
        if self.weighted[t] {
            b.weights[t] = self.read_weights(t, first, base, offs[n])?;
        }
        if offs[n] - base > u32::MAX as u64 {
            return Err(Error::input(
                path,
                format!(
                    "examples {first}..{hi} hold {} ids of table {t}, more than a batch \
                     holds (u32 offsets); read fewer examples",
                    offs[n] - base
                ),
            ));
        }
        if self.keyed {
            b.keys[t] = KeyBags {
                offsets: offs.iter().map(|&o| (o - base) as u32).collect(),
                ids: read_range::<u64>(f, path, &idn, base, offs[n])?,
            };
            b.bags[t].offsets = vec![0; n + 1];
            return Ok(());
        }
        let ids = read_range::<u32>(f, path, &idn, base, offs[n])?;
        for i in 0..n {
            let bag = &ids[(offs[i] - base) as usize..(offs[i + 1] - base) as usize];
            if let Some(&id) = bag.iter().find(|&&id| id as u64 >= table.vocab) {
                return Err(Error::layout(
                    path,
                    &idn,
                    format!(
                        "example {}: id {id} >= vocab {} of table {t} ({:?})",
                        first + i as u64,
                        table.vocab,
                        table.name
                    ),
                ));
            }
        }
        b.bags[t] = Bags {
            offsets: offs.iter().map(|&o| (o - base) as u32).collect(),
            ids,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::preset;
    use hdf5::types::VarLenUnicode;

    fn tiny() -> ModelSpec {
        preset("tiny", 1.0).unwrap()
    }

    fn write(path: &Path, seed: u64, examples: u64) -> LogSummary {
        write_click_log(path, &tiny(), seed, examples, false, 128).unwrap()
    }

    #[test]
    fn round_trip_equals_the_generator() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("clicks.h5");
        let spec = tiny();
        let s = write(&p, 7, 1000);
        assert!(!temp_path(&p).exists());
        let gen = ClickGen::new(&spec, 7);
        let whole = gen.batch(0, 1000);
        assert_eq!(s.examples, 1000);
        assert_eq!(
            s.ids_per_table,
            whole
                .bags
                .iter()
                .map(|b| b.ids.len() as u64)
                .collect::<Vec<_>>()
        );
        let rate = whole.labels.iter().sum::<f32>() as f64 / 1000.0;
        assert!((s.positive_rate - rate).abs() < 1e-12);
        assert_eq!(s.bytes, std::fs::metadata(&p).unwrap().len());

        let log = ClickLog::open(&p).unwrap();
        assert_eq!(log.spec(), &spec);
        assert_eq!(log.seed(), 7);
        assert_eq!(log.examples(), 1000);
        assert_eq!(log.ids_per_table(), &s.ids_per_table[..]);
        assert_eq!(log.read(0, 1000).unwrap(), whole);
        assert_eq!(log.read(123, 456).unwrap(), gen.batch(123, 456));
        assert_eq!(log.read(999, 1).unwrap(), gen.batch(999, 1));
        assert_eq!(log.read(1000, 0).unwrap(), Batch::empty(&spec));
        let e = log.read(990, 11).unwrap_err().to_string();
        assert!(e.contains("outside the log's 1000 examples"), "{e}");

        // Chunks of one example, and a chunk larger than the log, write the same data.
        for chunk in [1, 5000] {
            let q = dir.path().join(format!("c{chunk}.h5"));
            write_click_log(&q, &spec, 7, 1000, false, chunk).unwrap();
            assert_eq!(ClickLog::open(&q).unwrap().read(0, 1000).unwrap(), whole);
        }
    }

    #[test]
    fn empty_log_and_bad_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty.h5");
        let s = write(&p, 1, 0);
        assert_eq!(s.ids_per_table, vec![0; 5]);
        let log = ClickLog::open(&p).unwrap();
        assert_eq!(log.examples(), 0);
        assert_eq!(log.read(0, 0).unwrap(), Batch::empty(&tiny()));

        let q = dir.path().join("zero-chunk.h5");
        assert!(write_click_log(&q, &tiny(), 1, 10, false, 0).is_err());
        assert!(!q.exists() && !temp_path(&q).exists());
        let e = write_click_log(&dir.path().join("no/such/dir.h5"), &tiny(), 1, 10, false, 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn refuses_to_overwrite_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("clicks.h5");
        write(&p, 1, 300);
        let before = std::fs::read(&p).unwrap();
        let e = write_click_log(&p, &tiny(), 2, 300, false, 64).unwrap_err();
        assert!(matches!(e, Error::OutputExists(_)), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), before);
        assert!(!temp_path(&p).exists());
        assert_eq!(ClickLog::open(&p).unwrap().seed(), 1);

        write_click_log(&p, &tiny(), 2, 200, true, 64).unwrap();
        let log = ClickLog::open(&p).unwrap();
        assert_eq!((log.seed(), log.examples()), (2, 200));
        assert_eq!(
            log.read(0, 200).unwrap(),
            ClickGen::new(&tiny(), 2).batch(0, 200)
        );
    }

    /// Where example `e`'s ids of table `t` start in the file.
    fn ids_start(p: &Path, t: usize, e: u64) -> u64 {
        let f = crate::io::h5::open(p).unwrap();
        read_range::<u64>(&f, p, &offsets_name(t), e, e + 1).unwrap()[0]
    }

    #[test]
    fn a_planted_bad_id_is_reported_with_dataset_and_example() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("clicks.h5");
        write(&p, 3, 200);
        let at = ids_start(&p, 1, 17) as usize;
        {
            let f = crate::io::h5::open_rw(&p).unwrap();
            let ds = f.dataset("/tables/1/ids").unwrap();
            ds.write_slice(&[50u32], at..at + 1).unwrap(); // vocab of table 1 is 50
        }
        let log = ClickLog::open(&p).unwrap();
        let e = log.read(0, 100).unwrap_err();
        assert!(matches!(e, Error::Layout { .. }));
        let e = e.to_string();
        assert!(
            e.contains("/tables/1/ids") && e.contains("example 17") && e.contains("clicks.h5"),
            "{e}"
        );
        // Ranges without that example still read.
        assert!(log.read(18, 100).is_ok());
        assert!(log.read(0, 17).is_ok());
    }

    #[test]
    fn corrupt_values_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("clicks.h5");
        write(&p, 4, 100);
        let at = ids_start(&p, 0, 80);
        {
            let f = crate::io::h5::open_rw(&p).unwrap();
            f.dataset("/labels")
                .unwrap()
                .write_slice(&[0.5f32], 42..43)
                .unwrap();
            f.dataset("/dense")
                .unwrap()
                .write_slice(ndarray::arr2(&[[f32::NAN]]).view(), (60..61, 2..3))
                .unwrap();
            f.dataset("/tables/0/offsets")
                .unwrap()
                .write_slice(&[at + 1000], 80..81)
                .unwrap();
        }
        let log = ClickLog::open(&p).unwrap();
        let e = log.read(40, 5).unwrap_err().to_string();
        assert!(e.contains("/labels") && e.contains("example 42"), "{e}");
        let e = log.read(55, 10).unwrap_err().to_string();
        assert!(
            e.contains("/dense") && e.contains("example 60, feature 2"),
            "{e}"
        );
        let e = log.read(75, 10).unwrap_err().to_string();
        assert!(
            e.contains("/tables/0/offsets") && e.contains("decreases at example 80"),
            "{e}"
        );
    }

    #[test]
    fn inconsistent_shapes_are_refused_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("clicks.h5");
        write(&p, 5, 100);
        let last = ids_start(&p, 2, 100);
        {
            let f = crate::io::h5::open_rw(&p).unwrap();
            f.dataset("/tables/2/offsets")
                .unwrap()
                .write_slice(&[last - 1], 100..101)
                .unwrap();
        }
        let e = ClickLog::open(&p).unwrap_err().to_string();
        assert!(
            e.contains("/tables/2/offsets") && e.contains("ends at"),
            "{e}"
        );

        write_click_log(&p, &tiny(), 5, 100, true, 64).unwrap();
        {
            let f = crate::io::h5::open_rw(&p).unwrap();
            f.unlink("labels").unwrap();
            f.new_dataset::<f32>().shape(99).create("labels").unwrap();
        }
        let e = ClickLog::open(&p).unwrap_err().to_string();
        assert!(e.contains("/labels") && e.contains("shape [99]"), "{e}");

        write_click_log(&p, &tiny(), 5, 100, true, 64).unwrap();
        {
            let f = crate::io::h5::open_rw(&p).unwrap();
            f.unlink("tables/4/ids").unwrap();
        }
        let e = ClickLog::open(&p).unwrap_err().to_string();
        assert!(e.contains("/tables/4/ids") && e.contains("missing"), "{e}");
    }

    #[test]
    fn wrong_schema_and_spec_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("clicks.h5");
        write(&p, 6, 10);
        let set_str = |k: &str, v: &str| {
            let f = crate::io::h5::open_rw(&p).unwrap();
            f.delete_attr(k).unwrap();
            let v: VarLenUnicode = v.parse().unwrap();
            f.new_attr::<VarLenUnicode>()
                .create(k)
                .unwrap()
                .write_scalar(&v)
                .unwrap();
        };
        set_str("schema", "torusrec-clicks-v3");
        let e = ClickLog::open(&p).unwrap_err().to_string();
        assert!(
            e.contains("schema") && e.contains("torusrec-clicks-v3"),
            "{e}"
        );
        // A v1 file that claims v2: its ids are u32 and it has no days.
        set_str("schema", SCHEMA_V2);
        let e = ClickLog::open(&p).unwrap_err().to_string();
        assert!(e.contains("/tables/0/ids"), "{e}");

        set_str("schema", SCHEMA);
        set_str("spec_json", "{\"tables\": 3}");
        let e = ClickLog::open(&p).unwrap_err().to_string();
        assert!(e.contains("spec_json"), "{e}");

        let mut bad = tiny();
        bad.tables[0].vocab = 0;
        set_str("spec_json", &serde_json::to_string(&bad).unwrap());
        let e = ClickLog::open(&p).unwrap_err().to_string();
        assert!(
            e.contains("spec_json") && e.contains("vocab must be"),
            "{e}"
        );

        // An HDF5 file without the attribute.
        let q = dir.path().join("other.h5");
        crate::io::h5::create(&q).unwrap();
        let e = ClickLog::open(&q).unwrap_err().to_string();
        assert!(e.contains("other.h5") && e.contains("schema"), "{e}");
    }

    /// A keyed (v2) log of the Criteo generator: 3 days of 400 examples.
    fn write_v2(path: &Path) -> crate::data::clicks::ingest::IngestReport {
        use crate::data::clicks::criteo::Layout;
        use crate::data::clicks::criteo_gen::{CriteoGen, GenSource};
        use crate::data::clicks::ingest::{global_write_log, LogHeader};
        let comm = crate::comm::single::SingleComm::new();
        let gen = CriteoGen::new(&tiny(), 9);
        let names: Vec<PathBuf> = (0..3).map(|d| format!("day_{d}.tsv").into()).collect();
        let header = LogHeader {
            format: "criteo".into(),
            columns: None,
            source: names.iter().map(|n| n.display().to_string()).collect(),
            seed: 9,
            dim: 8,
            table_names: Layout::criteo().table_names(),
        };
        let src = GenSource::new(gen, names, 400, 0, 1);
        global_write_log(&comm, &src, &header, path, 0).unwrap()
    }

    #[test]
    fn keyed_logs_read_keys_days_and_sources() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keyed.h5");
        let rep = write_v2(&p);
        let log = ClickLog::open(&p).unwrap();
        assert!(log.keyed());
        assert_eq!(log.days(), &[0, 400, 800, 1200]);
        assert_eq!(log.source_files(), &["day_0.tsv", "day_1.tsv", "day_2.tsv"]);
        assert_eq!(log.ids_per_table(), &rep.ids_per_table[..]);
        assert_eq!(log.spec().tables.len(), 26);
        assert_eq!(log.spec().tables[3].vocab, rep.distinct[3]);
        let whole = log.read(0, 1200).unwrap();
        assert_eq!(whole.keys.len(), 26);
        assert!(whole
            .bags
            .iter()
            .all(|b| b.ids.is_empty() && b.offsets == vec![0; 1201]));
        assert_eq!(
            whole
                .keys
                .iter()
                .map(|k| k.ids.len() as u64)
                .collect::<Vec<_>>(),
            rep.ids_per_table
        );
        // A range reads the same examples as the whole.
        let part = log.read(390, 20).unwrap();
        assert_eq!(part.dense, whole.dense[390 * 13..410 * 13]);
        assert_eq!(part.labels, whole.labels[390..410]);
        for (k, w) in part.keys.iter().zip(&whole.keys) {
            for e in 0..20 {
                assert_eq!(k.bag(e), w.bag(390 + e));
            }
        }
        assert_eq!(part.bags[0].offsets, vec![0; 21]);
        let empty = log.read(1200, 0).unwrap();
        assert!(empty
            .keys
            .iter()
            .all(|k| k.offsets == [0] && k.ids.is_empty()));
        // v1 logs have one day and no sources.
        let q = dir.path().join("v1.h5");
        write(&q, 1, 10);
        let v1 = ClickLog::open(&q).unwrap();
        assert!(!v1.keyed());
        assert_eq!((v1.days(), v1.source_files().len()), (&[0u64, 10][..], 0));
    }

    #[test]
    fn corrupt_keyed_logs_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keyed.h5");
        write_v2(&p);
        let edit = |f: &dyn Fn(&hdf5::File)| {
            let h = crate::io::h5::open_rw(&p).unwrap();
            f(&h);
        };
        edit(&|f| {
            f.dataset("/labels")
                .unwrap()
                .write_slice(&[2.0f32], 500..501)
                .unwrap()
        });
        edit(&|f| {
            f.dataset("/tables/7/offsets")
                .unwrap()
                .write_slice(&[0u64], 1000..1001)
                .unwrap()
        });
        let log = ClickLog::open(&p).unwrap();
        let e = log.read(400, 400).unwrap_err().to_string();
        assert!(e.contains("/labels") && e.contains("example 500"), "{e}");
        assert!(log.read(0, 400).is_ok());
        let e = log.read(900, 200).unwrap_err().to_string();
        assert!(
            e.contains("/tables/7/offsets") && e.contains("decreases at example 999"),
            "{e}"
        );
    }

    #[test]
    fn keyed_days_and_sources_are_checked_at_open() {
        let dir = tempfile::tempdir().unwrap();
        for (k, what) in ["decreasing", "short", "end", "sources"].iter().enumerate() {
            let p = dir.path().join(format!("k{k}.h5"));
            write_v2(&p);
            {
                let f = crate::io::h5::open_rw(&p).unwrap();
                let ds = f.dataset("/day_offsets").unwrap();
                match *what {
                    "decreasing" => ds.write_slice(&[900u64], 1..2).unwrap(),
                    "end" => ds.write_slice(&[1199u64], 3..4).unwrap(),
                    "short" => {
                        drop(ds);
                        f.unlink("day_offsets").unwrap();
                        f.new_dataset::<u64>()
                            .shape(1)
                            .create("day_offsets")
                            .unwrap();
                    }
                    _ => {
                        f.delete_attr("source").unwrap();
                        let v: VarLenUnicode = "[\"a\"]".parse().unwrap();
                        f.new_attr::<VarLenUnicode>()
                            .create("source")
                            .unwrap()
                            .write_scalar(&v)
                            .unwrap();
                    }
                }
            }
            let e = ClickLog::open(&p).unwrap_err().to_string();
            let want = match *what {
                "decreasing" => "decreases at day 2",
                "end" => "expected 0 to the 1200 examples",
                "short" => "expected at least 2",
                _ => "1 files for 3 days",
            };
            assert!(e.contains(want), "{what}: {e}");
        }
    }

    #[test]
    fn non_hdf5_empty_truncated_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("text.h5");
        std::fs::write(&text, "dense,labels\n1,0\n").unwrap();
        let e = ClickLog::open(&text).unwrap_err().to_string();
        assert!(
            e.contains("text.h5") && e.contains("not an HDF5 file"),
            "{e}"
        );

        let empty = dir.path().join("empty.h5");
        std::fs::write(&empty, "").unwrap();
        let e = ClickLog::open(&empty).unwrap_err().to_string();
        assert!(
            e.contains("empty.h5") && e.contains("not an HDF5 file"),
            "{e}"
        );

        let e = ClickLog::open(&dir.path().join("none.h5"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no such file"), "{e}");

        let p = dir.path().join("cut.h5");
        write(&p, 8, 2000);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
        let e = match ClickLog::open(&p) {
            Err(e) => e,
            Ok(log) => log.read(0, 2000).unwrap_err(),
        };
        assert!(e.to_string().contains("cut.h5"), "{e}");
    }
}
