//! Large buffers backed by transparent huge pages where the kernel allows it.
//!
//! The solves read the fixed table at random, one row per non-zero: with 4 KiB pages
//! nearly every row costs a TLB miss and a page walk on top of its cache misses, since
//! a table of hundreds of MB spans far more pages than the TLB holds. A buffer made by
//! [`huge_vec`] asks the kernel (`madvise(MADV_HUGEPAGE)`, before any page is touched)
//! for 2 MiB pages, so the same table spans a few hundred TLB entries. It is a hint:
//! with transparent huge pages disabled (`/sys/kernel/mm/transparent_hugepage/enabled`
//! = `never`) or on other systems the buffer is an ordinary one. Contents and results
//! never depend on it.

/// The huge page size the hint aligns to.
const HUGE_PAGE: usize = 2 << 20;

/// Buffers smaller than this are left alone (they would gain little).
const MIN_BYTES: usize = 4 << 20;

/// `vec![value; n]`, with its memory advised for huge pages first.
pub fn huge_vec<T: Clone>(n: usize, value: T) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(n);
    advise(
        v.as_mut_ptr().cast::<u8>(),
        n.saturating_mul(std::mem::size_of::<T>()),
    );
    v.resize(n, value);
    v
}

/// Advise the whole huge pages inside `[ptr, ptr + bytes)`.
fn advise(ptr: *mut u8, bytes: usize) {
    if bytes < MIN_BYTES {
        return;
    }
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize + bytes) / HUGE_PAGE * HUGE_PAGE;
    if end <= start {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: the range lies inside an allocation this process owns and has not yet
    // touched; MADV_HUGEPAGE only changes how its pages are backed, never its contents.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_vec_is_vec_of_the_value() {
        for n in [0usize, 1, 1000, (5 << 20) / 4 + 3] {
            let v = huge_vec(n, 7u32);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&x| x == 7));
        }
        let v = huge_vec(3, 1.5f32);
        assert_eq!(v, vec![1.5f32; 3]);
    }
}
