//! `project measure`: on this machine, at the launched torus shape, measure what the
//! projection needs (link latency and bandwidth, the solve's FLOP rate, one rank's
//! matrix-multiply peak) and check the projection against a real run: train iALS
//! with the torus collectives and compare every rank's per-link bytes and messages
//! with the projected ones, and the measured communication seconds with the projected.

use super::als::{AlsModel, AlsParams, EpochProjection};
use super::chip::Calibration;
use super::traffic::{self, Traffic};
use crate::als::train::{global_train_unsaved_between, EvalAt, Trainer};
use crate::als::AlsConfig;
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

/// Link parameters fitted to the torus collectives themselves on this shape, so that
/// they include what a hop costs here beyond the bytes (packing, copies, scheduling):
/// all-reduces of 16 kB to 4 MB and uniform all-to-alls of 64 kB to 8 MB per rank,
/// each after the rank has written as many bytes as its solves stream
/// ([`evict_bytes`]), started after a barrier and followed by one (as `project measure`
/// times the run's collectives: [`Comm::timer_stop`]), the slowest
/// rank's mean of the calls of a round, averaged over the rounds; then the `(latency,
/// bandwidth)` of least relative squares of `seconds = latency x shifts + bytes /
/// bandwidth` over those calls, with `shifts` and `bytes` the chain the traffic model
/// computes for each call. `project measure` takes a round before the measured epochs
/// and one after each, so that the link model samples the machine over the same
/// minutes as the epochs it is checked against (a shared machine's speed moves from
/// one minute to the next).
#[derive(Debug, Default, Clone)]
pub struct LinkPoints {
    /// Per call kind and size: (shifts, bytes of the chain, seconds summed over the
    /// rounds).
    calls: Vec<(f64, f64, f64)>,
    rounds: usize,
}

/// The bytes a rank's solves stream in training, written before each link call: its
/// shards of both tables (`table_bytes`) and of both CSRs (`nnz` non-zeros, a u32 id
/// each), at least 1 MiB. They shrink as the ranks grow, and so does what a rank
/// evicts before a collective; a fixed 32 MB (the setting before) priced the 8-rank
/// tori's calls as after a solve twice the size of theirs.
pub fn evict_bytes(table_bytes: u64, nnz: u64) -> usize {
    (table_bytes + 4 * nnz).max(1 << 20) as usize
}

/// Collective: one round of the link microbenchmarks, `(shifts, bytes of the chain,
/// seconds)` per call (the slowest rank's mean of `reps` timed calls), each call after
/// `evict` bytes written by every rank.
fn global_round<C: Comm>(comm: &C, reps: usize, evict: usize) -> Result<Vec<(f64, f64, f64)>> {
    let p = comm.size();
    let _phase = comm.stats().phase("calibrate");
    let dims = comm.torus().dims.clone();
    let mut round = Vec::new();
    // In training every collective follows a solve that streams the rank's tables and
    // CSR through the caches: time each call after writing as many bytes.
    let mut evict = vec![0u8; evict.max(1)];
    let mut time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        f()?;
        let mut total = 0.0;
        for rep in 0..reps {
            evict.fill(rep as u8);
            std::hint::black_box(&evict);
            comm.raw_barrier();
            let t = Instant::now();
            f()?;
            total += t.elapsed().as_secs_f64();
            // As `project measure` times training's calls: no rank writes the next
            // eviction while another is still in this call.
            comm.raw_barrier();
        }
        let s = total / reps.max(1) as f64;
        Ok(f64::from_bits(comm.raw_all_reduce_max_u64(s.to_bits())))
    };
    for bytes in [16usize << 10, 256 << 10, 4 << 20] {
        let mut buf = vec![1.0f32; bytes / 4];
        let s = time(&mut || {
            comm.all_reduce_sum(&mut buf);
            Ok(())
        })?;
        let t = traffic::all_reduce(&dims, bytes / 4, 4);
        round.push((t.serial_messages as f64, t.serial_bytes as f64, s));
    }
    for bytes in [64usize << 10, 1 << 20, 8 << 20] {
        let per = bytes / 4 / p;
        let send = vec![2u32; per * p];
        let counts = vec![per; p];
        let s = time(&mut || comm.all_to_all_v(&send, &counts).map(|_| ()))?;
        let t = traffic::all_to_all(&dims, &|a, b| if a == b { 0 } else { 4 * per as u64 });
        round.push((t.serial_messages as f64, t.serial_bytes as f64, s));
    }
    Ok(round)
}

impl LinkPoints {
    /// Collective: one round of the calls, `reps` timed calls each (the slowest rank's
    /// mean), added to the earlier rounds'. Each call is timed from a barrier to its
    /// end (then a barrier) with the communicator's own barriers off (as `project measure` counts a
    /// phase's seconds: from after the barrier), then the setting is restored.
    pub fn global_measure<C: Comm>(&mut self, comm: &C, reps: usize, evict: usize) -> Result<()> {
        if comm.size() < 2 {
            return Ok(());
        }
        let sync = comm.stats().sync_timing();
        comm.stats().set_sync_timing(false);
        let round = global_round(comm, reps, evict);
        comm.stats().set_sync_timing(sync);
        self.add_round(&round?);
        Ok(())
    }

    /// Add one round's `(shifts, bytes of the chain, seconds)` per call, in the order
    /// of the first round.
    pub fn add_round(&mut self, round: &[(f64, f64, f64)]) {
        if self.rounds == 0 {
            self.calls = round.iter().map(|&(m, b, _)| (m, b, 0.0)).collect();
        }
        assert_eq!(self.calls.len(), round.len(), "rounds of other calls");
        for (acc, &(_, _, s)) in self.calls.iter_mut().zip(round) {
            acc.2 += s;
        }
        self.rounds += 1;
    }

    /// Rounds measured.
    pub fn rounds(&self) -> usize {
        self.rounds
    }

    /// `(latency, bandwidth)` of least relative squares over every call's mean seconds
    /// over the rounds; `(0, inf)` without calls (one rank).
    pub fn fit(&self) -> (f64, f64) {
        if self.rounds == 0 || self.calls.is_empty() {
            return (0.0, f64::INFINITY);
        }
        let n = self.rounds as f64;
        let points: Vec<(f64, f64, f64)> =
            self.calls.iter().map(|&(m, b, s)| (m, b, s / n)).collect();
        // Normal equations of s = a m + c b (a: latency, c: 1 / bandwidth) in relative
        // error (each call's equation divided by its seconds), so that the small calls,
        // which fix the latency, weigh as much as the large ones.
        let (mut mm, mut mb, mut bb, mut ms, mut bs) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(m, b, s) in &points {
            let (m, b, s) = (m / s.max(1e-12), b / s.max(1e-12), 1.0);
            mm += m * m;
            mb += m * b;
            bb += b * b;
            ms += m * s;
            bs += b * s;
        }
        let det = mm * bb - mb * mb;
        let (mut a, mut c) = ((ms * bb - bs * mb) / det, (mm * bs - mb * ms) / det);
        if !(a.is_finite() && c.is_finite()) || a < 0.0 || c <= 0.0 {
            // Fall back to one parameter each, through the largest and the smallest call.
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
    /// Bytes written before each link call ([`evict_bytes`]), the most on any rank.
    pub evict_bytes: u64,
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

/// Timed calls of each link microbenchmark per round ([`LinkPoints::global_measure`]).
const LINK_REPS: usize = 10;

fn measure_inner<C: Comm>(
    comm: &C,
    cfg: &AlsConfig,
    threads: usize,
    preempt: Preemption,
) -> Result<Option<Measured>> {
    let p = comm.size();
    let peak = local_gemm_peak(threads);
    let peak = f64::from_bits(comm.raw_all_reduce_max_u64(peak.to_bits()));
    // The model, on rank 0 (the whole training CSR).
    let model = comm.agree(if comm.rank() == 0 {
        local_read_model(&cfg.data, p).map(Some)
    } else {
        Ok(None)
    })?;
    let stats0 = comm.stats().links();
    let tr = Trainer::<f32>::global_new(comm, cfg, preempt.clone())?;
    let after_setup = comm.stats().links();
    let secs_setup = comm.stats().snapshot();
    // The link model's calls: a round before the epochs and one after each, so that
    // they sample the machine over the same minutes as the epochs they are checked
    // against, each call after this rank's solve-sized eviction.
    let evict = evict_bytes(
        ((tr.w.len() + tr.h.len()) * std::mem::size_of::<f32>()) as u64,
        tr.rows_side().shard.nnz() + tr.cols_side().shard.nnz(),
    );
    let evict_max = comm.raw_all_reduce_max_u64(evict as u64);
    let mut links = LinkPoints::default();
    links.global_measure(comm, LINK_REPS, evict)?;
    let t = Instant::now();
    let mut between = 0.0;
    let trained = global_train_unsaved_between(comm, tr, EvalAt::Never, || {
        // After a barrier: a rank waiting for slower ones to end the epoch is not
        // counted as round time.
        comm.raw_barrier();
        let t = Instant::now();
        // Its collectives fail only with a broken communicator, and not on every rank
        // at once: a panic aborts the job (a rank's error here would leave the others
        // in the round's collectives).
        if let Err(e) = links.global_measure(comm, LINK_REPS, evict) {
            panic!("project measure: a round of link microbenchmarks failed: {e}");
        }
        between += t.elapsed().as_secs_f64();
    });
    let (_, reports) = trained.map_err(|e| match e {
        Error::Interrupted(_) => Error::Interrupted(
            "signal received during the measured epochs; project measure saves nothing (exit 1, not 75: there is nothing to resume)".into(),
        ),
        other => other,
    })?;
    let solve: f64 = reports.iter().map(|r| r.phases.solve).sum();
    let epoch_seconds = (t.elapsed().as_secs_f64() - between) / cfg.epochs as f64;
    let (latency, bandwidth) = links.fit();
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
                (&stats0, &after_setup, 0.0, seconds_of(&secs_setup, ph))
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
    let Some(model) = model else {
        return Ok(None);
    };
    let params = AlsParams {
        dim: cfg.dim,
        elem: 4,
        exchange: cfg.exchange,
        cg_steps: cfg.cg_steps,
        step_nnz: cfg.step_nnz,
        round_bytes: crate::als::exchange::round_bytes() as u64,
    };
    let dims = comm.torus().dims.clone();
    let proj: EpochProjection = model.project(&dims, &params);
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
        evict_bytes: evict_max,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_fit_averages_the_rounds_and_recovers_the_line() {
        // Calls on a line of 250 us per shift and 1.5 GB/s, measured in three rounds
        // at 1.3, 0.9 and 0.8 times it: the mean over the rounds is on the line, and
        // the fit gives its latency and bandwidth back. One round alone is not.
        let (a, c) = (250e-6, 1.0 / 1.5e9);
        let calls = [
            (8.0, 32768.0),
            (8.0, 524288.0),
            (16.0, 8388608.0),
            (12.0, 65632.0),
        ];
        let round = |k: f64| -> Vec<(f64, f64, f64)> {
            calls
                .iter()
                .map(|&(m, b)| (m, b, k * (a * m + c * b)))
                .collect()
        };
        let mut links = LinkPoints::default();
        links.add_round(&round(1.3));
        let (lat1, _) = links.fit();
        assert!((lat1 / a - 1.3).abs() < 1e-9, "{lat1}");
        links.add_round(&round(0.9));
        links.add_round(&round(0.8));
        assert_eq!(links.rounds(), 3);
        let (lat, bw) = links.fit();
        assert!((lat / a - 1.0).abs() < 1e-9, "{lat}");
        assert!((bw * c - 1.0).abs() < 1e-9, "{bw}");
        // Without calls (one rank) there are no links to price.
        assert_eq!(LinkPoints::default().fit(), (0.0, f64::INFINITY));
    }

    #[test]
    fn a_link_call_first_writes_what_the_solves_of_its_rank_stream() {
        // Both tables' shards and a u32 id per non-zero of both CSRs.
        assert_eq!(evict_bytes(16 << 20, 3 << 20), (16 << 20) + (12 << 20));
        // Twice the ranks, half the bytes each.
        assert_eq!(
            evict_bytes(8 << 20, 3 << 19),
            evict_bytes(16 << 20, 3 << 20) / 2
        );
        // A tiny shard still writes a MiB.
        assert_eq!(evict_bytes(0, 0), 1 << 20);
    }
}
