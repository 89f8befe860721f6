//! This rank's pieces of the embedding tables, how an id finds its shards, and the
//! table optimizers. No communication here.

use rayon::prelude::*;

use super::hashtab::HashShard;
use super::placement::{Placement, Plan, Rows, Shard};
use crate::bf16::EmbDtype;
use crate::rng::{stream, SplitMix64};
use crate::spec::{ModelSpec, VocabKind};
use crate::{Error, Result};

pub use super::table_opt::TableOpt;

/// Mean of the squares of a full row's gradient (f64 accumulation in column order).
#[inline]
pub fn row_stat(g: &[f32]) -> f64 {
    sq_sum(g) / g.len() as f64
}

/// Sum of the squares of `g` in f64, in column order.
#[inline]
pub fn sq_sum(g: &[f32]) -> f64 {
    g.iter().map(|&x| (x as f64) * (x as f64)).sum()
}

/// [`sq_sum`] of every row of `g` (`w` floats each) appended to `out`, the same bits
/// per row. Eight rows at a time: each row's sum is still one chain of additions in
/// column order, but eight independent chains keep the adder busy where one row
/// alone waits on the latency of each addition (about 8x faster on 64-wide rows).
pub fn sq_sums_into(g: &[f32], w: usize, out: &mut Vec<f64>) {
    const LANES: usize = 8;
    if w == 0 {
        return;
    }
    let mut blocks = g.chunks_exact(LANES * w);
    for block in &mut blocks {
        let mut acc = [0.0f64; LANES];
        for j in 0..w {
            for (r, a) in acc.iter_mut().enumerate() {
                let x = block[r * w + j] as f64;
                *a += x * x;
            }
        }
        out.extend_from_slice(&acc);
    }
    out.extend(blocks.remainder().chunks(w).map(sq_sum));
}

/// One shard's rows (local row order), `width` values each, and optimizer state
/// (f32). An f32 table's rows are in `data`; a bf16 or f16 table's in `half` (their
/// bit patterns; `data` is empty), widened to f32 to be read and rounded back to
/// nearest even when updated.
#[derive(Clone, Debug)]
pub struct LocalShard {
    pub shard: Shard,
    pub rows: u64,
    pub dtype: EmbDtype,
    pub data: Vec<f32>,
    pub half: Vec<u16>,
    pub state: Vec<f32>,
}

impl LocalShard {
    /// Row `r` of an f32 table (see [`LocalShard::row_into`] for any dtype).
    #[inline]
    pub fn row(&self, r: u64) -> &[f32] {
        let w = self.shard.width();
        &self.data[r as usize * w..(r as usize + 1) * w]
    }

    /// Row `r` as f32 into `out` (`width` values), whatever the dtype.
    #[inline]
    pub fn row_into(&self, r: u64, out: &mut [f32]) {
        let w = self.shard.width();
        let at = r as usize * w..(r as usize + 1) * w;
        if self.dtype.is_f32() {
            out.copy_from_slice(&self.data[at]);
        } else {
            self.dtype.widen(&self.half[at], out);
        }
    }

    /// Row `r` set to `v` (`width` f32 values; rounded to nearest even at 16 bits).
    #[inline]
    pub fn set_row(&mut self, r: u64, v: &[f32]) {
        let w = self.shard.width();
        let at = r as usize * w..(r as usize + 1) * w;
        if self.dtype.is_f32() {
            self.data[at].copy_from_slice(v);
        } else {
            self.dtype.narrow(v, &mut self.half[at]);
        }
    }

    /// Every row widened to f32, row after row (for the model file and checksums).
    pub fn rows_f32(&self) -> std::borrow::Cow<'_, [f32]> {
        if self.dtype.is_f32() {
            std::borrow::Cow::Borrowed(&self.data)
        } else {
            let mut v = vec![0.0; self.half.len()];
            self.dtype.widen(&self.half, &mut v);
            std::borrow::Cow::Owned(v)
        }
    }

    /// Every row set from `v` (f32, row after row): exact for values of the dtype.
    pub fn set_rows_f32(&mut self, v: &[f32]) {
        if self.dtype.is_f32() {
            self.data.copy_from_slice(v);
        } else {
            self.dtype.narrow(v, &mut self.half);
        }
    }

    /// Every row filled as f32 by `fill` (in place at f32; at 16 bits through an f32
    /// buffer rounded to nearest even, exact for values the dtype holds, such as a
    /// model file written from it).
    pub fn fill_rows_f32<E>(
        &mut self,
        fill: impl FnOnce(&mut [f32]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        if self.dtype.is_f32() {
            return fill(&mut self.data);
        }
        let mut v = vec![0.0; self.half.len()];
        fill(&mut v)?;
        self.set_rows_f32(&v);
        Ok(())
    }

    /// The optimizer's update of row `r` with gradient `g`: in place at f32; at 16
    /// bits the row is widened into `scratch`, updated in f32 and rounded back to
    /// nearest even. `sp` state floats per row.
    #[inline]
    pub fn apply(
        &mut self,
        opt: TableOpt,
        r: usize,
        sp: usize,
        g: &[f32],
        stat: f64,
        scratch: &mut [f32],
    ) {
        let w = g.len();
        let state = &mut self.state[r * sp..(r + 1) * sp];
        if self.dtype.is_f32() {
            opt.apply(&mut self.data[r * w..(r + 1) * w], state, g, stat);
        } else {
            let (row, scratch) = (&mut self.half[r * w..(r + 1) * w], &mut scratch[..w]);
            self.dtype.widen(row, scratch);
            opt.apply(scratch, state, g, stat);
            self.dtype.narrow(scratch, row);
        }
    }

    /// Bytes of the rows and state held.
    pub fn bytes(&self) -> u64 {
        (self.data.len() * 4 + self.half.len() * 2 + self.state.len() * 4) as u64
    }
}

/// Where the shards of every table are, and this rank's pieces.
#[derive(Clone, Debug)]
pub struct Store {
    pub spec: ModelSpec,
    pub plan: Plan,
    pub rank: usize,
    pub opt: TableOpt,
    /// Every non-replicated shard of every table, in plan order ("slots"; the same on
    /// every rank).
    pub slots: Vec<Shard>,
    /// Per table: its slots (empty for a data-parallel table).
    pub table_slots: Vec<Vec<usize>>,
    /// Per rank: the slots it owns, ascending.
    pub owned: Vec<Vec<usize>>,
    /// Per slot: index into `local` when this rank owns it.
    pub slot_local: Vec<Option<usize>>,
    /// Per table: index into `local` of this rank's replica of a data-parallel table.
    pub replica: Vec<Option<usize>>,
    pub local: Vec<LocalShard>,
    /// Per table: this rank's shard of a hash table (its slots are the local rows of
    /// the table's row-cyclic shard here; see [`super::keys`]).
    pub hash: Vec<Option<HashShard>>,
    /// The seed of the initial rows (hash tables initialize a row when a key arrives).
    pub seed: u64,
}

/// The initial value of row `id` of table `t`: uniform in `±sqrt(1/vocab)` (TorchRec's
/// default), drawn from (seed, table, id), so that it does not depend on the placement.
pub fn init_row(
    seed: u64,
    t: usize,
    vocab: u64,
    id: u64,
    out: &mut [f32],
    cols: std::ops::Range<usize>,
) {
    let a = (1.0 / vocab as f64).sqrt();
    let mut rng = SplitMix64::for_id(seed, stream::EMB_INIT, ((t as u64) << 40) ^ id);
    for j in 0..cols.end {
        let v = ((rng.next_f64() * 2.0 - 1.0) * a) as f32;
        if j >= cols.start {
            out[j - cols.start] = v;
        }
    }
}

impl Store {
    /// This rank's shards of `plan`, initialized from `seed`. Fails (before any
    /// allocation) if they would not fit in `mem_limit` bytes.
    pub fn new(
        spec: &ModelSpec,
        plan: &Plan,
        rank: usize,
        opt: TableOpt,
        seed: u64,
        mem_limit: Option<u64>,
    ) -> Result<Store> {
        let mut s = Store::layout(spec, plan, rank, opt, mem_limit)?;
        s.seed = seed;
        for ls in &mut s.local {
            let t = ls.shard.table;
            if s.hash[t].is_some() {
                // Rows of hash tables are initialized as keys arrive.
                continue;
            }
            let vocab = spec.tables[t].vocab;
            let w = ls.shard.width();
            let rows = ls.shard.rows;
            let cols = ls.shard.cols.clone();
            if ls.dtype.is_f32() {
                ls.data
                    .par_chunks_mut(w.max(1) * 1024)
                    .enumerate()
                    .for_each(|(c, chunk)| {
                        for (k, row) in chunk.chunks_mut(w).enumerate() {
                            let local = (c * 1024 + k) as u64;
                            init_row(seed, t, vocab, rows.global(local), row, cols.clone());
                        }
                    });
                continue;
            }
            // 16 bits: each initial value rounded to nearest even.
            let dtype = ls.dtype;
            ls.half
                .par_chunks_mut(w.max(1) * 1024)
                .enumerate()
                .for_each(|(c, chunk)| {
                    let mut v = vec![0.0f32; w];
                    for (k, row) in chunk.chunks_mut(w).enumerate() {
                        let local = (c * 1024 + k) as u64;
                        init_row(seed, t, vocab, rows.global(local), &mut v, cols.clone());
                        dtype.narrow(&v, row);
                    }
                });
        }
        Ok(s)
    }

    /// The layout with zero-filled shards (for restoring a checkpoint).
    pub fn layout(
        spec: &ModelSpec,
        plan: &Plan,
        rank: usize,
        opt: TableOpt,
        mem_limit: Option<u64>,
    ) -> Result<Store> {
        if opt.state_per_element() > 0 {
            if let Some((t, _)) = plan
                .tables
                .iter()
                .enumerate()
                .find(|(_, p)| matches!(p, Placement::Column { .. }))
            {
                return Err(Error::Config(format!(
                    "table {:?} is placed column-wise, but --table-opt {} keeps state per element of a row: place it table-wise or row-wise, or use sgd, rowwise-adagrad or rowwise-adam",
                    spec.tables[t].name,
                    opt.name()
                )));
            }
        }
        let need = plan.bytes_per_rank_with(spec, opt)[rank];
        if let Some(limit) = mem_limit {
            if need > limit {
                return Err(Error::Config(format!(
                    "rank {rank}: the plan puts {need} bytes of tables and optimizer state \
                     here, more than --mem-per-rank {limit}"
                )));
            }
        }
        let mut slots = Vec::new();
        let mut table_slots = vec![Vec::new(); spec.tables.len()];
        let mut owned = vec![Vec::new(); plan.world];
        let mut slot_local = Vec::new();
        let mut replica = vec![None; spec.tables.len()];
        let mut local = Vec::new();
        for shard in plan.all_shards(spec) {
            let t = shard.table;
            let mine = shard.rank == rank;
            let idx = if mine {
                let rows = shard.rows.len(spec.tables[t].vocab);
                // Rows are read and updated at random: on huge pages a shard spans a
                // few TLB entries instead of one per row touched.
                let (n, dtype) = (rows as usize * shard.width(), spec.table_dtype);
                let (n32, n16) = if dtype.is_f32() { (n, 0) } else { (0, n) };
                local.push(LocalShard {
                    rows,
                    dtype,
                    data: crate::hugepages::huge_vec(n32, 0.0),
                    half: crate::hugepages::huge_vec(n16, 0u16),
                    state: crate::hugepages::huge_vec(
                        rows as usize * opt.state_per_row(shard.width()),
                        0.0,
                    ),
                    shard: shard.clone(),
                });
                Some(local.len() - 1)
            } else {
                None
            };
            if shard.replica {
                if mine {
                    replica[t] = idx;
                }
                continue;
            }
            owned[shard.rank].push(slots.len());
            table_slots[t].push(slots.len());
            slot_local.push(idx);
            slots.push(shard);
        }
        let mut rows_here = vec![None; spec.tables.len()];
        for (t, tab) in spec.tables.iter().enumerate() {
            if tab.vocab_kind != VocabKind::Hash {
                continue;
            }
            let k = match &plan.tables[t] {
                Placement::Table { .. } => 1,
                Placement::RowCyclic { ranks } => ranks.len(),
                p => {
                    return Err(Error::Config(format!(
                        "table {:?} is a hash table: its placement must be table-wise or row_cyclic (keys spread over the ranks by their hash), the plan has {}",
                        tab.name,
                        p.kind()
                    )))
                }
            };
            if tab.vocab < k as u64 {
                return Err(Error::Config(format!(
                    "hash table {:?}: capacity {} is less than one row per rank ({k} ranks)",
                    tab.name, tab.vocab
                )));
            }
            rows_here[t] = local.iter().find(|l| l.shard.table == t).map(|l| l.rows);
        }
        let hash = super::hashtab::local_hash_shards(spec, &rows_here)?;
        Ok(Store {
            spec: spec.clone(),
            plan: plan.clone(),
            rank,
            opt,
            slots,
            table_slots,
            owned,
            slot_local,
            replica,
            local,
            hash,
            seed: 0,
        })
    }

    /// The index into `local` of this rank's shard of hash table `t` (a hash table has
    /// at most one shard per rank: table-wise or row-cyclic).
    pub fn hash_local(&self, t: usize) -> Result<usize> {
        self.local
            .iter()
            .position(|l| l.shard.table == t)
            .ok_or_else(|| {
                Error::Comm(format!(
                    "rank {} holds no shard of hash table {t}",
                    self.rank
                ))
            })
    }

    /// Optimizer floats per row of table `t` (per-element state is refused for
    /// column shards, so every shard of such a table is `dim` wide).
    pub fn state_per_row(&self, t: usize) -> usize {
        self.opt.state_per_row(self.spec.tables[t].dim)
    }

    /// Whether table `t` is a hash table (whether or not this rank holds a shard).
    pub fn is_hash(&self, t: usize) -> bool {
        self.spec.tables[t].vocab_kind == VocabKind::Hash
    }

    pub fn is_replicated(&self, t: usize) -> bool {
        matches!(self.plan.tables[t], Placement::DataParallel)
    }

    /// The slot of table `t` that holds row `id` (row-wise and table-wise tables), or
    /// `None` when every slot of the table holds it (column-wise).
    #[inline]
    pub fn row_slot(&self, t: usize, id: u64) -> Option<usize> {
        let slots = &self.table_slots[t];
        match &self.plan.tables[t] {
            Placement::Table { .. } => Some(slots[0]),
            Placement::RowBlock { ranks } => {
                let vocab = self.spec.tables[t].vocab;
                let k = ranks.len() as u64;
                let (base, extra) = (vocab / k, vocab % k);
                let boundary = extra * (base + 1);
                let j = if id < boundary {
                    id / (base + 1)
                } else {
                    extra + (id - boundary) / base.max(1)
                };
                Some(slots[j as usize])
            }
            Placement::RowCyclic { ranks } => Some(slots[(id % ranks.len() as u64) as usize]),
            Placement::Column { .. } | Placement::DataParallel => None,
        }
    }

    /// The local row of global row `id` in slot `s`.
    #[inline]
    pub fn local_row(&self, s: usize, id: u64) -> u64 {
        self.slots[s].rows.local(id)
    }

    /// Bytes of rows and optimizer state held here.
    pub fn bytes(&self) -> u64 {
        self.local.iter().map(LocalShard::bytes).sum()
    }

    /// Full rows of table `t` that this rank holds, by global id (for tests and the
    /// model file): `(global id, column range, values)`.
    pub fn local_pieces(&self, t: usize) -> Vec<(u64, std::ops::Range<usize>, Vec<f32>)> {
        let mut out = Vec::new();
        for l in self.local.iter().filter(|l| l.shard.table == t) {
            for r in 0..l.rows {
                let mut v = vec![0.0; l.shard.width()];
                l.row_into(r, &mut v);
                out.push((l.shard.rows.global(r), l.shard.cols.clone(), v));
            }
        }
        out
    }

    pub fn rows_of(&self, shard: &Shard) -> Rows {
        shard.rows
    }
}

/// Column offset of each table's pooled vector in the MLP input.
pub fn input_offsets(store: &Store) -> Vec<usize> {
    let mut o = 0;
    store
        .spec
        .tables
        .iter()
        .map(|t| {
            let at = o;
            o += t.dim;
            at
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::preset;

    #[test]
    fn row_square_sums_in_blocks_give_the_bits_of_one_row_at_a_time() {
        let mut st = 7u64;
        let mut next = || {
            st = crate::rng::mix64(st);
            // Magnitudes 2^-20..2^20: the f64 sums round, so their order shows.
            let scale = 2f32.powi(((st >> 8) % 41) as i32 - 20);
            ((st >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0 * scale
        };
        for w in [1, 3, 8, 16, 63, 64] {
            for rows in [0, 1, 7, 8, 9, 17, 40] {
                let g: Vec<f32> = (0..rows * w).map(|_| next()).collect();
                let mut got = vec![-1.0];
                sq_sums_into(&g, w, &mut got);
                assert_eq!(got.len(), 1 + rows, "w {w} rows {rows}: appends");
                for (r, v) in got[1..].iter().enumerate() {
                    let want = sq_sum(&g[r * w..(r + 1) * w]);
                    assert_eq!(v.to_bits(), want.to_bits(), "w {w} rows {rows} row {r}");
                }
            }
        }
    }

    #[test]
    fn row_slot_matches_the_shards_rows() {
        let spec = preset("tiny", 1.0).unwrap();
        for world in 1..=4 {
            for kind in ["table", "row_block", "row_cyclic"] {
                let plan = Plan::uniform(&spec, world, kind).unwrap();
                let st = Store::layout(&spec, &plan, 0, TableOpt::Sgd { lr: 0.1, wd: 0.0 }, None)
                    .unwrap();
                for (t, ts) in spec.tables.iter().enumerate() {
                    for id in 0..ts.vocab {
                        let s = st.row_slot(t, id).unwrap();
                        let rows = st.slots[s].rows;
                        assert_eq!(rows.global(rows.local(id)), id);
                        assert!(
                            rows.local(id) < rows.len(ts.vocab),
                            "{kind} P={world} t={t} id={id}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn init_does_not_depend_on_the_placement() {
        let spec = preset("tiny", 1.0).unwrap();
        let full = |world: usize, kind: &str| {
            let plan = Plan::uniform(&spec, world, kind).unwrap();
            let mut tables: Vec<Vec<f32>> = spec
                .tables
                .iter()
                .map(|t| vec![f32::NAN; t.vocab as usize * t.dim])
                .collect();
            for r in 0..world {
                let st = Store::new(&spec, &plan, r, TableOpt::Sgd { lr: 0.1, wd: 0.0 }, 7, None)
                    .unwrap();
                for (t, ts) in spec.tables.iter().enumerate() {
                    for (id, cols, v) in st.local_pieces(t) {
                        let o = id as usize * ts.dim;
                        tables[t][o + cols.start..o + cols.end].copy_from_slice(&v);
                    }
                }
            }
            tables
        };
        let want = full(1, "table");
        assert!(want.iter().flatten().all(|v| v.is_finite()));
        for kind in ["row_block", "row_cyclic", "column", "data_parallel"] {
            assert_eq!(full(3, kind), want, "{kind}");
        }
    }

    #[test]
    fn memory_limit_is_enforced() {
        let spec = preset("tiny", 1.0).unwrap();
        let plan = Plan::uniform(&spec, 1, "table").unwrap();
        let opt = TableOpt::RowWiseAdagrad {
            lr: 0.1,
            eps: 1e-8,
            wd: 0.0,
        };
        let need = plan.bytes_per_rank(&spec, 1)[0];
        assert!(Store::layout(&spec, &plan, 0, opt, Some(need)).is_ok());
        let e = Store::layout(&spec, &plan, 0, opt, Some(need - 1)).unwrap_err();
        assert!(e.to_string().contains("--mem-per-rank"), "{e}");
        assert_eq!(
            Store::layout(&spec, &plan, 0, opt, None).unwrap().bytes(),
            need
        );
    }

    #[test]
    fn rowwise_adagrad_matches_hand_computation() {
        let opt = TableOpt::RowWiseAdagrad {
            lr: 0.5,
            eps: 0.0,
            wd: 0.0,
        };
        let mut row = [1.0f32, 2.0];
        let mut st = [1.0f32];
        let g = [3.0f32, 4.0];
        opt.apply(&mut row, &mut st, &g, row_stat(&g));
        // G = 1 + (9 + 16) / 2 = 13.5
        assert_eq!(st[0], 13.5);
        let m = 0.5 / 13.5f32.sqrt();
        assert_eq!(row, [1.0 - m * 3.0, 2.0 - m * 4.0]);
    }
}
