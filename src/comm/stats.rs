//! Per-phase communication counters: bytes sent and received (to and from other
//! ranks only), calls and wall time of each collective.

use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::time::Duration;

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseStats {
    pub calls: u64,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub seconds: f64,
}

impl PhaseStats {
    pub fn merge(&mut self, o: &PhaseStats) {
        self.calls += o.calls;
        self.bytes_sent += o.bytes_sent;
        self.bytes_recv += o.bytes_recv;
        self.seconds += o.seconds;
    }
}

#[derive(Debug)]
struct Inner {
    current: &'static str,
    phases: Vec<(&'static str, PhaseStats)>,
}

/// Counters of one rank, grouped by the phase that was current at each call.
#[derive(Debug)]
pub struct CommStats {
    inner: RefCell<Inner>,
}

impl Default for CommStats {
    fn default() -> Self {
        Self {
            inner: RefCell::new(Inner {
                current: "other",
                phases: Vec::new(),
            }),
        }
    }
}

/// Restores the previous phase when dropped.
pub struct PhaseGuard<'a> {
    stats: &'a CommStats,
    previous: &'static str,
}

impl Drop for PhaseGuard<'_> {
    fn drop(&mut self) {
        self.stats.inner.borrow_mut().current = self.previous;
    }
}

impl CommStats {
    /// Make `name` the current phase until the guard is dropped.
    pub fn phase(&self, name: &'static str) -> PhaseGuard<'_> {
        let mut inner = self.inner.borrow_mut();
        let previous = std::mem::replace(&mut inner.current, name);
        PhaseGuard {
            stats: self,
            previous,
        }
    }

    pub fn current_phase(&self) -> &'static str {
        self.inner.borrow().current
    }

    /// Add one call to the current phase.
    pub fn record(&self, bytes_sent: u64, bytes_recv: u64, elapsed: Duration) {
        let mut inner = self.inner.borrow_mut();
        let cur = inner.current;
        let slot = match inner.phases.iter().position(|(n, _)| *n == cur) {
            Some(i) => i,
            None => {
                inner.phases.push((cur, PhaseStats::default()));
                inner.phases.len() - 1
            }
        };
        let s = &mut inner.phases[slot].1;
        s.calls += 1;
        s.bytes_sent += bytes_sent;
        s.bytes_recv += bytes_recv;
        s.seconds += elapsed.as_secs_f64();
    }

    /// The counters of one phase (zero if it never communicated).
    pub fn get(&self, name: &str) -> PhaseStats {
        self.inner
            .borrow()
            .phases
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
            .unwrap_or_default()
    }

    /// Every phase's counters, in the order phases first communicated.
    pub fn snapshot(&self) -> Vec<(String, PhaseStats)> {
        self.inner
            .borrow()
            .phases
            .iter()
            .map(|(n, s)| (n.to_string(), *s))
            .collect()
    }

    /// The sum over all phases.
    pub fn total(&self) -> PhaseStats {
        let mut t = PhaseStats::default();
        for (_, s) in self.inner.borrow().phases.iter() {
            t.merge(s);
        }
        t
    }
}
