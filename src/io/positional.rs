//! Positional writes into preallocated HDF5 datasets: rank 0 creates every dataset
//! contiguous with early allocation ([`create_allocated`]), so each has a fixed byte
//! offset in the file; the offsets are broadcast and every rank then writes (and
//! reads back) its disjoint ranges with `pwrite`/`pread` ([`PositionalFile`]), no
//! HDF5 handle open, in native byte order — as HDF5 stores `new_dataset::<u32>()`,
//! `<u64>()` and `<f32>()` on this platform.

use crate::error::{Error, Result};
use crate::io::h5::ctx as h5;
use hdf5::H5Type;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Marks a dataset without storage (no elements).
pub const NO_OFFSET: u64 = u64::MAX;

/// Bytes staged for one `pwrite`: a longer write goes in pieces of this size.
const STAGING_BYTES: usize = 16 << 20;

/// Rank 0: the dataset `name` of `shape` under `parent`, contiguous and allocated
/// now, with its byte offset in the file ([`NO_OFFSET`] when it has no elements).
/// `label` names it in errors.
pub fn create_allocated<T: H5Type>(
    parent: &hdf5::Group,
    tmp: &Path,
    name: &str,
    label: &str,
    shape: impl Into<hdf5::Extents>,
) -> Result<(hdf5::Dataset, u64)> {
    use hdf5::plist::dataset_create::AllocTime;
    let shape = shape.into();
    let elems = shape.size();
    let ds = h5(
        tmp,
        label,
        parent
            .new_dataset::<T>()
            .shape(shape)
            .alloc_time(Some(AllocTime::Early))
            .create(name),
    )?;
    if elems == 0 {
        return Ok((ds, NO_OFFSET));
    }
    let off = ds
        .offset()
        .ok_or_else(|| Error::layout(tmp, label, "no contiguous storage after early allocation"))?;
    Ok((ds, off))
}

/// Values stored as their native bytes.
pub trait Raw: Copy + Default {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(b: &[u8]) -> Self;
}

impl Raw for u32 {
    const SIZE: usize = 4;
    #[inline]
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_ne_bytes());
    }
    fn get(b: &[u8]) -> Self {
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Raw for u64 {
    const SIZE: usize = 8;
    #[inline]
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_ne_bytes());
    }
    fn get(b: &[u8]) -> Self {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        u64::from_ne_bytes(a)
    }
}

impl Raw for f32 {
    const SIZE: usize = 4;
    #[inline]
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_ne_bytes());
    }
    fn get(b: &[u8]) -> Self {
        f32::from_ne_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// The allocated datasets of a partial file, by index into their byte offsets.
pub struct PositionalFile<'a> {
    path: &'a Path,
    file: File,
    offs: Vec<u64>,
    /// Names a dataset in write errors (`None`: the file's path only).
    name: Option<fn(usize) -> &'static str>,
}

impl<'a> PositionalFile<'a> {
    /// Open `path` (created by rank 0) whose datasets start at byte `offs[i]`.
    pub fn open(path: &'a Path, offs: Vec<u64>) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        Ok(Self {
            path,
            file,
            offs,
            name: None,
        })
    }

    /// Name dataset `i` as `name(i)` in write errors.
    pub fn naming(mut self, name: fn(usize) -> &'static str) -> Self {
        self.name = Some(name);
        self
    }

    fn byte_at<T: Raw>(&self, ds: usize, at: u64) -> u64 {
        self.offs[ds] + at * T::SIZE as u64
    }

    /// Flush this rank's writes to stable storage (every rank, before the commit:
    /// on a shared file system another node's writes are its own to flush).
    pub fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| Error::io(self.path, e))
    }

    /// Write `data` at element `at` of dataset `ds`.
    pub fn put<T: Raw>(&self, ds: usize, at: u64, data: &[T]) -> Result<()> {
        self.put_iter(ds, at, data.iter().copied())
    }

    /// Write the values of `data` at element `at` of dataset `ds`, staging at most
    /// `STAGING_BYTES` (16 MB) at a time.
    pub fn put_iter<T: Raw>(
        &self,
        ds: usize,
        at: u64,
        mut data: impl ExactSizeIterator<Item = T>,
    ) -> Result<()> {
        let len = data.len();
        if len == 0 {
            return Ok(());
        }
        debug_assert_ne!(self.offs[ds], NO_OFFSET);
        let per = STAGING_BYTES / T::SIZE;
        let mut buf = Vec::with_capacity(per.min(len) * T::SIZE);
        let mut done = 0usize;
        while done < len {
            let k = per.min(len - done);
            buf.clear();
            for x in data.by_ref().take(k) {
                x.put(&mut buf);
            }
            let pos = self.byte_at::<T>(ds, at + done as u64);
            self.file
                .write_all_at(&buf, pos)
                .map_err(|e| self.write_error(ds, e))?;
            done += k;
        }
        Ok(())
    }

    fn write_error(&self, ds: usize, e: std::io::Error) -> Error {
        match self.name {
            Some(name) => Error::io(
                self.path,
                std::io::Error::new(e.kind(), format!("{}: {e}", name(ds))),
            ),
            None => Error::io(self.path, e),
        }
    }

    /// Read elements `lo..hi` of dataset `ds`.
    pub fn get<T: Raw>(&self, ds: usize, lo: u64, hi: u64) -> Result<Vec<T>> {
        if lo == hi {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; (hi - lo) as usize * T::SIZE];
        self.file
            .read_exact_at(&mut buf, self.byte_at::<T>(ds, lo))
            .map_err(|e| Error::io(self.path, e))?;
        Ok(buf.chunks_exact(T::SIZE).map(T::get).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values written at offsets read back, across staging pieces.
    #[test]
    fn put_then_get_round_trips() {
        let dir = std::env::temp_dir().join(format!("torusrec-positional-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.bin");
        std::fs::write(&path, vec![0u8; 64]).unwrap();
        let f = PositionalFile::open(&path, vec![0, 32]).unwrap();
        f.put(0, 1, &[7u32, 8, 9]).unwrap();
        f.put_iter(1, 2, [1.5f32, -2.0].into_iter()).unwrap();
        f.put::<u64>(0, 0, &[]).unwrap();
        assert_eq!(f.get::<u32>(0, 0, 4).unwrap(), vec![0, 7, 8, 9]);
        assert_eq!(f.get::<f32>(1, 2, 4).unwrap(), vec![1.5, -2.0]);
        f.sync().unwrap();
        drop(f);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
