//! The tables' starting values (from the seed and each row's global id) and the
//! Gramian of a distributed table.

use crate::als::solve::gramian;
use crate::bf16::TableElem;
use crate::comm::Comm;
use crate::rng::SplitMix64;

/// Initial embedding of global id `id`: N(0, (init_std / sqrt(d))^2), from (seed, id),
/// rounded to the table's element type.
pub fn init_table<T: TableElem>(
    lo: u64,
    n: usize,
    d: usize,
    seed: u64,
    which: u64,
    init_std: f32,
) -> Vec<T> {
    let scale = init_std as f64 / (d as f64).sqrt();
    let mut t = crate::hugepages::huge_vec(n * d, T::default());
    for (i, row) in t.chunks_exact_mut(d.max(1)).enumerate() {
        let mut g = SplitMix64::for_id(seed, which, lo + i as u64);
        for x in row {
            *x = T::from_f32((g.next_normal() * scale) as f32);
        }
    }
    t
}

/// Collective: every rank must call. The Gramian of a distributed table.
pub fn global_gramian<C: Comm, T: TableElem>(comm: &C, local: &[T], d: usize) -> Vec<f64> {
    let mut g = gramian(local, d);
    let _p = comm.stats().phase("gramian");
    comm.all_reduce_sum(&mut g);
    g
}
