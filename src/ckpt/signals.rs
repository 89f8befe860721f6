//! Preemption signals only set a flag; the training loop looks at it at step
//! boundaries. A second SIGINT exits at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The flag of the handlers installed in this process, if any.
static INSTALLED: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

/// Whether a preemption signal reached this process (false before
/// [`Preemption::install`]): for long phases that no [`Preemption`] is handed to, such
/// as `prepare`.
pub fn signalled() -> bool {
    INSTALLED.get().is_some_and(|f| f.load(Ordering::SeqCst))
}

/// The preemption check of a pass that saves nothing to resume (a prepare, an
/// ingestion, a statistics run): a signal, or the test hook `TORUSREC_PREEMPT_IN`
/// naming the pass, stops it with [`crate::Error::Interrupted`] (exit 1).
///
/// `Err(crate::Error::Interrupted(message()))` when a preemption signal arrived or
/// `TORUSREC_PREEMPT_IN` names `phase`; checked per chunk, so every rank then meets
/// the others at the pass's agreement. The caller words the message (its job and
/// what is left behind).
pub fn check_preempted(phase: &str, message: impl FnOnce() -> String) -> crate::Result<()> {
    if signalled() || crate::faults::preempt_in(phase) {
        return Err(crate::Error::Interrupted(message()));
    }
    Ok(())
}

/// Set when SIGTERM, SIGUSR1 or SIGINT arrives.
#[derive(Clone, Default)]
pub struct Preemption {
    flag: Arc<AtomicBool>,
    /// Milliseconds since the Unix epoch when the first signal arrived.
    at_ms: Arc<AtomicU64>,
}

impl Preemption {
    /// A flag no signal sets (tests set it by hand).
    pub fn manual() -> Self {
        Self::default()
    }

    /// Install the handlers for this process.
    pub fn install() -> std::io::Result<Self> {
        use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
        let p = Self::default();
        // A second SIGINT exits immediately with 130: its own flag, so that a SIGTERM
        // or SIGUSR1 before it does not make the first SIGINT fatal. (Actions run in
        // the order registered: the check, then the flag.)
        let sigint = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register_conditional_shutdown(SIGINT, 130, Arc::clone(&sigint))?;
        signal_hook::flag::register(SIGINT, sigint)?;
        for sig in [SIGTERM, SIGUSR1, SIGINT] {
            signal_hook::flag::register(sig, Arc::clone(&p.flag))?;
            // Recording the time is async-signal-safe: an atomic store.
            let at = Arc::clone(&p.at_ms);
            // SAFETY: the action only performs atomic operations and a clock read
            // (clock_gettime is async-signal-safe).
            unsafe {
                signal_hook::low_level::register(sig, move || {
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    let _ = at.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
                })?;
            }
        }
        let _ = INSTALLED.set(Arc::clone(&p.flag));
        Ok(p)
    }

    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Raise the flag by hand (tests, fault injection).
    pub fn raise(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let _ = self
            .at_ms
            .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
        self.flag.store(true, Ordering::SeqCst);
    }

    /// Seconds since the first signal, if one arrived.
    pub fn seconds_since(&self) -> Option<f64> {
        let at = self.at_ms.load(Ordering::SeqCst);
        (at > 0).then(|| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            now.saturating_sub(at) as f64 / 1000.0
        })
    }
}
