//! One side of the alternation on this rank: the rows it solves, the plan that gathers
//! the fixed rows they reference, its steps, and (out of core) its spill and gather
//! rounds.

use crate::als::shard::bounds::balance_by_nnz;
use crate::als::shard::csr::CsrShard;
use crate::als::shard::exchange::ExchangePlan;
use crate::als::shard::memory::Layout;
use crate::als::shard::spill::{local_spill_side, SpillSpec, SpilledSide};
use crate::als::AlsConfig;
use crate::comm::Comm;
use crate::error::Result;

/// One side of the alternation on this rank: the rows it solves (their observed ids
/// rewritten to positions in the gathered fixed table, so the CSR is held once, in
/// memory or in a spill file), the plan that gathers the fixed rows, and its steps.
pub struct Side {
    /// The rows; `indices` empty when spilled.
    pub shard: CsrShard,
    /// The plan of the whole half's gather (`None` when the half gathers in blocks:
    /// each gather round builds its block's plan).
    pub plan: Option<ExchangePlan>,
    pub counts: Vec<u32>,
    /// `steps + 1` local row boundaries of the steps, balanced by non-zeros.
    pub step_bounds: Vec<u64>,
    /// The CSR's indices out of core (`None`: in `shard.indices`).
    pub spill: Option<SpilledSide>,
    /// The steps at which every rank runs a gather round: the union of every rank's
    /// gather-block starts (`[0]`: one gather per half).
    pub rounds: Vec<usize>,
}

impl Side {
    pub(super) fn global_build<C: Comm>(
        comm: &C,
        cfg: &AlsConfig,
        mut shard: CsrShard,
        fixed_bounds: &[u64],
        steps: usize,
    ) -> Result<Self> {
        let plan =
            ExchangePlan::global_build(comm, cfg.exchange, &mut shard.indices, fixed_bounds)?;
        let counts = shard.counts();
        let step_bounds = balance_by_nnz(&shard.indptr, steps);
        Ok(Self {
            shard,
            plan: Some(plan),
            counts,
            step_bounds,
            spill: None,
            rounds: vec![0],
        })
    }

    /// Collective: every rank must call. [`Side::global_build`] for a shard left in
    /// the file: write its spill (checking and checksumming its arcs, which are
    /// returned), then agree on the gather rounds.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn global_build_spilled<C: Comm>(
        comm: &C,
        cfg: &AlsConfig,
        shard: CsrShard,
        fixed_bounds: &[u64],
        steps: usize,
        layout: &Layout,
        name: &str,
        transposed: bool,
    ) -> Result<(Self, [u64; 2])> {
        let step_bounds = balance_by_nnz(&shard.indptr, steps);
        let dir = cfg
            .memory
            .spill_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        let spec = SpillSpec {
            path: &cfg.data,
            name,
            shard: &shard,
            step_bounds: &step_bounds,
            bound: *fixed_bounds.last().unwrap_or(&0),
            transposed,
            gather_rows: (comm.size() > 1).then(|| layout.gather_rows.unwrap_or(u64::MAX)),
            chunk_elems: (layout.csr_buffer / 8).max(1),
            dir: &dir,
            rank: comm.rank(),
        };
        let spill = {
            let _p = comm.stats().phase("io");
            comm.agree(local_spill_side(&spec))?
        };
        let starts: Vec<u64> = spill.block_starts.iter().map(|&s| s as u64).collect();
        let mut rounds: Vec<usize> = {
            // Setup, as the spill itself (not a phase the projection prices).
            let _p = comm.stats().phase("io");
            comm.all_gather_v(&starts)?
                .data
                .into_iter()
                .map(|s| s as usize)
                .collect()
        };
        rounds.sort_unstable();
        rounds.dedup();
        let plan = if rounds.len() == 1 {
            let needed = if comm.size() > 1 {
                comm.agree(spill.needed(0))?
            } else {
                Vec::new()
            };
            Some(ExchangePlan::global_from_needed(
                comm,
                cfg.exchange,
                needed,
                fixed_bounds,
            )?)
        } else {
            None
        };
        let checksum = spill.checksum;
        let counts = shard.counts();
        Ok((
            Self {
                shard,
                plan,
                counts,
                step_bounds,
                spill: Some(spill),
                rounds,
            },
            checksum,
        ))
    }

    /// Rows of local steps `s0..s1`.
    pub(super) fn step_rows(&self, s0: usize, s1: usize) -> (usize, usize) {
        (self.step_bounds[s0] as usize, self.step_bounds[s1] as usize)
    }

    /// Rank-local: read the indices of local rows `r0..r1` of a spilled side; returns
    /// the rows' `indptr` from 0 and the indices.
    pub(super) fn read_rows(&self, r0: usize, r1: usize) -> Result<(Vec<u64>, Vec<u32>)> {
        let ip = &self.shard.indptr;
        let (a, b) = (ip[r0], ip[r1]);
        let mut indices = Vec::new();
        if let Some(sp) = &self.spill {
            sp.file.read_at(a, (b - a) as usize, &mut indices)?;
        }
        Ok((ip[r0..=r1].iter().map(|x| x - a).collect(), indices))
    }
}
