//! Tables by global id in HDF5: the trained model (`/W`, `/H`) and, later, checkpoints.
//! Written through a temporary name by every rank in turn, then renamed by rank 0.

use crate::comm::Comm;
use crate::data::dataset::temp_path;
use crate::error::{Error, Result};
use crate::rng::mix64;
use hdf5::types::VarLenUnicode;
use std::path::Path;

/// One rank's rows `lo..lo + data.len()/d` of a distributed `n x d` f32 table.
pub struct TablePart<'a> {
    pub name: &'a str,
    pub n: u64,
    pub lo: u64,
    pub data: &'a [f32],
}

fn h5<T>(path: &Path, what: impl Into<String>, r: hdf5::Result<T>) -> Result<T> {
    r.map_err(|e| Error::hdf5(path, what, e))
}

/// Collective: every rank must call. Writes `tables` and string/number attributes to
/// `out` atomically (temporary file, rank-ordered writes, rename by rank 0).
pub fn global_write_tables<C: Comm>(
    comm: &C,
    out: &Path,
    d: usize,
    tables: &[TablePart],
    str_attrs: &[(&str, String)],
    f64_attrs: &[(&str, f64)],
) -> Result<()> {
    let _p = comm.stats().phase("io");
    let tmp = temp_path(out);
    let created = if comm.rank() == 0 {
        (|| -> Result<()> {
            let f = h5(&tmp, "create", hdf5::File::create(&tmp))?;
            for t in tables {
                h5(
                    &tmp,
                    t.name,
                    f.new_dataset::<f32>()
                        .shape((t.n as usize, d))
                        .create(t.name),
                )?;
            }
            for (k, v) in str_attrs {
                let v: VarLenUnicode = v
                    .parse()
                    .map_err(|e| Error::Config(format!("attribute {k}: {e}")))?;
                h5(
                    &tmp,
                    *k,
                    f.new_attr::<VarLenUnicode>()
                        .create(*k)
                        .and_then(|a| a.write_scalar(&v)),
                )?;
            }
            for (k, v) in f64_attrs {
                h5(
                    &tmp,
                    *k,
                    f.new_attr::<f64>()
                        .create(*k)
                        .and_then(|a| a.write_scalar(v)),
                )?;
            }
            h5(&tmp, "close", f.close())
        })()
    } else {
        Ok(())
    };
    comm.agree(created)?;
    let mut mine = Ok(());
    for turn in 0..comm.size() {
        comm.barrier();
        if turn == comm.rank() {
            mine = (|| -> Result<()> {
                let f = h5(&tmp, "open", hdf5::File::open_rw(&tmp))?;
                for t in tables {
                    let rows = t.data.len() / d;
                    if rows == 0 {
                        continue;
                    }
                    let ds = h5(&tmp, t.name, f.dataset(t.name))?;
                    let view = ndarray::ArrayView2::from_shape((rows, d), t.data)
                        .map_err(|e| Error::Comm(format!("table {}: {e}", t.name)))?;
                    let lo = t.lo as usize;
                    h5(
                        &tmp,
                        t.name,
                        ds.write_slice(view, ndarray::s![lo..lo + rows, ..]),
                    )?;
                }
                h5(&tmp, "close", f.close())
            })();
            crate::ckpt::faults::point("after-shard-write", comm.rank());
        }
    }
    let mut result = comm.agree(mine);
    if result.is_ok() && comm.rank() == 0 {
        crate::ckpt::faults::point("before-commit", 0);
        result = std::fs::rename(&tmp, out).map_err(|e| Error::io(out, e));
    }
    let result = comm.agree(result);
    if result.is_err() && comm.rank() == 0 {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// An order-independent checksum of a table part by global row id (sum over rows of a
/// hash of the row's bits and id), to be summed over ranks.
pub fn local_checksum(data: &[f32], lo: u64, d: usize, salt: u64) -> u64 {
    data.chunks_exact(d)
        .enumerate()
        .map(|(i, row)| {
            let mut h = mix64(salt ^ (lo + i as u64));
            for x in row {
                h = mix64(h ^ x.to_bits() as u64);
            }
            h
        })
        .fold(0u64, |a, b| a.wrapping_add(b))
}

/// Rank-local: rows `lo..hi` of the `n x d` f32 table `name` in an open file.
pub fn local_read_rows(
    f: &hdf5::File,
    path: &Path,
    name: &str,
    lo: u64,
    hi: u64,
    d: usize,
) -> Result<Vec<f32>> {
    let ds = f
        .dataset(name)
        .map_err(|_| Error::Hold(format!("{}: dataset /{name} is missing", path.display())))?;
    let shape = ds.shape();
    if shape.len() != 2 || shape[1] != d || (shape[0] as u64) < hi {
        return Err(Error::Hold(format!(
            "{}: dataset /{name} has shape {shape:?}, expected at least {hi} x {d}",
            path.display()
        )));
    }
    if lo == hi {
        return Ok(Vec::new());
    }
    ds.read_slice_2d::<f32, _>(ndarray::s![lo as usize..hi as usize, ..])
        .map(|a| a.into_raw_vec_and_offset().0)
        .map_err(|e| {
            Error::Hold(format!(
                "{}: dataset /{name} is unreadable: {e}",
                path.display()
            ))
        })
}

/// Rank-local: a string attribute of the root group.
pub fn read_str_attr(f: &hdf5::File, path: &Path, name: &str) -> Result<String> {
    f.attr(name)
        .and_then(|a| a.read_scalar::<VarLenUnicode>())
        .map(|s| s.as_str().to_string())
        .map_err(|e| {
            Error::Hold(format!(
                "{}: attribute {name} is missing or unreadable: {e}",
                path.display()
            ))
        })
}
