//! The communication watchdog (`--comm-timeout`, docs/cluster.md): a rank whose peer
//! died or whose link went down must stop, with a message naming the lost ranks and
//! hosts and exit code [`crate::error::exit::PEER_LOST`], whatever the MPI library does.
//!
//! The MPI backend marks every library call it makes with [`enter`] (one clock read and
//! one atomic store; nothing else on the default path: results are untouched). A thread
//! wakes a few times per timeout and, when one call has been in flight longer than the
//! timeout, stops the process. Two ways in:
//!
//! - a call in flight for longer than `--comm-timeout` (a cut link: TCP waits for the
//!   peer indefinitely, and a collective cannot be cancelled);
//! - the process exiting while a call is in flight (the MPI library aborting this rank
//!   because a peer's connection closed: a killed process), seen by an `atexit` hook.
//!
//! Either way the rank asks every other rank, at that moment only, whether it is alive:
//! each rank listens on a TCP port of its own (gathered with the host names at start-up,
//! [`Peers`]) and accepts and drops connections on a thread of its own, so a rank that
//! is blocked in a collective still answers. A connection refused (the process is gone)
//! or not made within [`PROBE_TIMEOUT`] (the host or its link is down) names the rank as
//! lost. Then the message, and `_exit` (no MPI finalize, no destructors: the library
//! may be stuck in the call).

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The default `--comm-timeout`: 600 s. A call's time in flight includes the wait for
/// the slowest rank to reach it, so it must be longer than the longest legitimate gap
/// between two collectives on one rank: a half-epoch's solve of a large graph on few
/// ranks, an evaluation, rank 0 writing and fsyncing a checkpoint while the others
/// wait in the commit's agreement (minutes on a network filesystem).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a liveness probe waits for a peer's connection.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a rank that stops keeps answering probes before it exits.
pub const LINGER: Duration = Duration::from_secs(2);

/// The MPI calls the backend marks (for the message).
pub const OPS: &[&str] = &[
    "barrier",
    "all-reduce",
    "all-to-all",
    "all-gather",
    "broadcast",
    "neighbour shift",
];

/// Every rank's host name and liveness port, by rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peers {
    pub hosts: Vec<String>,
    pub ports: Vec<u16>,
}

struct State {
    rank: usize,
    size: usize,
    peers: Peers,
    start: Instant,
    /// Milliseconds since `start` + 1 at which the call in flight began; 0: none.
    since: AtomicU64,
    what: AtomicUsize,
}

static STATE: OnceLock<State> = OnceLock::new();

/// A call in flight; dropping it marks the rank idle again.
pub struct InFlight(bool);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0 {
            if let Some(s) = STATE.get() {
                s.since.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// Mark a call to the MPI library (`OPS[op]`) as in flight until the guard drops.
/// Does nothing before [`start`].
#[inline]
pub fn enter(op: usize) -> InFlight {
    match STATE.get() {
        Some(s) => {
            s.what.store(op, Ordering::Relaxed);
            let ms = s.start.elapsed().as_millis() as u64 + 1;
            s.since.store(ms, Ordering::Relaxed);
            InFlight(true)
        }
        None => InFlight(false),
    }
}

/// Open this rank's liveness port (all interfaces, an ephemeral port) and answer it on
/// a thread: every connection is accepted and closed at once, nothing is sent.
pub fn listen() -> std::io::Result<u16> {
    let l = TcpListener::bind(("0.0.0.0", 0))?;
    let port = l.local_addr()?.port();
    std::thread::Builder::new()
        .name("torusrec-alive".into())
        .spawn(move || {
            for c in l.incoming() {
                drop(c);
            }
        })?;
    Ok(port)
}

/// Start watching (once per process): `timeout` None disables the timeout but keeps
/// the exit hook (a rank the MPI library ends mid-call still names the lost ranks).
pub fn start(rank: usize, size: usize, timeout: Option<Duration>, peers: Peers) {
    let state = State {
        rank,
        size,
        peers,
        start: Instant::now(),
        since: AtomicU64::new(0),
        what: AtomicUsize::new(0),
    };
    if STATE.set(state).is_err() {
        return;
    }
    // SAFETY: registering a plain `extern "C"` function with no arguments.
    unsafe {
        libc::atexit(at_exit);
    }
    watch_sigterm();
    if let Some(t) = timeout {
        let tick = (t / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let _ = std::thread::Builder::new()
            .name("torusrec-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(tick);
                let Some(s) = STATE.get() else { return };
                if let Some(held) = in_flight_for(s) {
                    if held > t {
                        fire(
                            s,
                            &format!(
                                "{} in flight for {:.1} s (--comm-timeout {} s)",
                                op_name(s),
                                held.as_secs_f64(),
                                t.as_secs()
                            ),
                            true,
                        );
                    }
                }
            });
    }
}

fn op_name(s: &State) -> &'static str {
    OPS.get(s.what.load(Ordering::Relaxed))
        .copied()
        .unwrap_or("call")
}

fn in_flight_for(s: &State) -> Option<Duration> {
    let since = s.since.load(Ordering::Relaxed);
    (since != 0).then(|| {
        let now = s.start.elapsed().as_millis() as u64 + 1;
        Duration::from_millis(now.saturating_sub(since))
    })
}

/// A SIGTERM while a call is in flight: under mpirun, the launcher ending the job
/// because a rank died (Open MPI sends SIGTERM, then SIGKILL after
/// `odls_base_sigkill_timeout`). The probe runs at once, on a thread of its own; when
/// every rank answers (a preemption signal during a call), nothing happens here and
/// the preemption flag does its work at the next step boundary.
fn watch_sigterm() {
    let Ok((mut rx, tx)) = std::os::unix::net::UnixStream::pair() else {
        return;
    };
    if signal_hook::low_level::pipe::register(signal_hook::consts::SIGTERM, tx).is_err() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("torusrec-sigterm".into())
        .spawn(move || {
            use std::io::Read;
            let mut b = [0u8; 64];
            while rx.read(&mut b).is_ok_and(|n| n > 0) {
                let Some(s) = STATE.get() else { continue };
                if in_flight_for(s).is_some() {
                    let why = format!("a SIGTERM during {}", op_name(s));
                    fire(s, &why, false);
                }
            }
        });
}

extern "C" fn at_exit() {
    if let Some(s) = STATE.get() {
        if in_flight_for(s).is_some() {
            let why = format!("the MPI library ended this rank during {}", op_name(s));
            fire(s, &why, false);
        }
    }
}

/// The ranks that do not answer a probe, in rank order.
pub fn probe_lost(rank: usize, peers: &Peers, timeout: Duration) -> Vec<usize> {
    let me = &peers.hosts[rank];
    let targets: Vec<(usize, Option<SocketAddr>)> = (0..peers.hosts.len())
        .filter(|&r| r != rank)
        .map(|r| {
            let host = if &peers.hosts[r] == me {
                "127.0.0.1"
            } else {
                peers.hosts[r].as_str()
            };
            let addr = (host, peers.ports[r])
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next());
            (r, addr)
        })
        .collect();
    let mut lost = Vec::new();
    for chunk in targets.chunks(64) {
        let handles: Vec<_> = chunk
            .iter()
            .map(|&(r, addr)| {
                std::thread::spawn(move || {
                    // A name that does not resolve says nothing about the rank.
                    let alive =
                        addr.is_none_or(|a| TcpStream::connect_timeout(&a, timeout).is_ok());
                    (r, alive)
                })
            })
            .collect();
        for h in handles {
            if let Ok((r, false)) = h.join() {
                lost.push(r);
            }
        }
    }
    lost
}

/// `ranks 1, 3 (host h2)`, grouped by host in rank order.
pub fn describe_lost(lost: &[usize], hosts: &[String]) -> String {
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for &r in lost {
        match groups.iter_mut().find(|(h, _)| *h == hosts[r]) {
            Some((_, v)) => v.push(r),
            None => groups.push((&hosts[r], vec![r])),
        }
    }
    groups
        .iter()
        .map(|(h, v)| {
            let list: Vec<String> = v.iter().map(|r| r.to_string()).collect();
            let noun = if v.len() == 1 { "rank" } else { "ranks" };
            format!("{noun} {} (host {h})", list.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Probe, print the message and `_exit`. From the exit hook (`timed_out` false) a
/// probe that finds every rank alive leaves the exit alone: the call was ended for
/// another reason (a panic's abort), whose own message and code stand.
fn fire(s: &State, why: &str, timed_out: bool) {
    let lost = probe_lost(s.rank, &s.peers, PROBE_TIMEOUT);
    if lost.is_empty() && !timed_out {
        return;
    }
    let who = if lost.is_empty() {
        "every rank answers its liveness probe, so one is stuck".to_string()
    } else {
        format!("lost {}", describe_lost(&lost, &s.peers.hosts))
    };
    let code = crate::error::exit::PEER_LOST;
    let line = format!(
        "[{}/{}] torusrec: {who} ({why}, on host {}); stopping with exit {code}: resume with --resume auto on the hosts that are left\n",
        s.rank, s.size, s.peers.hosts[s.rank]
    );
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    // The other ranks probe at about the same time: answer them a little longer, so
    // that this rank is not taken for a lost one.
    std::thread::sleep(LINGER);
    // SAFETY: ends the process at once; nothing here relies on destructors running.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_lost_ranks_by_host() {
        let hosts: Vec<String> = ["h1", "h2", "h2", "h3"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(describe_lost(&[1, 2], &hosts), "ranks 1, 2 (host h2)");
        assert_eq!(
            describe_lost(&[0, 3], &hosts),
            "rank 0 (host h1), rank 3 (host h3)"
        );
    }

    #[test]
    fn probe_tells_a_listening_rank_from_a_closed_port() {
        let alive = listen().unwrap();
        // A port that was open and is closed again: connections are refused.
        let closed = TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let peers = Peers {
            hosts: vec!["a".into(), "a".into(), "a".into()],
            ports: vec![0, alive, closed],
        };
        assert_eq!(probe_lost(0, &peers, Duration::from_secs(2)), vec![2]);
    }
}
