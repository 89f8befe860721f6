//! The global allocator: the system's, counting large allocations so that a training
//! step can show (and a test can check) that its hot path allocates none.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// Allocations of at least this many bytes are counted (payloads, per-table
/// buffers); smaller ones (headers, per-rank counts) are not.
pub const LARGE: usize = 64 << 10;

/// The system allocator, counting allocations (and growing reallocations) of at least
/// [`LARGE`] bytes. The count costs one comparison per allocation and one relaxed
/// atomic add per large one.
pub struct Counting;

static LARGE_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static LARGE_LIVE: AtomicU64 = AtomicU64::new(0);
static LARGE_PEAK: AtomicU64 = AtomicU64::new(0);

fn grew(bytes: usize) {
    let live = LARGE_LIVE.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
    LARGE_PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrank(bytes: usize) {
    LARGE_LIVE.fetch_sub(bytes as u64, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= LARGE {
            LARGE_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            grew(layout.size());
        }
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= LARGE {
            LARGE_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            grew(layout.size());
        }
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= LARGE {
            shrank(layout.size());
        }
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= LARGE && new_size > layout.size() {
            LARGE_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        if layout.size() >= LARGE {
            shrank(layout.size());
        }
        if new_size >= LARGE {
            grew(new_size);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Make room in `v` for `total` elements in all. When it must grow, a quarter more:
/// a buffer refilled every step with about the same amount then allocates once, not
/// each time a step is a little larger than every earlier one.
pub fn reserve_with_room<T>(v: &mut Vec<T>, total: usize) {
    if total > v.capacity() {
        v.reserve(total + total / 4 - v.len());
    }
}

/// Make `v` `len` long for a caller that overwrites every element: a reused buffer
/// keeps its old values (no zero fill); only a grown tail is filled, with room to
/// spare (see [`reserve_with_room`]).
pub fn resize_for_overwrite<T: Copy + Default>(v: &mut Vec<T>, len: usize) {
    reserve_with_room(v, len);
    v.resize(len, T::default());
    v.truncate(len);
}

/// Make room in `v` for `total` elements in all, exactly (no doubling): when it must
/// grow, its old buffer is freed before the new one is made, so that the two are never
/// held at once (its contents are dropped: for a caller that overwrites them).
pub fn regrow_exact<T>(v: &mut Vec<T>, total: usize) {
    if total > v.capacity() {
        *v = Vec::new();
        v.reserve_exact(total);
    }
}

/// Large allocations (of at least [`LARGE`] bytes) made so far by this process, on
/// every thread.
pub fn large_allocations() -> u64 {
    LARGE_ALLOCATIONS.load(Ordering::Relaxed)
}

/// `(live, peak)` bytes of large allocations (of at least [`LARGE`] bytes) on every
/// thread: the heap the estimate of a run's memory accounts for, without the
/// program, its libraries and the allocator's own slack.
pub fn large_bytes() -> (u64, u64) {
    (
        LARGE_LIVE.load(Ordering::Relaxed),
        LARGE_PEAK.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_for_overwrite_sets_the_length_and_fills_only_a_grown_tail() {
        let mut v: Vec<u32> = vec![7, 8, 9];
        resize_for_overwrite(&mut v, 2);
        assert_eq!(v, [7, 8]);
        // Back within the old length: the kept values stay, the tail is filled.
        resize_for_overwrite(&mut v, 4);
        assert_eq!(v, [7, 8, 0, 0]);
        // Growing past the capacity leaves a quarter more room.
        resize_for_overwrite(&mut v, 100);
        assert_eq!(v.len(), 100);
        assert!(v.capacity() >= 125, "{}", v.capacity());
    }

    #[test]
    fn regrow_exact_grows_to_the_size_asked_and_keeps_a_large_enough_buffer() {
        let mut v: Vec<u32> = Vec::with_capacity(10);
        v.extend([1, 2, 3]);
        regrow_exact(&mut v, 8);
        assert_eq!(v, [1, 2, 3], "a buffer with room is kept as it is");
        regrow_exact(&mut v, 1000);
        assert!(v.is_empty());
        assert!(
            v.capacity() >= 1000 && v.capacity() < 1250,
            "{}",
            v.capacity()
        );
    }

    #[test]
    fn large_allocations_are_counted() {
        // Other tests run in parallel threads of this process: count a few large
        // allocations and check that at least as many were recorded.
        let before = large_allocations();
        let v: Vec<Vec<u8>> = (0..5).map(|_| vec![1u8; LARGE]).collect();
        let after = large_allocations();
        assert!(after - before >= 5, "{before} -> {after}");
        std::hint::black_box(&v);
        // Growing a vector past the threshold counts too.
        let before = large_allocations();
        let mut g: Vec<u8> = Vec::with_capacity(16);
        g.resize(4 * LARGE, 0);
        assert!(large_allocations() > before);
        std::hint::black_box(&g);
    }
}
