//! The streaming prepare's pass 4, the transpose: each rank owns a block of columns
//! of `/train`, fills sub-blocks of at most `transpose_arcs` arcs by reading `/train`
//! back from the partial file in chunks of rows (rows come in increasing order, so
//! each column's rows come out sorted), and writes them to `/train_t`.

use super::passes::{
    check_signal, Passes, Progress, TRAIN_INDICES, TRAIN_INDPTR, TRAIN_T_INDICES, TRAIN_T_INDPTR,
};
use crate::error::Result;
use crate::io::positional::PositionalFile;

/// Pass 4, transpose (rank-local): this rank's block `clo..chi` of columns of
/// `/train` (whose all-reduced column counts are `col_count`), filled in sub-blocks
/// of at most `transpose_arcs` arcs by reading `/train` back from `file` in chunks
/// of rows, and written.
pub(super) fn local_transpose<S>(
    pass: &Passes<S>,
    file: &PositionalFile,
    num_kept: u64,
    (clo, chi): (u64, u64),
    col_count: Vec<u64>,
    prog: &mut Progress,
) -> Result<()> {
    let opts = pass.opts;
    let before: u64 = col_count[..clo as usize].iter().sum();
    let mine: Vec<u64> = col_count[clo as usize..chi as usize].to_vec();
    drop(col_count);
    let mut indptr = Vec::with_capacity(mine.len() + 1);
    let mut acc = before;
    indptr.push(acc);
    for &c in &mine {
        acc += c;
        indptr.push(acc);
    }
    file.put(TRAIN_T_INDPTR, clo, &indptr)?;
    let mut a = 0usize;
    while a < mine.len() {
        check_signal("transpose")?;
        // Columns a..b of the block, at most transpose_arcs arcs (>= 1 column).
        let mut b = a + 1;
        let mut arcs = mine[a];
        while b < mine.len() && arcs + mine[b] <= opts.transpose_arcs as u64 {
            arcs += mine[b];
            b += 1;
        }
        let (ca, cb) = ((clo + a as u64) as u32, (clo + b as u64) as u32);
        let mut fill: Vec<u64> = indptr[a..b].iter().map(|&x| x - indptr[a]).collect();
        let mut buf = vec![0u32; arcs as usize];
        let mut scratch = Scatter::default();
        // Rows are read back in pieces of at most a quarter chunk (plus one row):
        // the piece, its (column, row) pairs and the block are alive at once.
        let read_arcs = (opts.chunk_arcs as u64 / 4).max(1);
        let mut r0 = 0u64;
        while r0 < num_kept {
            // A chunk of /train rows of about chunk_arcs arcs.
            let step = 1 << 16;
            let r1 = (r0 + step).min(num_kept);
            let ip: Vec<u64> = file.get(TRAIN_INDPTR, r0, r1 + 1)?;
            let mut s = 0usize;
            while s < ip.len() - 1 {
                let mut e = s + 1;
                while e < ip.len() - 1 && ip[e + 1] - ip[s] <= read_arcs {
                    e += 1;
                }
                let idx: Vec<u32> = file.get(TRAIN_INDICES, ip[s], ip[e])?;
                local_scatter_columns(
                    &idx,
                    &ip[s..=e],
                    r0 + s as u64,
                    (ca, cb),
                    &mut fill,
                    &mut buf,
                    &mut scratch,
                );
                s = e;
            }
            r0 = r1;
        }
        file.put(TRAIN_T_INDICES, indptr[a], &buf)?;
        prog.add((b - a) as u64, arcs);
        a = b;
    }
    Ok(())
}

/// Columns per bucket of the transpose scatter: a bucket's fill pointers and the
/// output lines it writes stay in cache.
const BUCKET_SHIFT: u32 = 8;

/// Reusable buffers of [`local_scatter_columns`].
#[derive(Default)]
struct Scatter {
    counts: Vec<usize>,
    pairs: Vec<(u32, u32)>,
}

/// Appends the arcs into columns `ca..cb` of rows `r0, r0 + 1, ..` (row `i`'s sorted
/// targets are `idx[ip[i] - ip[0] .. ip[i + 1] - ip[0]]`) to their columns: the arc
/// `r -> c` goes to `buf[fill[c - ca]]`, which then advances. Rows are visited in
/// order, so each column receives its rows increasing. The arcs are first grouped by
/// bucket of `2^BUCKET_SHIFT` columns (a stable counting sort), so the scattered
/// writes of each group touch few cache lines.
fn local_scatter_columns(
    idx: &[u32],
    ip: &[u64],
    r0: u64,
    (ca, cb): (u32, u32),
    fill: &mut [u64],
    buf: &mut [u32],
    scratch: &mut Scatter,
) {
    let base = ip[0];
    let rows = ip.len() - 1;
    let range = |i: usize| -> (usize, usize) {
        let row = &idx[(ip[i] - base) as usize..(ip[i + 1] - base) as usize];
        let from = row.partition_point(|&c| c < ca);
        let to = from + row[from..].partition_point(|&c| c < cb);
        ((ip[i] - base) as usize + from, (ip[i] - base) as usize + to)
    };
    let nb = ((cb - ca) >> BUCKET_SHIFT) as usize + 1;
    let counts = &mut scratch.counts;
    counts.clear();
    counts.resize(nb + 1, 0);
    for i in 0..rows {
        let (f, t) = range(i);
        for &c in &idx[f..t] {
            counts[((c - ca) >> BUCKET_SHIFT) as usize + 1] += 1;
        }
    }
    for b in 0..nb {
        counts[b + 1] += counts[b];
    }
    let pairs = &mut scratch.pairs;
    pairs.clear();
    pairs.resize(counts[nb], (0, 0));
    for i in 0..rows {
        let (f, t) = range(i);
        let r = (r0 + i as u64) as u32;
        for &c in &idx[f..t] {
            let slot = &mut counts[((c - ca) >> BUCKET_SHIFT) as usize];
            pairs[*slot] = (c, r);
            *slot += 1;
        }
    }
    for &(c, r) in pairs.iter() {
        let slot = &mut fill[(c - ca) as usize];
        buf[*slot as usize] = r;
        *slot += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::graph::rows::LocalRows;

    /// The bucketed scatter equals the direct one, over several row pieces.
    #[test]
    fn scatter_matches_the_direct_transpose() {
        let mut rng = crate::rng::SplitMix64::new(5);
        let rows: Vec<Vec<u32>> = (0..300)
            .map(|_| {
                let mut r: Vec<u32> = (0..rng.below(40)).map(|_| rng.below(2000) as u32).collect();
                r.sort_unstable();
                r.dedup();
                r
            })
            .collect();
        let g = LocalRows::from_rows(0, rows);
        for (ca, cb) in [(0u32, 2000u32), (300, 1700), (999, 1000)] {
            let mut want: Vec<Vec<u32>> = vec![Vec::new(); (cb - ca) as usize];
            for i in 0..g.num_rows() {
                for &c in g.row(i).iter().filter(|&&c| c >= ca && c < cb) {
                    want[(c - ca) as usize].push(i as u32);
                }
            }
            let mut fill = vec![0u64; want.len()];
            let mut acc = 0;
            for (f, w) in fill.iter_mut().zip(&want) {
                *f = acc;
                acc += w.len() as u64;
            }
            let mut buf = vec![u32::MAX; acc as usize];
            let mut scratch = Scatter::default();
            for (a, b) in [(0usize, 7usize), (7, 150), (150, 300)] {
                let base = g.indptr[a] as usize;
                local_scatter_columns(
                    &g.targets[base..g.indptr[b] as usize],
                    &g.indptr[a..=b],
                    a as u64,
                    (ca, cb),
                    &mut fill,
                    &mut buf,
                    &mut scratch,
                );
            }
            assert_eq!(buf, want.concat(), "columns {ca}..{cb}");
        }
    }
}
