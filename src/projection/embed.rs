//! The embedding workload of a projection: one optimizer step of the sharded
//! embedding model under the planner's placement for `P` chips, as link traffic,
//! work and memory per chip.
//!
//! Traffic per step, from the batch statistics (the mean distinct ids `U` of a table
//! in one chip's batch of `b` examples, its mean valency `v`) and the plan's shards
//! (a shard of `rows` of a table's `V` rows and `w` columns serves the fraction
//! `f = rows / V` of its ids, as in the planner's cost model, `embed::planner`):
//! - request (chip -> owner): `rows` mode, the distinct ids `4 U f`; `pooled` mode,
//!   also the occurrences and per-example counts `4 b v f + 4 b`;
//! - response (owner -> chip): `4 w U f` rows, or `4 w b` pooled vectors;
//! - backward (chip -> owner): the gradients, the same sizes as the response;
//! - dense: the MLP gradient all-reduced (4 bytes per parameter), and every
//!   data-parallel table's full gradient.
//!
//! Every all-to-all is the torus algorithm's (`traffic::all_to_all`), with these
//! expected bytes rounded to whole bytes per pair. Compute: the MLP's
//! `6 b params` FLOPs at the chip's peak (a dense matrix product, which reaches it)
//! plus the rows pooled, scattered and updated at the chip's memory bandwidth;
//! memory: the plan's rows and optimizer state per chip plus the MLP with its
//! optimizer state (three copies).

use super::traffic::{self, Traffic};
use crate::embed::dense::arch::DenseShape;
use crate::embed::planner::CostModel;
use crate::embed::tables::placement::{OutputMode, Plan};
use crate::embed::train::batch_stats::BatchStats;
use crate::spec::ModelSpec;

/// One optimizer step on one torus shape.
#[derive(Debug, Clone)]
pub struct StepProjection {
    pub dims: Vec<usize>,
    /// `lookup` (ids out, rows or pooled vectors back), `backward`, `dense`.
    pub phases: Vec<(&'static str, Traffic)>,
    /// The MLP's FLOPs on one chip per step.
    pub flops: f64,
    /// The busiest chip's table bytes read and written per step.
    pub memory_traffic: f64,
    /// The largest chip's resident bytes.
    pub memory: u64,
}

/// One step of `spec` under `plan` on torus `dims` with `b` examples per chip and
/// `state` optimizer floats per row.
pub fn project_step(
    spec: &ModelSpec,
    stats: &BatchStats,
    plan: &Plan,
    dims: &[usize],
    b: usize,
    state: u64,
) -> StepProjection {
    let p: usize = dims.iter().product();
    assert_eq!(plan.world, p, "plan and shape disagree");
    let b = b as f64;
    // Per (source, owner): bytes of the request, the response and the backward.
    let mut req = vec![0f64; p * p];
    let mut resp = vec![0f64; p * p];
    let mut dp_floats = 0f64;
    let mut mem_traffic = vec![0f64; p];
    for (t, ts) in spec.tables.iter().enumerate() {
        let st = &stats.tables[t];
        let (u, v) = (st.unique_per_rank_batch, st.mean_valency);
        let pooled = plan.mode(t) == OutputMode::Pooled;
        // The asking side pools every occurrence and adds its gradient.
        for m in mem_traffic.iter_mut() {
            *m += 2.0 * b * v * 4.0 * ts.dim as f64;
        }
        for sh in plan.table_shards(spec, t) {
            let w = sh.width() as f64;
            if sh.replica {
                if sh.rank == 0 {
                    dp_floats += ts.vocab as f64 * w;
                }
                mem_traffic[sh.rank] += ts.vocab as f64 * (3.0 * 4.0 * w + 4.0 * state as f64);
                continue;
            }
            let f = sh.rows.len(ts.vocab) as f64 / ts.vocab as f64;
            // Every chip's distinct rows of this shard are read, then updated.
            mem_traffic[sh.rank] += p as f64 * u * f * (3.0 * 4.0 * w + 4.0 * state as f64);
            for src in 0..p {
                if src == sh.rank {
                    continue;
                }
                let at = src * p + sh.rank;
                if pooled {
                    req[at] += 4.0 * u * f + 4.0 * b * v * f + 4.0 * b;
                    resp[at] += 4.0 * w * b;
                } else {
                    req[at] += 4.0 * u * f;
                    resp[at] += 4.0 * w * u * f;
                }
            }
        }
    }
    let round = |x: f64| x.round() as u64;
    let mut lookup = traffic::all_to_all(dims, &|s, d| round(req[s * p + d]));
    lookup.add(&traffic::all_to_all(dims, &|s, d| round(resp[d * p + s])));
    let backward = traffic::all_to_all(dims, &|s, d| round(resp[s * p + d]));
    // The architecture's parameters (DLRM's two MLPs, DCN-v2's cross layers); the
    // plain MLP's stand in for a spec the dense model refuses (refused before a run).
    let shape = DenseShape::of(spec).ok();
    let params: usize = shape.as_ref().map_or_else(
        || {
            spec.mlp_layers()
                .windows(2)
                .map(|w| w[0] * w[1] + w[1])
                .sum()
        },
        |sh| sh.params,
    );
    let mut dense = Traffic::new(dims);
    if p > 1 {
        dense.add(&traffic::all_reduce(dims, params, 4));
        if dp_floats > 0.0 {
            dense.add(&traffic::all_reduce(dims, dp_floats as usize, 4));
        }
    }
    let rows = plan.bytes_per_rank(spec, state);
    StepProjection {
        dims: dims.to_vec(),
        phases: vec![("lookup", lookup), ("backward", backward), ("dense", dense)],
        flops: 6.0 * b * params as f64,
        memory_traffic: mem_traffic.iter().copied().fold(0.0, f64::max),
        memory: rows.iter().copied().max().unwrap_or(0) + 3 * 4 * params as u64,
    }
}

/// Seconds per row lookup or update the planner charges on a chip with its own
/// memory bandwidth: the fixed part of a row gather (issuing it, the index
/// arithmetic) beside its bytes. Not measured on a TPU: with 0 the planner takes
/// HBM row work for free and at 64 chips concentrates the torchrec-peer tables on few
/// owners, whose links then carry twice the bytes (bench/torus.md).
pub const CHIP_LOOKUP_S: f64 = 2e-9;

/// The planner's cost model for chips of `chip` on torus `dims`, so that the planner
/// weighs bytes against row work as this projection does:
/// - bytes exchanged at the rate one chip sends in the torus all-to-all
///   (`traffic::all_to_all` with the same bytes for every pair: what a chip sends to
///   the others over the seconds the shifts take); the planner charges it to the
///   bytes that leave a chip, and a chip's share to itself as a copy in its memory;
/// - a replicated table's gradient at the torus all-reduce's rate
///   (`traffic::all_reduce`, as a ring all-reduce's per-rank bytes);
/// - rows at the chip's memory bandwidth, with [`CHIP_LOOKUP_S`] per row (this
///   machine's chip, whose bandwidth the calibration does not measure, keeps the
///   default row costs);
/// - one message per shard.
pub fn cost_model(chip: &super::chip::Chip, dims: &[usize]) -> CostModel {
    let mut m = CostModel::default();
    let p: usize = dims.iter().product();
    if p > 1 {
        const PAIR: u64 = 1 << 20;
        let secs =
            traffic::all_to_all(dims, &|_, _| PAIR).serial_bytes as f64 / chip.link_bandwidth;
        m.net_bw = (PAIR * (p as u64 - 1)) as f64 / secs;
        const LEN: usize = 1 << 20;
        let secs = traffic::all_reduce(dims, LEN, 4).serial_bytes as f64 / chip.link_bandwidth;
        m.allreduce_bw = 2.0 * (4 * LEN) as f64 * (p - 1) as f64 / p as f64 / secs;
    }
    if let Some(bw) = chip.memory_bandwidth {
        m.mem_bw = bw;
        m.lookup_s = CHIP_LOOKUP_S;
    }
    m.shard_s = chip.link_latency;
    m
}
