//! The fit's kernel phases: from the gather and scatter points, the seconds of a row
//! access (lookup and bytes) with a factor per width, the size factor, the
//! interference of several tables, and the Zipf ids' ratio.

use super::line::line;
use super::{access, IDENTIFIES};
use crate::embed::calibrate::points::{Costs, KernelPoint};
use crate::embed::planner::CostModel;

/// `m.lookup_s` and `m.mem_bw` from the uniform single-table points at the reference
/// size (`at_ref`): per id, `seconds / ids = lookup_s + x / mem_bw` by least squares;
/// then `m.width_factor`, each measured width's measured over fitted seconds. The
/// measured widths, sorted.
pub(super) fn row_access(
    c: &Costs,
    at_ref: &dyn Fn(&KernelPoint) -> bool,
    m: &mut CostModel,
) -> Vec<usize> {
    // Per id: (bytes a row access moves, seconds), uniform single-table points.
    let single = |pts: &[KernelPoint], mult: f64| -> Vec<(usize, f64, f64)> {
        pts.iter()
            .filter(|q| q.tables == 1 && q.dist == "uniform" && at_ref(q))
            .map(|q| {
                (
                    q.dim,
                    mult * access(m, q.dim),
                    q.seconds / q.ids.max(1) as f64,
                )
            })
            .collect()
    };
    let mut per_id = single(&c.gather, 1.0);
    per_id.extend(single(&c.scatter, 2.0));
    let xy: Vec<(f64, f64)> = per_id.iter().map(|&(_, x, y)| (x, y)).collect();
    match line(&xy) {
        Some((a, b)) if b > 0.0 => {
            m.mem_bw = 1.0 / b;
            m.lookup_s = a.max(0.0);
        }
        _ => {
            // One width (or a slope <= 0): memory at the default rate, the rest
            // per lookup.
            let n = xy.len().max(1) as f64;
            let mean_rest = xy.iter().map(|&(x, y)| y - x / m.mem_bw).sum::<f64>() / n;
            m.lookup_s = mean_rest.max(0.0);
        }
    }
    let mut widths: Vec<usize> = per_id.iter().map(|q| q.0).collect();
    widths.sort_unstable();
    widths.dedup();
    m.width_factor = widths
        .iter()
        .map(|&w| {
            let (mut measured, mut fitted) = (0.0, 0.0);
            for &(_, x, y) in per_id.iter().filter(|q| q.0 == w) {
                measured += y;
                fitted += m.lookup_s + x / m.mem_bw;
            }
            [w as f64, (measured / fitted.max(1e-15)).max(1e-6)]
        })
        .collect();
    widths
}

/// `m.interference` from the kernel points of several tables: per-id seconds of `k`
/// tables together over alone, against the law's variable (`m.size_factor` set
/// first); the mean ratio per table count (the report's `together_ratio`).
pub(super) fn kernel_interference(c: &Costs, m: &mut CostModel) -> Vec<[f64; 2]> {
    let mut num = 0.0;
    let mut den = 0.0;
    // Per table count: the sum and number of the ratios (for the report).
    let mut by_k: std::collections::BTreeMap<usize, (f64, usize)> = Default::default();
    for pts in [&c.gather, &c.scatter] {
        for q in pts.iter().filter(|q| q.tables > 1) {
            let alone = pts.iter().find(|a| {
                a.tables == 1
                    && a.dim == q.dim
                    && a.pooling == q.pooling
                    && a.dist == q.dist
                    && a.rows == q.rows
            });
            if let Some(a) = alone {
                let r = (q.seconds / q.ids.max(1) as f64) / (a.seconds / a.ids.max(1) as f64);
                let bytes = q.tables as f64 * q.rows as f64 * q.dim as f64 * 4.0;
                let x = m.interference_x(q.tables, bytes);
                if x >= IDENTIFIES {
                    num += (r - 1.0) * x;
                    den += x * x;
                }
                let e = by_k.entry(q.tables).or_default();
                e.0 += r;
                e.1 += 1;
            }
        }
    }
    m.interference = if den > 0.0 { (num / den).max(0.0) } else { 0.0 };
    let together_ratio = by_k
        .iter()
        .map(|(&k, &(r, n))| [k as f64, r / n as f64])
        .collect();
    together_ratio
}

/// Per width of `widths`: the mean over (kernel, pooling) of Zipf's per-id seconds
/// over uniform ids', single tables at the reference size (`at_ref`).
pub(super) fn zipf_ratio(
    c: &Costs,
    widths: &[usize],
    at_ref: &dyn Fn(&KernelPoint) -> bool,
) -> Vec<[f64; 2]> {
    widths
        .iter()
        .filter_map(|&w| {
            let mut r = Vec::new();
            for pts in [&c.gather, &c.scatter] {
                for z in pts
                    .iter()
                    .filter(|q| q.tables == 1 && q.dim == w && q.dist == "zipf" && at_ref(q))
                {
                    let u = pts.iter().find(|q| {
                        q.tables == 1
                            && q.dim == w
                            && q.pooling == z.pooling
                            && q.dist == "uniform"
                            && at_ref(q)
                    });
                    if let Some(u) = u {
                        r.push((z.seconds / z.ids as f64) / (u.seconds / u.ids as f64));
                    }
                }
            }
            (!r.is_empty()).then(|| [w as f64, r.iter().sum::<f64>() / r.len() as f64])
        })
        .collect()
}

/// Per table size measured: the per-id seconds of the single-table uniform points of
/// that size over those of the reference size (same kernel, width and pooling),
/// their geometric mean, as `[bytes, factor]` sorted by bytes with the reference at
/// factor 1; empty without size points. Sizes within 5 % of each other (the same
/// nominal size at widths that do not divide it) are one size.
pub(super) fn size_factor(c: &Costs, at_ref: &dyn Fn(&KernelPoint) -> bool) -> Vec<[f64; 2]> {
    // (bytes, ln ratio) of every size point with its reference.
    let mut r: Vec<(f64, f64)> = Vec::new();
    for pts in [&c.gather, &c.scatter] {
        for q in pts
            .iter()
            .filter(|q| q.tables == 1 && q.dist == "uniform" && !at_ref(q))
        {
            let reference = pts.iter().find(|a| {
                a.tables == 1
                    && a.dist == "uniform"
                    && a.dim == q.dim
                    && a.pooling == q.pooling
                    && at_ref(a)
            });
            if let Some(a) = reference {
                let ratio = (q.seconds / q.ids.max(1) as f64) / (a.seconds / a.ids.max(1) as f64);
                r.push((q.rows as f64 * q.dim as f64 * 4.0, ratio.ln()));
            }
        }
    }
    if r.is_empty() {
        return Vec::new();
    }
    r.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Groups of sizes within 5 % of the group's first: mean bytes, mean ln ratio.
    let mut out: Vec<[f64; 2]> = Vec::new();
    let mut i = 0;
    while i < r.len() {
        let first = r[i].0;
        let j = i + r[i..].iter().take_while(|x| x.0 <= first * 1.05).count();
        let n = (j - i) as f64;
        let bytes = r[i..j].iter().map(|x| x.0).sum::<f64>() / n;
        let ln = r[i..j].iter().map(|x| x.1).sum::<f64>() / n;
        out.push([bytes, ln.exp()]);
        i = j;
    }
    let tb = c.conditions.table_bytes as f64;
    out.retain(|x| (x[0] / tb - 1.0).abs() > 0.05);
    out.push([tb, 1.0]);
    out.sort_by(|a, b| a[0].total_cmp(&b[0]));
    out
}
