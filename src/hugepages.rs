//! Large buffers backed by transparent huge pages where the kernel allows it.
//!
//! The solves read the fixed table at random, one row per non-zero: with 4 KiB pages
//! nearly every row costs a TLB miss and a page walk on top of its cache misses, since
//! a table of hundreds of MB spans far more pages than the TLB holds. A buffer made by
//! [`huge_vec`] asks the kernel (`madvise(MADV_HUGEPAGE)`, before any page is touched)
//! for 2 MiB pages, so the same table spans a few hundred TLB entries. The advice only
//! shapes pages not yet touched: when the allocator hands back memory this process
//! used before (a freed buffer's, in the heap), those pages are already 4 KiB ones.
//! So once the buffer is filled, [`huge_vec`] also asks the kernel to collapse it
//! into huge pages now (`MADV_COLLAPSE`, Linux 6.1 and later; a no-op on pages that
//! are huge already). Without it, which shards of a rank ended up on 4 KiB pages
//! depended on what that rank had allocated and freed before: in torchrec-peer at
//! P = 2, rank 0 (which plans and prints) had 22-35 MB of its embedding shards on
//! small pages and rank 1 none, and on plans that give both ranks the same work
//! rank 0 was the busier (by 3 and 6 % over four runs each; `bench/costs.md`). It is
//! all a hint:
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
    collapse(
        v.as_mut_ptr().cast::<u8>(),
        n.saturating_mul(std::mem::size_of::<T>()),
    );
    v
}

/// The whole huge pages inside `[ptr, ptr + bytes)`, with their start and length
/// (none when the range holds no whole huge page or is too small to bother).
fn inner_huge_pages(ptr: *mut u8, bytes: usize) -> Option<(usize, usize)> {
    if bytes < MIN_BYTES {
        return None;
    }
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize + bytes) / HUGE_PAGE * HUGE_PAGE;
    (end > start).then_some((start, end - start))
}

/// Advise the whole huge pages inside `[ptr, ptr + bytes)`.
fn advise(ptr: *mut u8, bytes: usize) {
    let Some((_start, _len)) = inner_huge_pages(ptr, bytes) else {
        return;
    };
    #[cfg(target_os = "linux")]
    // SAFETY: the range lies inside an allocation this process owns;
    // MADV_HUGEPAGE only changes how its pages are backed, never its contents.
    unsafe {
        libc::madvise(_start as *mut libc::c_void, _len, libc::MADV_HUGEPAGE);
    }
}

/// `MADV_COLLAPSE` (Linux 6.1), not in every `libc` release's constants.
#[cfg(target_os = "linux")]
const MADV_COLLAPSE: libc::c_int = 25;

/// Collapse the whole huge pages inside `[ptr, ptr + bytes)` into huge pages now.
/// Errors (an older kernel, transparent huge pages off, no free huge page) leave
/// the buffer as it is, which is all a hint can promise.
fn collapse(ptr: *mut u8, bytes: usize) {
    let Some((_start, _len)) = inner_huge_pages(ptr, bytes) else {
        return;
    };
    #[cfg(target_os = "linux")]
    // SAFETY: the range lies inside an allocation this process owns and is not
    // borrowed elsewhere; MADV_COLLAPSE copies pages into huge ones in place of
    // them, never changing their contents.
    unsafe {
        libc::madvise(_start as *mut libc::c_void, _len, MADV_COLLAPSE);
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

    /// The `AnonHugePages` of the mapping holding `addr`, from `/proc/self/smaps`.
    fn huge_bytes_of_mapping_at(addr: usize) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = head.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    return kb
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<usize>()
                        .ok()
                        .map(|k| k << 10);
                }
            }
        }
        None
    }

    #[test]
    fn touched_memory_is_collapsed_into_huge_pages() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if thp.as_deref().map_or(true, |s| s.contains("[never]")) {
            eprintln!("transparent huge pages are off here: nothing to check");
            return;
        }
        // Pages touched before any advice, as those of a freed buffer the allocator
        // hands back to `huge_vec` are: 4 KiB ones where huge pages are by advice only.
        let n = 20 << 20;
        let mut w = std::hint::black_box(vec![1u8; n]);
        advise(w.as_mut_ptr(), n);
        collapse(w.as_mut_ptr(), n);
        assert!(w.iter().all(|&x| x == 1));
        let (start, len) = inner_huge_pages(w.as_mut_ptr(), n).unwrap();
        let huge =
            huge_bytes_of_mapping_at(start).expect("the buffer's mapping in /proc/self/smaps");
        assert!(
            huge >= len,
            "{huge} bytes on huge pages, want the buffer's {len}"
        );
    }
}
