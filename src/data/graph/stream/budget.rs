//! The streaming prepare's buffer sizes ([`StreamOpts`]) and the memory a rank needs
//! with them ([`estimate_bytes`]), checked against the node's before anything sized by
//! the input is allocated ([`check_memory`]).

use crate::error::{Error, Result};

/// Buffer sizes of the streaming path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOpts {
    /// Arcs per chunk of rows in passes 1-3 (a chunk holds at least one row).
    pub chunk_arcs: usize,
    /// Arcs of `/train_t` a rank builds in memory at once (at least one column).
    pub transpose_arcs: usize,
}

impl Default for StreamOpts {
    /// 16M arcs per chunk (64 MB of targets, a few copies live at once) and 64M arcs
    /// (256 MB) per transpose block.
    fn default() -> Self {
        Self {
            chunk_arcs: 1 << 24,
            transpose_arcs: 1 << 26,
        }
    }
}

/// Bytes one rank of [`global_prepare_stream`](super::global_prepare_stream) holds
/// for a graph of `nodes` nodes of which it owns `block_rows`: the arrays by node
/// (in-degrees when `min_links > 0`, the renumbering, the kept mask, the column
/// counts), the arrays by owned row, and the chunk and transpose buffers of `opts`.
/// Pure arithmetic, no overflow.
pub fn estimate_bytes(nodes: u64, block_rows: u64, min_links: u64, opts: &StreamOpts) -> u64 {
    let per_node = if min_links > 0 { 8 } else { 0 } + 4 + 1 + 8;
    let per_row = 4 + 4 + 8 + 1 + 1 + 8;
    let buffers = opts.chunk_arcs as u64 * 12 * 3 + opts.transpose_arcs as u64 * 4;
    nodes
        .saturating_mul(per_node)
        .saturating_add(block_rows.saturating_mul(per_row))
        .saturating_add(buffers)
}

/// Refuse (exit 2) a preparation whose [`estimate_bytes`] exceeds the node's memory
/// divided by the ranks on it, before anything sized by the input is allocated.
/// Rank-local and identical on every rank.
pub fn check_memory(
    name: &str,
    nodes: u64,
    ranks: usize,
    min_links: u64,
    opts: &StreamOpts,
) -> Result<()> {
    let block = nodes.div_ceil(ranks.max(1) as u64);
    let need = estimate_bytes(nodes, block, min_links, opts);
    match crate::node::mem_limit(None) {
        Some(limit) if need > limit => Err(Error::Input {
            path: name.into(),
            msg: format!(
                "{} nodes (K = {min_links}) need an estimated {} per rank to prepare, more than {} (the node's memory divided by the {} rank(s) on it)",
                crate::metrics::group(nodes),
                crate::metrics::human_bytes(need),
                crate::metrics::human_bytes(limit),
                crate::node::ranks_on_node()
            ),
        }),
        _ => Ok(()),
    }
}
