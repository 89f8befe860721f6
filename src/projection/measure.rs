//! `project measure`: on this machine, at the launched torus shape, measure what the
//! projection needs (link latency and bandwidth, the solve's FLOP rate, one rank's
//! matrix-multiply peak) and check the projection against a real run: train iALS
//! with the torus collectives and compare every rank's per-link bytes and messages
//! with the projected ones, and the measured communication seconds with the projected.

use super::als::{AlsModel, AlsParams, EpochProjection};
use super::chip::Calibration;
use super::traffic::{self, Traffic};
use crate::als::train::run::{global_train_unsaved_between, EvalAt};
use crate::als::train::trainer::Trainer;
use crate::als::AlsConfig;
use crate::ckpt::signals::Preemption;
use crate::comm::{raw_gather_json, Collectives, Comm, Links};
use crate::data::graph::dataset::check_indptr;
use crate::error::{Error, Result};
use crate::io::h5::dataset_len;
use crate::io::h5::open_h5;
use crate::io::h5::read_range;
use crate::lsq::nonneg_least_squares;
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
        let meta = crate::data::graph::dataset::read_meta(&f, path)?;
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
/// all-reduces of 16 kB to 4 MB and of the run's Gramian (`8 d^2` bytes), uniform
/// all-to-alls of 64 kB to 8 MB per rank, and skewed ones (rank 0 sends as much as all
/// the others together, 256 kB and 2 MB per rank), each after the rank has run the
/// Gramian kernel over as many bytes as its solves stream ([`evict_bytes`]), started
/// after a barrier and followed by one (as `project measure` times the run's
/// collectives: [`Comm::timer_stop`]), the slowest rank's mean of the calls of a
/// round, averaged over the rounds. Then [`LinkPoints::fit`] prices them.
/// `project measure` takes a round before the measured epochs and one after each, so
/// that the link model samples the machine over the same minutes as the epochs it is
/// checked against (a shared machine's speed moves from one minute to the next).
#[derive(Debug, Default, Clone)]
pub struct LinkPoints {
    calls: Vec<LinkCall>,
    rounds: usize,
}

/// One link microbenchmark call: what the traffic model computes for it, and its
/// seconds (summed over the rounds in [`LinkPoints`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkCall {
    /// Shifts on the chain.
    pub shifts: f64,
    /// Bytes on the chain.
    pub chain_bytes: f64,
    /// Bytes on every link of every rank.
    pub total_bytes: f64,
    pub seconds: f64,
}

impl LinkCall {
    fn of(t: &Traffic, seconds: f64) -> Self {
        LinkCall {
            shifts: t.serial_messages as f64,
            chain_bytes: t.serial_bytes as f64,
            total_bytes: t.total_bytes() as f64,
            seconds,
        }
    }
}

/// The link model fitted by [`LinkPoints::fit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkFit {
    /// Seconds per shift.
    pub latency: f64,
    /// Bytes/s of the chain.
    pub bandwidth: f64,
    /// Bytes/s of all links' bytes together, if the fit found that term.
    pub node_bandwidth: Option<f64>,
}

impl LinkFit {
    /// Seconds of `t` on this machine.
    pub fn seconds(&self, t: &Traffic) -> f64 {
        t.seconds_on_node(self.latency, self.bandwidth, self.node_bandwidth)
    }
}

/// The bytes a rank's solves stream in training, read by the Gramian kernel before each
/// link call ([`global_round`]): its shards of both tables (`table_bytes`) and of both
/// CSRs (`nnz` non-zeros, a u32 id each), at least 1 MiB. They shrink as the ranks
/// grow, and so does what a rank evicts before a collective; a fixed 32 MB (the
/// setting before) priced the 8-rank tori's calls as after a solve twice the size of
/// theirs.
pub fn evict_bytes(table_bytes: u64, nnz: u64) -> usize {
    (table_bytes + 4 * nnz).max(1 << 20) as usize
}

/// Collective: one round of the link microbenchmarks, one [`LinkCall`] per call (the
/// slowest rank's mean of `reps` timed calls), each call after every rank has run the
/// Gramian kernel over a table of `evict` bytes, `dim` wide.
fn global_round<C: Comm>(comm: &C, reps: usize, evict: usize, dim: usize) -> Result<Vec<LinkCall>> {
    let p = comm.size();
    let _phase = comm.stats().phase("calibrate");
    let dims = comm.torus().dims.clone();
    let mut round = Vec::new();
    // In training every collective follows vector work (a solve, a Gramian) that streams
    // the rank's tables and CSR through the caches: time each call after the Gramian
    // kernel over as many bytes. A memset of them instead (the setting until 58e66e6)
    // left the cores in another state: on a Zen 5 the small calls (16 and 32 kB
    // all-reduces) then cost 10-25 % less, and training's Gramian all-reduce was
    // projected at 60-70 % of its seconds in every run (docs/project.md).
    let dim = dim.max(1);
    let table = vec![0.5f32; (evict / 4 / dim).max(1) * dim];
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        f()?;
        let mut total = 0.0;
        for _ in 0..reps {
            std::hint::black_box(crate::als::solve::gramian(&table, dim));
            comm.raw_barrier();
            let t = Instant::now();
            f()?;
            total += t.elapsed().as_secs_f64();
            // As `project measure` times training's calls: no rank computes the next
            // Gramian while another is still in this call.
            comm.raw_barrier();
        }
        let s = total / reps.max(1) as f64;
        Ok(f64::from_bits(comm.raw_all_reduce_max_u64(s.to_bits())))
    };
    // All-reduces from 16 kB to 4 MB, and of the run's Gramian (its all-reduce is
    // among training's most frequent calls, where the line has to be right).
    let gramian_bytes = dim * dim * std::mem::size_of::<f64>();
    let mut sizes = vec![16usize << 10, 256 << 10, 4 << 20];
    if !sizes.contains(&gramian_bytes) {
        sizes.push(gramian_bytes);
        sizes.sort_unstable();
    }
    for bytes in sizes {
        let mut buf = vec![1.0f32; bytes / 4];
        let s = time(&mut || {
            comm.all_reduce_sum(&mut buf);
            Ok(())
        })?;
        round.push(LinkCall::of(&traffic::all_reduce(&dims, bytes / 4, 4), s));
    }
    // Uniform all-to-alls put P times the chain's bytes on the links; training's
    // exchange, whose owners of popular rows serve more, 2 to 2.5 times. The skewed
    // calls (rank 0 sends `skew` times what each other rank sends) let the fit tell
    // the chain's cost from the cost of all the bytes on the shared cores.
    let skew = p;
    for (bytes, skewed) in [
        (64usize << 10, false),
        (1 << 20, false),
        (8 << 20, false),
        (256 << 10, true),
        (2 << 20, true),
    ] {
        let per = bytes / 4 / p;
        let mine = if skewed && comm.rank() == 0 {
            per * skew
        } else {
            per
        };
        let send = vec![2u32; mine * p];
        let counts = vec![mine; p];
        let s = time(&mut || comm.all_to_all_v(&send, &counts).map(|_| ()))?;
        let t = traffic::all_to_all(&dims, &|a, b| match (a == b, skewed && a == 0) {
            (true, _) => 0,
            (false, true) => 4 * (per * skew) as u64,
            (false, false) => 4 * per as u64,
        });
        round.push(LinkCall::of(&t, s));
    }
    Ok(round)
}

impl LinkPoints {
    /// Collective: one round of the calls, `reps` timed calls each (the slowest rank's
    /// mean), added to the earlier rounds'. Each call is timed from a barrier to its
    /// end (then a barrier) with the communicator's own barriers off (as `project
    /// measure` counts a phase's seconds), then the setting is restored.
    pub fn global_measure<C: Comm>(
        &mut self,
        comm: &C,
        reps: usize,
        evict: usize,
        dim: usize,
    ) -> Result<()> {
        if comm.size() < 2 {
            return Ok(());
        }
        let sync = comm.stats().sync_timing();
        comm.stats().set_sync_timing(false);
        let round = global_round(comm, reps, evict, dim);
        comm.stats().set_sync_timing(sync);
        self.add_round(&round?);
        Ok(())
    }

    /// Add one round's calls, in the order of the first round.
    pub fn add_round(&mut self, round: &[LinkCall]) {
        if self.rounds == 0 {
            self.calls = round
                .iter()
                .map(|c| LinkCall { seconds: 0.0, ..*c })
                .collect();
        }
        assert_eq!(self.calls.len(), round.len(), "rounds of other calls");
        for (acc, c) in self.calls.iter_mut().zip(round) {
            acc.seconds += c.seconds;
        }
        self.rounds += 1;
    }

    /// Rounds measured.
    pub fn rounds(&self) -> usize {
        self.rounds
    }

    /// The link model of least relative squares over every call's mean seconds over
    /// the rounds (each call's equation divided by its seconds, so that the small
    /// calls, which fix the latency, weigh as much as the large ones):
    /// `seconds = latency x shifts + chain bytes / bandwidth + all links' bytes /
    /// node bandwidth`. The last term is what the ranks' messages cost the cores and
    /// memory they share on this machine, all of them at once; it is left out (and
    /// the first two fitted alone) when the fit gives it no positive rate. Without
    /// calls (one rank): no latency and infinite bandwidth.
    pub fn fit(&self) -> LinkFit {
        if self.rounds == 0 || self.calls.is_empty() {
            return LinkFit {
                latency: 0.0,
                bandwidth: f64::INFINITY,
                node_bandwidth: None,
            };
        }
        let n = self.rounds as f64;
        let terms = |c: &LinkCall| [c.shifts, c.chain_bytes, c.total_bytes];
        // Each call's equation divided by its seconds; each term's column scaled to
        // unit length (shifts and bytes differ by a million), undone after the fit.
        let mut scale = [0.0f64; 3];
        for c in &self.calls {
            for (k, t) in terms(c).iter().enumerate() {
                scale[k] += (t / (c.seconds / n).max(1e-12)).powi(2);
            }
        }
        let scale = scale.map(|x| x.sqrt().max(f64::MIN_POSITIVE));
        let rows: Vec<([f64; 3], f64)> = self
            .calls
            .iter()
            .map(|c| {
                let s = (c.seconds / n).max(1e-12);
                let t = terms(c);
                ([0, 1, 2].map(|k| t[k] / s / scale[k]), 1.0)
            })
            .collect();
        // The chain's term in every subset tried (a chain without a bandwidth is no
        // link model).
        let x = nonneg_least_squares(&rows, 0b010);
        let x = [0, 1, 2].map(|k| x[k] / scale[k]);
        if x.iter().all(|v| v.is_finite()) && x[1] > 0.0 {
            return LinkFit {
                latency: x[0],
                bandwidth: 1.0 / x[1],
                node_bandwidth: (x[2] > 0.0).then(|| 1.0 / x[2]),
            };
        }
        // One parameter each, through the largest and the smallest call.
        let points: Vec<([f64; 3], f64)> = self
            .calls
            .iter()
            .map(|c| (terms(c), c.seconds / n))
            .collect();
        let c = points
            .iter()
            .map(|&(f, s)| s / f[1].max(1.0))
            .fold(f64::INFINITY, f64::min);
        let a = points
            .iter()
            .map(|&(f, s)| ((s - c * f[1]) / f[0].max(1.0)).max(0.0))
            .fold(f64::INFINITY, f64::min);
        LinkFit {
            latency: a,
            bandwidth: 1.0 / c,
            node_bandwidth: None,
        }
    }
}

/// One rank's f32 matrix-multiply rate (FLOP/s) with `threads` threads.
pub fn local_gemm_peak(threads: usize) -> f64 {
    use ndarray::Array2;
    let n = 384;
    let a = Array2::<f32>::from_elem((n, n), 0.5);
    let b = Array2::<f32>::from_elem((n, n), 0.25);
    let mut c = Array2::<f32>::zeros((n, n));
    crate::cpu::blas_single_thread();
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
    /// Bytes the Gramian kernel reads before each link call ([`evict_bytes`]), the most
    /// on any rank.
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

/// This rank's (links, seconds) of each of `phases` as measured: the set-up's
/// (`plan`: from `stats0` to `after_setup`), else the epochs' (from `after_setup` to
/// `after`), from the link counters and phase seconds read at those points.
#[allow(clippy::type_complexity)]
fn phase_traffic(
    phases: &[&str],
    [stats0, after_setup, after]: [&[(String, Links)]; 3],
    [secs_setup, secs_after]: [&[(String, crate::comm::PhaseStats)]; 2],
) -> Vec<(Links, f64)> {
    phases
        .iter()
        .map(|&ph| {
            let (a, b, sa, sb) = if ph == "plan" {
                (stats0, after_setup, 0.0, seconds_of(secs_setup, ph))
            } else {
                (
                    after_setup,
                    after,
                    seconds_of(secs_setup, ph),
                    seconds_of(secs_after, ph),
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
        .collect()
}

/// Each phase's measured traffic and seconds (the slowest rank's) against the
/// projection's, per epoch (`plan`: once), and the communication seconds per epoch,
/// measured and projected (`plan` excluded).
fn phase_checks(
    phases: &[&str],
    all: &[Vec<(Links, f64)>],
    proj: &EpochProjection,
    dims: &[usize],
    link: &LinkFit,
    epochs: usize,
) -> (Vec<PhaseCheck>, f64, f64) {
    let mut checks = Vec::new();
    let (mut comm_m, mut comm_p) = (0.0, 0.0);
    for (i, &ph) in phases.iter().enumerate() {
        let times = if ph == "plan" { 1 } else { epochs as u64 };
        let projected = proj
            .phase(ph)
            .cloned()
            .unwrap_or_else(|| Traffic::new(dims))
            .times(times);
        let mut measured = Traffic::new(dims);
        let mut secs = 0.0f64;
        for (r, per_rank) in all.iter().enumerate() {
            measured.links[r] = per_rank[i].0;
            secs = secs.max(per_rank[i].1);
        }
        let (_, _, mb, mm) = measured.summary();
        let (_, _, pb, pm) = projected.summary();
        let ps = link.seconds(&projected) / times as f64;
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
    (checks, comm_m, comm_p)
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
    links.global_measure(comm, LINK_REPS, evict, cfg.dim)?;
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
        if let Err(e) = links.global_measure(comm, LINK_REPS, evict, cfg.dim) {
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
    let link = links.fit();
    let after = comm.stats().links();
    let secs_after = comm.stats().snapshot();
    let solve = f64::from_bits(comm.raw_all_reduce_max_u64(solve.to_bits())) / cfg.epochs as f64;
    let phases = ["plan", "exchange", "gramian", "loss"];
    // Per rank and phase: (links measured, seconds measured) over the epochs (plan:
    // the set-up).
    let mine = phase_traffic(
        &phases,
        [&stats0, &after_setup, &after],
        [&secs_setup, &secs_after],
    );
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
        round_bytes: crate::als::shard::exchange::round_bytes() as u64,
    };
    let dims = comm.torus().dims.clone();
    let proj: EpochProjection = model.project(&dims, &params);
    let (checks, comm_m, comm_p) = phase_checks(&phases, &all, &proj, &dims, &link, cfg.epochs);
    let solve_flops = proj.flops / solve.max(1e-9);
    let mem = crate::node::memory_bytes().unwrap_or(0) / crate::node::ranks_on_node() as u64;
    let calibration = Calibration {
        shape: comm.torus().shape(),
        link_latency: link.latency,
        link_bandwidth: link.bandwidth,
        node_bandwidth: link.node_bandwidth,
        solve_flops,
        peak_flops: peak,
        memory_bytes: mem,
        threads,
    };
    let status = proj.phase("status").map_or(0.0, |t| link.seconds(t));
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

    /// Calls of `(shifts, chain bytes, all links' bytes)` priced by `model`, `k` times.
    fn round(
        calls: &[(f64, f64, f64)],
        k: f64,
        model: &dyn Fn(f64, f64, f64) -> f64,
    ) -> Vec<LinkCall> {
        calls
            .iter()
            .map(|&(m, b, t)| LinkCall {
                shifts: m,
                chain_bytes: b,
                total_bytes: t,
                seconds: k * model(m, b, t),
            })
            .collect()
    }

    #[test]
    fn the_link_fit_averages_the_rounds_and_recovers_the_line() {
        // Uniform calls (all links' bytes 4 times the chain's, as at 2x2) on a line of
        // 250 us per shift and 1.5 GB/s, measured in three rounds at 1.3, 0.9 and 0.8
        // times it: the mean over the rounds is on the line, and the fit gives its
        // latency and bandwidth back. One round alone is not. With every call's
        // bytes in the same proportion the node term cannot be told from the chain's,
        // and the fit leaves it out.
        let (a, c) = (250e-6, 1.0 / 1.5e9);
        let calls = [
            (8.0, 32768.0, 131072.0),
            (8.0, 524288.0, 2097152.0),
            (16.0, 8388608.0, 33554432.0),
            (12.0, 65632.0, 262528.0),
        ];
        let line = |m: f64, b: f64, _| a * m + c * b;
        let mut links = LinkPoints::default();
        links.add_round(&round(&calls, 1.3, &line));
        let lat1 = links.fit().latency;
        assert!((lat1 / a - 1.3).abs() < 1e-9, "{lat1}");
        links.add_round(&round(&calls, 0.9, &line));
        links.add_round(&round(&calls, 0.8, &line));
        assert_eq!(links.rounds(), 3);
        let fit = links.fit();
        assert!((fit.latency / a - 1.0).abs() < 1e-9, "{fit:?}");
        assert!((fit.bandwidth * c - 1.0).abs() < 1e-9, "{fit:?}");
        assert_eq!(fit.node_bandwidth, None);
        // Without calls (one rank) there are no links to price.
        let none = LinkPoints::default().fit();
        assert_eq!(
            (none.latency, none.bandwidth, none.node_bandwidth),
            (0.0, f64::INFINITY, None)
        );
    }

    #[test]
    fn skewed_calls_let_the_fit_tell_the_chain_from_the_node() {
        // 20 us per shift, 3 GB/s on the chain and 6 GB/s over all links together:
        // uniform calls (8 times the chain's bytes on all links) and skewed ones
        // (twice) give all three back, and the fitted model prices a training-like
        // traffic of its own proportions.
        let (a, c, n) = (20e-6, 1.0 / 3e9, 1.0 / 6e9);
        let model = |m: f64, b: f64, t: f64| a * m + c * b + n * t;
        let calls = [
            (16.0, 40960.0, 327680.0),
            (16.0, 10485760.0, 83886080.0),
            (12.0, 98592.0, 788736.0),
            (12.0, 12583200.0, 100665600.0),
            (12.0, 852064.0, 1835392.0),
            (12.0, 6815840.0, 14680448.0),
        ];
        let mut links = LinkPoints::default();
        links.add_round(&round(&calls, 1.0, &model));
        let fit = links.fit();
        assert!((fit.latency / a - 1.0).abs() < 1e-6, "{fit:?}");
        assert!((fit.bandwidth * c - 1.0).abs() < 1e-6, "{fit:?}");
        let nb = fit.node_bandwidth.expect("a node term");
        assert!((nb * n - 1.0).abs() < 1e-6, "{fit:?}");
        // The uniform calls alone fit one line through them, which prices a skewed
        // exchange (all links' bytes 2.5 times the chain's) far from the model.
        let mut uniform = LinkPoints::default();
        uniform.add_round(&round(&calls[..4], 1.0, &model));
        let u = uniform.fit();
        assert_eq!(u.node_bandwidth, None);
        let (m, b, t) = (44.0, 11085472.0, 27011584.0);
        let truth = model(m, b, t);
        let priced = u.latency * m + b / u.bandwidth;
        assert!(
            (priced / truth - 1.0).abs() > 0.3,
            "{priced} against {truth}"
        );
        let fitted = fit.latency * m + b / fit.bandwidth + t / nb;
        assert!((fitted / truth - 1.0).abs() < 1e-6);
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
