//! Structural statistics of a directed graph, the numbers that tell a web crawl from
//! a random graph (definitions in `docs/inspect.md#graph-statistics`):
//!
//! * **sizes**: nodes and arcs;
//! * **degrees**: out- and in-degree quantiles at 50, 90, 99 and 99.9 % over all
//!   nodes (nearest rank: the value at 1-based position `ceil(q n)` of the sorted
//!   degrees), and the tail exponent of each (the discrete power-law maximum
//!   likelihood estimate of Clauset, Shalizi and Newman 2009, eq. 3.7,
//!   `alpha = 1 + n_t / sum ln(x / (x_min - 1/2))` over the `n_t` degrees
//!   `x >= x_min`, with `x_min` the 90 % quantile of the positive degrees);
//! * **locality**: the fraction of arcs `u -> v` with `|v - u| < 2^4, 2^8, 2^12,
//!   2^16` (in a crawl in URL order a host is a run of consecutive ids);
//! * **reciprocity**: the fraction of arcs `u -> v` whose reverse `v -> u` is an arc;
//! * **adjacent Jaccard**: the mean Jaccard similarity `|A n B| / |A u B|` of the
//!   out-link sets of nodes `u` and `u + 1`, over the pairs where both are
//!   non-empty (templates and copied link lists);
//! * **top-1 % share**: the fraction of arcs that point to the `ceil(nodes / 100)`
//!   nodes of largest in-degree;
//! * **far-target share**: the number of distinct targets of the far arcs (those with
//!   `|v - u| >= 2^16`) over the number of far arcs (0 without far arcs): near 1 when
//!   long links go everywhere, small when they go to a few popular pages. It is what
//!   sets the traffic of a row-block partition (a rank fetches each distinct remote
//!   target once);
//! * **sink in-link share**: the fraction of arcs into nodes without out-links (in
//!   a crawl, documents and pages not fetched: what `--min-links 1` removes);
//! * **far-source share**: the number of distinct sources of the far arcs (nodes with
//!   at least one) over the number of far arcs (0 without far arcs): near 1 when
//!   every page has its one long link, small when a few hub pages hold them. The
//!   other half of that traffic (the transposed side fetches each distinct remote
//!   source once).
//!
//! Everything here is pure: [`RowStats`] takes clean rows (sorted, distinct, no
//! self-loop) chunk by chunk in id order and keeps only O(distinct degrees) state
//! plus the in-degree array the caller owns; partial results merge across ranks
//! ([`RowStats::merge`]); the reciprocity of a multiset of canonical pair keys is
//! [`mutual_pairs`]. The caller (the `inspect --stats` command) does the reading and
//! the communication.

use super::rows::LocalRows;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Gap thresholds of the locality statistic: `|v - u| < 2^b` for these `b`.
pub const GAP_BITS: [u32; 4] = [4, 8, 12, 16];
/// Arcs with `|v - u| >= 2^FAR_BITS` are far.
pub const FAR_BITS: u32 = 16;

/// Counts, for each target of a far arc of `chunk`, its far in-links in `far_in`
/// (indexed by global id); the far-target share is the number of non-zero entries
/// over the far arcs.
pub fn add_far_in(chunk: &LocalRows, far_in: &mut [u64]) {
    for i in 0..chunk.num_rows() {
        let u = chunk.lo + i as u64;
        for &v in chunk.row(i) {
            if (v as u64).abs_diff(u) >= 1u64 << FAR_BITS {
                far_in[v as usize] += 1;
            }
        }
    }
}
/// Quantiles reported for both degree distributions.
pub const QUANTILES: [f64; 4] = [0.5, 0.9, 0.99, 0.999];
/// The tail exponent's `x_min` is this quantile of the positive degrees.
pub const TAIL_QUANTILE: f64 = 0.9;

/// A degree histogram: degree -> number of nodes with it.
pub type Histogram = BTreeMap<u64, u64>;

/// Summary of one degree distribution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DegreeSummary {
    pub mean: f64,
    pub max: u64,
    /// Fraction of nodes of degree 0.
    pub zero_fraction: f64,
    /// The degrees at [`QUANTILES`] (nearest rank over all nodes).
    pub quantiles: [u64; 4],
    /// Discrete power-law exponent of the tail (0 when fewer than 2 degrees reach
    /// `x_min`).
    pub tail_exponent: f64,
    /// The tail's lower bound `x_min`.
    pub tail_min: u64,
}

/// The statistics of a whole graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphStats {
    pub nodes: u64,
    pub arcs: u64,
    pub out_degree: DegreeSummary,
    pub in_degree: DegreeSummary,
    /// Fraction of arcs with `|v - u| < 2^GAP_BITS[i]`.
    pub gap_below: [f64; 4],
    pub reciprocity: f64,
    pub adjacent_jaccard: f64,
    pub top1_in_share: f64,
    pub far_target_share: f64,
    /// Distinct sources of the far arcs over the far arcs (0 without far arcs).
    #[serde(default)]
    pub far_source_share: f64,
    /// Arcs into nodes without out-links over all arcs (0 without arcs).
    #[serde(default)]
    pub sink_in_share: f64,
}

/// The 1-based nearest-rank position of quantile `q` among `n` values.
fn rank_of(q: f64, n: u64) -> u64 {
    ((q * n as f64).ceil() as u64).clamp(1, n.max(1))
}

/// The value at 1-based position `pos` of the sorted multiset `hist` describes.
fn value_at(hist: &Histogram, pos: u64) -> u64 {
    let mut seen = 0;
    for (&v, &c) in hist {
        seen += c;
        if seen >= pos {
            return v;
        }
    }
    hist.keys().next_back().copied().unwrap_or(0)
}

/// Summary of the degree multiset `hist` (counts over all nodes, zeros included).
pub fn summarize_degrees(hist: &Histogram) -> DegreeSummary {
    let n: u64 = hist.values().sum();
    if n == 0 {
        return DegreeSummary {
            mean: 0.0,
            max: 0,
            zero_fraction: 0.0,
            quantiles: [0; 4],
            tail_exponent: 0.0,
            tail_min: 0,
        };
    }
    let total: f64 = hist.iter().map(|(&v, &c)| v as f64 * c as f64).sum();
    let zeros = hist.get(&0).copied().unwrap_or(0);
    let quantiles = QUANTILES.map(|q| value_at(hist, rank_of(q, n)));
    let positive = n - zeros;
    let (tail_exponent, tail_min) = if positive == 0 {
        (0.0, 0)
    } else {
        let x_min = value_at(hist, zeros + rank_of(TAIL_QUANTILE, positive)).max(1);
        let (mut nt, mut s) = (0u64, 0.0f64);
        for (&v, &c) in hist.range(x_min..) {
            nt += c;
            s += c as f64 * (v as f64 / (x_min as f64 - 0.5)).ln();
        }
        let a = if nt >= 2 && s > 0.0 {
            1.0 + nt as f64 / s
        } else {
            0.0
        };
        (a, x_min)
    };
    DegreeSummary {
        mean: total / n as f64,
        max: hist.keys().next_back().copied().unwrap_or(0),
        zero_fraction: zeros as f64 / n as f64,
        quantiles,
        tail_exponent,
        tail_min,
    }
}

/// `|a n b|` of two sorted, distinct lists.
fn intersection_len(a: &[u32], b: &[u32]) -> u64 {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}

/// Jaccard similarity of two sorted, distinct, non-empty lists.
pub fn jaccard(a: &[u32], b: &[u32]) -> f64 {
    let i = intersection_len(a, b);
    i as f64 / (a.len() as u64 + b.len() as u64 - i) as f64
}

/// The canonical key of the unordered pair `{u, v}`, `u != v`.
#[inline]
pub fn pair_key(u: u32, v: u32) -> u64 {
    let (a, b) = if u < v { (u, v) } else { (v, u) };
    ((a as u64) << 32) | b as u64
}

/// The number of keys that occur twice in `keys` (sorted in place). With each arc
/// `u -> v` of a clean graph contributing `pair_key(u, v)`, a key occurs at most
/// twice, and twice exactly for a reciprocated pair; the reciprocity is then
/// `2 x mutual_pairs / arcs`.
pub fn mutual_pairs(keys: &mut [u64]) -> u64 {
    keys.sort_unstable();
    keys.windows(2).filter(|w| w[0] == w[1]).count() as u64
}

/// Rank-local statistics of a run of consecutive rows, fed in id order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowStats {
    /// First and one-past-last row seen.
    pub lo: u64,
    pub hi: u64,
    pub arcs: u64,
    pub out_hist: Histogram,
    /// Arcs with `|v - u| < 2^GAP_BITS[i]`.
    pub gap_counts: [u64; 4],
    /// Arcs by `floor(log2 |v - u|)` (index 0: gap 1; ids are u32, so at most 31).
    pub gap_log2: [u64; 32],
    /// Sum of the Jaccard similarities of adjacent non-empty rows, and their count.
    pub jaccard_sum: f64,
    pub jaccard_pairs: u64,
    /// Rows with at least one far arc (`|v - u| >= 2^FAR_BITS`).
    pub far_sources: u64,
    /// The first row seen and the last (for the pairs that cross a boundary).
    pub first_row: Option<Vec<u32>>,
    pub last_row: Option<Vec<u32>>,
}

impl RowStats {
    /// Empty statistics of rows starting at `lo`.
    pub fn new(lo: u64) -> Self {
        Self {
            lo,
            hi: lo,
            ..Self::default()
        }
    }

    /// Adds the rows of `chunk` (clean: sorted, distinct, no self-loop), which must
    /// start where the previous chunk ended. Each target's in-degree is incremented
    /// in `in_degree` (indexed by global id), and `key(u, v)` is called for every
    /// arc, for the caller's reciprocity keys.
    pub fn add_chunk(
        &mut self,
        chunk: &LocalRows,
        in_degree: &mut [u64],
        mut key: impl FnMut(u32, u32),
    ) {
        debug_assert_eq!(chunk.lo, self.hi, "chunks must be consecutive");
        for i in 0..chunk.num_rows() {
            let u = chunk.lo + i as u64;
            let row = chunk.row(i);
            *self.out_hist.entry(row.len() as u64).or_insert(0) += 1;
            self.arcs += row.len() as u64;
            let mut far = false;
            for &v in row {
                in_degree[v as usize] += 1;
                let gap = (v as u64).abs_diff(u);
                for (c, &b) in self.gap_counts.iter_mut().zip(&GAP_BITS) {
                    if gap < 1u64 << b {
                        *c += 1;
                    }
                }
                self.gap_log2[gap.max(1).ilog2() as usize] += 1;
                far |= gap >= 1u64 << FAR_BITS;
                key(u as u32, v);
            }
            self.far_sources += u64::from(far);
            if let Some(prev) = &self.last_row {
                if !prev.is_empty() && !row.is_empty() {
                    self.jaccard_sum += jaccard(prev, row);
                    self.jaccard_pairs += 1;
                }
            }
            if self.first_row.is_none() {
                self.first_row = Some(row.to_vec());
            }
            self.last_row = Some(row.to_vec());
        }
        self.hi = chunk.lo + chunk.num_rows() as u64;
    }

    /// Merges `next`, the statistics of the rows right after these (`next.lo ==
    /// self.hi`), counting the adjacent pair across the boundary.
    pub fn merge(mut self, next: RowStats) -> RowStats {
        if next.lo == next.hi {
            return self;
        }
        if self.lo == self.hi {
            return next;
        }
        debug_assert_eq!(self.hi, next.lo, "merged blocks must be consecutive");
        if let (Some(a), Some(b)) = (&self.last_row, &next.first_row) {
            if !a.is_empty() && !b.is_empty() {
                self.jaccard_sum += jaccard(a, b);
                self.jaccard_pairs += 1;
            }
        }
        self.arcs += next.arcs;
        for (d, c) in next.out_hist {
            *self.out_hist.entry(d).or_insert(0) += c;
        }
        for (a, b) in self.gap_counts.iter_mut().zip(next.gap_counts) {
            *a += b;
        }
        for (a, b) in self.gap_log2.iter_mut().zip(next.gap_log2) {
            *a += b;
        }
        self.jaccard_sum += next.jaccard_sum;
        self.jaccard_pairs += next.jaccard_pairs;
        self.far_sources += next.far_sources;
        self.hi = next.hi;
        self.last_row = next.last_row;
        self
    }
}

/// A graph's statistics with the distributions they were read from, for fitting a
/// generator to it.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphProfile {
    pub stats: GraphStats,
    pub out_hist: Histogram,
    pub in_hist: Histogram,
    /// Arcs by `floor(log2 |v - u|)`.
    pub gap_log2: [u64; 32],
}

/// The whole graph's statistics from the merged row statistics of all `nodes` rows,
/// the in-degree and far in-links ([`add_far_in`]) of every node, the number of
/// reciprocated pairs and the arcs into nodes without out-links ([`sink_in_arcs`]).
pub fn finish(
    rows: &RowStats,
    in_degree: &[u64],
    far_in: &[u64],
    mutual: u64,
    sink_in: u64,
) -> GraphStats {
    profile(rows, in_degree, far_in, mutual, sink_in).stats
}

/// The arcs into the nodes of `empty` (nodes without out-links), from the
/// in-degrees of every node.
pub fn sink_in_arcs(empty: impl IntoIterator<Item = u64>, in_degree: &[u64]) -> u64 {
    empty.into_iter().map(|u| in_degree[u as usize]).sum()
}

/// [`finish`] with the distributions.
pub fn profile(
    rows: &RowStats,
    in_degree: &[u64],
    far_in: &[u64],
    mutual: u64,
    sink_in: u64,
) -> GraphProfile {
    let nodes = in_degree.len() as u64;
    let arcs = rows.arcs;
    let frac = |x: u64| {
        if arcs == 0 {
            0.0
        } else {
            x as f64 / arcs as f64
        }
    };
    let mut in_hist = Histogram::new();
    for &d in in_degree {
        *in_hist.entry(d).or_insert(0) += 1;
    }
    // The ceil(nodes / 100) largest in-degrees, from the histogram's top.
    let mut top = nodes.div_ceil(100);
    let mut top_arcs = 0u64;
    for (&d, &c) in in_hist.iter().rev() {
        if top == 0 {
            break;
        }
        let take = c.min(top);
        top_arcs += take * d;
        top -= take;
    }
    let stats = GraphStats {
        nodes,
        arcs,
        out_degree: summarize_degrees(&rows.out_hist),
        in_degree: summarize_degrees(&in_hist),
        gap_below: rows.gap_counts.map(frac),
        reciprocity: frac(2 * mutual),
        adjacent_jaccard: if rows.jaccard_pairs == 0 {
            0.0
        } else {
            rows.jaccard_sum / rows.jaccard_pairs as f64
        },
        top1_in_share: frac(top_arcs),
        far_target_share: {
            let far_arcs = arcs - rows.gap_counts[3];
            let targets = far_in.iter().filter(|&&c| c > 0).count() as u64;
            if far_arcs == 0 {
                0.0
            } else {
                targets as f64 / far_arcs as f64
            }
        },
        far_source_share: {
            let far_arcs = arcs - rows.gap_counts[3];
            if far_arcs == 0 {
                0.0
            } else {
                rows.far_sources as f64 / far_arcs as f64
            }
        },
        sink_in_share: frac(sink_in),
    };
    GraphProfile {
        stats,
        out_hist: rows.out_hist.clone(),
        in_hist,
        gap_log2: rows.gap_log2,
    }
}

/// The statistics of an in-memory graph of `nodes` nodes whose rows are all of
/// `rows` (`rows.lo == 0`, clean). One pass; for tests and the generator's fitting.
pub fn of_rows(rows: &LocalRows, nodes: u64) -> GraphStats {
    profile_of_rows(rows, nodes).stats
}

/// [`of_rows`] with the distributions.
pub fn profile_of_rows(rows: &LocalRows, nodes: u64) -> GraphProfile {
    assert_eq!(rows.lo, 0, "of_rows needs every row from 0");
    let mut in_degree = vec![0u64; nodes as usize];
    let mut far_in = vec![0u64; nodes as usize];
    let mut keys = Vec::with_capacity(rows.targets.len());
    let mut st = RowStats::new(0);
    st.add_chunk(rows, &mut in_degree, |u, v| keys.push(pair_key(u, v)));
    add_far_in(rows, &mut far_in);
    // Rows past the CSR's end (if any) are empty.
    let missing = nodes.saturating_sub(st.hi);
    if missing > 0 {
        *st.out_hist.entry(0).or_insert(0) += missing;
    }
    let empty = (0..rows.num_rows())
        .filter(|&i| rows.row(i).is_empty())
        .map(|i| i as u64)
        .chain(st.hi..nodes);
    let sink = sink_in_arcs(empty, &in_degree);
    profile(&st, &in_degree, &far_in, mutual_pairs(&mut keys), sink)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 6 nodes: 0 -> 1 2 3, 1 -> 0 2 3, 2 -> 0, 3 -> (none), 4 -> 0 5, 5 -> 4 0 1.
    fn small() -> LocalRows {
        LocalRows::from_rows(
            0,
            vec![
                vec![1, 2, 3],
                vec![0, 2, 3],
                vec![0],
                vec![],
                vec![0, 5],
                vec![0, 1, 4],
            ],
        )
    }

    #[test]
    fn a_hand_made_graph_exactly() {
        let s = of_rows(&small(), 6);
        assert_eq!(s.nodes, 6);
        assert_eq!(s.arcs, 12);
        // Out-degrees sorted: 0 1 2 3 3 3 -> q50 at position 3 = 2, q90 at 6 = 3.
        assert_eq!(s.out_degree.quantiles, [2, 3, 3, 3]);
        assert_eq!(s.out_degree.max, 3);
        assert!((s.out_degree.zero_fraction - 1.0 / 6.0).abs() < 1e-15);
        assert!((s.out_degree.mean - 2.0).abs() < 1e-15);
        // In-degrees: 0:4, 1:2, 2:2, 3:2, 4:1, 5:1 -> sorted 1 1 2 2 2 4.
        assert_eq!(s.in_degree.quantiles, [2, 4, 4, 4]);
        assert_eq!(s.in_degree.max, 4);
        // Gaps: all < 16.
        assert_eq!(s.gap_below, [1.0; 4]);
        // Mutual pairs: {0,1}, {0,2}, {4,5} ({1,5}: 5 -> 1 only).
        assert!((s.reciprocity - 6.0 / 12.0).abs() < 1e-15);
        // Adjacent non-empty pairs: (0,1): {1,2,3} vs {0,2,3} = 2/4; (1,2): {0,2,3} vs
        // {0} = 1/3; (2,3): 3 empty; (3,4): empty; (4,5): {0,5} vs {0,1,4} = 1/4.
        let j = (0.5 + 1.0 / 3.0 + 0.25) / 3.0;
        assert!((s.adjacent_jaccard - j).abs() < 1e-15);
        // Top ceil(6/100) = 1 node: node 0 with 4 of 12 arcs.
        assert!((s.top1_in_share - 4.0 / 12.0).abs() < 1e-15);
        // Node 3 has no out-links and 2 in-links.
        assert!((s.sink_in_share - 2.0 / 12.0).abs() < 1e-15);
        // Out tail: positive degrees 1 2 3 3 3, x_min = q90 of them = 3; all three
        // tail degrees equal x_min: alpha = 1 + 3 / (3 ln(3 / 2.5)).
        assert_eq!(s.out_degree.tail_min, 3);
        let a = 1.0 + 1.0 / (3.0f64 / 2.5).ln();
        assert!((s.out_degree.tail_exponent - a).abs() < 1e-12);
    }

    #[test]
    fn gaps_count_each_threshold() {
        // 0 -> 15 (gap 15 < 16), 0 -> 16 (gap 16: < 256 only), 0 -> 70000 (none).
        let rows = LocalRows::from_rows(0, vec![vec![15, 16, 70_000]]);
        let s = of_rows(&rows, 70_001);
        assert_eq!(s.gap_below, [1.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0]);
        // One far arc, one far target.
        assert_eq!(s.far_target_share, 1.0);
        assert_eq!(s.far_source_share, 1.0);
        let rows = LocalRows::from_rows(0, vec![vec![70_000], vec![70_000], vec![70_000, 70_001]]);
        assert_eq!(of_rows(&rows, 70_002).far_target_share, 2.0 / 4.0);
        // Three rows hold the four far arcs.
        assert_eq!(of_rows(&rows, 70_002).far_source_share, 3.0 / 4.0);
    }

    #[test]
    fn split_blocks_merge_to_the_whole() {
        let whole = small();
        for cut in 0..=6usize {
            let a = LocalRows::from_rows(0, (0..cut).map(|i| whole.row(i).to_vec()).collect());
            let b = LocalRows::from_rows(
                cut as u64,
                (cut..6).map(|i| whole.row(i).to_vec()).collect(),
            );
            let mut indeg = vec![0u64; 6];
            let far = vec![0u64; 6];
            let mut keys = Vec::new();
            let mut sa = RowStats::new(0);
            sa.add_chunk(&a, &mut indeg, |u, v| keys.push(pair_key(u, v)));
            let mut sb = RowStats::new(cut as u64);
            sb.add_chunk(&b, &mut indeg, |u, v| keys.push(pair_key(u, v)));
            let merged = sa.merge(sb);
            // Node 3, the one without out-links, has in-links from 0 and 1.
            assert_eq!(sink_in_arcs([3], &indeg), 2);
            let got = finish(&merged, &indeg, &far, mutual_pairs(&mut keys), 2);
            assert_eq!(got, of_rows(&whole, 6), "cut at {cut}");
        }
    }

    #[test]
    fn power_law_tail_is_recovered() {
        // Degrees with P(X >= x) ~ x^-1.5 (density exponent 2.5) from x = 20 on,
        // deterministic (the estimator's approximation holds for x_min of 6 or more).
        let n = 200_000u64;
        let mut hist = Histogram::new();
        for i in 0..n {
            let u = (i as f64 + 0.5) / n as f64;
            let x = (20.0 * u.powf(-1.0 / 1.5)).floor() as u64;
            *hist.entry(x).or_insert(0) += 1;
        }
        let s = summarize_degrees(&hist);
        assert!(
            (s.tail_exponent - 2.5).abs() < 0.1,
            "tail exponent {}",
            s.tail_exponent
        );
    }

    #[test]
    fn empty_graph_is_all_zero() {
        let s = of_rows(&LocalRows::empty(0), 3);
        assert_eq!(s.arcs, 0);
        assert_eq!(s.out_degree.quantiles, [0; 4]);
        assert_eq!(s.reciprocity, 0.0);
        assert_eq!(s.adjacent_jaccard, 0.0);
    }
}
