//! Runs across network-namespace hosts (`scripts/netcluster.sh`, docs/cluster.md): a
//! 2-host run equals the 1-host run's bits; a killed host and a cut link end every
//! rank within their bounds with exit 77 naming the lost rank and host; a restart on
//! fewer hosts resumes exactly, for iALS and for the embedding model. Each test makes its own cluster and removes it when it
//! ends, passed or failed; where namespaces cannot be made, each says so and skips.

use crate::util::{self, TestCommand};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/netcluster.sh")
}

/// A cluster of `n` hosts, taken down when dropped.
struct Cluster;

impl Cluster {
    /// None (with a line saying why) where namespaces cannot be made here.
    fn up(n: usize) -> Option<Cluster> {
        let _ = Command::new(script()).arg("down").status();
        let out = Command::new(script())
            .args(["up", &n.to_string()])
            .output()
            .expect("run netcluster.sh");
        if !out.status.success() {
            eprintln!(
                "SKIPPED: network namespaces cannot be made here (netcluster.sh up: {})",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        Some(Cluster)
    }

    /// `netcluster.sh mpirun ARGS` started with its output in `dir/out`, `dir/err`.
    fn spawn(&self, dir: &Path, args: &[&str]) -> Child {
        let mut cmd = Command::new(script());
        cmd.arg("mpirun").args(args);
        util::set_mpi_env(&mut cmd);
        use std::os::unix::process::CommandExt;
        cmd.env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("out")).unwrap())
            .stderr(std::fs::File::create(dir.join("err")).unwrap())
            .process_group(0)
            .spawn()
            .expect("start netcluster.sh mpirun")
    }

    /// The `torusrec` processes of host `h`.
    fn ranks_of(&self, h: usize) -> Vec<u32> {
        let out = Command::new(script())
            .args(["pids", &h.to_string()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "torusrec")
            })
            .collect()
    }

    fn link(&self, h: usize, state: &str) {
        let ok = Command::new(script())
            .args(["link", &h.to_string(), state])
            .status()
            .unwrap();
        assert!(ok.success(), "netcluster.sh link {h} {state}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("down").status();
    }
}

/// Wait for `child` at most `limit`; its exit code, or a panic (after killing it).
fn wait(child: &mut Child, limit: Duration, what: &str) -> i32 {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code().unwrap_or(-1);
        }
        if t.elapsed() > limit {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            panic!("TIMEOUT: {what} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn checksum(stdout: &str) -> String {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("final:"))
        .unwrap_or_else(|| panic!("no final: line in\n{stdout}"));
    let mut w = line.split_whitespace();
    w.find(|x| *x == "checksum");
    w.next().expect("a checksum").to_string()
}

fn als_args<'a>(data: &'a str, epochs: &'a str) -> Vec<&'a str> {
    vec![
        "als",
        "--data",
        data,
        "--dim",
        "32",
        "--epochs",
        epochs,
        "--threads",
        "1",
        "--reg",
        "0.01",
    ]
}

#[test]
fn two_hosts_give_the_one_host_bits() {
    let _lock = util::serial();
    let data = util::cnr2000_k10().to_str().unwrap().to_string();
    let Some(c) = Cluster::up(2) else { return };
    let dir = util::tempdir();
    let bin = util::bin();
    let mut full = vec!["-np", "2", bin.to_str().unwrap()];
    full.extend(als_args(&data, "3"));
    let mut child = c.spawn(dir.path(), &full);
    let code = wait(&mut child, util::TIMEOUT, "the 2-host run");
    let out = std::fs::read_to_string(dir.path().join("out")).unwrap();
    let err = std::fs::read_to_string(dir.path().join("err")).unwrap();
    assert_eq!(code, 0, "2-host run\n{out}\n{err}");
    assert!(err.contains("2 ranks on 2 host(s): h1 h2"), "{err}");
    let one = TestCommand::mpirun(2).args(als_args(&data, "3")).run();
    one.expect_code(0);
    assert_eq!(
        checksum(&out),
        checksum(&one.stdout),
        "2 hosts vs 1 host at P = 2"
    );
}

/// The embedding model's run of the restart test: long enough to be killed mid-run,
/// short enough to finish in seconds from a checkpoint; the global batch is fixed, so
/// the run at 1 rank is the same model as at 2 (`--batch` is per rank).
fn embed_args() -> Vec<&'static str> {
    vec![
        "embed",
        "--preset",
        "small",
        "--global-batch",
        "512",
        "--steps",
        "600",
        "--log-every",
        "200",
        "--threads",
        "1",
        "--checkpoint-every",
        "40",
    ]
}

/// Start a 2-host iALS run with checkpoints; wait for its first checkpoint.
fn start_checkpointed(c: &Cluster, dir: &Path, data: &str, ckpt: &Path, extra: &[&str]) -> Child {
    let mut args = als_args(data, "400");
    args.extend(extra);
    start_checkpointed_run(c, dir, &args, ckpt)
}

/// Start `args` on 2 hosts with checkpoints in `ckpt`; wait for its first checkpoint.
fn start_checkpointed_run(c: &Cluster, dir: &Path, args: &[&str], ckpt: &Path) -> Child {
    let bin = util::bin();
    let mut full = vec!["-np", "2", bin.to_str().unwrap()];
    full.extend(args);
    full.extend([
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--resume",
        "auto",
    ]);
    let mut child = c.spawn(dir, &full);
    let t = Instant::now();
    while !std::fs::read_dir(ckpt).is_ok_and(|d| {
        d.filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().ends_with(".h5"))
    }) {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        assert!(
            t.elapsed() < util::TIMEOUT,
            "no checkpoint within {:?}",
            util::TIMEOUT
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    child
}

#[test]
fn a_killed_host_ends_every_rank_and_a_restart_on_fewer_hosts_resumes_exactly() {
    let data = util::cnr2000_k10().to_str().unwrap().to_string();
    kill_a_host_then_resume_on_fewer(&als_args(&data, "400"), "iALS");
}

#[test]
fn the_embedding_model_resumes_exactly_on_fewer_hosts_after_a_killed_host() {
    kill_a_host_then_resume_on_fewer(&embed_args(), "embed");
}

/// Run `args` on 2 hosts with checkpoints, `kill -9` host 2's rank after the first
/// checkpoint: every rank ends within 30 s, rank 0 naming the lost rank and host, exit
/// 77. Then the last committed checkpoint resumes on the host that is left, with one
/// rank, and gives the bits of a one-rank run resumed from a copy of it.
fn kill_a_host_then_resume_on_fewer(args: &[&str], what: &str) {
    let _lock = util::serial();
    let Some(c) = Cluster::up(2) else { return };
    let dir = util::tempdir();
    let ckpt = dir.path().join("ckpt");
    let mut child = start_checkpointed_run(&c, dir.path(), args, &ckpt);
    let victims = c.ranks_of(2);
    assert_eq!(victims.len(), 1, "one rank on host 2");
    let t = Instant::now();
    for p in victims {
        let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
    }
    let code = wait(
        &mut child,
        Duration::from_secs(30),
        "the job after kill -9 of host 2",
    );
    let took = t.elapsed();
    let err = std::fs::read_to_string(dir.path().join("err")).unwrap();
    assert_ne!(code, 0, "{err}");
    assert!(c.ranks_of(1).is_empty(), "a rank of host 1 is left");
    assert!(
        err.contains("[0/2] torusrec: lost rank 1 (host h2)") && err.contains("exit 77"),
        "rank 0 names the lost rank and host:\n{err}"
    );
    eprintln!(
        "{what}: kill -9 to the job's end: {:.1} s",
        took.as_secs_f64()
    );
    let copy = dir.path().join("copy");
    let ok = Command::new("cp")
        .arg("-r")
        .arg(&ckpt)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(ok.success());
    let bin = util::bin();
    let mut full = vec!["-np", "1", bin.to_str().unwrap()];
    full.extend(args);
    full.extend([
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--resume",
        "auto",
    ]);
    let rdir = dir.path().join("restart");
    std::fs::create_dir_all(&rdir).unwrap();
    let t = Instant::now();
    let mut child = c.spawn(&rdir, &full);
    let code = wait(
        &mut child,
        Duration::from_secs(300),
        "the restart on host 1",
    );
    let out = std::fs::read_to_string(rdir.join("out")).unwrap();
    let rerr = std::fs::read_to_string(rdir.join("err")).unwrap();
    assert_eq!(code, 0, "{out}\n{rerr}");
    assert!(
        rerr.contains("resum") || out.contains("resum"),
        "it resumed:\n{out}\n{rerr}"
    );
    eprintln!(
        "{what}: the restart on 1 host took {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let reference = TestCommand::direct()
        .args(args)
        .arg("--checkpoint-dir")
        .arg(&copy)
        .args(["--resume", "auto"])
        .timeout(Duration::from_secs(300))
        .run();
    reference.expect_code(0);
    assert_eq!(
        checksum(&out),
        checksum(&reference.stdout),
        "{what}: restart on 1 host vs 1 rank"
    );
}

#[test]
fn a_cut_link_ends_every_rank_within_the_comm_timeout() {
    let _lock = util::serial();
    let data = util::cnr2000_k10().to_str().unwrap().to_string();
    let Some(c) = Cluster::up(2) else { return };
    let dir = util::tempdir();
    let ckpt = dir.path().join("ckpt");
    let mut child = start_checkpointed(&c, dir.path(), &data, &ckpt, &["--comm-timeout", "5"]);
    let t = Instant::now();
    c.link(2, "down");
    // Each side: 5 s in flight, a watchdog tick, a 3 s probe, 2 s answering probes.
    let bound = Duration::from_secs(5 + 2 + 3 + 2 + 8);
    while !(c.ranks_of(1).is_empty() && c.ranks_of(2).is_empty()) {
        assert!(
            t.elapsed() < bound,
            "a rank still runs {:?} after the cut",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "link cut to the last rank's exit: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // mpirun itself notices its lost daemon by keepalive (netcluster.sh sets ~11 s).
    let code = wait(&mut child, Duration::from_secs(60), "mpirun after the cut");
    let err = std::fs::read_to_string(dir.path().join("err")).unwrap();
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("[0/2] torusrec: lost rank 1 (host h2)")
            && err.contains("--comm-timeout 5 s")
            && err.contains("exit 77"),
        "rank 0 names the lost rank and host:\n{err}"
    );
}

/// The link options act or are refused: `--rate` puts a shaper (netem, or tbf where the
/// kernel has no sch_netem) on both ends of every host's link; `--delay` puts netem on
/// the hosts' egress, or, without sch_netem, exits 2 naming it and leaves no namespace.
#[test]
fn link_rates_and_delays_shape_the_links_or_are_refused() {
    let _lock = util::serial();
    let qdisc = |ns: &str, dev: &str| {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "tc", "qdisc", "show", "dev", dev])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let _ = Command::new(script()).arg("down").status();
    let up = |args: &[&str]| {
        Command::new(script())
            .arg("up")
            .args(args)
            .output()
            .expect("run netcluster.sh")
    };
    let o = up(&["2", "--rate", "1gbit"]);
    if !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("cannot make") {
        eprintln!("SKIPPED: network namespaces cannot be made here");
        return;
    }
    let c = Cluster;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (ns, dev) in [
        ("trc-h1", "eth0"),
        ("trc-h2", "eth0"),
        ("trc-sw", "p1"),
        ("trc-sw", "p2"),
    ] {
        let q = qdisc(ns, dev);
        let shaped = (q.contains("netem") && q.contains("rate 1Gbit"))
            || (q.contains("tbf") && q.contains("rate 1Gbit"));
        assert!(shaped, "{ns} {dev}: {q}");
    }
    drop(c);
    let o = up(&["2", "--delay", "50us"]);
    if o.status.success() {
        let c = Cluster;
        let q = qdisc("trc-h1", "eth0");
        assert!(q.contains("netem") && q.contains("delay 50"), "{q}");
        drop(c);
    } else {
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("--delay 50us needs") && err.contains("sch_netem"),
            "{err}"
        );
        let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
        assert!(!String::from_utf8_lossy(&left.stdout).contains("trc-"));
    }
}
