//! Rank-local scoring: for each folded-in row, the best `k` columns of this rank's H
//! shard, with the row's visible arcs removed.
//!
//! [`local_score_topk`] scores in tiles of [`ROW_BLOCK`] rows x [`COL_BLOCK`] columns,
//! so its memory is bounded by the tile size whatever the number of columns. A column
//! tile of a bf16 table is widened into an f32 scratch first. Tiles are cut from the row
//! index 0 and the shard's first column, never by thread.
//!
//! On a CPU with AVX-512F the product and the top-K scan are one kernel
//! ([`Scorer::Avx512`]): a register block of 12 columns x 32 rows (24 accumulators)
//! is computed from the rows packed 32 wide and the table's rows broadcast in place,
//! and compared with the 32 rows' current top-K thresholds before it leaves the
//! registers; the few scores that beat a threshold go to the row's [`TopK`]. Every
//! score is summed over `k = 0..d` in order from `+0`, whatever the tile, block or
//! thread, with the arithmetic of the OpenBLAS kernels the process runs (which
//! `OPENBLAS_CORETYPE` or the CPU chose, as for training's products), so that recall
//! did not move when this kernel replaced the sgemm: [`Scorer::Avx512Fma`]
//! (`s = fma(x[k], h[k], s)`) where OpenBLAS's sgemm uses fused multiply-adds
//! (Haswell, SkylakeX, Zen, ...: SkylakeX's gives these bits for every score, Haswell's
//! for most), else [`Scorer::Avx512`] (`s = s + x[k] * h[k]`, each step rounded: the
//! reference's arithmetic, and what OpenBLAS's SSE3 "Prescott" kernels, as it detects
//! some virtual Xeons, compute in a tile's interior). OpenBLAS's edge kernels may sum
//! in other orders, so the fallback [`Scorer::Blas`] may score by rounding-level other
//! bits there. The FMA variant does twice the arithmetic per instruction
//! (`scripts/bench_eval.sh`).
//! Work is split by row blocks and, when there are fewer row blocks than threads can
//! share, by column segments too; the top `k` of a row is unique under "higher score,
//! then lower column id", so the split does not change the result.
//! [`local_score_topk_ref`] is the slow reference (every score by a plain dot product,
//! a full sort).

use crate::bf16::TableElem;
use rayon::prelude::*;

/// Rows per scoring tile.
pub const ROW_BLOCK: usize = 256;
/// Columns per scoring tile: a tile of scores is `ROW_BLOCK * COL_BLOCK` f32 (1 MiB,
/// about a core's L2, so the top-K scan reads it from cache).
pub const COL_BLOCK: usize = 1024;

/// A scored column. Better = higher score, then lower column id (deterministic ties).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cand {
    pub score: f32,
    pub col: u32,
}

impl Cand {
    /// "No candidate": pads a ranking with fewer than `k` columns.
    pub const NONE: Cand = Cand {
        score: f32::NEG_INFINITY,
        col: u32::MAX,
    };
    #[inline]
    pub fn better(&self, o: &Cand) -> bool {
        self.score > o.score || (self.score == o.score && self.col < o.col)
    }
}

/// The best `k` of a stream of candidates, kept sorted best first.
#[derive(Debug, Clone)]
pub struct TopK {
    k: usize,
    items: Vec<Cand>,
}

impl TopK {
    pub fn new(k: usize) -> Self {
        Self {
            k,
            items: Vec::with_capacity(k + 1),
        }
    }
    /// Add a candidate; NaN scores and "no candidate" are ignored.
    #[inline]
    pub fn push(&mut self, c: Cand) {
        if c.score.is_nan() || c.col == u32::MAX || self.k == 0 {
            return;
        }
        if self.items.len() == self.k {
            if !c.better(&self.items[self.k - 1]) {
                return;
            }
            self.items.pop();
        }
        let at = self.items.partition_point(|x| x.better(&c));
        self.items.insert(at, c);
    }
    /// A score that a candidate must exceed to enter when candidates arrive in
    /// increasing column order (a tie with the k-th best loses on the column id):
    /// the k-th best score when full, else -inf (so -inf, the mask, never enters).
    #[inline]
    pub fn threshold(&self) -> f32 {
        if self.k > 0 && self.items.len() == self.k {
            self.items[self.k - 1].score
        } else if self.k == 0 {
            f32::INFINITY
        } else {
            f32::NEG_INFINITY
        }
    }
    /// Best first, padded with "no candidate" up to `k`.
    pub fn into_padded(mut self) -> Vec<Cand> {
        self.items.resize(self.k, Cand::NONE);
        self.items
    }
    pub fn into_sorted(self) -> Vec<Cand> {
        self.items
    }
}

/// Rows to score: `x` is `rows x d`; `mask_cols[mask_indptr[r]..mask_indptr[r + 1]]`
/// are row `r`'s visible arcs (global column ids, increasing), which are never ranked.
#[derive(Debug, Clone, Copy)]
pub struct ScoreRows<'a> {
    pub x: &'a [f32],
    pub mask_indptr: &'a [usize],
    pub mask_cols: &'a [u32],
}

impl ScoreRows<'_> {
    pub fn num_rows(&self) -> usize {
        self.mask_indptr.len().saturating_sub(1)
    }
    fn mask(&self, r: usize) -> &[u32] {
        &self.mask_cols[self.mask_indptr[r]..self.mask_indptr[r + 1]]
    }
}

/// The table as f32 without a copy when it is f32.
fn as_f32<T: TableElem>(h: &[T]) -> Option<&[f32]> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: T is f32 (same TypeId), so the slice is a slice of f32.
        Some(unsafe { std::slice::from_raw_parts(h.as_ptr().cast::<f32>(), h.len()) })
    } else {
        None
    }
}

/// Which kernel scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scorer {
    /// One `sgemm` per tile (OpenBLAS), then a scan of the tile's scores.
    Blas,
    /// The fused AVX-512 product and top-K scan, each product and sum rounded.
    Avx512,
    /// [`Scorer::Avx512`] with fused multiply-adds.
    Avx512Fma,
}

impl Scorer {
    /// The AVX-512 kernel where the CPU has AVX-512F (with fused multiply-adds when
    /// OpenBLAS's sgemm uses them), else OpenBLAS.
    pub fn auto() -> Scorer {
        if !crate::cpu::avx512f() {
            Scorer::Blas
        } else if crate::cpu::openblas_sgemm_fma() {
            Scorer::Avx512Fma
        } else {
            Scorer::Avx512
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Scorer::Blas => "openblas",
            Scorer::Avx512 => "torusrec-avx512",
            Scorer::Avx512Fma => "torusrec-avx512-fma",
        }
    }
}

/// Rank-local: for each row of `rows`, its best `k` columns of the shard `h`
/// (`n_local x d`, global ids `col_lo..`), visible arcs excluded, best first and padded
/// with [`Cand::NONE`] to `k` (row-major `rows x k`). Scores are `x_r . h_c`.
pub fn local_score_topk<T: TableElem>(
    rows: ScoreRows,
    h: &[T],
    col_lo: u64,
    d: usize,
    k: usize,
) -> Vec<Cand> {
    local_score_topk_tiled(rows, h, col_lo, d, k, ROW_BLOCK, COL_BLOCK)
}

/// [`local_score_topk`] with other tile sizes (for tests and tuning).
#[doc(hidden)]
pub fn local_score_topk_tiled<T: TableElem>(
    rows: ScoreRows,
    h: &[T],
    col_lo: u64,
    d: usize,
    k: usize,
    row_block: usize,
    col_block: usize,
) -> Vec<Cand> {
    local_score_topk_with(Scorer::auto(), rows, h, col_lo, d, k, row_block, col_block)
}

/// [`local_score_topk_tiled`] with the kernel `scorer` names.
///
/// # Panics
/// If the shapes do not match, a tile size is 0, or `scorer` is [`Scorer::Avx512`] on
/// a CPU without AVX-512F.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn local_score_topk_with<T: TableElem>(
    scorer: Scorer,
    rows: ScoreRows,
    h: &[T],
    col_lo: u64,
    d: usize,
    k: usize,
    row_block: usize,
    col_block: usize,
) -> Vec<Cand> {
    let t = rows.num_rows();
    assert_eq!(rows.x.len(), t * d, "local_score_topk: x is not rows x d");
    assert!(
        row_block > 0 && col_block > 0,
        "local_score_topk: empty tiles"
    );
    let mut out = vec![Cand::NONE; t * k];
    if t == 0 || k == 0 {
        return out;
    }
    let n_local = h.len().checked_div(d).unwrap_or(0);
    assert_eq!(h.len(), n_local * d, "local_score_topk: h is not n x d");
    if n_local == 0 {
        return out;
    }
    match scorer {
        Scorer::Blas => score_blas(rows, h, col_lo, d, k, row_block, col_block, &mut out),
        Scorer::Avx512 | Scorer::Avx512Fma => {
            assert!(
                crate::cpu::avx512f(),
                "the AVX-512 scorer on a CPU without AVX-512F"
            );
            let fma = scorer == Scorer::Avx512Fma;
            score_fused(rows, h, col_lo, d, k, row_block, col_block, fma, &mut out)
        }
    }
    out
}

/// The OpenBLAS scorer: rayon over row blocks, one single-threaded sgemm per tile,
/// then [`scan_row`] over each row of the tile's scores.
#[allow(clippy::too_many_arguments)]
fn score_blas<T: TableElem>(
    rows: ScoreRows,
    h: &[T],
    col_lo: u64,
    d: usize,
    k: usize,
    row_block: usize,
    col_block: usize,
    out: &mut [Cand],
) {
    let n_local = h.len() / d;
    // Scoring calls BLAS from rayon threads: keep BLAS itself single-threaded.
    crate::cpu::blas_single_thread();
    let h32 = as_f32(h);
    out.par_chunks_mut(row_block * k)
        .enumerate()
        .for_each(|(b, out_b)| {
            let r0 = b * row_block;
            let rb = out_b.len() / k;
            let mut scores = vec![0f32; rb * col_block.min(n_local)];
            let mut wide = if h32.is_none() {
                vec![0f32; col_block.min(n_local) * d]
            } else {
                Vec::new()
            };
            let mut tops: Vec<TopK> = (0..rb).map(|_| TopK::new(k)).collect();
            // Per row, the next visible arc not yet masked (tiles go left to right).
            let mut cursor: Vec<usize> = (r0..r0 + rb).map(|r| rows.mask_indptr[r]).collect();
            let xb = ndarray::ArrayView2::from_shape((rb, d), &rows.x[r0 * d..(r0 + rb) * d])
                .expect("shape");
            for c0 in (0..n_local).step_by(col_block) {
                let cb = col_block.min(n_local - c0);
                let hb: &[f32] = match h32 {
                    Some(h32) => &h32[c0 * d..(c0 + cb) * d],
                    None => {
                        crate::bf16::widen(&h[c0 * d..(c0 + cb) * d], &mut wide[..cb * d]);
                        &wide[..cb * d]
                    }
                };
                let hv = ndarray::ArrayView2::from_shape((cb, d), hb).expect("shape");
                let sc = &mut scores[..rb * cb];
                let mut sv = ndarray::ArrayViewMut2::from_shape((rb, cb), &mut *sc).expect("shape");
                ndarray::linalg::general_mat_mul(1.0, &xb, &hv.t(), 0.0, &mut sv);
                let g0 = col_lo + c0 as u64;
                let g1 = g0 + cb as u64;
                for (i, top) in tops.iter_mut().enumerate() {
                    let row = &mut sc[i * cb..(i + 1) * cb];
                    let r = r0 + i;
                    let end = rows.mask_indptr[r + 1];
                    let cur = &mut cursor[i];
                    while *cur < end && (rows.mask_cols[*cur] as u64) < g1 {
                        let c = rows.mask_cols[*cur] as u64;
                        if c >= g0 {
                            row[(c - g0) as usize] = f32::NEG_INFINITY;
                        }
                        *cur += 1;
                    }
                    scan_row(row, g0, top);
                }
            }
            for (i, top) in tops.into_iter().enumerate() {
                out_b[i * k..(i + 1) * k].copy_from_slice(&top.into_padded());
            }
        });
}

/// Rows per register panel of the fused kernel (two 16-lane vectors).
const PANEL_ROWS: usize = 32;
/// Columns per register block of the fused kernel.
const PANEL_COLS: usize = 12;

/// The fused AVX-512 scorer (see the module doc). Tasks are (row block, column
/// segment) pairs; each keeps its rows' top `k` over its segment, and the segments of
/// a row block are merged in order.
#[allow(clippy::too_many_arguments)]
fn score_fused<T: TableElem>(
    rows: ScoreRows,
    h: &[T],
    col_lo: u64,
    d: usize,
    k: usize,
    row_block: usize,
    col_block: usize,
    fma: bool,
    out: &mut [Cand],
) {
    let t = rows.num_rows();
    let n_local = h.len() / d;
    let blocks = t.div_ceil(row_block);
    let tiles = n_local.div_ceil(col_block);
    // Enough tasks for every thread, in segments of whole tiles.
    let want = 4 * rayon::current_num_threads();
    let segs = want.div_ceil(blocks).clamp(1, tiles);
    let per_seg = tiles.div_ceil(segs);
    let segs = tiles.div_ceil(per_seg);
    let h32 = as_f32(h);
    let parts: Vec<Vec<TopK>> = (0..blocks * segs)
        .into_par_iter()
        .map(|task| {
            let (b, sg) = (task / segs, task % segs);
            let r0 = b * row_block;
            let rb = row_block.min(t - r0);
            let c_lo = sg * per_seg * col_block;
            let c_hi = ((sg + 1) * per_seg * col_block).min(n_local);
            let xpack = pack_rows(&rows.x[r0 * d..(r0 + rb) * d], d);
            let mut wide = if h32.is_none() {
                vec![0f32; col_block.min(n_local) * d]
            } else {
                Vec::new()
            };
            let mut tops: Vec<TopK> = (0..rb).map(|_| TopK::new(k)).collect();
            for c0 in (c_lo..c_hi).step_by(col_block) {
                let cb = col_block.min(c_hi - c0);
                let hb: &[f32] = match h32 {
                    Some(h32) => &h32[c0 * d..(c0 + cb) * d],
                    None => {
                        crate::bf16::widen(&h[c0 * d..(c0 + cb) * d], &mut wide[..cb * d]);
                        &wide[..cb * d]
                    }
                };
                let g0 = col_lo + c0 as u64;
                for (p, panel) in xpack.chunks_exact(PANEL_ROWS * d).enumerate() {
                    let j0 = p * PANEL_ROWS;
                    let nr = PANEL_ROWS.min(rb - j0);
                    let masks: [&[u32]; PANEL_ROWS] =
                        std::array::from_fn(|j| if j < nr { rows.mask(r0 + j0 + j) } else { &[] });
                    panel_tile(panel, hb, d, g0, &masks[..nr], &mut tops[j0..j0 + nr], fma);
                }
            }
            tops
        })
        .collect();
    for (b, out_b) in out.chunks_mut(row_block * k).enumerate() {
        let mut segs_b = parts[b * segs..(b + 1) * segs].iter();
        let first = segs_b.next().expect("at least one segment");
        let mut tops = first.clone();
        for more in segs_b {
            for (top, other) in tops.iter_mut().zip(more) {
                for &c in &other.items {
                    top.push(c);
                }
            }
        }
        for (i, top) in tops.into_iter().enumerate() {
            out_b[i * k..(i + 1) * k].copy_from_slice(&top.into_padded());
        }
    }
}

/// Rows (`rb x d`, row-major) packed in panels of [`PANEL_ROWS`]: value `k` of the
/// panel's row `j` at `k * PANEL_ROWS + j`, zeros past the last row.
fn pack_rows(x: &[f32], d: usize) -> Vec<f32> {
    let rb = x.len() / d;
    let mut out = vec![0f32; rb.div_ceil(PANEL_ROWS) * PANEL_ROWS * d];
    for (r, xr) in x.chunks_exact(d).enumerate() {
        let (p, j) = (r / PANEL_ROWS, r % PANEL_ROWS);
        let panel = &mut out[p * PANEL_ROWS * d..(p + 1) * PANEL_ROWS * d];
        for (kk, &v) in xr.iter().enumerate() {
            panel[kk * PANEL_ROWS + j] = v;
        }
    }
    out
}

/// One packed panel of rows (`tops.len()` of them valid) against a tile of columns
/// (`hb`: `cb x d`, global ids `g0..`), register block by register block, columns in
/// increasing order: each score beating its row's threshold is offered to the row's
/// top K unless the column is one of the row's visible arcs.
fn panel_tile(
    panel: &[f32],
    hb: &[f32],
    d: usize,
    g0: u64,
    masks: &[&[u32]],
    tops: &mut [TopK],
    fma: bool,
) {
    let nr = tops.len();
    let cb = hb.len() / d;
    debug_assert!(panel.len() == PANEL_ROWS * d && nr <= PANEL_ROWS && masks.len() == nr);
    // Rows past the panel's last never pass (+inf threshold).
    let mut thr = [f32::INFINITY; PANEL_ROWS];
    for (t, top) in thr.iter_mut().zip(tops.iter()) {
        *t = top.threshold();
    }
    let mut scores = [0f32; PANEL_ROWS * PANEL_COLS];
    for c in (0..cb).step_by(PANEL_COLS) {
        let nc = PANEL_COLS.min(cb - c);
        // SAFETY: the caller checked AVX-512F; `panel` holds `d` steps of 32 values;
        // `hb` holds the block's `nc` rows of `d` values from row `c`.
        let hb = &hb[c * d..(c + nc) * d];
        let hits = unsafe {
            if fma {
                avx512::block::<true>(d, panel, hb, nc, &thr, &mut scores)
            } else {
                avx512::block::<false>(d, panel, hb, nc, &thr, &mut scores)
            }
        };
        for (i, &mask) in hits.iter().enumerate().take(nc) {
            let mut m = mask;
            while m != 0 {
                let j = m.trailing_zeros() as usize;
                m &= m - 1;
                let col = (g0 + (c + i) as u64) as u32;
                if masks[j].binary_search(&col).is_ok() {
                    continue;
                }
                tops[j].push(Cand {
                    score: scores[i * PANEL_ROWS + j],
                    col,
                });
                thr[j] = tops[j].threshold();
            }
        }
    }
}

/// Off x86_64 there is no fused kernel: [`Scorer::auto`] never picks it.
#[cfg(not(target_arch = "x86_64"))]
mod avx512 {
    pub unsafe fn block<const FMA: bool>(
        _: usize,
        _: &[f32],
        _: &[f32],
        _: usize,
        _: &[f32; 32],
        _: &mut [f32; 384],
    ) -> [u32; 12] {
        unreachable!("no AVX-512 scorer off x86_64")
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{PANEL_COLS, PANEL_ROWS};
    use std::arch::x86_64::*;

    /// The scores of `nc` (1..=12) columns (`h`: their rows, `d` values each) against
    /// one packed panel of 32 rows, each summed in `k` order from `+0` (rounding each
    /// product and sum, or with fused multiply-adds when `FMA`), into
    /// `scores[i * 32 + j]`; returns per column the rows `j` (bits) whose score is
    /// greater than `thr[j]` (ordered: NaN never is).
    ///
    /// # Safety
    /// AVX-512F must be present; `panel` holds `32 * d` values, `h` `nc * d`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn block<const FMA: bool>(
        d: usize,
        panel: &[f32],
        h: &[f32],
        nc: usize,
        thr: &[f32; PANEL_ROWS],
        scores: &mut [f32; PANEL_ROWS * PANEL_COLS],
    ) -> [u32; PANEL_COLS] {
        debug_assert!((1..=PANEL_COLS).contains(&nc));
        debug_assert!(panel.len() >= PANEL_ROWS * d && h.len() >= nc * d);
        let mut acc = [[_mm512_setzero_ps(); 2]; PANEL_COLS];
        let x = panel.as_ptr();
        // Columns past `nc` repeat the last one (in bounds; their results are unused).
        let hp: [*const f32; PANEL_COLS] =
            std::array::from_fn(|i| h.as_ptr().add(i.min(nc - 1) * d));
        for p in 0..d {
            let b0 = _mm512_loadu_ps(x.add(p * PANEL_ROWS));
            let b1 = _mm512_loadu_ps(x.add(p * PANEL_ROWS + 16));
            for (acc, hi) in acc.iter_mut().zip(&hp) {
                let a = _mm512_set1_ps(*hi.add(p));
                if FMA {
                    acc[0] = _mm512_fmadd_ps(a, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(a, b1, acc[1]);
                } else {
                    acc[0] = _mm512_add_ps(acc[0], _mm512_mul_ps(a, b0));
                    acc[1] = _mm512_add_ps(acc[1], _mm512_mul_ps(a, b1));
                }
            }
        }
        let t0 = _mm512_loadu_ps(thr.as_ptr());
        let t1 = _mm512_loadu_ps(thr.as_ptr().add(16));
        let mut hits = [0u32; PANEL_COLS];
        let s = scores.as_mut_ptr();
        for (i, (acc, hit)) in acc.iter().zip(hits.iter_mut()).enumerate() {
            let m0 = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(acc[0], t0);
            let m1 = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(acc[1], t1);
            *hit = u32::from(m0) | (u32::from(m1) << 16);
            if *hit != 0 {
                _mm512_storeu_ps(s.add(i * PANEL_ROWS), acc[0]);
                _mm512_storeu_ps(s.add(i * PANEL_ROWS + 16), acc[1]);
            }
        }
        hits
    }
}

/// Offer one row of scores (columns `g0..`, increasing) to `top`: a chunk whose
/// maximum does not beat the current threshold is skipped whole.
#[inline]
fn scan_row(row: &[f32], g0: u64, top: &mut TopK) {
    const CHUNK: usize = 16;
    let mut thr = top.threshold();
    for (ci, chunk) in row.chunks(CHUNK).enumerate() {
        // NaN compares false everywhere, so it neither raises the maximum nor enters.
        let m = chunk
            .iter()
            .fold(f32::NEG_INFINITY, |a, &s| if s > a { s } else { a });
        if m <= thr {
            continue;
        }
        for (j, &s) in chunk.iter().enumerate() {
            if s > thr {
                top.push(Cand {
                    score: s,
                    col: (g0 + (ci * CHUNK + j) as u64) as u32,
                });
                thr = top.threshold();
            }
        }
    }
}

/// The slow reference of [`local_score_topk`]: every score by a sequential f32 dot
/// product, visible arcs dropped, all columns sorted (score down, id up), first `k`.
pub fn local_score_topk_ref<T: TableElem>(
    rows: ScoreRows,
    h: &[T],
    col_lo: u64,
    d: usize,
    k: usize,
) -> Vec<Cand> {
    let t = rows.num_rows();
    let n_local = h.len().checked_div(d).unwrap_or(0);
    let mut out = Vec::with_capacity(t * k);
    for r in 0..t {
        let x = &rows.x[r * d..(r + 1) * d];
        let mask = rows.mask(r);
        let mut all: Vec<Cand> = (0..n_local)
            .filter(|&j| !mask.contains(&((col_lo + j as u64) as u32)))
            .map(|j| Cand {
                score: x
                    .iter()
                    .zip(&h[j * d..(j + 1) * d])
                    .map(|(&a, &b)| a * b.to_f32())
                    .sum(),
                col: (col_lo + j as u64) as u32,
            })
            .filter(|c| !c.score.is_nan() && c.score != f32::NEG_INFINITY)
            .collect();
        all.sort_by(|a, b| {
            b.score
                .partial_cmp(&a.score)
                .expect("no NaN")
                .then(a.col.cmp(&b.col))
        });
        all.truncate(k);
        all.resize(k, Cand::NONE);
        out.extend(all);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topk_keeps_the_best_with_deterministic_ties() {
        let mut t = TopK::new(3);
        for (s, c) in [
            (0.5, 4),
            (0.9, 1),
            (0.5, 2),
            (0.1, 0),
            (0.9, 0),
            (f32::NAN, 7),
        ] {
            t.push(Cand { score: s, col: c });
        }
        assert_eq!(t.threshold(), 0.5);
        let v: Vec<(f32, u32)> = t.into_sorted().iter().map(|c| (c.score, c.col)).collect();
        assert_eq!(v, vec![(0.9, 0), (0.9, 1), (0.5, 2)]);
        let p = TopK::new(4).into_padded();
        assert_eq!(p.len(), 4);
        assert!(p.iter().all(|c| c.col == u32::MAX));
        assert_eq!(TopK::new(4).threshold(), f32::NEG_INFINITY);
    }

    #[test]
    fn scan_skips_masked_and_nan_and_keeps_lowest_ids_on_ties() {
        let row = [
            1.0,
            f32::NEG_INFINITY,
            f32::NAN,
            2.0,
            1.0,
            2.0,
            f32::INFINITY,
        ];
        let mut top = TopK::new(3);
        scan_row(&row, 10, &mut top);
        let v: Vec<(f32, u32)> = top.into_sorted().iter().map(|c| (c.score, c.col)).collect();
        assert_eq!(v, vec![(f32::INFINITY, 16), (2.0, 13), (2.0, 15)]);
    }
}
