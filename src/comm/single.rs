//! The size-1 communicator: every collective is a local copy.

use super::{Comm, CommStats, Elem, Summable, Torus};
use crate::error::Result;

#[derive(Debug)]
pub struct SingleComm {
    torus: Torus,
    stats: CommStats,
}

impl Default for SingleComm {
    fn default() -> Self {
        Self {
            torus: Torus::new(&[1, 1], 0),
            stats: CommStats::default(),
        }
    }
}

impl SingleComm {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Comm for SingleComm {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn torus(&self) -> &Torus {
        &self.torus
    }
    fn stats(&self) -> &CommStats {
        &self.stats
    }
    fn raw_barrier(&self) {}
    fn raw_all_reduce_sum<T: Summable>(&self, _buf: &mut [T]) {}
    fn raw_all_reduce_max_u64(&self, value: u64) -> u64 {
        value
    }
    fn raw_all_to_all_counts(&self, send: &[usize]) -> Result<Vec<usize>> {
        Ok(send.to_vec())
    }
    fn raw_all_to_all_v_into<T: Elem>(
        &self,
        send: &[T],
        _: &[usize],
        _: &[usize],
        recv: &mut Vec<T>,
    ) -> Result<()> {
        recv.clear();
        recv.extend_from_slice(send);
        Ok(())
    }
    fn raw_all_gather_u64(&self, value: u64) -> Vec<u64> {
        vec![value]
    }
    fn raw_all_gather_v<T: Elem>(&self, send: &[T], _: &[usize]) -> Result<Vec<T>> {
        Ok(send.to_vec())
    }
    fn raw_broadcast<T: Elem>(&self, _root: usize, _buf: &mut [T]) -> Result<()> {
        Ok(())
    }
    fn raw_shift<T: Elem>(&self, _dim: usize, _up: bool, send: &[T]) -> Result<Vec<T>> {
        Ok(send.to_vec())
    }
}
