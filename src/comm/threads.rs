//! Threads simulating N ranks in one process, for testing collective logic in plain
//! `cargo test`. Reductions add contributions in rank order, so results are
//! deterministic. If one simulated rank panics, the others panic at their next
//! collective instead of waiting forever.

use super::{dims_create, Comm, CommStats, Elem, Summable, Torus};
use crate::error::Result;
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

type Slot = Option<Arc<dyn Any + Send + Sync>>;

struct Shared {
    size: usize,
    slots: Mutex<Vec<Slot>>,
    gate: Mutex<(usize, u64)>, // (arrived, generation)
    cv: Condvar,
    poisoned: AtomicBool,
}

impl Shared {
    fn barrier(&self) {
        let mut g = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        let generation = g.1;
        g.0 += 1;
        if g.0 == self.size {
            g.0 = 0;
            g.1 += 1;
            self.cv.notify_all();
            return;
        }
        while g.1 == generation {
            if self.poisoned.load(Ordering::SeqCst) {
                drop(g);
                panic!("another simulated rank panicked");
            }
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// One simulated rank.
pub struct ThreadComm {
    rank: usize,
    shared: Arc<Shared>,
    torus: Torus,
    stats: CommStats,
}

struct PoisonOnPanic(Arc<Shared>);
impl Drop for PoisonOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.poisoned.store(true, Ordering::SeqCst);
            self.0.cv.notify_all();
        }
    }
}

/// Run `f` on `size` simulated ranks (threads) laid out as a 2-D torus from
/// [`dims_create`]; returns each rank's result in rank order. Panics if a rank panics.
pub fn run<R, F>(size: usize, f: F) -> Vec<R>
where
    R: Send,
    F: Fn(ThreadComm) -> R + Sync,
{
    run_on(&dims_create(size, 2), f)
}

/// As [`run`], on a torus of the given dimensions.
pub fn run_on<R, F>(dims: &[usize], f: F) -> Vec<R>
where
    R: Send,
    F: Fn(ThreadComm) -> R + Sync,
{
    let size: usize = dims.iter().product();
    assert!(size > 0, "a torus needs at least one rank");
    let shared = Arc::new(Shared {
        size,
        slots: Mutex::new(vec![None; size]),
        gate: Mutex::new((0, 0)),
        cv: Condvar::new(),
        poisoned: AtomicBool::new(false),
    });
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let shared = Arc::clone(&shared);
                let f = &f;
                let dims = dims.to_vec();
                s.spawn(move || {
                    let _guard = PoisonOnPanic(Arc::clone(&shared));
                    f(ThreadComm {
                        rank,
                        shared,
                        torus: Torus::new(&dims, rank),
                        stats: CommStats::default(),
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

impl ThreadComm {
    /// Post `mine`, wait for every rank, and return every rank's post in rank order.
    fn exchange<V: Send + Sync + 'static>(&self, mine: V) -> Vec<Arc<V>> {
        self.shared.slots.lock().unwrap_or_else(|e| e.into_inner())[self.rank] =
            Some(Arc::new(mine));
        self.shared.barrier();
        let all: Vec<Arc<V>> = self
            .shared
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|s| {
                let any = Arc::clone(s.as_ref().expect("every rank posted"));
                any.downcast::<V>()
                    .unwrap_or_else(|_| panic!("ranks called different collectives"))
            })
            .collect();
        // Nobody overwrites a slot before every rank has read them all.
        self.shared.barrier();
        all
    }
}

impl Comm for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.size
    }
    fn torus(&self) -> &Torus {
        &self.torus
    }
    fn stats(&self) -> &CommStats {
        &self.stats
    }
    fn raw_barrier(&self) {
        self.shared.barrier();
    }
    fn raw_all_reduce_sum<T: Summable>(&self, buf: &mut [T]) {
        let all = self.exchange(buf.to_vec());
        for (i, x) in buf.iter_mut().enumerate() {
            let mut acc = all[0][i];
            for other in &all[1..] {
                acc = acc.add(other[i]);
            }
            *x = acc;
        }
    }
    fn raw_all_reduce_max_u64(&self, value: u64) -> u64 {
        self.exchange(value)
            .iter()
            .map(|v| **v)
            .max()
            .unwrap_or(value)
    }
    fn raw_all_to_all_counts(&self, send: &[usize]) -> Result<Vec<usize>> {
        let all = self.exchange(send.to_vec());
        Ok(all.iter().map(|c| c[self.rank]).collect())
    }
    fn raw_all_to_all_v_into<T: Elem>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv_counts: &[usize],
        recv: &mut Vec<T>,
    ) -> Result<()> {
        let all = self.exchange((send.to_vec(), super::prefix_offsets(send_counts)));
        recv.clear();
        recv.reserve(recv_counts.iter().sum());
        for (data, offsets) in all.iter().map(|a| &**a) {
            recv.extend_from_slice(&data[offsets[self.rank]..offsets[self.rank + 1]]);
        }
        Ok(())
    }
    fn raw_all_gather_u64(&self, value: u64) -> Vec<u64> {
        self.exchange(value).iter().map(|v| **v).collect()
    }
    fn raw_all_gather_v<T: Elem>(&self, send: &[T], counts: &[usize]) -> Result<Vec<T>> {
        let all = self.exchange(send.to_vec());
        let mut out = Vec::with_capacity(counts.iter().sum());
        for part in &all {
            out.extend_from_slice(part);
        }
        Ok(out)
    }
    fn raw_broadcast<T: Elem>(&self, root: usize, buf: &mut [T]) -> Result<()> {
        let all = self.exchange(buf.to_vec());
        buf.copy_from_slice(&all[root]);
        Ok(())
    }
    fn raw_shift<T: Elem>(&self, dim: usize, up: bool, send: &[T]) -> Result<Vec<T>> {
        let all = self.exchange(send.to_vec());
        // From the neighbour one step the other way.
        let (down, upn) = self.torus.neighbours[dim];
        Ok(all[if up { down } else { upn }].to_vec())
    }
}
