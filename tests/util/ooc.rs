//! iALS on simulated ranks (`comm::threads::run`) in out-of-core layouts: a spilled
//! training CSR (`--csr-buffer`) and the fixed table gathered in blocks of steps
//! (`--gather-buffer`), compared bit for bit with everything in memory. Used by
//! `als::ooc` and by the preemption tests of `tests/faults`.

use super::max_rel_diff;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use torusrec::als::model::TableScalar;
use torusrec::als::shard::memory::GatherBuffer;
use torusrec::als::shard::spill::step_chunks;
use torusrec::als::train::report::TrainReport;
use torusrec::als::train::run::global_train_as;
use torusrec::als::train::side::Side;
use torusrec::als::train::trainer::Trainer;
use torusrec::als::{AlsConfig, SolverKind};
use torusrec::bf16::{Bf16, TableDtype};
use torusrec::ckpt::signals::Preemption;
use torusrec::comm::threads::run;

pub const DIM: usize = 8;
/// A CSR buffer far below any rank's CSR: chunks of 512 indices.
pub const TINY_CSR: u64 = 4 << 10;

// ---------------------------------------------------------------------------------
// one test at a time, the datasets

/// A dataset, the `--step-nnz` its runs use, and a `--csr-buffer` below every
/// rank's CSR at up to 3 ranks whose chunks hold several steps.
pub struct Data {
    pub path: PathBuf,
    pub step_nnz: u64,
    pub small_csr: u64,
}

fn scratch_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("als-ooc-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// cnr-2000 with K = 10 (22,988 nodes, [`super::cnr2000_k10`]).
pub fn cnr() -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| Data {
        path: super::cnr2000_k10().to_path_buf(),
        step_nnz: 10_000,
        small_csr: 256 << 10,
    })
}

/// A synthetic web graph of 4,000 nodes and about 60,000 arcs.
pub fn synthetic() -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| Data {
        path: super::synthetic_dataset(&scratch_dir(), 4000, 60_000, 9),
        step_nnz: 1500,
        small_csr: 32 << 10,
    })
}

/// A synthetic web graph whose rows one half-epoch gathers exceed the automatic
/// gather buffer's floor (`MIN_GATHER_ROWS`) at two ranks.
pub fn large_synthetic() -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| Data {
        path: super::synthetic_dataset(&scratch_dir(), 200_000, 800_000, 10),
        step_nnz: 50_000,
        small_csr: 1 << 20,
    })
}

// ---------------------------------------------------------------------------------
// training on simulated ranks

/// One solver setting: the solver, the table dtype, and `--loss-every-half`.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub solver: SolverKind,
    pub dtype: TableDtype,
    pub loss_every_half: bool,
}

pub const SETTINGS: [Setting; 4] = [
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

pub fn config(data: &Data, s: Setting) -> AlsConfig {
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
pub fn with_memory(cfg: &AlsConfig, csr_buffer: u64, gather: GatherBuffer) -> AlsConfig {
    let mut c = cfg.clone();
    c.memory.csr_buffer = csr_buffer;
    c.memory.gather_buffer = gather;
    c
}

/// A gather buffer of `rows` rows of `cfg`'s tables.
pub fn gather_rows(cfg: &AlsConfig, rows: u64) -> GatherBuffer {
    GatherBuffer::Bytes(rows * cfg.dim as u64 * cfg.table_dtype.bytes() as u64)
}

/// How one side of one rank was laid out.
#[derive(Debug, Clone, PartialEq)]
pub struct SideLayout {
    pub spilled: bool,
    /// One gather per half (else a gather round at each of `rounds`).
    pub one_gather: bool,
    pub rounds: Vec<usize>,
    /// This rank's own gather blocks.
    pub blocks: usize,
    /// Chunks of steps a half reads from the spill.
    pub chunks: usize,
    /// The most steps any chunk holds.
    pub max_chunk_steps: usize,
}

pub fn side_layout(side: &Side, steps: usize, csr_buffer: u64) -> SideLayout {
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
pub struct Outcome {
    pub checksum: u64,
    /// The bits of every loss reported: per epoch the row half's (if computed) and
    /// the epoch's.
    pub losses: Vec<Option<u64>>,
    pub final_loss: u64,
    /// The bits of W and of H by global id (bf16 widened to f32, which is exact).
    pub w: Vec<u32>,
    pub h: Vec<u32>,
    /// Per rank, (rows side, columns side).
    pub layout: Vec<(SideLayout, SideLayout)>,
    pub steps_per_half: usize,
}

impl Outcome {
    pub fn w_f32(&self) -> Vec<f32> {
        self.w.iter().map(|&b| f32::from_bits(b)).collect()
    }
    pub fn h_f32(&self) -> Vec<f32> {
        self.h.iter().map(|&b| f32::from_bits(b)).collect()
    }
    pub fn spilled(&self) -> bool {
        self.layout.iter().all(|(r, c)| r.spilled && c.spilled)
    }
    pub fn in_memory(&self) -> bool {
        self.layout.iter().all(|(r, c)| {
            !r.spilled && !c.spilled && r.one_gather && c.one_gather && r.rounds == [0]
        })
    }
    /// Every rank gathers in more than one round per half on one side at least.
    pub fn gathers_in_blocks_somewhere(&self) -> bool {
        self.layout.iter().all(|(r, c)| {
            (!r.one_gather && r.rounds.len() > 1) || (!c.one_gather && c.rounds.len() > 1)
        })
    }
    /// Both sides gather in more than one round per half.
    pub fn gathers_in_blocks(&self) -> bool {
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
pub fn try_train(p: usize, cfg: &AlsConfig) -> Vec<torusrec::Result<RankOut>> {
    run(p, |c| match cfg.table_dtype {
        TableDtype::F32 => global_train_as::<_, f32>(&c, cfg, Preemption::manual(), |_| {})
            .map(|(tr, rep)| rank_out(&tr, rep)),
        TableDtype::Bf16 => global_train_as::<_, Bf16>(&c, cfg, Preemption::manual(), |_| {})
            .map(|(tr, rep)| rank_out(&tr, rep)),
    })
}

/// Train on `p` simulated ranks (panics on an error).
#[track_caller]
pub fn train(p: usize, cfg: &AlsConfig) -> Outcome {
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
pub fn differing(a: &[u32], b: &[u32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// The same checksum and the same bits in both tables (and the same losses: see
/// [`check_same_losses`]).
#[track_caller]
pub fn assert_same_bits(got: &Outcome, want: &Outcome, what: &str, losses: &mut Vec<String>) {
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
pub fn check_same_losses(got: &Outcome, want: &Outcome, what: &str, mismatches: &mut Vec<String>) {
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
pub fn assert_no_loss_mismatch(mismatches: &[String]) {
    assert!(
        mismatches.is_empty(),
        "the tables had the same bits in every case, but {} run(s) reported another loss:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

pub fn describe(s: Setting) -> String {
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
