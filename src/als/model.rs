//! Tables by global id in HDF5: the trained model (`/W`, `/H`) and the checkpoints.
//! Committed by [`crate::ckpt::commit::global_write_atomic`]: through a temporary name,
//! written by every rank in turn, renamed by rank 0.

use crate::bf16::{Bf16, TableDtype, TableElem};
use crate::ckpt::commit::global_write_atomic;
use crate::comm::{Comm, Elem};
use crate::error::{Error, Result};
use crate::io::h5::{ctx as h5, write_attr, write_attrs, Attr};
use crate::rng::mix64;
use hdf5::types::VarLenUnicode;
use std::path::Path;

/// The root attribute of a model (`als --out`) that names the dataset it was trained
/// on: the checksum of the dataset's `/train` arcs ([`data_checksum_hex`]), the same at
/// every rank count. `recommend` refuses a dataset with another checksum; a model
/// written before the attribute existed is accepted with a warning.
pub const DATA_CHECKSUM: &str = "data_checksum";

/// The 32 hex digits of a dataset's arcs checksum (`Shards::arcs_checksum`).
pub fn data_checksum_hex(c: [u64; 2]) -> String {
    format!("{:016x}{:016x}", c[0], c[1])
}

/// One rank's rows `lo..lo + data.len()/d` of a distributed `n x d` table.
pub struct TablePart<'a, T> {
    pub name: &'a str,
    pub n: u64,
    pub lo: u64,
    pub data: &'a [T],
}

/// How a table's element type is stored in HDF5: f32 as f32; bf16 as its u16 bit
/// pattern, with the dataset attribute `dtype = "bf16"` (HDF5 has no bf16 type).
pub trait StoredElem: TableElem {
    fn create(f: &hdf5::File, name: &str, n: usize, d: usize) -> hdf5::Result<hdf5::Dataset>;
    fn write(
        ds: &hdf5::Dataset,
        data: &[Self],
        rows: usize,
        d: usize,
        lo: usize,
    ) -> hdf5::Result<()>;
    fn read(ds: &hdf5::Dataset, lo: usize, hi: usize) -> hdf5::Result<Vec<Self>>;
}

fn write_rows<U: hdf5::H5Type>(
    ds: &hdf5::Dataset,
    data: &[U],
    rows: usize,
    d: usize,
    lo: usize,
) -> hdf5::Result<()> {
    let view = ndarray::ArrayView2::from_shape((rows, d), data)
        .map_err(|e| hdf5::Error::from(e.to_string().as_str()))?;
    ds.write_slice(view, ndarray::s![lo..lo + rows, ..])
}

fn read_rows<U: hdf5::H5Type>(ds: &hdf5::Dataset, lo: usize, hi: usize) -> hdf5::Result<Vec<U>> {
    ds.read_slice_2d::<U, _>(ndarray::s![lo..hi, ..])
        .map(|a| a.into_raw_vec_and_offset().0)
}

impl StoredElem for f32 {
    fn create(f: &hdf5::File, name: &str, n: usize, d: usize) -> hdf5::Result<hdf5::Dataset> {
        f.new_dataset::<f32>().shape((n, d)).create(name)
    }
    fn write(
        ds: &hdf5::Dataset,
        data: &[f32],
        rows: usize,
        d: usize,
        lo: usize,
    ) -> hdf5::Result<()> {
        write_rows(ds, data, rows, d, lo)
    }
    fn read(ds: &hdf5::Dataset, lo: usize, hi: usize) -> hdf5::Result<Vec<f32>> {
        read_rows(ds, lo, hi)
    }
}

impl StoredElem for Bf16 {
    fn create(f: &hdf5::File, name: &str, n: usize, d: usize) -> hdf5::Result<hdf5::Dataset> {
        let ds = f.new_dataset::<u16>().shape((n, d)).create(name)?;
        let v: VarLenUnicode = "bf16".parse().map_err(|_| hdf5::Error::from("dtype"))?;
        ds.new_attr::<VarLenUnicode>()
            .create("dtype")
            .and_then(|a| a.write_scalar(&v))?;
        Ok(ds)
    }
    fn write(
        ds: &hdf5::Dataset,
        data: &[Bf16],
        rows: usize,
        d: usize,
        lo: usize,
    ) -> hdf5::Result<()> {
        write_rows(ds, crate::bf16::bits(data), rows, d, lo)
    }
    fn read(ds: &hdf5::Dataset, lo: usize, hi: usize) -> hdf5::Result<Vec<Bf16>> {
        read_rows::<u16>(ds, lo, hi).map(crate::bf16::from_bits)
    }
}

/// The element types a table can be stored in: f32 or bf16 (`--table-dtype`).
pub trait TableScalar: StoredElem + Elem {}
impl TableScalar for f32 {}
impl TableScalar for Bf16 {}

/// The element type a stored table dataset holds: `dtype = "bf16"` on a u16 dataset,
/// else f32.
pub fn stored_dtype(ds: &hdf5::Dataset) -> TableDtype {
    let tagged = ds
        .attr("dtype")
        .and_then(|a| a.read_scalar::<VarLenUnicode>())
        .is_ok_and(|v| v.as_str() == "bf16");
    if tagged {
        TableDtype::Bf16
    } else {
        TableDtype::F32
    }
}

/// Collective: every rank must call. Writes `tables` with the root attribute
/// `table_dtype` and `attrs` to `out` atomically ([`crate::ckpt::commit`]: temporary
/// file, rank-ordered writes, rename by rank 0).
pub fn global_write_tables<C: Comm, T: StoredElem>(
    comm: &C,
    out: &Path,
    d: usize,
    tables: &[TablePart<T>],
    attrs: &[(&str, Attr)],
) -> Result<()> {
    let _p = comm.stats().phase("io");
    let create = |tmp: &Path| -> Result<()> {
        let f = h5(tmp, "create", crate::io::h5::create(tmp))?;
        for t in tables {
            h5(tmp, t.name, T::create(&f, t.name, t.n as usize, d))?;
        }
        write_attr(&f, tmp, "table_dtype", &Attr::Str(T::DTYPE.name().into()))?;
        write_attrs(&f, tmp, attrs)?;
        h5(tmp, "close", f.close())
    };
    let write = |tmp: &Path| -> Result<()> {
        let f = h5(tmp, "open", crate::io::h5::open_rw(tmp))?;
        for t in tables {
            let rows = t.data.len() / d;
            if rows == 0 {
                continue;
            }
            let ds = h5(tmp, t.name, f.dataset(t.name))?;
            h5(tmp, t.name, T::write(&ds, t.data, rows, d, t.lo as usize))?;
        }
        h5(tmp, "close", f.close())
    };
    global_write_atomic(comm, out, create, write)
}

/// An order-independent checksum of a table part by global row id (sum over rows of a
/// hash of the row's bits and id), to be summed over ranks. A bf16 value hashes as its
/// (exact) f32 widening, so a table and its f32 copy have the same checksum.
pub fn local_checksum<T: TableElem>(data: &[T], lo: u64, d: usize, salt: u64) -> u64 {
    data.chunks_exact(d)
        .enumerate()
        .map(|(i, row)| {
            let mut h = mix64(salt ^ (lo + i as u64));
            for x in row {
                h = mix64(h ^ x.to_f32().to_bits() as u64);
            }
            h
        })
        .fold(0u64, |a, b| a.wrapping_add(b))
}

/// Rank-local: rows `lo..hi` of the `n x d` table `name` in an open file, stored in
/// `T`'s element type (another element type is refused, naming both).
pub fn local_read_rows<T: StoredElem>(
    f: &hdf5::File,
    path: &Path,
    name: &str,
    lo: u64,
    hi: u64,
    d: usize,
) -> Result<Vec<T>> {
    let ds = f
        .dataset(name)
        .map_err(|_| Error::Corrupt(format!("{}: dataset /{name} is missing", path.display())))?;
    let stored = stored_dtype(&ds);
    if stored != T::DTYPE {
        return Err(Error::Hold(format!(
            "{}: dataset /{name} holds {stored} values, this run stores its tables in {} (--table-dtype {})",
            path.display(),
            T::DTYPE,
            T::DTYPE
        )));
    }
    let shape = ds.shape();
    if shape.len() != 2 || shape[1] != d || (shape[0] as u64) < hi {
        return Err(Error::Corrupt(format!(
            "{}: dataset /{name} has shape {shape:?}, expected at least {hi} x {d}",
            path.display()
        )));
    }
    if lo == hi {
        return Ok(Vec::new());
    }
    T::read(&ds, lo as usize, hi as usize).map_err(|e| {
        Error::Corrupt(format!(
            "{}: dataset /{name} is unreadable: {e}",
            path.display()
        ))
    })
}
