//! One side's CSR shard (a contiguous block of rows of `/train` or `/train_t`, in
//! memory or left in the file), and the arc checksum by which the ranks check that
//! one side is the other's transpose.

use crate::comm::Comm;
use crate::error::{Error, Result};
use std::path::Path;

/// One side's CSR shard: rows `lo..hi` (global) of `/train` or `/train_t`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CsrShard {
    pub lo: u64,
    pub hi: u64,
    /// Local offsets, starting at 0.
    pub indptr: Vec<u64>,
    /// Global ids of the other side (empty when `on_disk`).
    pub indices: Vec<u32>,
    /// Not loaded: the training CSR stays in the prepared file (and goes to a spill,
    /// see `spill.rs`); this is the offset of the shard's first index there.
    pub on_disk: Option<u64>,
    /// The confidence of each index (beside `indices`), or empty: every confidence 1
    /// (`--confidence binary`, which never reads the stored weights).
    pub weights: Vec<f32>,
}

impl CsrShard {
    pub fn num_rows(&self) -> usize {
        (self.hi - self.lo) as usize
    }
    pub fn nnz(&self) -> u64 {
        self.indptr.last().copied().unwrap_or(0)
    }
    /// The confidences beside `indices`, or `None` when they are all 1.
    pub fn weights(&self) -> Option<&[f32]> {
        (!self.weights.is_empty()).then_some(&self.weights[..])
    }
    /// Observed count of each local row.
    pub fn counts(&self) -> Vec<u32> {
        self.indptr
            .windows(2)
            .map(|w| (w[1] - w[0]) as u32)
            .collect()
    }
}

/// Two independent 64-bit mixes of an arc, summed (wrapping) over every arc of
/// `/train` and of `/train_t`: equal sums say one is the other's transpose (a
/// mismatch goes unnoticed with probability about 2^-128).
/// Shards left on disk add nothing here: the spill adds their arcs as it reads them
/// ([`global_check_transpose`] then compares).
pub fn arc_checksum(csr: &CsrShard, transposed: bool) -> [u64; 2] {
    let mut s = [0u64; 2];
    if csr.on_disk.is_none() {
        add_checksum(&mut s, csr.lo, &csr.indptr, &csr.indices, transposed);
    }
    s
}

/// Collective: every rank must call. Compare the summed checksums of `/train`'s arcs
/// (`a`) and `/train_t`'s (`b`); returns `/train`'s sum over ranks.
pub fn global_check_transpose<C: Comm>(
    comm: &C,
    path: &Path,
    a: [u64; 2],
    b: [u64; 2],
) -> Result<[u64; 2]> {
    let mut sums = [a[0], a[1], b[0], b[1]];
    comm.all_reduce_sum(&mut sums);
    if sums[..2] != sums[2..] {
        // Every rank sees the same sums; rank 0 reports, the others name it.
        return Err(if comm.rank() == 0 {
            Error::layout(
                path,
                "train_t/indices",
                "not the transpose of /train (the arcs' checksums differ)",
            )
        } else {
            Error::Remote { rank: 0, code: 2 }
        });
    }
    Ok([sums[0], sums[1]])
}

/// Add the arcs of rows `first..` (local `indptr` over `indices`) to a transpose
/// checksum (see [`arc_checksum`]).
pub fn add_checksum(
    s: &mut [u64; 2],
    first: u64,
    indptr: &[u64],
    indices: &[u32],
    transposed: bool,
) {
    for (i, w) in indptr.windows(2).enumerate() {
        let a = first + i as u64;
        for &b in &indices[w[0] as usize..w[1] as usize] {
            let (r, c) = if transposed {
                (b as u64, a)
            } else {
                (a, b as u64)
            };
            let key = (r << 32) | c;
            s[0] = s[0].wrapping_add(crate::rng::mix64(key ^ 0x9e37_79b9_7f4a_7c15));
            s[1] = s[1].wrapping_add(crate::rng::mix64(
                key.rotate_left(17) ^ 0xd1b5_4a32_d192_ed03,
            ));
        }
    }
}
