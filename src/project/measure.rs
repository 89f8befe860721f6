//! `project measure`: on this machine, at the launched torus shape, measure what the
//! projection needs (link latency and bandwidth, the solve's FLOP rate, one rank's
//! matrix-multiply peak) and check the projection against a real run: train iALS
//! with the torus collectives and compare every rank's per-link bytes and messages
//! with the projected ones, and the measured communication seconds with the projected.
//!
//! The link parameters are fitted to the run's own communication, replayed alone
//! before the training ([`global_replay`], [`link_fit`]), not to generic collectives.
//! A fit to all-reduces of 16 kB to 4 MB and uniform all-to-alls of 64 kB to 8 MB per
//! rank (the earlier one) missed the run's calls: at 2x2 every one of those calls is a
//! chain of 8 shifts (each ring has 2 ranks), so the fit could not tell a shift's
//! fixed cost from its size-dependent one, and none of them had the run's shapes (an
//! exchange in which one pair carries most of the bytes, 8-byte and 8 kB all-reduces).
//! It projected 2x2's loss all-reduce (8 shifts of 8 bytes) at 2.0 ms for 1.2 ms
//! measured, its Gramian at 4.1 ms for 6.6 ms and its exchange at 9.6 ms for 19.6 ms
//! (bench/torus.md at ff7f43a: communication -42% at 2x2). Fitted to the replayed
//! phases, the link model is held to the calls it must project; what it still misses
//! is what a replay without the solves between the calls does not show.

use super::als::{AlsModel, AlsParams, EpochProjection};
use super::chip::Calibration;
use super::traffic::Traffic;
use crate::als::exchange::ExchangePlan;
use crate::als::shard::balance_by_nnz;
use crate::als::train::Trainer;
use crate::als::{AlsConfig, ExchangeKind};
use crate::ckpt::signals::Preemption;
use crate::comm::{raw_gather_json, Collectives, Comm, Links};
use crate::data::dataset::{check_indptr, dataset_len, read_range};
use crate::error::{Error, Result};
use crate::h5::open_h5;
use std::path::Path;
use std::time::Instant;

/// A prepared dataset's training arcs, read whole (`/train` and `/train_t/indptr`),
/// from which [`TrainArcs::model`] builds the exact iALS model at any rank count.
pub struct TrainArcs {
    source: String,
    indptr: Vec<u64>,
    indices: Vec<u32>,
    col_indptr: Vec<u64>,
}

impl TrainArcs {
    /// Rank-local: read and check the arcs once.
    pub fn local_read(path: &Path) -> Result<Self> {
        let f = open_h5(path)?;
        let meta = crate::data::dataset::read_meta(&f, path)?;
        let read_ip = |name: &str, rows: u64| -> Result<Vec<u64>> {
            let ip = read_range::<u64>(&f, path, &format!("{name}/indptr"), 0, rows + 1)?;
            let nnz = dataset_len(&f, path, &format!("{name}/indices"))?;
            check_indptr(path, name, &ip, rows, nnz)?;
            Ok(ip)
        };
        let indptr = read_ip("train", meta.num_rows)?;
        let col_indptr = read_ip("train_t", meta.num_cols)?;
        let nnz = indptr[indptr.len() - 1];
        let indices = read_range::<u32>(&f, path, "train/indices", 0, nnz)?;
        if let Some(&bad) = indices.iter().find(|&&c| c as u64 >= meta.num_cols) {
            return Err(Error::layout(
                path,
                "train/indices",
                format!("column {bad} outside 0..{}", meta.num_cols),
            ));
        }
        Ok(TrainArcs {
            source: path.display().to_string(),
            indptr,
            indices,
            col_indptr,
        })
    }

    /// The exact model at `p` ranks.
    pub fn model(&self, p: usize) -> AlsModel {
        AlsModel::from_csr(
            &self.source,
            &self.indptr,
            &self.indices,
            &self.col_indptr,
            p,
        )
    }
}

/// Rank-local: the exact iALS model of a prepared dataset at `p` ranks.
pub fn local_read_model(path: &Path, p: usize) -> Result<AlsModel> {
    Ok(TrainArcs::local_read(path)?.model(p))
}

/// The communication of one training run, as every rank needs it to replay that
/// communication: the fixed table's shard bounds and the distinct rows every rank
/// needs from every other, per half (as in [`AlsModel::need`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RunShape {
    /// Per half, the fixed table's bounds (half 0: the columns, half 1: the rows).
    pub bounds: [Vec<u64>; 2],
    /// Per half, `P x P` row-major: distinct fixed-table rows rank `p` needs from `q`.
    pub need: [Vec<u64>; 2],
}

impl RunShape {
    /// The shape of a run on `arcs` at `p` ranks, with its model's needs.
    pub fn of(arcs: &TrainArcs, model: &AlsModel) -> Self {
        let p = model.ranks;
        RunShape {
            bounds: [
                balance_by_nnz(&arcs.col_indptr, p),
                balance_by_nnz(&arcs.indptr, p),
            ],
            need: model.need.clone(),
        }
    }

    /// Collective: every rank must call; rank 0 passes `Some`. Rank 0's shape on
    /// every rank.
    pub fn global_share<C: Comm>(comm: &C, shape: Option<&RunShape>) -> Result<RunShape> {
        let p = comm.size();
        let (nb, nn) = (p + 1, p * p);
        let mut buf = vec![0u64; 2 * (nb + nn)];
        if let Some(s) = shape {
            let parts = [&s.bounds[0], &s.bounds[1], &s.need[0], &s.need[1]];
            let mut at = 0;
            for v in parts {
                buf[at..at + v.len()].copy_from_slice(v);
                at += v.len();
            }
        }
        comm.raw_broadcast(0, &mut buf)?;
        Ok(RunShape {
            bounds: [buf[..nb].to_vec(), buf[nb..2 * nb].to_vec()],
            need: [
                buf[2 * nb..2 * nb + nn].to_vec(),
                buf[2 * nb + nn..].to_vec(),
            ],
        })
    }
}

/// Phases whose communication [`global_replay`] times (the phases `project measure`
/// checks), with the counters' phase each is recorded under.
const REPLAYED: [(&str, &str); 4] = [
    ("plan", "plan"),
    ("exchange", "exchange"),
    ("gramian", "replay gramian"),
    ("loss", "replay loss"),
];

/// Collective: every rank must call. The run's own communication, without its
/// compute, `reps` times: the two exchange plans (the plan phase), both halves'
/// fetches through [`ExchangePlan::global_fetch`] with tables of the run's sizes
/// (the exchange phase of one epoch), the two `d x d` Gramian all-reduces and the
/// loss's all-reduce of 2 values. Each phase starts after evicting the caches (in
/// training each follows a solve that streams the tables through them) and each
/// collective after a barrier (`CommStats::set_sync_timing`, as `project measure`
/// times the run). Returns per phase of [`REPLAYED`] the slowest rank's mean seconds.
///
/// The plan and the fetch run the training's own code, so their traffic is counted
/// under the run's phase names (`plan`, `exchange`): take counters' differences
/// around the training, not totals.
pub fn global_replay<C: Comm>(
    comm: &C,
    shape: &RunShape,
    dim: usize,
    exchange: ExchangeKind,
    reps: usize,
) -> Result<[f64; 4]> {
    let (me, p) = (comm.rank(), comm.size());
    let needed = |h: usize| -> Vec<u32> {
        let b = &shape.bounds[h];
        (0..p)
            .flat_map(|q| (b[q]..b[q] + shape.need[h][me * p + q]).map(|i| i as u32))
            .collect()
    };
    let tables: Vec<Vec<f32>> = (0..2)
        .map(|h| {
            let b = &shape.bounds[h];
            vec![0.5f32; (b[me + 1] - b[me]) as usize * dim]
        })
        .collect();
    let mut evict = vec![0u8; 32 << 20];
    let seconds = |name: &str| comm.stats().get(name).seconds;
    let mut total = [0.0f64; 4];
    let mut gram = vec![0f64; dim * dim];
    let mut loss = [0f64; 2];
    // One round to warm up, then `reps` timed.
    for rep in 0..=reps {
        let mut phase_run = |k: usize, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
            evict.fill(rep as u8);
            std::hint::black_box(&evict);
            let before = seconds(REPLAYED[k].1);
            f()?;
            if rep > 0 {
                total[k] += seconds(REPLAYED[k].1) - before;
            }
            Ok(())
        };
        let mut plans = Vec::new();
        phase_run(0, &mut || {
            for h in 0..2 {
                plans.push(ExchangePlan::global_from_needed(
                    comm,
                    exchange,
                    needed(h),
                    &shape.bounds[h],
                )?);
            }
            Ok(())
        })?;
        phase_run(1, &mut || {
            for (plan, table) in plans.iter().zip(&tables) {
                std::hint::black_box(plan.global_fetch(comm, table, dim)?);
            }
            Ok(())
        })?;
        phase_run(2, &mut || {
            let _p = comm.stats().phase(REPLAYED[2].1);
            for _ in 0..2 {
                comm.all_reduce_sum(&mut gram);
            }
            Ok(())
        })?;
        phase_run(3, &mut || {
            let _p = comm.stats().phase(REPLAYED[3].1);
            comm.all_reduce_sum(&mut loss);
            Ok(())
        })?;
    }
    let mut out = [0.0; 4];
    for (o, t) in out.iter_mut().zip(total) {
        let s = t / reps.max(1) as f64;
        *o = f64::from_bits(comm.raw_all_reduce_max_u64(s.to_bits()));
    }
    Ok(out)
}

/// The link parameters `(latency, bandwidth)` of least squares, in seconds, of
/// `seconds = latency x shifts + bytes / bandwidth` over `points` of `(shifts, bytes
/// of the chain, seconds)` (the traffic model's chain of each replayed phase, and
/// its measured seconds). Absolute, not relative, error: the check is on seconds of
/// communication per epoch, so each phase weighs by the time it takes. If that gives
/// a negative parameter, one each: the bandwidth through the call of the least
/// seconds per byte, then the latency through what the calls leave.
pub fn link_fit(points: &[(f64, f64, f64)]) -> (f64, f64) {
    let (mut mm, mut mb, mut bb, mut ms, mut bs) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(m, b, s) in points {
        mm += m * m;
        mb += m * b;
        bb += b * b;
        ms += m * s;
        bs += b * s;
    }
    let det = mm * bb - mb * mb;
    let (mut a, mut c) = ((ms * bb - bs * mb) / det, (mm * bs - mb * ms) / det);
    if !(a.is_finite() && c.is_finite()) || a < 0.0 || c <= 0.0 {
        c = points
            .iter()
            .map(|&(_, b, s)| s / b.max(1.0))
            .fold(f64::INFINITY, f64::min);
        a = points
            .iter()
            .map(|&(m, b, s)| ((s - c * b) / m.max(1.0)).max(0.0))
            .fold(f64::INFINITY, f64::min);
    }
    (a, 1.0 / c)
}

/// One rank's f32 matrix-multiply rate (FLOP/s) with `threads` threads.
pub fn local_gemm_peak(threads: usize) -> f64 {
    use ndarray::Array2;
    let n = 384;
    let a = Array2::<f32>::from_elem((n, n), 0.5);
    let b = Array2::<f32>::from_elem((n, n), 0.25);
    let mut c = Array2::<f32>::zeros((n, n));
    crate::blas_single_thread();
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        ndarray::linalg::general_mat_mul(1.0, &a, &b, 0.0, &mut c);
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&c);
    2.0 * (n * n * n) as f64 / best * threads as f64
}

/// One phase, measured against projected.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PhaseCheck {
    pub phase: String,
    /// Every rank's per-link bytes and messages equal the projection's.
    pub links_equal: bool,
    pub measured_busiest: u64,
    pub projected_busiest: u64,
    pub measured_mean: f64,
    pub projected_mean: f64,
    /// Per epoch (the plan: once).
    pub measured_seconds: f64,
    pub projected_seconds: f64,
    /// The same communication replayed alone, which the link model is fitted to
    /// ([`global_replay`]).
    pub replayed_seconds: f64,
}

/// What `project measure` found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Measured {
    pub calibration: Calibration,
    pub epochs: usize,
    pub checks: Vec<PhaseCheck>,
    /// Measured and projected communication seconds per epoch (the epoch phases).
    pub comm_seconds: f64,
    pub projected_comm_seconds: f64,
    pub epoch_seconds: f64,
    pub projected_epoch_seconds: f64,
}

fn links_of(stats: &[(String, Links)], phase: &str) -> Links {
    stats
        .iter()
        .find(|(n, _)| n == phase)
        .map(|(_, l)| *l)
        .unwrap_or_default()
}

fn seconds_of(stats: &[(String, crate::comm::PhaseStats)], phase: &str) -> f64 {
    stats
        .iter()
        .find(|(n, _)| n == phase)
        .map_or(0.0, |(_, s)| s.seconds)
}

/// Timed rounds of the run's communication in the link fit ([`global_replay`]).
pub const REPLAY_REPS: usize = 10;

/// Collective: every rank must call. Measures this machine at the launched shape and
/// checks the projection of `cfg`'s run against `epochs` measured epochs (rank 0
/// gets `Some`). The run uses the torus collectives.
pub fn global_measure<C: Comm>(
    comm: &C,
    cfg: &AlsConfig,
    threads: usize,
    preempt: Preemption,
) -> Result<Option<Measured>> {
    let p = comm.size();
    if p < 2 {
        return comm.agree(Err(Error::Config(
            "project measure needs at least 2 ranks (launch it with mpirun at the shape to measure)"
                .into(),
        )));
    }
    comm.agree(cfg.validate())?;
    let keep = comm.stats().collectives();
    comm.stats().set_collectives(Collectives::Torus);
    comm.stats().set_sync_timing(true);
    let result = measure_inner(comm, cfg, threads, preempt);
    comm.stats().set_sync_timing(false);
    comm.stats().set_collectives(keep);
    result
}

fn measure_inner<C: Comm>(
    comm: &C,
    cfg: &AlsConfig,
    threads: usize,
    preempt: Preemption,
) -> Result<Option<Measured>> {
    let p = comm.size();
    let peak = local_gemm_peak(threads);
    let peak = f64::from_bits(comm.raw_all_reduce_max_u64(peak.to_bits()));
    // The model and the run's shape, on rank 0 (the whole training CSR).
    let read = comm.agree(if comm.rank() == 0 {
        TrainArcs::local_read(&cfg.data).map(|arcs| {
            let model = arcs.model(p);
            let shape = RunShape::of(&arcs, &model);
            Some((model, shape))
        })
    } else {
        Ok(None)
    })?;
    let shape = RunShape::global_share(comm, read.as_ref().map(|(_, s)| s))?;
    let params = AlsParams {
        dim: cfg.dim,
        elem: 4,
        exchange: cfg.exchange,
        cg_steps: cfg.cg_steps,
        step_nnz: cfg.step_nnz,
        round_bytes: crate::als::exchange::round_bytes() as u64,
    };
    let dims = comm.torus().dims.clone();
    // The link parameters: fitted to the run's own communication, replayed.
    let replayed = global_replay(comm, &shape, cfg.dim, cfg.exchange, REPLAY_REPS)?;
    let fitted = read.map(|(model, _)| {
        let proj: EpochProjection = model.project(&dims, &params);
        let points: Vec<(f64, f64, f64)> = REPLAYED
            .iter()
            .zip(replayed)
            .map(|(&(ph, _), s)| {
                let t = proj
                    .phase(ph)
                    .cloned()
                    .unwrap_or_else(|| Traffic::new(&dims));
                (t.serial_messages as f64, t.serial_bytes as f64, s)
            })
            .collect();
        (proj, link_fit(&points))
    });
    let stats0 = comm.stats().links();
    let secs0 = comm.stats().snapshot();
    let mut tr = Trainer::<f32>::global_new(comm, cfg, preempt.clone())?;
    let after_setup = comm.stats().links();
    let secs_setup = comm.stats().snapshot();
    let mut solve = 0.0f64;
    let t = Instant::now();
    for _ in 0..cfg.epochs {
        let rep = tr.global_epoch(comm, false)?;
        solve += rep.phases.solve;
    }
    let epoch_seconds = t.elapsed().as_secs_f64() / cfg.epochs as f64;
    let after = comm.stats().links();
    let secs_after = comm.stats().snapshot();
    let solve = f64::from_bits(comm.raw_all_reduce_max_u64(solve.to_bits())) / cfg.epochs as f64;
    let phases = ["plan", "exchange", "gramian", "loss"];
    // Per rank and phase: (links measured, seconds measured) over the epochs (plan:
    // the set-up).
    let mine: Vec<(Links, f64)> = phases
        .iter()
        .map(|&ph| {
            let (a, b, sa, sb) = if ph == "plan" {
                (
                    &stats0,
                    &after_setup,
                    seconds_of(&secs0, ph),
                    seconds_of(&secs_setup, ph),
                )
            } else {
                (
                    &after_setup,
                    &after,
                    seconds_of(&secs_setup, ph),
                    seconds_of(&secs_after, ph),
                )
            };
            let (la, lb) = (links_of(a, ph), links_of(b, ph));
            let mut l = Links::default();
            for k in 0..l.len() {
                l[k].bytes = lb[k].bytes - la[k].bytes;
                l[k].messages = lb[k].messages - la[k].messages;
            }
            (l, sb - sa)
        })
        .collect();
    let all: Vec<Vec<(Links, f64)>> = raw_gather_json(comm, &mine)?;
    let Some((proj, (latency, bandwidth))) = fitted else {
        return Ok(None);
    };
    let mut checks = Vec::new();
    let (mut comm_m, mut comm_p) = (0.0, 0.0);
    for (i, &ph) in phases.iter().enumerate() {
        let times = if ph == "plan" { 1 } else { cfg.epochs as u64 };
        let projected = proj
            .phase(ph)
            .cloned()
            .unwrap_or_else(|| Traffic::new(&dims))
            .times(times);
        let mut measured = Traffic::new(&dims);
        let mut secs = 0.0f64;
        for (r, per_rank) in all.iter().enumerate() {
            measured.links[r] = per_rank[i].0;
            secs = secs.max(per_rank[i].1);
        }
        let (_, _, mb, mm) = measured.summary();
        let (_, _, pb, pm) = projected.summary();
        let ps = projected.seconds(latency, bandwidth) / times as f64;
        let ms = secs / times as f64;
        if ph != "plan" {
            comm_m += ms;
            comm_p += ps;
        }
        checks.push(PhaseCheck {
            phase: ph.to_string(),
            links_equal: measured.links == projected.links,
            measured_busiest: mb / times,
            projected_busiest: pb / times,
            measured_mean: mm / times as f64,
            projected_mean: pm / times as f64,
            measured_seconds: ms,
            projected_seconds: ps,
            replayed_seconds: replayed[i],
        });
    }
    let solve_flops = proj.flops / solve.max(1e-9);
    let mem = crate::node::memory_bytes().unwrap_or(0) / crate::node::ranks_on_node() as u64;
    let calibration = Calibration {
        shape: comm.torus().shape(),
        link_latency: latency,
        link_bandwidth: bandwidth,
        solve_flops,
        peak_flops: peak,
        memory_bytes: mem,
        threads,
    };
    let status = proj
        .phase("status")
        .map_or(0.0, |t| t.seconds(latency, bandwidth));
    Ok(Some(Measured {
        projected_epoch_seconds: proj.flops / solve_flops + comm_p + status,
        calibration,
        epochs: cfg.epochs,
        checks,
        comm_seconds: comm_m,
        projected_comm_seconds: comm_p,
        epoch_seconds,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_fit_recovers_a_linear_link_and_never_goes_negative() {
        let (lat, bw) = (150e-6, 0.5e9);
        let pts: Vec<(f64, f64, f64)> = [(16.0, 1e5), (20.0, 6.6e6), (16.0, 1.3e5), (8.0, 64.0)]
            .iter()
            .map(|&(m, b)| (m, b, lat * m + b / bw))
            .collect();
        let (a, c) = link_fit(&pts);
        assert!((a / lat - 1.0).abs() < 1e-9, "latency {a}");
        assert!((c / bw - 1.0).abs() < 1e-9, "bandwidth {c}");
        // Seconds falling with the shifts: least squares wants a negative latency.
        let (a, c) = link_fit(&[(8.0, 1e6, 0.004), (16.0, 1e6, 0.002), (4.0, 2e6, 0.009)]);
        assert!(a >= 0.0 && c.is_finite() && c > 0.0, "{a} {c}");
    }

    #[test]
    fn run_shape_needs_fit_in_their_owners_shards() {
        // 4 rows x 4 cols, as in the model's own test.
        let arcs = TrainArcs {
            source: "t".into(),
            indptr: vec![0, 2, 4, 5, 6],
            indices: vec![0, 3, 0, 2, 3, 1],
            col_indptr: vec![0, 2, 3, 4, 6],
        };
        let model = arcs.model(2);
        let s = RunShape::of(&arcs, &model);
        assert_eq!(s.bounds[0], balance_by_nnz(&arcs.col_indptr, 2));
        assert_eq!(s.bounds[1], balance_by_nnz(&arcs.indptr, 2));
        assert_eq!(s.need, model.need);
        for h in 0..2 {
            for r in 0..2 {
                for q in 0..2 {
                    let range = s.bounds[h][q + 1] - s.bounds[h][q];
                    assert!(s.need[h][r * 2 + q] <= range, "half {h}: {r} from {q}");
                }
            }
        }
    }
}
