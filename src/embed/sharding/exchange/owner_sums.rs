//! The owners' side of the backward: one slot's gradients summed over its sources in
//! rank order (deduplicated or not, the same bits), and the table optimizer applied
//! once to each summed row.

use super::index::Index;
use super::request::protocol_violation;
use crate::allocs::reserve_with_room as reserve_total;
use crate::embed::tables::row_kernels::{prefetch_distinct_ahead, Isa};
use crate::embed::tables::store::{LocalShard, TableOpt};
use crate::{Error, Result};

/// An owner's sum of one slot's gradients over sources (rows in first-seen order, or
/// ascending when asked).
#[cfg(test)]
struct SlotSum {
    rows: Vec<u32>,
    grads: Vec<f32>,
}

/// A row id on the wire: u32, or u32 bits carried in an f32 message.
pub(super) trait IdBits: Copy + Sync {
    fn bits(self) -> u32;
}
impl IdBits for u32 {
    fn bits(self) -> u32 {
        self
    }
}
impl IdBits for f32 {
    fn bits(self) -> u32 {
        self.to_bits()
    }
}

/// Add `g` to the sum of `row` in a first-seen list (`rows`, and `grads` with `w`
/// values per row, positions in `index`). A new row's sum starts from +0.0, as every
/// sum does (`0.0 + x` is `x` except that it turns -0.0 into +0.0).
#[inline]
fn add_to_sum(
    index: &mut Index,
    rows: &mut Vec<u32>,
    grads: &mut Vec<f32>,
    w: usize,
    row: u32,
    g: &[f32],
) {
    let n = rows.len() as u32;
    let p = index.get_or_insert(row, n) as usize;
    if p == n as usize {
        rows.push(row);
        grads.extend(g.iter().map(|&x| 0.0 + x));
    } else {
        for (d, &x) in grads[p * w..(p + 1) * w].iter_mut().zip(g) {
            *d += x;
        }
    }
}

/// Sum one slot's gradients over its sources' pieces (in order; within a piece in
/// order) into `rows` and `grads` (refilled), with `index` (empty before and after;
/// made for this shard on first use). Rows ascending when `sorted`.
#[allow(clippy::too_many_arguments)]
pub(super) fn sum_slot_into<I: IdBits>(
    pieces: &[(&[I], &[f32])],
    w: usize,
    dedup: bool,
    shard_rows: u64,
    sorted: bool,
    index: &mut Option<Index>,
    rows: &mut Vec<u32>,
    grads: &mut Vec<f32>,
    scratch: &mut SortScratch,
) -> Result<()> {
    let total: usize = pieces.iter().map(|(ids, _)| ids.len()).sum();
    let index = index.get_or_insert_with(|| Index::new(shard_rows, total));
    // At most `total` rows: reserved once (growing would copy the sums again).
    rows.clear();
    grads.clear();
    reserve_total(rows, total);
    reserve_total(grads, total * w);
    let check = |row: u32| {
        if row as u64 >= shard_rows {
            protocol_violation(format!(
                "gradient for row {row} of a {shard_rows}-row shard"
            ))
        } else {
            Ok::<u32, Error>(row)
        }
    };
    // Per source: the positions of its rows in `lrows` (no-dedup only).
    let mut local = if dedup {
        None
    } else {
        Some(Index::new(shard_rows, total))
    };
    for &(ids, gs) in pieces {
        match local.as_mut() {
            None => {
                for (k, id) in ids.iter().enumerate() {
                    let row = check(id.bits())?;
                    add_to_sum(index, rows, grads, w, row, &gs[k * w..(k + 1) * w]);
                }
            }
            Some(lindex) => {
                // Sum this source's occurrences first, in order, then add the source.
                let mut lrows: Vec<u32> = Vec::new();
                let mut lg: Vec<f32> = Vec::new();
                for (k, id) in ids.iter().enumerate() {
                    let row = check(id.bits())?;
                    let n = lrows.len() as u32;
                    let p = lindex.get_or_insert(row, n) as usize;
                    if p == n as usize {
                        lrows.push(row);
                        lg.resize(lg.len() + w, 0.0);
                    }
                    for (d, &x) in lg[p * w..(p + 1) * w]
                        .iter_mut()
                        .zip(&gs[k * w..(k + 1) * w])
                    {
                        *d += x;
                    }
                }
                for (p, &row) in lrows.iter().enumerate() {
                    add_to_sum(index, rows, grads, w, row, &lg[p * w..(p + 1) * w]);
                }
                lindex.clear(&lrows);
            }
        }
    }
    index.clear(rows);
    if !sorted {
        return Ok(());
    }
    // Ascending rows: the order every column shard of a table agrees on. Written into
    // the scratch buffers, which are then swapped in (both kept from step to step).
    let SortScratch {
        order,
        rows: sorted_rows,
        grads: sorted_grads,
    } = scratch;
    order.clear();
    reserve_total(order, rows.len());
    order.extend(0..rows.len() as u32);
    order.sort_unstable_by_key(|&p| rows[p as usize]);
    sorted_rows.clear();
    reserve_total(sorted_rows, rows.len());
    sorted_rows.extend(order.iter().map(|&p| rows[p as usize]));
    sorted_grads.clear();
    reserve_total(sorted_grads, grads.len());
    for &p in order.iter() {
        let p = p as usize;
        sorted_grads.extend_from_slice(&grads[p * w..(p + 1) * w]);
    }
    std::mem::swap(rows, sorted_rows);
    std::mem::swap(grads, sorted_grads);
    Ok(())
}

/// Buffers of [`sum_slot_into`]'s sort into ascending rows, kept from step to step.
#[derive(Debug, Default)]
pub struct SortScratch {
    order: Vec<u32>,
    rows: Vec<u32>,
    grads: Vec<f32>,
}

/// [`sum_slot_into`] into fresh buffers.
#[cfg(test)]
fn sum_slot<I: IdBits>(
    pieces: &[(&[I], &[f32])],
    w: usize,
    dedup: bool,
    shard_rows: u64,
    sorted: bool,
) -> Result<SlotSum> {
    let (mut rows, mut grads) = (Vec::new(), Vec::new());
    sum_slot_into(
        pieces,
        w,
        dedup,
        shard_rows,
        sorted,
        &mut None,
        &mut rows,
        &mut grads,
        &mut SortScratch::default(),
    )?;
    Ok(SlotSum { rows, grads })
}

/// [`sum_slot_into`] of a pooled slot's per-source sums (`sums[q]`: one row of `w`
/// per row of `rows[q]`, distinct within each source), in place: the first source's
/// sums become the slot's (the same rows in the same order and the same bits as
/// `sum_slot_into`, without copying them: every sum starts from +0.0, so it is never
/// -0.0 and `0.0 + x == x`); `out` gets the rows.
pub(in crate::embed) fn sum_sources_into(
    rows: &[&[u32]],
    sums: &mut [Vec<f32>],
    w: usize,
    shard_rows: u64,
    index: &mut Option<Index>,
    out: &mut Vec<u32>,
) {
    if let Some(&row) = rows
        .iter()
        .flat_map(|r| r.iter())
        .find(|&&r| r as u64 >= shard_rows)
    {
        protocol_violation(format!(
            "gradient for row {row} of a {shard_rows}-row shard"
        ));
    }
    out.clear();
    let Some((first, others)) = sums.split_first_mut() else {
        return;
    };
    let total: usize = rows.iter().map(|r| r.len()).sum();
    reserve_total(out, total);
    out.extend_from_slice(rows[0]);
    if others.is_empty() {
        return;
    }
    reserve_total(first, total * w);
    let index = index.get_or_insert_with(|| Index::new(shard_rows, total));
    for (p, &r) in rows[0].iter().enumerate() {
        index.prefetch_ahead(rows[0], p);
        index.get_or_insert(r, p as u32);
    }
    for (&rq, gq) in rows[1..].iter().zip(others.iter()) {
        for (k, (&row, g)) in rq.iter().zip(gq.chunks_exact(w.max(1))).enumerate() {
            index.prefetch_ahead(rq, k);
            add_to_sum(index, out, first, w, row, g);
        }
    }
    index.clear(out);
}

/// [`sum_sources_into`] into fresh buffers.
#[cfg(test)]
fn sum_sources(rows: &[&[u32]], mut grads: Vec<Vec<f32>>, w: usize, shard_rows: u64) -> SlotSum {
    let mut out = Vec::new();
    sum_sources_into(rows, &mut grads, w, shard_rows, &mut None, &mut out);
    SlotSum {
        rows: out,
        grads: grads.into_iter().next().unwrap_or_default(),
    }
}

/// The table optimizer applied once to each of `rows` (local rows of `ls`, distinct)
/// with its summed gradient (`gs`, row after row, `ls`'s width each) and, for
/// the row-wise optimizers, its full row's sum of squared gradients (`totals`; divided by
/// the table's `dim` here).
pub(in crate::embed) fn apply_rows(
    isa: Isa,
    opt: TableOpt,
    ls: &mut LocalShard,
    dim: f64,
    rows: &[u32],
    gs: &[f32],
    totals: &[f64],
) {
    let w = ls.shard.width();
    let sp = opt.state_per_row(w);
    let row_stat = opt.needs_row_stat();
    if !ls.dtype.is_f32() {
        return apply_rows_half(isa, opt, ls, dim, rows, gs, totals);
    }
    for (k, &row) in rows.iter().enumerate() {
        let r = row as usize;
        prefetch_distinct_ahead(isa, &ls.data, w, rows, k);
        if sp > 0 {
            prefetch_distinct_ahead(isa, &ls.state, sp, rows, k);
        }
        let stat = if row_stat { totals[k] / dim } else { 0.0 };
        opt.apply(
            &mut ls.data[r * w..(r + 1) * w],
            &mut ls.state[r * sp..(r + 1) * sp],
            &gs[k * w..(k + 1) * w],
            stat,
        );
    }
}

/// [`apply_rows`] on a bf16 or f16 shard: each row widened, updated in f32 and
/// rounded back to nearest even ([`LocalShard::apply`]).
fn apply_rows_half(
    isa: Isa,
    opt: TableOpt,
    ls: &mut LocalShard,
    dim: f64,
    rows: &[u32],
    gs: &[f32],
    totals: &[f64],
) {
    let w = ls.shard.width();
    let sp = opt.state_per_row(w);
    let row_stat = opt.needs_row_stat();
    let mut scratch = vec![0.0f32; w];
    for (k, &row) in rows.iter().enumerate() {
        prefetch_distinct_ahead(isa, &ls.half, w, rows, k);
        if sp > 0 {
            prefetch_distinct_ahead(isa, &ls.state, sp, rows, k);
        }
        let stat = if row_stat { totals[k] / dim } else { 0.0 };
        ls.apply(
            opt,
            row as usize,
            sp,
            &gs[k * w..(k + 1) * w],
            stat,
            &mut scratch,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summing_pooled_sources_in_place_gives_sum_slots_rows_and_bits() {
        let mut r = crate::rng::SplitMix64::new(5);
        for &(sources, w, shard_rows) in &[
            (1usize, 64usize, 1000u64),
            (2, 64, 1000),
            (3, 8, 50),
            (2, 16, 3_000_000),
            (4, 64, 200),
        ] {
            // Per source: distinct rows (overlapping across sources) and their sums,
            // negative zeros and values of mixed magnitude included.
            let mut rows: Vec<Vec<u32>> = Vec::new();
            let mut grads: Vec<Vec<f32>> = Vec::new();
            for q in 0..sources {
                let n = (r.next_u64() % 300) as usize + q;
                let mut seen = std::collections::HashSet::new();
                let rq: Vec<u32> = (0..n)
                    .map(|_| (r.next_u64() % shard_rows.min(400)) as u32)
                    .filter(|&x| seen.insert(x))
                    .collect();
                let gq: Vec<f32> = (0..rq.len() * w)
                    .map(|i| match i % 7 {
                        0 => 0.0,
                        1 => (r.next_f64() as f32 - 0.5) * 1e-6,
                        _ => (r.next_f64() as f32 - 0.5) * 1e3,
                    })
                    .collect();
                rows.push(rq);
                grads.push(gq);
            }
            let refs: Vec<&[u32]> = rows.iter().map(|v| v.as_slice()).collect();
            let pieces: Vec<(&[u32], &[f32])> = rows
                .iter()
                .zip(&grads)
                .map(|(a, b)| (a.as_slice(), b.as_slice()))
                .collect();
            let want = sum_slot(&pieces, w, true, shard_rows, false).unwrap();
            let got = sum_sources(&refs, grads.clone(), w, shard_rows);
            assert_eq!(got.rows, want.rows, "{sources} sources, w {w}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got.grads),
                bits(&want.grads),
                "{sources} sources, w {w}"
            );
        }
        // No source at all: nothing.
        let none = sum_sources(&[], Vec::new(), 8, 10);
        assert!(none.rows.is_empty() && none.grads.is_empty());
    }
}
