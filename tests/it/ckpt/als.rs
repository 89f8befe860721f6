//! End-to-end tests of checkpoints, preemption and the training hold of `torusrec als`
//! under `mpirun`: exact resume after a preemption at any step boundary, real signals,
//! resuming on another rank count, crashes while a checkpoint is written, corrupt and
//! mismatched checkpoints, and the NaN hold (docs/design.md, "Exit codes" and "Checkpoints").
//!
//! Every run is under a timeout. The tests take [`util::serial`] and run one at a
//! time: they start up to four ranks each, and the signal tests depend on timing.

use crate::util;

use std::ffi::{OsStr, OsString};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use torusrec::ckpt::file_name;
use util::{bin, collect, drain, rank_codes, serial, shell_quote, tempdir, Output, TIMEOUT};

const DIM: usize = 16;
const STEP_NNZ: u64 = 50_000;
/// Epochs of the short runs.
const EPOCHS: usize = 3;
/// Epochs of the runs that a signal or `kill -9` interrupts at some time: long enough
/// to still be running when the signal arrives (`mpirun` waits 1 s before it passes
/// SIGTERM on).
const LONG_EPOCHS: usize = 60;

// ---------------------------------------------------------------------------------
// one test at a time, the dataset and the uninterrupted reference runs

/// The cnr-2000 K = 10 variant (22,988 nodes, [`util::cnr2000_k10`]) and its steps.
struct Data {
    path: PathBuf,
    /// `ceil(train_nnz / STEP_NNZ)`.
    steps_per_half: u64,
}

fn data() -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| {
        let path = util::cnr2000_k10().to_path_buf();
        let f = torusrec::io::h5::open(&path).unwrap();
        let indptr = f
            .dataset("train/indptr")
            .unwrap()
            .read_raw::<u64>()
            .unwrap();
        let nnz = *indptr.last().unwrap();
        assert!(nnz > 400_000, "unexpected training arcs: {nnz}");
        let steps_per_half = nnz.div_ceil(STEP_NNZ);
        assert!(
            steps_per_half >= 6,
            "too few steps per half: {steps_per_half}"
        );
        Data {
            path,
            steps_per_half,
        }
    })
}

/// `torusrec prepare` of cnr-2000 with K = 10 and split seed `seed`.
fn prepare(out: &Path, seed: u64) {
    let seed = seed.to_string();
    util::prepare_cnr2000(util::TestCommand::direct(), 10, out)
        .args(["--seed", &seed, "--force"])
        .run()
        .expect_code(0);
}

/// What an uninterrupted run produced.
struct Reference {
    checksum: String,
    w: Table,
    h: Table,
}

/// The uninterrupted run at `np` ranks for `epochs` epochs (no checkpoint directory),
/// computed once per test process.
fn reference(np: usize, epochs: usize) -> Arc<Reference> {
    type Refs = Mutex<Vec<((usize, usize), Arc<Reference>)>>;
    static REFS: OnceLock<Refs> = OnceLock::new();
    let refs = REFS.get_or_init(Default::default);
    if let Some((_, r)) = refs
        .lock()
        .unwrap()
        .iter()
        .find(|(k, _)| *k == (np, epochs))
    {
        return Arc::clone(r);
    }
    let dir = tempdir();
    let out = dir.path().join("model.h5");
    let run = Job::new(np)
        .args(als_args(&data().path, epochs))
        .arg("--out")
        .arg(&out)
        .run();
    run.expect_code(0);
    let r = Arc::new(Reference {
        checksum: run.final_checksum(),
        w: read_table(&out, "W"),
        h: read_table(&out, "H"),
    });
    refs.lock().unwrap().push(((np, epochs), Arc::clone(&r)));
    r
}

/// `als` with the settings every test shares.
fn als_args(data: &Path, epochs: usize) -> Vec<OsString> {
    als_args_with(data, epochs, DIM, 42)
}

/// `als` with another dimension or seed of the initial tables.
fn als_args_with(data: &Path, epochs: usize, dim: usize, seed: u64) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec!["als".into(), "--data".into(), data.into()];
    for a in [
        "--dim",
        &dim.to_string(),
        "--seed",
        &seed.to_string(),
        "--epochs",
        &epochs.to_string(),
        "--step-nnz",
        &STEP_NNZ.to_string(),
        "--threads",
        "1",
        "--force",
    ] {
        v.push(a.into());
    }
    v
}

/// `als` writing checkpoints into `ckpt` and the model to `out`.
fn als_job(np: usize, epochs: usize, ckpt: &Path, out: &Path) -> Job {
    Job::new(np)
        .args(als_args(&data().path, epochs))
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .arg("--out")
        .arg(out)
}

// ---------------------------------------------------------------------------------
// running mpirun with environment variables, in the background, with signals

/// An `mpirun -np N torusrec ...` invocation (like `util::TestCommand`, plus
/// environment variables and a handle on the running job for signals).
#[derive(Debug, Clone)]
struct Job {
    np: usize,
    args: Vec<OsString>,
    env: Vec<(String, String)>,
    rank_codes: Option<PathBuf>,
    timeout: Duration,
}

impl Job {
    fn new(np: usize) -> Self {
        Self {
            np,
            args: Vec::new(),
            env: Vec::new(),
            rank_codes: None,
            timeout: TIMEOUT,
        }
    }

    fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.args.push(a.as_ref().to_owned());
        self
    }

    fn args<I, S>(mut self, it: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(it.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    fn env(mut self, k: &str, v: impl ToString) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    /// Wrap every rank in `sh` that records the rank's exit code in `dir/rank.R` and
    /// exits 0 (read them with `util::rank_codes`). The wrapper ignores SIGTERM and
    /// SIGUSR1 so that it survives the signals `mpirun` sends to each rank's process
    /// group (the rank itself installs its own handlers).
    fn record_rank_codes(mut self, dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        self.rank_codes = Some(dir.to_owned());
        self
    }

    fn command(&self) -> Command {
        let mut c = Command::new("mpirun");
        c.args(["--oversubscribe", "--bind-to", "none", "-np"])
            .arg(self.np.to_string());
        if let Some(dir) = &self.rank_codes {
            let script = format!(
                "trap '' TERM USR1; \"$@\"; echo $? > {}/rank.$OMPI_COMM_WORLD_RANK",
                shell_quote(dir)
            );
            c.args(["sh", "-c"]).arg(script).arg("sh");
        }
        c.arg(bin()).args(&self.args);
        util::set_mpi_env(&mut c);
        c.env_remove("RUST_LOG")
            .env_remove("TORUSREC_FAULT")
            .env_remove("TORUSREC_INJECT_NAN")
            .env_remove("TORUSREC_PREEMPT_AT");
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        c
    }

    fn display(&self) -> String {
        let c = self.command();
        let env = self
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v} "))
            .collect::<String>();
        let cmd = std::iter::once(c.get_program())
            .chain(c.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        env + &cmd
    }

    fn spawn(&self) -> Running {
        let command = self.display();
        let mut child = self
            .command()
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{command}`: {e}"));
        let out = drain(child.stdout.take().unwrap());
        let err = drain(child.stderr.take().unwrap());
        Running {
            child: Some(child),
            out,
            err,
            start: Instant::now(),
            timeout: self.timeout,
            command,
        }
    }

    fn run(&self) -> Output {
        self.spawn().wait()
    }
}

/// A job under way. Dropping it (e.g. when an assertion fails) kills it.
struct Running {
    child: Option<Child>,
    out: mpsc::Receiver<Vec<u8>>,
    err: mpsc::Receiver<Vec<u8>>,
    start: Instant,
    timeout: Duration,
    command: String,
}

impl Running {
    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn finished(&mut self) -> bool {
        matches!(self.child.as_mut().unwrap().try_wait(), Ok(Some(_)))
    }

    /// Poll `cond` every 2 ms until it holds; fails if the job ends first or the
    /// timeout passes.
    #[track_caller]
    fn wait_until(&mut self, what: &str, mut cond: impl FnMut() -> bool) {
        loop {
            if cond() {
                return;
            }
            if self.finished() || self.start.elapsed() > self.timeout {
                let out = self.take_output();
                panic!("the job ended (or timed out) before {what}\n{}", out.dump());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Wait for the end (or fail the test on timeout).
    fn wait(mut self) -> Output {
        loop {
            match self.child.as_mut().unwrap().try_wait() {
                Ok(Some(_)) => return self.take_output(),
                Ok(None) if self.start.elapsed() < self.timeout => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Ok(None) => {
                    let out = self.take_output();
                    panic!(
                        "TIMEOUT: the job did not finish within {:?} and was killed (a hang)\n{}",
                        self.timeout,
                        out.dump()
                    );
                }
                Err(e) => panic!("waiting for `{}`: {e}", self.command),
            }
        }
    }

    /// Kill the job if it still runs, then collect its output.
    fn take_output(&mut self) -> Output {
        let mut child = self.child.take().unwrap();
        if !matches!(child.try_wait(), Ok(Some(_))) {
            kill_job(&mut child);
        }
        let status = child.wait().unwrap();
        Output {
            code: status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
            stdout: collect(&self.out),
            stderr: collect(&self.err),
            command: self.command.clone(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if !matches!(child.try_wait(), Ok(Some(_))) {
                kill_job(child);
            }
            let _ = child.wait();
        }
    }
}

/// Stop a job: SIGTERM to mpirun (it stops its ranks), then after 5 s SIGKILL to
/// mpirun's group and to every process it started (the ranks run in process groups
/// of their own).
fn kill_job(child: &mut Child) {
    let pid = child.id();
    let procs = descendants(pid);
    signal(pid, "TERM");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
    for p in procs {
        signal(p, "KILL");
    }
}

/// `kill -SIG pid`.
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// (pid, parent pid, command name) of every process.
fn processes() -> Vec<(u32, u32, String)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may contain spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        v.push((pid, ppid, comm));
    }
    v
}

/// Every process below `root`.
fn descendants(root: u32) -> Vec<u32> {
    let all = processes();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (pid, ppid, _) in &all {
            if *ppid == p {
                out.push(*pid);
                frontier.push(*pid);
            }
        }
    }
    out
}

/// The pid of rank `rank` (a `torusrec` process below `root`, told apart by its
/// `OMPI_COMM_WORLD_RANK`).
fn rank_pid(root: u32, rank: usize) -> Option<u32> {
    let all = processes();
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    descendants(root).into_iter().find(|pid| {
        all.iter()
            .any(|(p, _, comm)| p == pid && comm.starts_with("torusrec"))
            && std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|&b| b == 0).any(|kv| kv == want.as_bytes()))
                .unwrap_or(false)
    })
}

// ---------------------------------------------------------------------------------
// checkpoint directories, models and outputs

/// Committed checkpoints in `dir` as (step, path), oldest first.
fn committed(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut v: Vec<(u64, PathBuf)> = names(dir)
        .into_iter()
        .filter_map(|n| {
            let step = n.strip_prefix("ckpt-")?.strip_suffix(".h5")?.parse().ok()?;
            Some((step, dir.join(n)))
        })
        .collect();
    v.sort();
    v
}

/// Temporaries (`*.partial`) in `dir`.
fn partials(dir: &Path) -> Vec<String> {
    names(dir)
        .into_iter()
        .filter(|n| n.ends_with(".partial"))
        .collect()
}

/// The file names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

#[track_caller]
fn assert_rank_codes(dir: &Path, np: usize, want: i32, run: &Output) {
    let got = rank_codes(dir, np);
    assert!(
        got.iter().all(|c| *c == Some(want)),
        "every rank should exit {want}; recorded codes {got:?} (None: nothing recorded, \
         the rank was killed)\n{}",
        run.dump()
    );
}

/// Print the lines of stderr that contain `needle` (the messages a person would see;
/// shown with `--nocapture`).
fn show(what: &str, run: &Output, needle: &str) {
    for line in run.stderr.lines().filter(|l| l.contains(needle)) {
        println!("{what}: {line}");
    }
}

/// A 2-D f32 table of an HDF5 file.
#[derive(Debug, Clone, PartialEq)]
struct Table {
    shape: Vec<usize>,
    data: Vec<f32>,
}

#[track_caller]
fn read_table(path: &Path, name: &str) -> Table {
    let f = torusrec::io::h5::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let ds = f
        .dataset(name)
        .unwrap_or_else(|e| panic!("{}: /{name}: {e}", path.display()));
    Table {
        shape: ds.shape(),
        data: ds.read_raw::<f32>().unwrap(),
    }
}

/// The model at `out` holds exactly the reference tables (bit for bit).
#[track_caller]
fn assert_model_bitwise(out: &Path, reference: &Reference, what: &str) {
    for (name, want) in [("W", &reference.w), ("H", &reference.h)] {
        let got = read_table(out, name);
        assert_eq!(got.shape, want.shape, "{what}: shape of /{name}");
        let diff = got
            .data
            .iter()
            .zip(&want.data)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            diff, 0,
            "{what}: {diff} values of /{name} differ from the uninterrupted run"
        );
    }
}

/// Largest difference between the tables relative to the largest value of the
/// reference, and the relative Frobenius norm of the difference.
fn relative_difference(got: &Table, want: &Table) -> (f64, f64) {
    assert_eq!(got.shape, want.shape);
    let (mut max_diff, mut max_abs, mut sq_diff, mut sq) = (0f64, 0f64, 0f64, 0f64);
    for (&a, &b) in got.data.iter().zip(&want.data) {
        let (a, b) = (a as f64, b as f64);
        assert!(a.is_finite(), "non-finite value in the table");
        max_diff = max_diff.max((a - b).abs());
        max_abs = max_abs.max(b.abs());
        sq_diff += (a - b) * (a - b);
        sq += b * b;
    }
    (max_diff / max_abs, (sq_diff / sq).sqrt())
}

/// The resumed run finished and equals the uninterrupted one bitwise.
#[track_caller]
fn assert_resumed_equal(run: &Output, out: &Path, reference: &Reference, what: &str) {
    run.expect_code(0);
    assert_eq!(
        run.final_checksum(),
        reference.checksum,
        "{what}: the resumed run's checksum differs from the uninterrupted run\n{}",
        run.dump()
    );
    assert_model_bitwise(out, reference, what);
}

/// Flip (xor 0xff) the byte `at` bytes into the raw data of dataset `name`.
fn flip_byte_in_dataset(path: &Path, name: &str, at: u64) {
    let (offset, size) = {
        let f = torusrec::io::h5::open(path).unwrap();
        let ds = f.dataset(name).unwrap();
        let offset = ds
            .offset()
            .unwrap_or_else(|| panic!("/{name} of {} is not contiguous", path.display()));
        (offset, ds.storage_size())
    };
    assert!(at < size, "byte {at} is outside /{name} ({size} bytes)");
    let mut bytes = std::fs::read(path).unwrap();
    bytes[(offset + at) as usize] ^= 0xff;
    std::fs::write(path, bytes).unwrap();
}

// ---------------------------------------------------------------------------------
// 1. exact resume after a preemption at different step boundaries

#[test]
fn preempted_at_any_step_boundary_resumes_bitwise_equal() {
    let _serial = serial();
    let s = data().steps_per_half;
    let reference = reference(2, EPOCHS);
    let cases = [
        (1, "after the first step"),
        (s / 2, "in the middle of the row half"),
        (s, "after the last step of the row half"),
        (s + s / 2, "in the middle of the column half"),
        (2 * s, "after the last step of the first epoch"),
        (4 * s + 3, "in the third epoch"),
    ];
    for (step, what) in cases {
        let what = format!("preempted at global step {step} ({what})");
        let dir = tempdir();
        let (ckpt, codes, out) = (
            dir.path().join("ckpt"),
            dir.path().join("codes"),
            dir.path().join("model.h5"),
        );
        let run = als_job(2, EPOCHS, &ckpt, &out)
            .env("TORUSREC_PREEMPT_AT", step)
            .record_rank_codes(&codes)
            .run();
        run.expect_code(0); // the rank-recording wrapper exits 0
        assert_rank_codes(&codes, 2, 75, &run);
        run.stderr_has(&["preempted", &file_name(step)]);
        assert!(
            !run.stdout.contains("final:"),
            "{what}: a preempted run printed a final line\n{}",
            run.dump()
        );
        let files = committed(&ckpt);
        assert_eq!(
            files.last().map(|f| f.0),
            Some(step),
            "{what}: the newest committed checkpoint should be the preemption's: {:?}",
            names(&ckpt)
        );
        assert!(
            partials(&ckpt).is_empty(),
            "{what}: temporaries left: {:?}",
            names(&ckpt)
        );
        assert!(!out.exists(), "{what}: a preempted run wrote the model");

        let resumed = als_job(2, EPOCHS, &ckpt, &out)
            .arg("--resume")
            .arg("auto")
            .run();
        resumed.stderr_has(&[&format!(
            "resumed from {}",
            ckpt.join(file_name(step)).display()
        )]);
        assert_resumed_equal(&resumed, &out, &reference, &what);
    }
}

// ---------------------------------------------------------------------------------
// 2. real signals

/// Start a long run, wait for its first checkpoint, deliver a signal with `send`
/// (given mpirun's pid), and check that a complete checkpoint newer than the first
/// was committed and that resuming from it equals the uninterrupted run. Returns
/// the interrupted run and the exit codes its ranks recorded.
fn interrupt_and_resume(send: impl FnOnce(u32)) -> (Output, Vec<Option<i32>>) {
    let reference = reference(2, LONG_EPOCHS);
    let dir = tempdir();
    let (ckpt, codes, out) = (
        dir.path().join("ckpt"),
        dir.path().join("codes"),
        dir.path().join("model.h5"),
    );
    let mut job = als_job(2, LONG_EPOCHS, &ckpt, &out)
        .record_rank_codes(&codes)
        .spawn();
    job.wait_until("the first checkpoint", || !committed(&ckpt).is_empty());
    let first = committed(&ckpt)[0].0;
    send(job.pid());
    let run = job.wait();
    let codes = rank_codes(&codes, 2);
    assert!(
        !run.stdout.contains("final:"),
        "the run finished before the signal took effect (make LONG_EPOCHS larger)\n{}",
        run.dump()
    );
    run.stderr_has(&["preempted"]);
    let last = committed(&ckpt).last().map(|f| f.0).expect("a checkpoint");
    assert!(
        last > first,
        "no checkpoint committed after the signal (newest {last}, first {first})\n{}",
        run.dump()
    );
    assert!(
        partials(&ckpt).is_empty(),
        "temporaries left: {:?}",
        names(&ckpt)
    );
    let resumed = als_job(2, LONG_EPOCHS, &ckpt, &out)
        .arg("--resume")
        .arg("auto")
        .run();
    resumed.stderr_has(&[&format!(
        "resumed from {}",
        ckpt.join(file_name(last)).display()
    )]);
    assert_resumed_equal(&resumed, &out, &reference, "resumed after a signal");
    (run, codes)
}

/// SIGTERM to `mpirun` (what `kill` of a job script's mpirun does). Open MPI 4.1 does
/// not forward it: it aborts the job, sending SIGCONT, then after 1 s SIGTERM to every
/// rank's process group, then after another 1 s (`odls_base_sigkill_timeout`) SIGKILL,
/// and it kills the remaining ranks as soon as one exits. The ranks finish the step
/// and commit the checkpoint within that second, but whether each one gets to exit 75
/// before mpirun kills it is Open MPI's race (in practice they are killed in
/// `MPI_Finalize`, and mpirun exits 1). So this checks the checkpoint and that no rank
/// exits with any other code; exit 75 on every rank is checked with SIGUSR1 (forwarded
/// by mpirun) and with SIGTERM to the ranks themselves (what Slurm does to the tasks).
#[test]
fn sigterm_to_mpirun_commits_a_checkpoint_that_resumes_exactly() {
    let _serial = serial();
    let (run, codes) = interrupt_and_resume(|pid| signal(pid, "TERM"));
    println!(
        "SIGTERM to mpirun: mpirun exited {}, recorded rank codes {codes:?} (None: killed by mpirun)",
        run.code
    );
    assert!(
        codes.iter().all(|c| matches!(c, Some(75) | None)),
        "SIGTERM to mpirun: a rank exited with a code other than 75: {codes:?}\n{}",
        run.dump()
    );
}

/// SIGUSR1 to `mpirun`, which forwards it to the ranks without stopping the job.
#[test]
fn sigusr1_to_mpirun_checkpoints_and_every_rank_exits_75() {
    let _serial = serial();
    let (run, codes) = interrupt_and_resume(|pid| signal(pid, "USR1"));
    assert!(
        codes.iter().all(|c| *c == Some(75)),
        "SIGUSR1 forwarded by mpirun: rank codes {codes:?}\n{}",
        run.dump()
    );
}

/// SIGTERM to every rank process at once (what Slurm does to the tasks of a step).
#[test]
fn sigterm_to_every_rank_checkpoints_and_every_rank_exits_75() {
    let _serial = serial();
    let (run, codes) = interrupt_and_resume(|pid| {
        let ranks: Vec<u32> = (0..2)
            .map(|r| rank_pid(pid, r).unwrap_or_else(|| panic!("rank {r} not found")))
            .collect();
        for p in ranks {
            signal(p, "TERM");
        }
    });
    assert!(
        codes.iter().all(|c| *c == Some(75)),
        "SIGTERM to the ranks: rank codes {codes:?}\n{}",
        run.dump()
    );
}

/// SIGTERM, then one SIGINT, to every rank: the SIGINT is the first of its kind, so it
/// only joins the preemption (only a second SIGINT exits at once, with 130).
#[test]
fn a_first_sigint_after_sigterm_still_checkpoints_and_exits_75() {
    let _serial = serial();
    let (run, codes) = interrupt_and_resume(|pid| {
        let ranks: Vec<u32> = (0..2)
            .map(|r| rank_pid(pid, r).unwrap_or_else(|| panic!("rank {r} not found")))
            .collect();
        for sig in ["TERM", "INT"] {
            for &p in &ranks {
                signal(p, sig);
            }
        }
    });
    assert!(
        codes.iter().all(|c| *c == Some(75)),
        "SIGTERM then SIGINT to the ranks: rank codes {codes:?}\n{}",
        run.dump()
    );
}

/// The "loss ..." of a run's final line.
fn final_loss(o: &Output) -> String {
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("final:"))
        .unwrap_or_else(|| panic!("no final line\n{}", o.dump()));
    line.split("loss ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// A run resumed from the checkpoint of its last epoch trains nothing, and reports
/// the loss the checkpoint recorded; one with fewer --epochs than the checkpoint
/// reached is refused rather than reporting a run it did not do.
#[test]
fn a_resume_at_the_end_reports_the_loss_and_one_past_it_is_refused() {
    let _serial = serial();
    let dir = tempdir();
    let (ckpt, out) = (dir.path().join("ckpt"), dir.path().join("model.h5"));
    let first = als_job(2, EPOCHS, &ckpt, &out).run();
    first.expect_code(0);
    let again = als_job(2, EPOCHS, &ckpt, &out)
        .args(["--resume", "auto"])
        .run();
    again.expect_code(0);
    assert_ne!(final_loss(&first), "NaN");
    assert_eq!(final_loss(&again), final_loss(&first), "{}", again.dump());
    als_job(2, EPOCHS - 1, &ckpt, &out)
        .args(["--resume", "auto"])
        .run()
        .expect_code(2)
        .occurs(&format!("past --epochs {}", EPOCHS - 1), 1);
}

// ---------------------------------------------------------------------------------
// 3. a checkpoint written by 4 ranks restores on 2 and 3

#[test]
fn checkpoint_from_4_ranks_resumes_on_2_and_3_ranks() {
    let _serial = serial();
    let s = data().steps_per_half;
    let step = s + s / 2; // in the middle of the column half
    let reference = reference(4, EPOCHS);
    let dir = tempdir();
    let ckpt4 = dir.path().join("ckpt4");
    let codes = dir.path().join("codes");
    let run = als_job(4, EPOCHS, &ckpt4, &dir.path().join("unused.h5"))
        .env("TORUSREC_PREEMPT_AT", step)
        .record_rank_codes(&codes)
        .run();
    assert_rank_codes(&codes, 4, 75, &run);
    let file = ckpt4.join(file_name(step));
    assert!(file.is_file(), "no {}\n{}", file.display(), run.dump());

    for np in [2, 3, 4] {
        let ckpt = dir.path().join(format!("ckpt-on-{np}"));
        std::fs::create_dir_all(&ckpt).unwrap();
        std::fs::copy(&file, ckpt.join(file_name(step))).unwrap();
        let out = dir.path().join(format!("model-on-{np}.h5"));
        let resumed = als_job(np, EPOCHS, &ckpt, &out)
            .arg("--resume")
            .arg("auto")
            .run();
        resumed
            .expect_code(0)
            .stderr_has(&["resumed from", "written by 4 rank(s)"]);
        if np == 4 {
            // The same rank count: exact.
            assert_resumed_equal(&resumed, &out, &reference, "resumed on 4 ranks");
            continue;
        }
        let checksum = resumed.final_checksum();
        for (name, want) in [("W", &reference.w), ("H", &reference.h)] {
            let got = read_table(&out, name);
            let (max_rel, frob_rel) = relative_difference(&got, want);
            let bitwise = got
                .data
                .iter()
                .zip(&want.data)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            println!(
                "resumed on {np} ranks: /{name} max |diff| / max |value| = {max_rel:.3e}, \
                 ||diff|| / ||value|| = {frob_rel:.3e}, bitwise equal: {bitwise}"
            );
            assert!(
                max_rel <= 1e-5 && frob_rel <= 1e-5,
                "resumed on {np} ranks: /{name} differs from the 4-rank run: max {max_rel:.3e}, \
                 norm {frob_rel:.3e} (relative)"
            );
        }
        println!(
            "resumed on {np} ranks: checksum {checksum}, the 4-rank run's {} (equal: {})",
            reference.checksum,
            checksum == reference.checksum
        );
    }
}

// ---------------------------------------------------------------------------------
// 4. crashes while writing a checkpoint (or anywhere): the last commit survives

/// One crash: run with `--checkpoint-every 1` until it dies, check what is left,
/// resume and compare with the uninterrupted run.
fn crash_and_resume(what: &str, fault: &str, expect_partial: bool, expect_newest: u64) {
    let reference = reference(2, EPOCHS);
    let dir = tempdir();
    let (ckpt, out) = (dir.path().join("ckpt"), dir.path().join("model.h5"));
    let job = || als_job(2, EPOCHS, &ckpt, &out).args(["--checkpoint-every", "1"]);
    let started = Instant::now();
    let run = job().env("TORUSREC_FAULT", fault).run();
    assert!(
        run.code != 0 && run.code != 75 && run.code != 76,
        "{what}: the job should die; exit {}\n{}",
        run.code,
        run.dump()
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{what}: the job took {:?} to die",
        started.elapsed()
    );
    run.stderr_has(&["[fault]"]);
    let before = committed(&ckpt);
    assert_eq!(
        before.last().map(|f| f.0),
        Some(expect_newest),
        "{what}: newest committed checkpoint; files {:?}\n{}",
        names(&ckpt),
        run.dump()
    );
    let leftovers = partials(&ckpt);
    assert_eq!(
        !leftovers.is_empty(),
        expect_partial,
        "{what}: temporaries after the crash: {leftovers:?}"
    );

    let resumed = job().arg("--resume").arg("auto").run();
    let newest = &before.last().unwrap().1;
    resumed.stderr_has(&[&format!("resumed from {}", newest.display())]);
    for p in &leftovers {
        resumed.stderr_has(&["removed an incomplete checkpoint", p.as_str()]);
    }
    assert!(
        partials(&ckpt).is_empty(),
        "{what}: temporaries left after the restart: {:?}",
        names(&ckpt)
    );
    assert_resumed_equal(&resumed, &out, &reference, what);
}

#[test]
fn crash_after_a_shard_write_keeps_the_previous_checkpoint() {
    let _serial = serial();
    let s = data().steps_per_half;
    // Checkpoints after every half: s and 2s are committed, rank 1 dies after writing
    // its shard of the third.
    crash_and_resume(
        "abort on rank 1 after its shard of the 3rd checkpoint",
        "after-shard-write@1#3",
        true,
        2 * s,
    );
}

#[test]
fn crash_before_the_commit_keeps_the_previous_checkpoint() {
    let _serial = serial();
    let s = data().steps_per_half;
    crash_and_resume(
        "abort on rank 0 before committing the 3rd checkpoint",
        "before-commit#3",
        true,
        2 * s,
    );
}

#[test]
fn crash_in_the_middle_of_an_all_to_all_keeps_the_previous_checkpoint() {
    let _serial = serial();
    let s = data().steps_per_half;
    // The exchange runs once per half: the 3rd is the second epoch's row half, after
    // the checkpoints at s and 2s.
    crash_and_resume(
        "abort on rank 0 in the 3rd all-to-all",
        "mid-alltoall@0#3",
        false,
        2 * s,
    );
}

#[test]
fn kill_9_of_one_rank_keeps_the_last_checkpoint_and_resumes_exactly() {
    let _serial = serial();
    let reference = reference(2, LONG_EPOCHS);
    let dir = tempdir();
    let (ckpt, out) = (dir.path().join("ckpt"), dir.path().join("model.h5"));
    let job = || als_job(2, LONG_EPOCHS, &ckpt, &out).args(["--checkpoint-every", "1"]);
    let mut running = job().spawn();
    running.wait_until("the second checkpoint", || committed(&ckpt).len() >= 2);
    let victim = rank_pid(running.pid(), 1).expect("rank 1 of the job");
    signal(victim, "KILL");
    let started = Instant::now();
    let run = running.wait();
    assert!(
        run.code != 0 && run.code != 75 && !run.stdout.contains("final:"),
        "after kill -9 of rank 1 the job should fail; exit {}\n{}",
        run.code,
        run.dump()
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the job took {:?} to stop after kill -9 of a rank",
        started.elapsed()
    );
    let newest = committed(&ckpt).last().unwrap().1.clone();
    let resumed = job().arg("--resume").arg("auto").run();
    resumed.stderr_has(&[&format!("resumed from {}", newest.display())]);
    assert!(
        partials(&ckpt).is_empty(),
        "temporaries: {:?}",
        names(&ckpt)
    );
    assert_resumed_equal(
        &resumed,
        &out,
        &reference,
        "resumed after kill -9 of rank 1",
    );
}

// ---------------------------------------------------------------------------------
// 5. a corrupt checkpoint: training hold, nothing deleted

#[test]
fn flipped_byte_in_a_checkpoint_is_a_hold_naming_file_and_dataset() {
    let _serial = serial();
    let s = data().steps_per_half;
    let dir = tempdir();
    let clean = dir.path().join("clean");
    let run = als_job(2, EPOCHS, &clean, &dir.path().join("unused.h5"))
        .env("TORUSREC_PREEMPT_AT", s / 2)
        .run();
    run.expect_code(75);
    let (_, good) = committed(&clean).pop().expect("a checkpoint");

    for table in ["W", "H"] {
        let ckpt = dir.path().join(format!("flipped-{table}"));
        std::fs::create_dir_all(&ckpt).unwrap();
        let file = ckpt.join(good.file_name().unwrap());
        std::fs::copy(&good, &file).unwrap();
        // A byte in the middle of the table's raw data.
        let size = read_table(&file, table).data.len() as u64 * 4;
        flip_byte_in_dataset(&file, table, size / 2 + 1);
        let corrupt = std::fs::read(&file).unwrap();
        let before = names(&ckpt);

        // `--resume PATH` to a corrupt file stops (auto would fall back, see below).
        let codes = dir.path().join(format!("codes-{table}"));
        let run = als_job(2, EPOCHS, &ckpt, &dir.path().join("model.h5"))
            .arg("--resume")
            .arg(&file)
            .record_rank_codes(&codes)
            .run();
        assert_rank_codes(&codes, 2, 76, &run);
        show(&format!("flipped byte in /{table}"), &run, "torusrec:");
        run.stderr_has(&[&file.display().to_string(), &format!("/{table}")]);
        assert_eq!(
            std::fs::read(&file).unwrap(),
            corrupt,
            "the corrupt checkpoint was changed or deleted"
        );
        let mut want = before.clone();
        want.push("HOLD.json".into());
        want.sort();
        assert_eq!(names(&ckpt), want, "files after the refused restore");
        let hold = std::fs::read_to_string(ckpt.join("HOLD.json")).unwrap();
        assert!(
            hold.contains(&format!("/{table}")),
            "HOLD.json does not name /{table}: {hold}"
        );
    }
}

#[test]
fn resume_auto_falls_back_past_a_corrupt_newest_checkpoint_and_renames_it() {
    let _serial = serial();
    let s = data().steps_per_half;
    let reference = reference(2, EPOCHS);
    let dir = tempdir();
    let (ckpt, out) = (dir.path().join("ckpt"), dir.path().join("model.h5"));
    // Two committed checkpoints: at s/2, then (resumed) at s + s/2.
    als_job(2, EPOCHS, &ckpt, &out)
        .env("TORUSREC_PREEMPT_AT", s / 2)
        .run()
        .expect_code(75);
    als_job(2, EPOCHS, &ckpt, &out)
        .args(["--resume", "auto"])
        .env("TORUSREC_PREEMPT_AT", s + s / 2)
        .run()
        .expect_code(75);
    let files = committed(&ckpt);
    assert_eq!(
        files.iter().map(|f| f.0).collect::<Vec<_>>(),
        vec![s / 2, s + s / 2],
        "{:?}",
        names(&ckpt)
    );
    let (older, newest) = (files[0].1.clone(), files[1].1.clone());
    let size = read_table(&newest, "H").data.len() as u64 * 4;
    flip_byte_in_dataset(&newest, "H", size / 3);
    let corrupt = std::fs::read(&newest).unwrap();

    let run = als_job(2, EPOCHS, &ckpt, &out)
        .args(["--resume", "auto"])
        .run();
    show("corrupt newest checkpoint, --resume auto", &run, "skipping");
    run.stderr_has(&[
        "skipping checkpoint",
        &newest.display().to_string(),
        "/H",
        &format!("resumed from {}", older.display()),
    ]);
    assert_resumed_equal(&run, &out, &reference, "resumed past a corrupt checkpoint");
    let mut aside = newest.clone().into_os_string();
    aside.push(".corrupt");
    assert_eq!(
        std::fs::read(&aside).expect("the corrupt checkpoint, renamed"),
        corrupt,
        "the corrupt checkpoint was not kept byte for byte"
    );
    assert!(
        !ckpt.join("HOLD.json").exists(),
        "a hold after a good fallback"
    );

    // Every checkpoint corrupt: all are set aside, and the run holds (76).
    let dir2 = tempdir();
    let ckpt2 = dir2.path().join("ckpt");
    als_job(2, EPOCHS, &ckpt2, &out)
        .env("TORUSREC_PREEMPT_AT", s / 2)
        .run()
        .expect_code(75);
    let (_, only) = committed(&ckpt2).pop().expect("a checkpoint");
    let size = read_table(&only, "W").data.len() as u64 * 4;
    flip_byte_in_dataset(&only, "W", size / 2);
    let codes = dir2.path().join("codes");
    let run = als_job(2, EPOCHS, &ckpt2, &dir2.path().join("m.h5"))
        .args(["--resume", "auto"])
        .record_rank_codes(&codes)
        .run();
    assert_rank_codes(&codes, 2, 76, &run);
    run.stderr_has(&["none of the 1 checkpoint(s) verifies"]);
    assert!(committed(&ckpt2).is_empty(), "{:?}", names(&ckpt2));
    let mut aside = only.into_os_string();
    aside.push(".corrupt");
    assert!(Path::new(&aside).is_file(), "{:?}", names(&ckpt2));
    assert!(ckpt2.join("HOLD.json").is_file(), "no HOLD.json");
}

#[test]
fn a_signal_without_a_checkpoint_directory_exits_1_not_75() {
    let _serial = serial();
    let dir = tempdir();
    let codes = dir.path().join("codes");
    let run = Job::new(2)
        .args(als_args(&data().path, EPOCHS))
        .env("TORUSREC_PREEMPT_AT", 2)
        .record_rank_codes(&codes)
        .run();
    assert_rank_codes(&codes, 2, 1, &run);
    run.stderr_has(&["interrupted", "nothing was saved"]);
    assert!(!run.stdout.contains("final:"), "{}", run.dump());
}

// ---------------------------------------------------------------------------------
// 6. NaN: every rank stops with 76, the hold persists until released

#[test]
fn nan_on_one_rank_holds_every_rank_until_released() {
    let _serial = serial();
    let reference = reference(3, EPOCHS);
    let dir = tempdir();
    let (ckpt, out) = (dir.path().join("ckpt"), dir.path().join("model.h5"));

    let codes = dir.path().join("codes1");
    let started = Instant::now();
    let run = als_job(3, EPOCHS, &ckpt, &out)
        .env("TORUSREC_INJECT_NAN", "2@1")
        .record_rank_codes(&codes)
        .run();
    let took = started.elapsed();
    assert_rank_codes(&codes, 3, 76, &run);
    assert!(took < Duration::from_secs(30), "the hold took {took:?}");
    show("NaN", &run, "torusrec:");
    run.stderr_has(&["training hold", "rank 1"]);
    let hold: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("HOLD.json")).unwrap()).unwrap();
    assert_eq!(hold["rank"], 1, "HOLD.json: {hold}");
    assert_eq!(hold["epoch"], 2, "HOLD.json: {hold}");
    let reason = hold["reason"].as_str().unwrap().to_string();
    assert!(!out.exists(), "a held run wrote the model");

    // A restart (without the fault) refuses, printing the reason.
    let codes = dir.path().join("codes2");
    let run = als_job(3, EPOCHS, &ckpt, &out)
        .arg("--resume")
        .arg("auto")
        .record_rank_codes(&codes)
        .run();
    assert_rank_codes(&codes, 3, 76, &run);
    show("restart under the hold", &run, "torusrec:");
    run.stderr_has(&["HOLD.json", &reason, "--release-hold"]);
    assert!(ckpt.join("HOLD.json").is_file());

    // Released: it runs from the last checkpoint (before the NaN) to the end.
    let run = als_job(3, EPOCHS, &ckpt, &out)
        .arg("--resume")
        .arg("auto")
        .arg("--release-hold")
        .run();
    run.stderr_has(&["hold released", "resumed from"]);
    assert_resumed_equal(&run, &out, &reference, "released and resumed");
    assert!(!ckpt.join("HOLD.json").exists(), "HOLD.json still there");
    assert!(
        names(&ckpt).iter().any(|n| n.starts_with("HOLD.released-")),
        "the released hold is not kept: {:?}",
        names(&ckpt)
    );
}

// ---------------------------------------------------------------------------------
// 7. a checkpoint of another configuration; a missing checkpoint

#[test]
fn checkpoint_of_another_configuration_is_a_hold_and_missing_file_is_exit_2() {
    let _serial = serial();
    let s = data().steps_per_half;
    let dir = tempdir();
    let ckpt = dir.path().join("ckpt");
    let out = dir.path().join("model.h5");
    let run = als_job(2, EPOCHS, &ckpt, &out)
        .env("TORUSREC_PREEMPT_AT", s / 2)
        .run();
    run.expect_code(75);
    let (_, file) = committed(&ckpt).pop().expect("a checkpoint");

    let other_data = dir.path().join("seed7.h5");
    prepare(&other_data, 7);
    let cases: [(&str, &Path, usize, u64, &str); 3] = [
        ("--dim 8", &data().path, 8, 42, "configuration"),
        ("--seed 7", &data().path, DIM, 7, "configuration"),
        (
            "data split with seed 7",
            &other_data,
            DIM,
            42,
            "written for data",
        ),
    ];
    for (i, (what, dataset, dim, seed, needle)) in cases.into_iter().enumerate() {
        let ckpt2 = dir.path().join(format!("ckpt-{i}"));
        let codes = dir.path().join(format!("codes-{i}"));
        let run = Job::new(2)
            .args(als_args_with(dataset, EPOCHS, dim, seed))
            .arg("--checkpoint-dir")
            .arg(&ckpt2)
            .arg("--resume")
            .arg(&file)
            .record_rank_codes(&codes)
            .run();
        assert_rank_codes(&codes, 2, 76, &run);
        show(what, &run, "torusrec:");
        run.stderr_has(&[&file.display().to_string(), needle]);
        assert!(
            ckpt2.join("HOLD.json").is_file(),
            "{what}: no HOLD.json\n{}",
            run.dump()
        );
        assert!(file.is_file(), "{what}: the checkpoint was deleted");
    }

    let missing = dir.path().join("no-such-ckpt.h5");
    let codes = dir.path().join("codes-missing");
    let run = Job::new(2)
        .args(als_args(&data().path, EPOCHS))
        .arg("--checkpoint-dir")
        .arg(&ckpt)
        .arg("--resume")
        .arg(&missing)
        .record_rank_codes(&codes)
        .run();
    assert_rank_codes(&codes, 2, 2, &run);
    show("missing checkpoint", &run, "torusrec:");
    run.stderr_has(&[&missing.display().to_string()]);
}

// ---------------------------------------------------------------------------------
// 8. waits honour the preemption flag

#[test]
fn sigterm_while_waiting_for_data_ends_the_wait_on_every_rank() {
    let _serial = serial();
    let dir = tempdir();
    let codes = dir.path().join("codes");
    let missing = dir.path().join("not-yet.h5");
    let mut job = Job::new(2)
        .args(als_args(&missing, 1))
        .args(["--wait-for-data", "600"])
        .record_rank_codes(&codes)
        .spawn();
    let root = job.pid();
    job.wait_until("both ranks run", || {
        rank_pid(root, 0).is_some() && rank_pid(root, 1).is_some()
    });
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    signal(rank_pid(root, 1).unwrap(), "TERM");
    let run = job.wait();
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "the wait went on {:?} after the signal\n{}",
        t.elapsed(),
        run.dump()
    );
    assert_rank_codes(&codes, 2, 75, &run);
    run.stderr_has(&["while waiting for"]);
}

#[test]
fn wait_and_resume_flags_are_validated() {
    let dir = tempdir();
    for (extra, needle) in [
        (vec!["--wait-for-data", "nan"], "--wait-for-data NaN"),
        (vec!["--wait-for-data", "1e300"], "--wait-for-data 1000000"),
        (vec!["--wait-for-data", "inf"], "--wait-for-data inf"),
        (vec!["--resume", "x.h5"], "--resume needs --checkpoint-dir"),
    ] {
        let run = Job::new(1)
            .args(als_args(&data().path, 1))
            .args(extra)
            .arg("--out")
            .arg(dir.path().join("m.h5"))
            .run();
        assert_eq!(run.code, 2, "{}", run.dump());
        run.stderr_has(&[needle]);
    }
}
