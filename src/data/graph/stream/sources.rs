//! Where the streaming prepare's rows come from: a [`RowSource`] hands out a rank's
//! block of rows in chunks, as often as the passes ask — rows held in memory (the TSV
//! and MTX readers), a BV graph decoded again on each pass, or one of the two web
//! graph generators run again (row `u` depends only on `(seed, u)`).

use crate::blocks::block_range;
use crate::data::graph::readers::{bv_for_each_chunk, SourceInfo};
use crate::data::graph::rows::LocalRows;
use crate::data::graph::webgraph_copy::CopyModel;
use crate::data::graph::webgraph_gen::{generate_degrees, generate_rows, HostLayout, WebGraphSpec};
use crate::error::Result;
use std::path::Path;

/// A rank's block of source rows, readable several times in chunks.
pub trait RowSource: Sync {
    /// The owned block `lo..hi` of source nodes.
    fn block(&self) -> (u64, u64);
    /// One pass over the block: `f` gets consecutive chunks of rows, in order,
    /// covering `lo..hi`, each of about `chunk_arcs` arcs (rows as given, not cleaned).
    fn for_each_chunk(
        &self,
        chunk_arcs: usize,
        f: &mut dyn FnMut(LocalRows) -> Result<()>,
    ) -> Result<()>;
    /// The out-degree of each row of the block after cleaning, when the source knows
    /// it without producing the arcs (then the rows it yields are already clean).
    fn clean_out_degrees(&self) -> Option<Vec<u32>> {
        None
    }
    /// True when the input's arc count is what the passes read (the generator's);
    /// otherwise `SourceInfo::arcs` is taken as given.
    fn counts_arcs(&self) -> bool {
        false
    }
}

/// Rows held in memory (the TSV and MTX readers: an edge list in arbitrary order
/// must be gathered whole before its rows exist, so these keep the reader that
/// materializes the block and stream only the later stages).
pub struct MemoryRows(pub LocalRows);

impl RowSource for MemoryRows {
    fn block(&self) -> (u64, u64) {
        (self.0.lo, self.0.lo + self.0.num_rows() as u64)
    }

    fn for_each_chunk(
        &self,
        chunk_arcs: usize,
        f: &mut dyn FnMut(LocalRows) -> Result<()>,
    ) -> Result<()> {
        let r = &self.0;
        let n = r.num_rows();
        let mut a = 0;
        while a < n {
            // The most whole rows within chunk_arcs arcs, at least one.
            let end = r.indptr[a] + chunk_arcs as u64;
            let b = a + r.indptr[a + 1..=n].partition_point(|&x| x <= end).max(1);
            let base = r.indptr[a];
            f(LocalRows {
                lo: r.lo + a as u64,
                indptr: r.indptr[a..=b].iter().map(|&x| x - base).collect(),
                targets: r.targets[base as usize..r.indptr[b] as usize].to_vec(),
            })?;
            a = b;
        }
        Ok(())
    }
}

/// A BV graph's rows of one block, decoded again on each pass. The first pass
/// decodes the whole stream and checks it (as `read_bv` does); later ones stop at
/// the end of the block.
pub struct BvRows {
    basename: std::path::PathBuf,
    info: SourceInfo,
    lo: u64,
    hi: u64,
    validated: std::sync::atomic::AtomicBool,
}

impl BvRows {
    /// Rank `rank` of `size`'s block of the graph `info` (from `bv_info`) describes.
    pub fn new(basename: &Path, info: &SourceInfo, rank: usize, size: usize) -> Self {
        let (lo, hi) = block_range(info.nodes, size, rank);
        Self {
            basename: basename.to_path_buf(),
            info: info.clone(),
            lo,
            hi,
            validated: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl RowSource for BvRows {
    fn block(&self) -> (u64, u64) {
        (self.lo, self.hi)
    }

    fn for_each_chunk(
        &self,
        chunk_arcs: usize,
        f: &mut dyn FnMut(LocalRows) -> Result<()>,
    ) -> Result<()> {
        use std::sync::atomic::Ordering;
        let validate = !self.validated.load(Ordering::Relaxed);
        bv_for_each_chunk(
            &self.basename,
            &self.info,
            (self.lo, self.hi),
            validate,
            chunk_arcs,
            f,
        )?;
        self.validated.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// The generators' passes: rows `lo..hi` in chunks of `per` rows made by `gen(a, b)`
/// (CSR offsets and targets), handed to `f` in order. One producer thread generates
/// the next chunk while `f` handles the current one (a channel of one chunk: at most
/// three chunks alive).
fn produce_chunks(
    lo: u64,
    hi: u64,
    per: u64,
    f: &mut dyn FnMut(LocalRows) -> Result<()>,
    gen: impl Fn(u64, u64) -> (Vec<u64>, Vec<u32>) + Sync,
) -> Result<()> {
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<LocalRows>(1);
        let gen = &gen;
        scope.spawn(move || {
            let mut a = lo;
            while a < hi {
                let b = (a + per).min(hi);
                let (indptr, targets) = gen(a, b);
                if tx
                    .send(LocalRows {
                        lo: a,
                        indptr,
                        targets,
                    })
                    .is_err()
                {
                    return; // the consumer stopped on an error
                }
                a = b;
            }
        });
        for chunk in rx {
            f(chunk)?;
        }
        Ok(())
    })
}

/// The synthetic web graph generator's rows of one block, regenerated on each pass.
pub struct SyntheticRows {
    spec: WebGraphSpec,
    layout: HostLayout,
    seed: u64,
    lo: u64,
    hi: u64,
}

impl SyntheticRows {
    /// Rank `rank` of `size`'s block of `spec`'s nodes.
    pub fn new(spec: &WebGraphSpec, seed: u64, rank: usize, size: usize) -> Self {
        let (lo, hi) = block_range(spec.nodes, size, rank);
        Self {
            spec: spec.clone(),
            layout: HostLayout::new(spec, seed),
            seed,
            lo,
            hi,
        }
    }
}

impl RowSource for SyntheticRows {
    fn block(&self) -> (u64, u64) {
        (self.lo, self.hi)
    }

    /// The generator's rows are clean (sorted, distinct, no self-loop), and their
    /// lengths are the first draws of each row's generator.
    fn clean_out_degrees(&self) -> Option<Vec<u32>> {
        Some(generate_degrees(&self.spec, self.seed, self.lo, self.hi))
    }

    fn counts_arcs(&self) -> bool {
        true
    }

    fn for_each_chunk(
        &self,
        chunk_arcs: usize,
        f: &mut dyn FnMut(LocalRows) -> Result<()>,
    ) -> Result<()> {
        let per = ((chunk_arcs as f64 / self.spec.mean_degree()) as u64).max(1);
        produce_chunks(self.lo, self.hi, per, f, |a, b| {
            generate_rows(&self.spec, &self.layout, self.seed, a, b)
        })
    }
}

/// The copying model's rows of one block ([`crate::data::graph::webgraph_copy`]), regenerated on
/// each pass. The model (its host starts and every degree) is shared by the passes.
pub struct CopyingRows {
    model: std::sync::Arc<CopyModel>,
    lo: u64,
    hi: u64,
}

impl CopyingRows {
    /// Rank `rank` of `size`'s block of `model`'s nodes.
    pub fn new(model: std::sync::Arc<CopyModel>, rank: usize, size: usize) -> Self {
        let (lo, hi) = block_range(model.nodes, size, rank);
        Self { model, lo, hi }
    }
}

impl RowSource for CopyingRows {
    fn block(&self) -> (u64, u64) {
        (self.lo, self.hi)
    }

    /// The model's rows are clean and their lengths are its degrees.
    fn clean_out_degrees(&self) -> Option<Vec<u32>> {
        Some(self.model.degrees(self.lo, self.hi))
    }

    fn counts_arcs(&self) -> bool {
        true
    }

    fn for_each_chunk(
        &self,
        chunk_arcs: usize,
        f: &mut dyn FnMut(LocalRows) -> Result<()>,
    ) -> Result<()> {
        let mean = (self.model.arcs as f64 / self.model.nodes as f64).max(1.0);
        let per = ((chunk_arcs as f64 / mean) as u64).max(1);
        produce_chunks(self.lo, self.hi, per, f, |a, b| {
            self.model.generate_rows(a, b)
        })
    }
}
