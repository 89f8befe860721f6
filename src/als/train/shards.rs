//! Reading this run's shards under its memory limit: the layout (CSR in memory or
//! spilled, gather blocks) admitted from every rank's sizes before the large arrays
//! are read.

use crate::als::shard::memory::{Layout, ShardSizes};
use crate::als::shard::read::{global_read_shards_admitted, Shards};
use crate::als::AlsConfig;
use crate::comm::Comm;
use crate::error::{Error, Result};

/// Collective: every rank must call. Reads this rank's shards of `cfg.data`, refusing
/// (before the large arrays are read) a share whose estimated memory exceeds the limit.
pub fn global_read_shards_for<C: Comm>(comm: &C, cfg: &AlsConfig) -> Result<Shards> {
    let root = comm.rank() == 0;
    let admit = |all: &[ShardSizes], rank: usize| -> Result<Layout> {
        let limit = crate::node::mem_limit(cfg.mem_per_rank);
        let choose = |s: &ShardSizes| {
            crate::als::shard::memory::layout(
                s,
                cfg.dim,
                cfg.table_dtype,
                cfg.exchange == crate::als::ExchangeKind::Allgather,
                cfg.step_nnz,
                rayon::current_num_threads(),
                cfg.memory.csr_buffer,
                cfg.hub_chunk as u64,
                cfg.memory.gather_buffer,
                limit,
            )
        };
        // The evaluation folds in the sampled test rows only (their share of the
        // visible arcs, in expectation).
        let sized = |s: &ShardSizes| {
            let n = match cfg.eval_rows {
                crate::als::eval::EvalRows::Sample(n) => s.test_rows.min(n),
                crate::als::eval::EvalRows::All => s.test_rows,
                // A quarter of an epoch scores far fewer rows than this on the graphs
                // where memory matters.
                crate::als::eval::EvalRows::Auto => {
                    s.test_rows.min(crate::als::eval::AUTO_ESTIMATE_ROWS)
                }
            };
            ShardSizes {
                test_rows: n,
                fold_nnz_local: (s.fold_nnz_local as u128 * n as u128)
                    .div_ceil(s.test_rows.max(1) as u128) as u64,
                ..*s
            }
        };
        let all: Vec<ShardSizes> = all.iter().map(sized).collect();
        let (mut lay, mut est) = choose(&all[rank]);
        // The CSR stays in memory only if it does on every rank.
        if lay.csr_in_memory && !all.iter().all(|s| choose(s).0.csr_in_memory) {
            lay.csr_in_memory = false;
            est = crate::als::shard::memory::estimate_with(
                &all[rank],
                cfg.dim,
                cfg.table_dtype,
                cfg.exchange == crate::als::ExchangeKind::Allgather,
                cfg.step_nnz,
                rayon::current_num_threads(),
                &lay,
            );
        }
        if root {
            log::info!(
                "memory estimate for rank 0: {}; limit {}; CSR {}; gather {}",
                est.describe(),
                limit.map_or("none".into(), crate::metrics::human_bytes),
                if lay.csr_in_memory {
                    "in memory".to_string()
                } else {
                    format!(
                        "spilled, read in chunks of {}",
                        crate::metrics::human_bytes(
                            4 * lay.chunk_elems(all[rank].nnz_rows.max(all[rank].nnz_cols))
                        )
                    )
                },
                match lay.gather_rows {
                    None => "once per half".to_string(),
                    Some(r) => format!("in blocks of at most {r} rows"),
                }
            );
        }
        crate::als::shard::memory::check(&est, limit, cfg.mem_per_rank.is_some())
            .map_err(Error::Config)?;
        Ok(lay)
    };
    let mut shards = global_read_shards_admitted(comm, &cfg.data, &admit)?;
    if cfg.confidence.weighted() {
        let read =
            crate::als::shard::read::local_read_confidences(&cfg.data, &mut shards, cfg.confidence);
        comm.agree(read)?;
    }
    Ok(shards)
}
