//! What the integration tests share (both binaries, `tests/it` and `tests/faults`):
//! running the `torusrec` binary, directly or under `mpirun`, always under a timeout
//! (after ripgrep's `tests/util.rs`); the one lock of the tests that must not overlap;
//! the datasets and commands several features use. `ooc`: iALS on simulated ranks in
//! out-of-core layouts (`als::ooc` and the preemption tests of `faults`).

#![allow(dead_code)]

pub mod ooc;

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// No single run may take longer than this; a hang fails the test instead of the CI job.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// The binary under test, built by cargo for this integration test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_torusrec"))
}

/// The bundled cnr-2000 graph (a BV basename).
pub fn cnr2000() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cnr-2000/cnr-2000")
}

/// The environment of every `torusrec` and `mpirun` a test starts: Open MPI as
/// root, one BLAS thread a rank, and PMIx's security check by the node's own
/// credentials rather than munge. Where munge is installed (the Slurm tests add it)
/// but its daemon is not running, PMIx retries munge's socket for about 2.3 s at
/// every start of `mpirun` and of a singleton rank: most of a short test's time.
pub fn set_mpi_env(cmd: &mut Command) {
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OPENBLAS_NUM_THREADS", "1")
        .env("PMIX_MCA_psec", "native");
}

/// One test at a time: the tests that start `mpirun` jobs of several ranks (they
/// oversubscribe the cores, and the signal tests depend on timing) and, in
/// `tests/faults`, every test (each changes the process environment) take this lock
/// first and hold it to their end. A test that failed while holding it does not stop
/// the others.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// cnr-2000 prepared with K = 10 and split seed 42 (22,988 nodes), once per test
/// process.
pub fn cnr2000_k10() -> &'static Path {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tests-data");
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("cnr2000-k10.h5");
        prepare_cnr2000(TestCommand::direct(), 10, &out)
            .args(["--seed", "42", "--force"])
            .run()
            .expect_code(0);
        out
    })
}

/// `torusrec prepare` of the bundled cnr-2000 graph (BV) keeping K = `k` in- and
/// out-links, into `out`, started by `launcher` (`--seed`, `--force`: add them).
pub fn prepare_cnr2000(launcher: TestCommand, k: u64, out: &Path) -> TestCommand {
    launcher
        .args(["prepare", "--format", "bv", "--min-links", &k.to_string()])
        .arg("--input")
        .arg(cnr2000())
        .arg("--out")
        .arg(out)
}

/// Dataset `name` of the HDF5 file `path`, whole.
#[track_caller]
pub fn h5_read<T: hdf5::H5Type>(path: &Path, name: &str) -> Vec<T> {
    let f = torusrec::io::h5::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.dataset(name)
        .unwrap_or_else(|e| panic!("{}: /{name}: {e}", path.display()))
        .read_raw::<T>()
        .unwrap()
}

/// Overwrite dataset `name` of the HDF5 file `path` with `v` (of its length).
#[track_caller]
pub fn h5_write<T: hdf5::H5Type>(path: &Path, name: &str, v: &[T]) {
    let f = torusrec::io::h5::open_rw(path).unwrap();
    let ds = f.dataset(name).unwrap();
    assert_eq!(
        ds.size(),
        v.len(),
        "{name}: the mutation changed the length"
    );
    ds.write_raw(v).unwrap();
}

/// `torusrec embed` of the `tiny` preset under `mpirun -np NP`: a global batch of 128,
/// `steps` steps, a report every `log_every`, 2048 held-out examples, one thread.
pub fn tiny_embed(np: usize, steps: &str, log_every: &str) -> TestCommand {
    TestCommand::mpirun(np).args([
        "embed",
        "--preset",
        "tiny",
        "--global-batch",
        "128",
        "--steps",
        steps,
        "--log-every",
        log_every,
        "--eval-examples",
        "2048",
        "--table-lr",
        "0.05",
        "--dense-lr",
        "0.01",
        "--threads",
        "1",
    ])
}

/// A scratch directory, removed when dropped.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("torusrec-cli-")
        .tempdir()
        .expect("create a temporary directory")
}

/// `1,234,567` style grouping, as the binary prints counts.
pub fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// How the binary is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `torusrec ...` (an MPI singleton).
    Direct,
    /// `mpirun --oversubscribe --bind-to none -np N torusrec ...`.
    Mpirun(usize),
}

/// One invocation of the binary under test.
#[derive(Debug, Clone)]
pub struct TestCommand {
    launcher: Launcher,
    args: Vec<OsString>,
    cwd: Option<PathBuf>,
    timeout: Duration,
    rank_codes: Option<PathBuf>,
    envs: Vec<(String, String)>,
    /// Under `mpirun`: further ranks with their own arguments (MPMD, `: -np 1 ...`).
    more: Vec<Vec<OsString>>,
}

/// What a finished run produced.
#[derive(Debug, Clone)]
pub struct Output {
    /// The exit code (128 + signal if the process was killed by a signal).
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// The command line, for failure messages.
    pub command: String,
}

impl TestCommand {
    /// Run the binary directly.
    pub fn direct() -> Self {
        Self::new(Launcher::Direct)
    }

    /// Run the binary under `mpirun` with `np` ranks.
    pub fn mpirun(np: usize) -> Self {
        Self::new(Launcher::Mpirun(np))
    }

    pub fn new(launcher: Launcher) -> Self {
        Self {
            launcher,
            args: Vec::new(),
            cwd: None,
            timeout: TIMEOUT,
            rank_codes: None,
            envs: Vec::new(),
            more: Vec::new(),
        }
    }

    /// Under `mpirun`: one more rank, after the others, that runs the binary with
    /// `args` instead (mpirun's MPMD syntax, `: -np 1 torusrec ARGS`).
    pub fn and_rank_with<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        assert!(
            matches!(self.launcher, Launcher::Mpirun(_)),
            "more ranks only under mpirun"
        );
        self.more
            .push(args.into_iter().map(|a| a.as_ref().to_owned()).collect());
        self
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.args.push(a.as_ref().to_owned());
        self
    }

    pub fn args<I, S>(mut self, it: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(it.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Set an environment variable for the binary (passed through `mpirun -x`).
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.envs.push((k.into(), v.into()));
        self
    }

    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Under `mpirun`: wrap every rank in `sh` that writes the rank's exit code to
    /// `dir/rank.R` and then exits 0 (so mpirun aborts nobody and every rank's own
    /// code is seen; read them with [`rank_codes`]). A rank that hangs after another
    /// has exited then shows up as a timeout.
    pub fn record_rank_codes(mut self, dir: impl Into<PathBuf>) -> Self {
        assert!(
            matches!(self.launcher, Launcher::Mpirun(_)),
            "rank codes are recorded only under mpirun"
        );
        self.rank_codes = Some(dir.into());
        self
    }

    fn command(&self) -> Command {
        let mut cmd = match self.launcher {
            Launcher::Direct => {
                let mut c = Command::new(bin());
                c.args(&self.args);
                c
            }
            Launcher::Mpirun(np) => {
                let mut c = Command::new("mpirun");
                c.args(["--oversubscribe", "--bind-to", "none", "-np"])
                    .arg(np.to_string())
                    .args(["-x", "OPENBLAS_NUM_THREADS"]);
                for (k, _) in &self.envs {
                    c.args(["-x", k]);
                }
                let wrap = |c: &mut Command| {
                    if let Some(dir) = &self.rank_codes {
                        let script = format!(
                            "\"$@\"; echo $? > {}/rank.$OMPI_COMM_WORLD_RANK",
                            shell_quote(dir)
                        );
                        c.args(["sh", "-c"]).arg(script).arg("sh");
                    }
                };
                wrap(&mut c);
                c.arg(bin()).args(&self.args);
                for more in &self.more {
                    c.args([":", "-np", "1"]);
                    wrap(&mut c);
                    c.arg(bin()).args(more);
                }
                c
            }
        };
        set_mpi_env(&mut cmd);
        cmd.env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Our own process group, so a hung run can be killed with its children.
            .process_group(0);
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        cmd
    }

    /// The command line as a person would type it.
    pub fn display(&self) -> String {
        let c = self.command();
        std::iter::once(c.get_program())
            .chain(c.get_args())
            .map(|a| {
                let a = a.to_string_lossy();
                if a.is_empty()
                    || a.contains(|c: char| !c.is_ascii_alphanumeric() && !"-_./=:,".contains(c))
                {
                    shell_quote(Path::new(&*a))
                } else {
                    a.into_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Run to completion (or fail the test on timeout).
    pub fn run(&self) -> Output {
        let command = self.display();
        let mut child = self
            .command()
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{command}`: {e}"));
        let out_rx = drain(child.stdout.take().expect("piped stdout"));
        let err_rx = drain(child.stderr.take().expect("piped stderr"));
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if start.elapsed() < self.timeout => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    kill_group(&mut child);
                    let stdout = collect(&out_rx);
                    let stderr = collect(&err_rx);
                    panic!(
                        "TIMEOUT: `{command}` did not finish within {:?} and was killed \
                         (a hang, e.g. ranks waiting in a collective)\n\
                         --- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
                        self.timeout
                    );
                }
                Err(e) => panic!("waiting for `{command}`: {e}"),
            }
        };
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        Output {
            code,
            stdout: collect(&out_rx),
            stderr: collect(&err_rx),
            command,
        }
    }
}

/// Read a pipe to its end on a thread (so a chatty child never blocks on a full pipe).
pub fn drain(mut r: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

/// What [`drain`] read (waits at most 10 s for the pipe to close).
pub fn collect(rx: &mpsc::Receiver<Vec<u8>>) -> String {
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => "<output not closed: a leftover process still holds the pipe>".into(),
    }
}

/// SIGTERM to the child's process group (mpirun then stops its ranks), SIGKILL after 5 s.
fn kill_group(child: &mut Child) {
    let group = format!("-{}", child.id());
    let signal = |sig: &str| {
        let _ = Command::new("kill")
            .args([sig, "--", &group])
            .stderr(Stdio::null())
            .status();
    };
    signal("-TERM");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = child.try_wait() {
            signal("-KILL");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    signal("-KILL");
    let _ = child.kill();
    let _ = child.wait();
}

/// `p` in single quotes for `sh`.
pub fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"))
}

/// The exit codes recorded by [`TestCommand::record_rank_codes`] (None: the rank
/// wrote nothing).
pub fn rank_codes(dir: &Path, np: usize) -> Vec<Option<i32>> {
    (0..np)
        .map(|r| {
            std::fs::read_to_string(dir.join(format!("rank.{r}")))
                .ok()
                .and_then(|s| s.trim().parse().ok())
        })
        .collect()
}

impl Output {
    /// The checksum on rank 0's `final:` line, 16 hex digits (panics, with the run, if
    /// there is none).
    #[track_caller]
    pub fn final_checksum(&self) -> String {
        let line = self
            .stdout
            .lines()
            .find(|l| l.starts_with("final:"))
            .unwrap_or_else(|| panic!("no `final:` line\n{}", self.dump()));
        let mut words = line.split_whitespace();
        words.find(|w| *w == "checksum");
        let sum = words
            .next()
            .unwrap_or_else(|| panic!("no checksum in {line:?}\n{}", self.dump()));
        assert!(
            sum.len() == 16 && sum.chars().all(|c| c.is_ascii_hexdigit()),
            "checksum {sum:?} is not 16 hex digits\n{}",
            self.dump()
        );
        sum.to_string()
    }

    /// The log loss on rank 0's `final:` line (`logloss X`; panics, with the run, if
    /// there is none).
    #[track_caller]
    pub fn final_logloss(&self) -> f64 {
        let line = self
            .stdout
            .lines()
            .find(|l| l.starts_with("final:"))
            .unwrap_or_else(|| panic!("no `final:` line\n{}", self.dump()));
        let mut words = line.split_whitespace();
        words.find(|w| *w == "logloss");
        words
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("no log loss in {line:?}\n{}", self.dump()))
    }

    /// The whole run, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "`{}` exited {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command, self.code, self.stdout, self.stderr
        )
    }

    /// Assert the exit code; returns self for chaining.
    #[track_caller]
    pub fn expect_code(&self, want: i32) -> &Self {
        assert_eq!(
            self.code,
            want,
            "wrong exit code (want {want})\n{}",
            self.dump()
        );
        self
    }

    /// Assert that stdout contains every needle.
    #[track_caller]
    pub fn stdout_has(&self, needles: &[&str]) -> &Self {
        for n in needles {
            assert!(
                self.stdout.contains(n),
                "stdout lacks {n:?}\n{}",
                self.dump()
            );
        }
        self
    }

    /// Assert that stderr contains every needle.
    #[track_caller]
    pub fn stderr_has(&self, needles: &[&str]) -> &Self {
        for n in needles {
            assert!(
                self.stderr.contains(n),
                "stderr lacks {n:?}\n{}",
                self.dump()
            );
        }
        self
    }

    /// Assert that `needle` occurs exactly `n` times in stdout + stderr.
    #[track_caller]
    pub fn occurs(&self, needle: &str, n: usize) -> &Self {
        let got = self.stdout.matches(needle).count() + self.stderr.matches(needle).count();
        assert_eq!(got, n, "{needle:?} printed {got} times\n{}", self.dump());
        self
    }
}

/// The largest absolute difference of two tables relative to the largest value of `a`.
pub fn max_rel_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = a
        .iter()
        .map(|x| x.abs() as f64)
        .fold(0.0, f64::max)
        .max(1e-12);
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .fold(0.0, f64::max)
        / scale
}

/// A synthetic WebGraph of `nodes` and about `arcs` arcs, prepared (K = 0, split seed
/// `seed`) into `dir` by one process.
pub fn synthetic_dataset(dir: &Path, nodes: u64, arcs: u64, seed: u64) -> PathBuf {
    use torusrec::app::prepare::{global_run, PrepareConfig, Source};
    let out = dir.join(format!("g{nodes}_{arcs}_{seed}.h5"));
    let cfg = PrepareConfig {
        source: Source::Synthetic {
            preset: "test".into(),
            scale: 1.0,
            spec: torusrec::data::graph::webgraph_gen::WebGraphSpec::new(nodes, arcs).unwrap(),
        },
        min_links: 0,
        seed,
        out: out.clone(),
        force: false,
    };
    global_run(&torusrec::comm::single::SingleComm::new(), &cfg).unwrap();
    out
}

/// The embedding trainer's configuration the thread tests share: seed 5, Adagrad
/// (0.01) for the MLP, dedup on, no pipelining, 64 held-out examples, a report every
/// step, the data's ids as rows.
pub fn embed_config(
    spec: &torusrec::spec::ModelSpec,
    table_opt: torusrec::embed::tables::store::TableOpt,
    micro: usize,
    accumulate: usize,
    steps: u64,
) -> torusrec::embed::train::trainer::EmbedConfig {
    torusrec::embed::train::trainer::EmbedConfig {
        spec: spec.clone(),
        seed: 5,
        micro,
        accumulate,
        steps,
        table_opt,
        dense_opt: torusrec::embed::dense::mlp::DenseOpt::adagrad(0.01),
        dense_wd: 0.0,
        lr_schedule: Default::default(),
        dense_gemm: torusrec::embed::dense::gemm::Gemm::auto(),
        dedup: true,
        pipeline: false,
        eval_examples: 64,
        eval_every: 0,
        log_every: 1,
        mem_per_rank: None,
        ids: Default::default(),
    }
}
