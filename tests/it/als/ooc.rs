//! iALS with the training CSR out of core (`--csr-buffer`, `--spill-dir`) and the
//! fixed table gathered in blocks of steps (`--gather-buffer`): the tables have the
//! same bits, and the loss the same value, as with everything in memory at a given
//! rank count (CG f32, CG bf16, Cholesky; cnr-2000 and a synthetic graph); preempted
//! inside a spilled half gathered in blocks, a run resumes to the same bits (and on
//! another rank count to the bits the in-memory layout gives there); a spill read
//! error stops every rank with exit 1; the memory limit refuses what cannot fit and
//! otherwise picks gather blocks.
//!
//! Most runs use the thread communicator (`comm::threads::run`); `mpirun` (under a
//! timeout) only for process-level behaviour. The tests run one at a time (a
//! process-wide lock): the preemption tests set `TORUSREC_PREEMPT_AT` in this process.

mod util;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use torusrec::als::memory::{GatherBuffer, ShardSizes};
use torusrec::als::spill::step_chunks;
use torusrec::als::train::{global_train_as, Side, TableScalar, TrainReport, Trainer};
use torusrec::als::{AlsConfig, Resume, SolverKind};
use torusrec::bf16::{Bf16, TableDtype};
use torusrec::ckpt::file_name;
use torusrec::ckpt::signals::Preemption;
use torusrec::comm::threads::run;
use torusrec::comm::Comm;
use util::{cnr2000, max_rel_diff, rank_codes, tempdir, TestCommand};

const DIM: usize = 8;
/// A CSR buffer far below any rank's CSR: chunks of 512 indices.
const TINY_CSR: u64 = 4 << 10;

// ---------------------------------------------------------------------------------
// one test at a time, the datasets

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A dataset, the `--step-nnz` its runs use, and a `--csr-buffer` below every
/// rank's CSR at up to 3 ranks whose chunks hold several steps.
struct Data {
    path: PathBuf,
    step_nnz: u64,
    small_csr: u64,
}

fn scratch_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("als-ooc-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// cnr-2000 with K = 10 (22,988 nodes), prepared once per test process.
fn cnr() -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| {
        let path = scratch_dir().join("cnr2000-k10.h5");
        TestCommand::direct()
            .arg("prepare")
            .arg("--input")
            .arg(cnr2000())
            .args([
                "--format",
                "bv",
                "--min-links",
                "10",
                "--seed",
                "42",
                "--force",
            ])
            .arg("--out")
            .arg(&path)
            .run()
            .expect_code(0);
        Data {
            path,
            step_nnz: 10_000,
            small_csr: 256 << 10,
        }
    })
}

/// A synthetic web graph of 4,000 nodes and about 60,000 arcs.
fn synthetic() -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| Data {
        path: util::synthetic_dataset(&scratch_dir(), 4000, 60_000, 9),
        step_nnz: 1500,
        small_csr: 32 << 10,
    })
}

/// A synthetic web graph whose rows one half-epoch gathers exceed the automatic
/// gather buffer's floor (`MIN_GATHER_ROWS`) at two ranks.
fn large_synthetic() -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| Data {
        path: util::synthetic_dataset(&scratch_dir(), 200_000, 800_000, 10),
        step_nnz: 50_000,
        small_csr: 1 << 20,
    })
}

// ---------------------------------------------------------------------------------
// training on simulated ranks

/// One solver setting: the solver, the table dtype, and `--loss-every-half`.
#[derive(Debug, Clone, Copy)]
struct Setting {
    solver: SolverKind,
    dtype: TableDtype,
    loss_every_half: bool,
}

const SETTINGS: [Setting; 4] = [
    Setting {
        solver: SolverKind::Cg,
        dtype: TableDtype::F32,
        loss_every_half: false,
    },
    Setting {
        solver: SolverKind::Cg,
        dtype: TableDtype::Bf16,
        loss_every_half: true,
    },
    Setting {
        solver: SolverKind::Cholesky,
        dtype: TableDtype::F32,
        loss_every_half: false,
    },
    Setting {
        solver: SolverKind::Cholesky,
        dtype: TableDtype::F32,
        loss_every_half: true,
    },
];

fn config(data: &Data, s: Setting) -> AlsConfig {
    AlsConfig {
        dim: DIM,
        epochs: 2,
        reg: 0.05,
        unobserved_weight: 0.05,
        solver: s.solver,
        eval_rows: torusrec::als::eval::EvalRows::All,
        seed: 3,
        hub_chunk: 64,
        step_nnz: data.step_nnz,
        loss_every_half: s.loss_every_half,
        table_dtype: s.dtype,
        ..AlsConfig::new(&data.path)
    }
}

/// `cfg` with another CSR buffer and gather buffer.
fn with_memory(cfg: &AlsConfig, csr_buffer: u64, gather: GatherBuffer) -> AlsConfig {
    let mut c = cfg.clone();
    c.memory.csr_buffer = csr_buffer;
    c.memory.gather_buffer = gather;
    c
}

/// A gather buffer of `rows` rows of `cfg`'s tables.
fn gather_rows(cfg: &AlsConfig, rows: u64) -> GatherBuffer {
    GatherBuffer::Bytes(rows * cfg.dim as u64 * cfg.table_dtype.bytes() as u64)
}

/// How one side of one rank was laid out.
#[derive(Debug, Clone, PartialEq)]
struct SideLayout {
    spilled: bool,
    /// One gather per half (else a gather round at each of `rounds`).
    one_gather: bool,
    rounds: Vec<usize>,
    /// This rank's own gather blocks.
    blocks: usize,
    /// Chunks of steps a half reads from the spill.
    chunks: usize,
    /// The most steps any chunk holds.
    max_chunk_steps: usize,
}

fn side_layout(side: &Side, steps: usize, csr_buffer: u64) -> SideLayout {
    let chunks = step_chunks(
        &side.step_bounds,
        &side.shard.indptr,
        0,
        steps,
        (csr_buffer / 8).max(1),
        &[],
    );
    SideLayout {
        spilled: side.spill.is_some(),
        one_gather: side.plan.is_some(),
        rounds: side.rounds.clone(),
        blocks: side.spill.as_ref().map_or(1, |s| s.block_starts.len()),
        chunks: chunks.len(),
        max_chunk_steps: chunks.iter().map(|c| c.1 - c.0).max().unwrap_or(0),
    }
}

/// What a run produced, all ranks together.
#[derive(Debug, Clone)]
struct Outcome {
    checksum: u64,
    /// The bits of every loss reported: per epoch the row half's (if computed) and
    /// the epoch's.
    losses: Vec<Option<u64>>,
    final_loss: u64,
    /// The bits of W and of H by global id (bf16 widened to f32, which is exact).
    w: Vec<u32>,
    h: Vec<u32>,
    /// Per rank, (rows side, columns side).
    layout: Vec<(SideLayout, SideLayout)>,
    steps_per_half: usize,
}

impl Outcome {
    fn w_f32(&self) -> Vec<f32> {
        self.w.iter().map(|&b| f32::from_bits(b)).collect()
    }
    fn h_f32(&self) -> Vec<f32> {
        self.h.iter().map(|&b| f32::from_bits(b)).collect()
    }
    fn spilled(&self) -> bool {
        self.layout.iter().all(|(r, c)| r.spilled && c.spilled)
    }
    fn in_memory(&self) -> bool {
        self.layout.iter().all(|(r, c)| {
            !r.spilled && !c.spilled && r.one_gather && c.one_gather && r.rounds == [0]
        })
    }
    /// Every rank gathers in more than one round per half on one side at least.
    fn gathers_in_blocks_somewhere(&self) -> bool {
        self.layout.iter().all(|(r, c)| {
            (!r.one_gather && r.rounds.len() > 1) || (!c.one_gather && c.rounds.len() > 1)
        })
    }
    /// Both sides gather in more than one round per half.
    fn gathers_in_blocks(&self) -> bool {
        self.layout.iter().all(|(r, c)| {
            !r.one_gather && !c.one_gather && r.rounds.len() > 1 && c.rounds.len() > 1
        })
    }
}

type RankOut = (
    Vec<u32>,
    Vec<u32>,
    TrainReport,
    (SideLayout, SideLayout),
    usize,
);

fn rank_out<T: TableScalar>(tr: &Trainer<T>, rep: TrainReport) -> RankOut {
    let bits = |t: &[T]| t.iter().map(|v| v.to_f32().to_bits()).collect::<Vec<u32>>();
    let steps = tr.steps_per_half;
    let buf = tr.shards.layout.csr_buffer;
    (
        bits(&tr.w),
        bits(&tr.h),
        rep,
        (
            side_layout(tr.rows_side(), steps, buf),
            side_layout(tr.cols_side(), steps, buf),
        ),
        steps,
    )
}

/// Train on `p` simulated ranks; every rank's result (errors included).
fn try_train(p: usize, cfg: &AlsConfig) -> Vec<torusrec::Result<RankOut>> {
    run(p, |c| match cfg.table_dtype {
        TableDtype::F32 => global_train_as::<_, f32>(&c, cfg, Preemption::manual(), |_| {})
            .map(|(tr, rep)| rank_out(&tr, rep)),
        TableDtype::Bf16 => global_train_as::<_, Bf16>(&c, cfg, Preemption::manual(), |_| {})
            .map(|(tr, rep)| rank_out(&tr, rep)),
    })
}

/// Train on `p` simulated ranks (panics on an error).
#[track_caller]
fn train(p: usize, cfg: &AlsConfig) -> Outcome {
    let parts: Vec<RankOut> = try_train(p, cfg)
        .into_iter()
        .enumerate()
        .map(|(r, x)| x.unwrap_or_else(|e| panic!("P={p}, rank {r}: {e}")))
        .collect();
    let rep = &parts[0].2;
    let mut losses = Vec::new();
    for e in &rep.epochs {
        losses.push(e.loss_rows.map(f64::to_bits));
        losses.push(Some(e.loss.to_bits()));
    }
    Outcome {
        checksum: rep.checksum,
        losses,
        final_loss: rep.loss.to_bits(),
        w: parts.iter().flat_map(|x| x.0.clone()).collect(),
        h: parts.iter().flat_map(|x| x.1.clone()).collect(),
        layout: parts.iter().map(|x| x.3.clone()).collect(),
        steps_per_half: parts[0].4,
    }
}

/// Values of two tables whose bits differ.
fn differing(a: &[u32], b: &[u32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// The same checksum and the same bits in both tables (and the same losses: see
/// [`check_same_losses`]).
#[track_caller]
fn assert_same_bits(got: &Outcome, want: &Outcome, what: &str, losses: &mut Vec<String>) {
    let (dw, dh) = (differing(&got.w, &want.w), differing(&got.h, &want.h));
    assert!(
        dw == 0 && dh == 0,
        "{what}: {dw} values of W and {dh} of H differ from the in-memory run \
         (max rel. diff W {:.2e}, H {:.2e})",
        max_rel_diff(&want.w_f32(), &got.w_f32()),
        max_rel_diff(&want.h_f32(), &got.h_f32()),
    );
    assert_eq!(
        got.checksum, want.checksum,
        "{what}: checksum {:016x} vs {:016x}",
        got.checksum, want.checksum
    );
    check_same_losses(got, want, what, losses);
}

/// Records in `mismatches` a run whose losses differ (in any bit) from `want`'s, so
/// that a test checks the tables of every case before it fails on a loss
/// ([`assert_no_loss_mismatch`]).
fn check_same_losses(got: &Outcome, want: &Outcome, what: &str, mismatches: &mut Vec<String>) {
    let show = |o: &Outcome| -> Vec<Option<f64>> {
        o.losses.iter().map(|l| l.map(f64::from_bits)).collect()
    };
    if (&got.losses, got.final_loss) != (&want.losses, want.final_loss) {
        mismatches.push(format!(
            "{what}: losses {:?} vs the in-memory run's {:?}",
            show(got),
            show(want)
        ));
    }
}

#[track_caller]
fn assert_no_loss_mismatch(mismatches: &[String]) {
    assert!(
        mismatches.is_empty(),
        "the tables had the same bits in every case, but {} run(s) reported another loss:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

fn describe(s: Setting) -> String {
    format!(
        "{:?} {}{}",
        s.solver,
        s.dtype,
        if s.loss_every_half {
            " --loss-every-half"
        } else {
            ""
        }
    )
}

// ---------------------------------------------------------------------------------
// 1. a spilled CSR and gathering in blocks give the bits of the in-memory layout

/// At P = 1, 2, 3 and every setting: a tiny and a small CSR buffer give the bits
/// of the CSR in memory.
fn spilled_csr_gives_the_in_memory_bits(data: &Data, name: &str) {
    let mut losses = Vec::new();
    for s in SETTINGS {
        let cfg = config(data, s);
        for p in 1..=3 {
            let what = format!("{name}, {}, P={p}", describe(s));
            let reference = train(p, &cfg);
            assert!(reference.in_memory(), "{what}: {:?}", reference.layout);
            assert!(reference.steps_per_half >= 10, "{what}: too few steps");
            for buf in [TINY_CSR, data.small_csr] {
                let got = train(p, &with_memory(&cfg, buf, GatherBuffer::All));
                let what = format!("{what}, --csr-buffer {buf}");
                assert!(got.spilled(), "{what}: not spilled: {:?}", got.layout);
                for (r, c) in &got.layout {
                    assert!(r.one_gather && c.one_gather, "{what}: {:?}", got.layout);
                    assert!(r.chunks > 1 && c.chunks > 1, "{what}: {:?}", got.layout);
                }
                if buf == data.small_csr {
                    assert!(
                        got.layout.iter().any(|(r, _)| r.max_chunk_steps > 1),
                        "{what}: no chunk of several steps: {:?}",
                        got.layout
                    );
                }
                assert_same_bits(&got, &reference, &what, &mut losses);
            }
        }
    }
    assert_no_loss_mismatch(&losses);
}

#[test]
fn a_spilled_csr_gives_the_in_memory_bits_on_cnr2000() {
    let _serial = serial();
    spilled_csr_gives_the_in_memory_bits(cnr(), "cnr-2000 K=10");
}

#[test]
fn a_spilled_csr_gives_the_in_memory_bits_on_a_synthetic_graph() {
    let _serial = serial();
    spilled_csr_gives_the_in_memory_bits(synthetic(), "synthetic");
}

/// At P = 2, 3 and every setting: gather buffers of one step's rows (a round per
/// step) and of a few steps' rows give the bits of one gather per half, with a tiny
/// and the default CSR buffer (gathering in blocks spills the CSR).
fn gathering_in_blocks_gives_the_in_memory_bits(data: &Data, name: &str, moderate: u64) {
    let mut losses = Vec::new();
    for s in SETTINGS {
        let cfg = config(data, s);
        for p in [2, 3] {
            let what = format!("{name}, {}, P={p}", describe(s));
            let reference = train(p, &cfg);
            assert!(reference.in_memory(), "{what}: {:?}", reference.layout);
            for (rows, buf) in [
                (1, TINY_CSR),
                (moderate, TINY_CSR),
                (moderate, cfg.memory.csr_buffer),
            ] {
                let got = train(p, &with_memory(&cfg, buf, gather_rows(&cfg, rows)));
                let what = format!("{what}, gather buffer of {rows} rows, --csr-buffer {buf}");
                assert!(got.spilled(), "{what}: not spilled: {:?}", got.layout);
                assert!(
                    got.gathers_in_blocks(),
                    "{what}: one gather per half: {:?}",
                    got.layout
                );
                let rounds = got.layout[0].0.rounds.len();
                if rows == 1 {
                    // A block of one step's rows at least: a round at every step.
                    assert_eq!(rounds, got.steps_per_half, "{what}");
                } else {
                    // Blocks of several steps.
                    assert!(rounds < got.steps_per_half, "{what}: {rounds} rounds");
                }
                assert_same_bits(&got, &reference, &what, &mut losses);
            }
        }
    }
    assert_no_loss_mismatch(&losses);
}

#[test]
fn gathering_in_blocks_gives_the_in_memory_bits_on_cnr2000() {
    let _serial = serial();
    gathering_in_blocks_gives_the_in_memory_bits(cnr(), "cnr-2000 K=10", 3000);
}

#[test]
fn gathering_in_blocks_gives_the_in_memory_bits_on_a_synthetic_graph() {
    let _serial = serial();
    gathering_in_blocks_gives_the_in_memory_bits(synthetic(), "synthetic", 1000);
}

// ---------------------------------------------------------------------------------
// 2. preempted inside a spilled half gathered in blocks, resumed

/// Sets `TORUSREC_PREEMPT_AT` for this process while alive (rank 0 of the simulated
/// ranks raises the preemption after that global step). Take [`serial`] first.
struct PreemptAt;

impl PreemptAt {
    fn set(step: u64) -> Self {
        std::env::set_var("TORUSREC_PREEMPT_AT", step.to_string());
        PreemptAt
    }
}

impl Drop for PreemptAt {
    fn drop(&mut self) {
        std::env::remove_var("TORUSREC_PREEMPT_AT");
    }
}

/// Run `cfg` on `p` ranks until the preemption after global step `step`; returns the
/// checkpoint it wrote.
#[track_caller]
fn preempt(p: usize, cfg: &AlsConfig, step: u64, dir: &Path) -> PathBuf {
    let mut cfg = cfg.clone();
    cfg.checkpoint.dir = Some(dir.to_path_buf());
    cfg.checkpoint.every = 0;
    let out = {
        let _at = PreemptAt::set(step);
        try_train(p, &cfg)
    };
    for (r, x) in out.into_iter().enumerate() {
        match x {
            Ok(_) => panic!("rank {r} finished a run preempted at step {step}"),
            Err(e) => assert_eq!(e.exit_code(), 75, "rank {r}: {e}"),
        }
    }
    let file = dir.join(file_name(step));
    assert!(file.is_file(), "no checkpoint {}", file.display());
    file
}

/// `cfg` resumed from `file` (its checkpoints in a directory of their own).
fn resumed(cfg: &AlsConfig, file: &Path, dir: &Path) -> AlsConfig {
    let mut cfg = cfg.clone();
    std::fs::create_dir_all(dir).unwrap();
    cfg.checkpoint.dir = Some(dir.to_path_buf());
    cfg.checkpoint.every = 0;
    cfg.checkpoint.resume = Resume::Path(file.to_path_buf());
    cfg
}

/// A step `j` of a half, inside a gather block of several steps on every rank (no
/// round starts at `j`): the middle of the longest run of steps without a round.
fn inside_a_block(rounds: &[usize], steps: usize) -> usize {
    let mut starts = rounds.to_vec();
    starts.push(steps);
    let (a, b) = starts
        .windows(2)
        .map(|w| (w[0], w[1]))
        .max_by_key(|(a, b)| b - a)
        .unwrap();
    assert!(b - a >= 2, "no gather block of several steps: {rounds:?}");
    a + (b - a).div_ceil(2)
}

/// Preempted at P=3, spilled and gathered in blocks, inside a block of the half of
/// `half_of_epoch` (0: rows, 1: columns) in epoch `epoch` (from 0); resumed at P=3
/// spilled and in memory (the same bits as the uninterrupted run) and at P=2 spilled
/// and in memory (the same bits as each other, close to the uninterrupted P=2 run).
fn preempt_and_resume(s: Setting, epoch: u64, half: u64) {
    let data = cnr();
    let cfg = config(data, s);
    let ooc = with_memory(&cfg, TINY_CSR, gather_rows(&cfg, 3000));
    let what = describe(s);
    let mut losses = Vec::new();
    let reference3 = train(3, &cfg);
    let ooc3 = train(3, &ooc);
    assert!(ooc3.spilled() && ooc3.gathers_in_blocks(), "{what}");
    assert_same_bits(
        &ooc3,
        &reference3,
        &format!("{what}, uninterrupted"),
        &mut losses,
    );
    let steps = ooc3.steps_per_half;
    let side_rounds = |o: &Outcome| {
        let (r, c) = &o.layout[0];
        if half == 0 {
            r.rounds.clone()
        } else {
            c.rounds.clone()
        }
    };
    let j = inside_a_block(&side_rounds(&ooc3), steps);
    let step = (epoch * 2 + half) * steps as u64 + j as u64;
    let what = format!("{what}, preempted at P=3 after global step {step} (step {j} of {steps} of half {half}, epoch {})", epoch + 1);
    let dir = tempdir();
    let file = preempt(3, &ooc, step, &dir.path().join("ckpt"));

    // The same rank count: the uninterrupted run's bits in either layout.
    for (layout, c) in [("spilled, in blocks", &ooc), ("in memory", &cfg)] {
        let got = train(
            3,
            &resumed(c, &file, &dir.path().join(format!("p3-{layout}"))),
        );
        let what = format!("{what}, resumed at P=3 {layout}");
        if c.memory.csr_buffer == TINY_CSR {
            assert!(got.spilled() && got.gathers_in_blocks(), "{what}");
        } else {
            assert!(got.in_memory(), "{what}");
        }
        let (dw, dh) = (
            differing(&got.w, &reference3.w),
            differing(&got.h, &reference3.h),
        );
        assert!(
            dw == 0 && dh == 0,
            "{what}: {dw} values of W and {dh} of H differ from the uninterrupted run"
        );
        assert_eq!(got.checksum, reference3.checksum, "{what}: checksum");
        let (a, b) = (
            f64::from_bits(got.final_loss),
            f64::from_bits(reference3.final_loss),
        );
        assert!(
            (a - b).abs() <= 1e-9 * b.abs(),
            "{what}: loss {a} vs the uninterrupted run's {b}"
        );
    }

    // Another rank count: the rows the 3-rank layout had not reached are caught up;
    // spilled and in memory give the same bits, close to the uninterrupted P=2 run.
    let ooc_p2 = train(2, &resumed(&ooc, &file, &dir.path().join("p2-ooc")));
    let mem_p2 = train(2, &resumed(&cfg, &file, &dir.path().join("p2-mem")));
    assert!(ooc_p2.spilled() && ooc_p2.gathers_in_blocks(), "{what}");
    assert!(mem_p2.in_memory(), "{what}");
    assert_same_bits(
        &ooc_p2,
        &mem_p2,
        &format!("{what}, resumed at P=2"),
        &mut losses,
    );
    let reference2 = train(2, &cfg);
    let (dw, dh) = (
        max_rel_diff(&reference2.w_f32(), &ooc_p2.w_f32()),
        max_rel_diff(&reference2.h_f32(), &ooc_p2.h_f32()),
    );
    // As tests/ckpt.rs asks of a resume on another rank count (bf16 tables: one
    // rounding step of bf16 where a sum's order differs).
    let tol = if s.dtype == TableDtype::Bf16 {
        1e-2
    } else {
        1e-5
    };
    assert!(
        dw <= tol && dh <= tol,
        "{what}, resumed at P=2: W {dw:.2e}, H {dh:.2e} from the uninterrupted P=2 run"
    );
    assert_no_loss_mismatch(&losses);
}

#[test]
fn preempted_in_a_spilled_column_half_with_cg_resumes_to_the_same_bits() {
    let _serial = serial();
    preempt_and_resume(SETTINGS[0], 0, 1);
}

#[test]
fn preempted_in_a_spilled_row_half_with_cholesky_resumes_to_the_same_bits() {
    let _serial = serial();
    // --loss-every-half: the row half's loss is not fused into the solves.
    preempt_and_resume(SETTINGS[3], 1, 0);
}

#[test]
fn preempted_in_a_spilled_half_with_bf16_resumes_to_the_same_bits() {
    let _serial = serial();
    preempt_and_resume(SETTINGS[1], 0, 1);
}

// ---------------------------------------------------------------------------------
// 3. spill errors, --spill-dir

/// `als` on `data` with the shared settings and `extra` flags.
fn als(launcher: TestCommand, data: &Data, extra: &[&str]) -> TestCommand {
    let step = data.step_nnz.to_string();
    let dim = DIM.to_string();
    launcher
        .arg("als")
        .arg("--data")
        .arg(&data.path)
        .args([
            "--dim",
            &dim,
            "--epochs",
            "1",
            "--step-nnz",
            &step,
            "--threads",
            "1",
            "--seed",
            "3",
        ])
        .args(extra)
}

#[test]
fn a_spill_read_error_stops_every_rank_with_exit_1() {
    let _serial = serial();
    let data = cnr();
    let dir = tempdir();
    let codes = dir.path().join("codes");
    std::fs::create_dir_all(&codes).unwrap();
    // Rank 1's spill reads fail.
    let run = als(TestCommand::mpirun(2), data, &["--csr-buffer", "4K"])
        .env("TORUSREC_INJECT_SPILL_ERROR", "1")
        .record_rank_codes(&codes)
        .run();
    run.expect_code(0); // the rank-recording wrapper exits 0
    let got = rank_codes(&codes, 2);
    assert_eq!(got, vec![Some(1), Some(1)], "rank codes\n{}", run.dump());
    run.stderr_has(&["spill read", "torusrec-spill-"]);
    assert!(!run.stdout.contains("final:"), "{}", run.dump());

    // One rank: the failure comes from the chunk reader, in the middle of a half.
    let run = als(TestCommand::direct(), data, &["--csr-buffer", "4K"])
        .env("TORUSREC_INJECT_SPILL_ERROR", "0")
        .run();
    run.expect_code(1).stderr_has(&["spill read"]);
    assert!(!run.stdout.contains("final:"), "{}", run.dump());

    // Without the fault the same runs finish.
    als(TestCommand::mpirun(2), data, &["--csr-buffer", "4K"])
        .run()
        .expect_code(0)
        .stdout_has(&["final:"]);
}

#[test]
fn a_spill_dir_that_is_not_a_directory_is_refused_with_exit_2() {
    let _serial = serial();
    let data = cnr();
    let dir = tempdir();
    let missing = dir.path().join("no-such-dir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for bad in [&missing, &file] {
        for launcher in [TestCommand::direct(), TestCommand::mpirun(2)] {
            let run = als(launcher, data, &["--csr-buffer", "4K", "--spill-dir"])
                .arg(bad)
                .run();
            run.expect_code(2)
                .stderr_has(&["--spill-dir", &bad.display().to_string()]);
        }
    }
    // A usable one: the run finishes and leaves nothing there (the spill is unlinked).
    let spill = dir.path().join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let run = als(
        TestCommand::mpirun(2),
        data,
        &["--csr-buffer", "4K", "--spill-dir"],
    )
    .arg(&spill)
    .run();
    run.expect_code(0).stdout_has(&["final:"]);
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0);
}

/// A directory that exists but cannot hold files (procfs: root may write anywhere
/// else): refused on every rank with exit 2, naming the directory, no hang.
#[test]
fn an_unwritable_spill_dir_is_refused_with_exit_2() {
    let _serial = serial();
    let data = cnr();
    let dir = tempdir();
    let codes = dir.path().join("codes");
    std::fs::create_dir_all(&codes).unwrap();
    let run = als(
        TestCommand::mpirun(2),
        data,
        &["--csr-buffer", "4K", "--spill-dir", "/proc"],
    )
    .record_rank_codes(&codes)
    .run();
    run.expect_code(0); // the rank-recording wrapper exits 0
    run.stderr_has(&["--spill-dir /proc", "not writable"]);
    assert!(!run.stdout.contains("final:"), "{}", run.dump());
    let got = rank_codes(&codes, 2);
    assert_eq!(
        got,
        vec![Some(2), Some(2)],
        "an unusable --spill-dir: every rank should exit 2\n{}",
        run.dump()
    );
}

// ---------------------------------------------------------------------------------
// 4. the memory limit

#[test]
fn a_run_that_cannot_fit_is_refused_naming_mem_per_rank() {
    let _serial = serial();
    let data = cnr();
    for launcher in [TestCommand::direct(), TestCommand::mpirun(2)] {
        let run = als(launcher, data, &["--mem-per-rank", "1M"]).run();
        run.expect_code(2).stderr_has(&["--mem-per-rank"]);
        assert!(!run.stdout.contains("final:"), "{}", run.dump());
    }
}

/// Each rank's shard sizes of `path` at `p` ranks.
fn shard_sizes(path: &Path, p: usize) -> Vec<ShardSizes> {
    let mut got = run(p, |c| {
        let seen = Mutex::new(None);
        torusrec::als::shard::global_read_shards_admitted(&c, path, &|all, rank| {
            *seen.lock().unwrap() = Some(all[rank]);
            Ok(torusrec::als::memory::Layout::in_memory())
        })
        .unwrap();
        let s = seen.lock().unwrap().take();
        (c.rank(), s.unwrap())
    });
    got.sort_by_key(|x| x.0);
    got.into_iter().map(|x| x.1).collect()
}

#[test]
fn a_moderate_mem_per_rank_gathers_in_blocks_with_the_same_bits() {
    let _serial = serial();
    let data = large_synthetic();
    let s = Setting {
        solver: SolverKind::Cg,
        dtype: TableDtype::F32,
        loss_every_half: false,
    };
    let mut cfg = config(data, s);
    cfg.epochs = 1;
    let p = 2;
    // A limit that leaves every rank room for about the midpoint between the
    // automatic buffer's floor and the whole half's rows: the layout must gather in
    // blocks (the same arithmetic as `memory::layout`).
    let row_bytes = (DIM * 4) as u64;
    let threads = rayon::current_num_threads();
    let limit = shard_sizes(&data.path, p)
        .iter()
        .map(|sz| {
            let whole = sz
                .num_cols
                .min(sz.nnz_rows)
                .max(sz.num_rows.min(sz.nnz_cols));
            let floor = torusrec::als::memory::MIN_GATHER_ROWS;
            assert!(whole > 2 * floor, "the graph is too small: {whole} rows");
            let rest = torusrec::als::memory::estimate_with(
                sz,
                DIM,
                TableDtype::F32,
                false,
                cfg.step_nnz,
                threads,
                &torusrec::als::memory::Layout {
                    csr_in_memory: false,
                    csr_buffer: cfg.memory.csr_buffer,
                    gather_rows: Some(0),
                    hub_chunk: cfg.hub_chunk as u64,
                },
            )
            .total();
            rest + (floor + whole) / 2 * row_bytes
        })
        .max()
        .unwrap();
    let reference = train(p, &cfg);
    assert!(reference.in_memory(), "{:?}", reference.layout);
    let mut limited = cfg.clone();
    limited.mem_per_rank = Some(limit);
    // The layout chosen for this limit must also fit it: a refusal here means the
    // automatic gather buffer left out a part of the estimate that grows with it.
    for (r, x) in try_train(p, &limited).iter().enumerate() {
        if let Err(e) = x {
            panic!(
                "--mem-per-rank {limit} ({:.1} MB) with --gather-buffer auto: rank {r} refused \
                 the layout it chose for that limit: {e}",
                limit as f64 / 1e6
            );
        }
    }
    let got = train(p, &limited);
    assert!(
        got.gathers_in_blocks_somewhere(),
        "--mem-per-rank {limit}: one gather per half: {:?}",
        got.layout
    );
    let mut losses = Vec::new();
    assert_same_bits(
        &got,
        &reference,
        &format!("--mem-per-rank {limit}"),
        &mut losses,
    );
    assert_no_loss_mismatch(&losses);

    // The binary says so at RUST_LOG=info, and prints the in-memory run's checksum.
    let limit = limit.to_string();
    let run = als(TestCommand::mpirun(p), data, &["--mem-per-rank", &limit])
        .env("RUST_LOG", "info")
        .run();
    run.expect_code(0);
    let log = format!("{}{}", run.stdout, run.stderr);
    assert!(
        log.contains("gather in blocks of at most") && log.contains("spilled"),
        "{}",
        run.dump()
    );
    let plain = als(TestCommand::mpirun(p), data, &[]).run();
    plain.expect_code(0);
    assert_eq!(run.final_checksum(), plain.final_checksum());
}

/// `--gather-buffer` of a few steps' rows: the binary logs the blocks and the
/// layout, and prints the checksum of the run that gathers once per half.
#[test]
fn an_explicit_gather_buffer_is_logged_and_keeps_the_checksum() {
    let _serial = serial();
    let data = cnr();
    let plain = als(TestCommand::mpirun(3), data, &[]).run();
    plain.expect_code(0);
    for extra in [
        &["--gather-buffer", "64K"][..],
        &["--gather-buffer", "2K", "--csr-buffer", "4K"][..],
    ] {
        let run = als(TestCommand::mpirun(3), data, extra)
            .env("RUST_LOG", "info")
            .run();
        run.expect_code(0).stderr_has(&[
            "gather in blocks of at most",
            "CSR spilled, read in chunks of",
            "gather rounds per half",
        ]);
        assert_eq!(
            run.final_checksum(),
            plain.final_checksum(),
            "{}",
            run.dump()
        );
    }
}
