//! Regions where a panic from third-party code is expected and turned into an error
//! (e.g. a decoder reading a corrupt file), so `main`'s panic hook can tell them from
//! real bugs, which abort the whole job.

use std::cell::Cell;

thread_local! {
    static EXPECTED: Cell<bool> = const { Cell::new(false) };
}

/// Run `f`, returning `None` if it panicked. The panic hook stays quiet meanwhile.
pub fn catch<T>(f: impl FnOnce() -> T) -> Option<T> {
    let before = EXPECTED.with(|e| e.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    EXPECTED.with(|e| e.set(before));
    r.ok()
}

/// Whether the current thread is inside [`catch`].
pub fn is_expected() -> bool {
    EXPECTED.with(|e| e.get())
}
