//! Per-phase communication counters: bytes sent and received (to and from other
//! ranks only), calls, wall time and CPU time of each collective.

use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseStats {
    pub calls: u64,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub seconds: f64,
    /// CPU seconds of this process (all its threads) inside the collectives: the
    /// library's polling while it waits counts, time the process was not running
    /// (another rank or process had the core) does not.
    #[serde(default)]
    pub cpu_seconds: f64,
}

impl PhaseStats {
    pub fn merge(&mut self, o: &PhaseStats) {
        self.calls += o.calls;
        self.bytes_sent += o.bytes_sent;
        self.bytes_recv += o.bytes_recv;
        self.seconds += o.seconds;
        self.cpu_seconds += o.cpu_seconds;
    }
}

/// CPU seconds (user + system) this process has used so far, all its threads together
/// (`CLOCK_PROCESS_CPUTIME_ID`); 0 if the clock cannot be read. The one process CPU
/// clock: the communication phases and the evaluation's parts both read it.
pub fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the struct it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The start of a timed span: its wall clock and this process's CPU clock.
#[derive(Debug, Clone, Copy)]
pub struct Timer {
    wall: Instant,
    cpu: f64,
}

impl Timer {
    pub fn start() -> Timer {
        Timer {
            wall: Instant::now(),
            cpu: process_cpu_seconds(),
        }
    }

    /// Wall time since the start.
    pub fn elapsed(&self) -> Duration {
        self.wall.elapsed()
    }

    /// This process's CPU seconds since the start.
    pub fn cpu_elapsed(&self) -> f64 {
        (process_cpu_seconds() - self.cpu).max(0.0)
    }
}

/// Bytes and messages this rank put on one outgoing link (`+d` or `-d`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkStats {
    pub bytes: u64,
    pub messages: u64,
}

/// Most torus dimensions (and so 2 x this many links per rank).
pub const MAX_DIMS: usize = 3;

/// Per link, index `2 d` for `+d` and `2 d + 1` for `-d`.
pub type Links = [LinkStats; 2 * MAX_DIMS];

/// The name of link `i` (`+x`, `-x`, `+y`, ...).
pub fn link_name(i: usize) -> String {
    format!(
        "{}{}",
        if i.is_multiple_of(2) { '+' } else { '-' },
        ['x', 'y', 'z'][(i / 2).min(2)]
    )
}

#[derive(Debug)]
struct Inner {
    current: &'static str,
    phases: Vec<(&'static str, PhaseStats)>,
    links: Vec<(&'static str, Links)>,
    /// Per phase: all-to-all bytes sent to other ranks times their hops under
    /// dimension-ordered routing, and those bytes.
    hops: Vec<(&'static str, [u64; 2])>,
    collectives: super::torus_coll::Collectives,
    sync_timing: bool,
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
                links: Vec::new(),
                hops: Vec::new(),
                collectives: Default::default(),
                sync_timing: false,
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

    /// Add one call, started at `t`, to the current phase.
    pub fn record(&self, bytes_sent: u64, bytes_recv: u64, t: Timer) {
        let (elapsed, cpu) = (t.elapsed(), t.cpu_elapsed());
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
        s.cpu_seconds += cpu;
    }

    /// Which algorithms the counted collectives of this rank's communicator use.
    pub fn collectives(&self) -> super::torus_coll::Collectives {
        self.inner.borrow().collectives
    }

    /// Choose the collectives' algorithms (every rank must choose the same).
    pub fn set_collectives(&self, c: super::torus_coll::Collectives) {
        self.inner.borrow_mut().collectives = c;
    }

    /// Whether counted collectives start their clock after a barrier.
    pub fn sync_timing(&self) -> bool {
        self.inner.borrow().sync_timing
    }

    /// Start every counted collective's clock after an (uncounted) barrier, so that
    /// its seconds are communication, not waiting for slower ranks.
    pub fn set_sync_timing(&self, on: bool) {
        self.inner.borrow_mut().sync_timing = on;
    }

    /// Add one message of `bytes` on link (`dim`, `up`) to the current phase.
    pub fn record_link(&self, dim: usize, up: bool, bytes: u64) {
        self.record_links(&[(2 * dim.min(MAX_DIMS - 1) + usize::from(!up), bytes, 1)]);
    }

    /// Add `(link, bytes, messages)` to the current phase.
    pub fn record_links(&self, adds: &[(usize, u64, u64)]) {
        let mut inner = self.inner.borrow_mut();
        let cur = inner.current;
        let slot = match inner.links.iter().position(|(n, _)| *n == cur) {
            Some(i) => i,
            None => {
                inner.links.push((cur, Links::default()));
                inner.links.len() - 1
            }
        };
        for &(l, b, m) in adds {
            let s = &mut inner.links[slot].1[l];
            s.bytes += b;
            s.messages += m;
        }
    }

    /// Add all-to-all traffic: `bytes` to other ranks, `hop_bytes` = bytes x hops.
    pub fn record_hops(&self, hop_bytes: u64, bytes: u64) {
        let mut inner = self.inner.borrow_mut();
        let cur = inner.current;
        match inner.hops.iter_mut().find(|(n, _)| *n == cur) {
            Some((_, h)) => {
                h[0] += hop_bytes;
                h[1] += bytes;
            }
            None => inner.hops.push((cur, [hop_bytes, bytes])),
        }
    }

    /// Every phase's all-to-all `[hop_bytes, bytes]`.
    pub fn hops(&self) -> Vec<(String, [u64; 2])> {
        self.inner
            .borrow()
            .hops
            .iter()
            .map(|(n, h)| (n.to_string(), *h))
            .collect()
    }

    /// Every phase's per-link counters, in the order phases first used a link.
    pub fn links(&self) -> Vec<(String, Links)> {
        self.inner
            .borrow()
            .links
            .iter()
            .map(|(n, l)| (n.to_string(), *l))
            .collect()
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
