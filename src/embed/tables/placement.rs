//! Where each table lives: the plan format (JSON) and the shards it implies.
//!
//! A table is placed whole on one rank (table-wise), cut into row blocks or row
//! residues over some ranks (row-wise block or cyclic), cut into column ranges
//! (column-wise), or replicated on every rank (data-parallel).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::blocks::block_range;
use crate::spec::ModelSpec;
use crate::{Error, Result};

/// One column range of a column-wise table and the rank that holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnShard {
    pub rank: usize,
    /// `[start, end)` of the table's columns.
    pub cols: [usize; 2],
}

/// The placement of one table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Placement {
    /// The whole table on one rank.
    Table { rank: usize },
    /// Rows cut into `ranks.len()` contiguous blocks (`block_range`), block j on `ranks[j]`.
    RowBlock { ranks: Vec<usize> },
    /// Row `i` on `ranks[i % ranks.len()]`.
    RowCyclic { ranks: Vec<usize> },
    /// Column ranges that tile `0..dim`, in order.
    Column { shards: Vec<ColumnShard> },
    /// A full copy on every rank; its gradient joins the dense all-reduce.
    DataParallel,
}

impl Placement {
    pub fn kind(&self) -> &'static str {
        match self {
            Placement::Table { .. } => "table",
            Placement::RowBlock { .. } => "row_block",
            Placement::RowCyclic { .. } => "row_cyclic",
            Placement::Column { .. } => "column",
            Placement::DataParallel => "data_parallel",
        }
    }
}

/// How a table's lookups come back to the rank that asked (not for data-parallel
/// tables, which are pooled where they are).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputMode {
    /// Distinct ids go to the owners, their rows come back, the asking rank pools.
    #[default]
    Rows,
    /// The bags go to the owners (distinct ids and per-example occurrences), which
    /// pool their rows per example and return one partial pooled vector per example.
    Pooled,
}

impl OutputMode {
    pub fn name(&self) -> &'static str {
        match self {
            OutputMode::Rows => "rows",
            OutputMode::Pooled => "pooled",
        }
    }
}

/// Largest table (rows x width) a plan may replicate on every rank.
pub const MAX_REPLICATED: u64 = 1 << 26;

/// A complete plan: one placement per table of the model it was made for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Ranks the plan was made for.
    pub world: usize,
    /// [`ModelSpec::digest`] of the model it was made for.
    pub spec_digest: String,
    pub tables: Vec<Placement>,
    /// Per table, its output mode; empty means `rows` for every table (plans written
    /// before output modes existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modes: Vec<OutputMode>,
}

/// Which rows of a table a shard holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    All,
    /// Rows `lo..hi`.
    Block {
        lo: u64,
        hi: u64,
    },
    /// Rows `i` with `i % modulus == residue`.
    Cyclic {
        modulus: u64,
        residue: u64,
    },
}

impl Rows {
    /// Number of rows of a table of `vocab` rows that this selection holds.
    pub fn len(&self, vocab: u64) -> u64 {
        match *self {
            Rows::All => vocab,
            Rows::Block { lo, hi } => hi - lo,
            Rows::Cyclic { modulus, residue } => {
                if residue >= vocab {
                    0
                } else {
                    (vocab - residue).div_ceil(modulus)
                }
            }
        }
    }

    pub fn is_empty(&self, vocab: u64) -> bool {
        self.len(vocab) == 0
    }

    /// The local row index of global row `id` (which must be held).
    #[inline]
    pub fn local(&self, id: u64) -> u64 {
        match *self {
            Rows::All => id,
            Rows::Block { lo, .. } => id - lo,
            Rows::Cyclic { modulus, .. } => id / modulus,
        }
    }

    /// The global row of local row `i`.
    #[inline]
    pub fn global(&self, i: u64) -> u64 {
        match *self {
            Rows::All => i,
            Rows::Block { lo, .. } => lo + i,
            Rows::Cyclic { modulus, residue } => i * modulus + residue,
        }
    }
}

/// One piece of one table on one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub table: usize,
    pub rank: usize,
    pub rows: Rows,
    pub cols: Range<usize>,
    /// A data-parallel replica (every rank holds one; not looked up remotely).
    pub replica: bool,
}

impl Shard {
    pub fn width(&self) -> usize {
        self.cols.len()
    }
}

impl Plan {
    /// Check the plan against the model and the world: one placement per table, ranks
    /// in range, row placements over distinct ranks, column shards tiling `0..dim`.
    pub fn validate(&self, spec: &ModelSpec, world: usize, origin: &str) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(format!("plan {origin}: {msg}")));
        if self.world != world {
            return bad(format!(
                "made for {} ranks, this job has {world}",
                self.world
            ));
        }
        if self.spec_digest != spec.digest() {
            return bad(format!(
                "made for model {}, this model is {} (tables changed?)",
                self.spec_digest,
                spec.digest()
            ));
        }
        if self.tables.len() != spec.tables.len() {
            return bad(format!(
                "{} placements for {} tables",
                self.tables.len(),
                spec.tables.len()
            ));
        }
        if !self.modes.is_empty() && self.modes.len() != self.tables.len() {
            return bad(format!(
                "{} output modes for {} tables",
                self.modes.len(),
                self.tables.len()
            ));
        }
        for (t, (p, ts)) in self.tables.iter().zip(&spec.tables).enumerate() {
            let at = format!("table {t} ({:?})", ts.name);
            if self.mode(t) == OutputMode::Pooled && *p == Placement::DataParallel {
                return bad(format!(
                    "{at}: a data-parallel table is pooled where it is; output mode \"pooled\" \
                     is for sharded tables"
                ));
            }
            let check_ranks = |ranks: &[usize]| -> Result<()> {
                if ranks.is_empty() {
                    return bad(format!("{at}: no ranks"));
                }
                let mut seen = vec![false; world];
                for &r in ranks {
                    if r >= world {
                        return bad(format!("{at}: rank {r} out of range (world {world})"));
                    }
                    if std::mem::replace(&mut seen[r], true) {
                        return bad(format!("{at}: rank {r} listed twice"));
                    }
                }
                Ok(())
            };
            match p {
                Placement::Table { rank } => check_ranks(&[*rank])?,
                Placement::RowBlock { ranks } | Placement::RowCyclic { ranks } => {
                    check_ranks(ranks)?
                }
                Placement::Column { shards } => {
                    let mut next = 0;
                    for s in shards {
                        if s.rank >= world {
                            return bad(format!("{at}: rank {} out of range", s.rank));
                        }
                        if s.cols[0] != next || s.cols[1] <= s.cols[0] {
                            return bad(format!(
                                "{at}: column shards must tile 0..{} in order, got {:?}",
                                ts.dim, s.cols
                            ));
                        }
                        next = s.cols[1];
                    }
                    if next != ts.dim {
                        return bad(format!(
                            "{at}: column shards cover 0..{next}, table is {} wide",
                            ts.dim
                        ));
                    }
                }
                Placement::DataParallel => {
                    // Every rank holds the table, its gradient and a copy in the
                    // all-reduce buffer: only small tables.
                    if ts.vocab * ts.dim as u64 > MAX_REPLICATED {
                        return bad(format!(
                            "{at}: {} values is too large to replicate (at most {MAX_REPLICATED})",
                            ts.vocab * ts.dim as u64
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The output mode of table `t` (`rows` when the plan names none).
    pub fn mode(&self, t: usize) -> OutputMode {
        self.modes.get(t).copied().unwrap_or_default()
    }

    /// Every sharded table in `mode` (data-parallel tables keep `rows`).
    pub fn with_modes(mut self, mode: OutputMode) -> Plan {
        self.modes = self
            .tables
            .iter()
            .map(|p| match p {
                Placement::DataParallel => OutputMode::Rows,
                _ => mode,
            })
            .collect();
        self
    }

    /// The shards of table `t`, in a fixed order (the order of the placement).
    pub fn table_shards(&self, spec: &ModelSpec, t: usize) -> Vec<Shard> {
        let ts = &spec.tables[t];
        let shard = |rank, rows, cols: Range<usize>| Shard {
            table: t,
            rank,
            rows,
            cols,
            replica: false,
        };
        match &self.tables[t] {
            Placement::Table { rank } => vec![shard(*rank, Rows::All, 0..ts.dim)],
            Placement::RowBlock { ranks } => ranks
                .iter()
                .enumerate()
                .map(|(j, &r)| {
                    let (lo, hi) = block_range(ts.vocab, ranks.len(), j);
                    shard(r, Rows::Block { lo, hi }, 0..ts.dim)
                })
                .collect(),
            Placement::RowCyclic { ranks } => ranks
                .iter()
                .enumerate()
                .map(|(j, &r)| {
                    let rows = Rows::Cyclic {
                        modulus: ranks.len() as u64,
                        residue: j as u64,
                    };
                    shard(r, rows, 0..ts.dim)
                })
                .collect(),
            Placement::Column { shards } => shards
                .iter()
                .map(|s| shard(s.rank, Rows::All, s.cols[0]..s.cols[1]))
                .collect(),
            Placement::DataParallel => (0..self.world)
                .map(|r| Shard {
                    replica: true,
                    ..shard(r, Rows::All, 0..ts.dim)
                })
                .collect(),
        }
    }

    /// Every shard of every table, table by table.
    pub fn all_shards(&self, spec: &ModelSpec) -> Vec<Shard> {
        (0..self.tables.len())
            .flat_map(|t| self.table_shards(spec, t))
            .collect()
    }

    /// Bytes of rows (at the model's `table_dtype`: 4 or 2 bytes a value) and
    /// optimizer state (`state_floats_per_row` f32 per row of each shard) that each
    /// rank holds.
    pub fn bytes_per_rank(&self, spec: &ModelSpec, state_floats_per_row: u64) -> Vec<u64> {
        let mut b = vec![0u64; self.world];
        let elem = spec.table_dtype.bytes() as u64;
        for s in self.all_shards(spec) {
            let rows = s.rows.len(spec.tables[s.table].vocab);
            b[s.rank] += rows * (s.width() as u64 * elem + state_floats_per_row * 4);
            if spec.tables[s.table].vocab_kind == crate::spec::VocabKind::Hash {
                b[s.rank] += rows * super::hashtab::SLOT_BYTES;
            }
        }
        b
    }

    /// [`Plan::bytes_per_rank`] with the state of `opt`: its floats per row and per
    /// element of each shard's row.
    pub fn bytes_per_rank_with(
        &self,
        spec: &ModelSpec,
        opt: super::table_opt::TableOpt,
    ) -> Vec<u64> {
        let mut b = self.bytes_per_rank(spec, opt.state_fixed_per_row() as u64);
        let per_elem = opt.state_per_element() as u64;
        if per_elem > 0 {
            for s in self.all_shards(spec) {
                let rows = s.rows.len(spec.tables[s.table].vocab);
                b[s.rank] += rows * s.width() as u64 * per_elem * 4;
            }
        }
        b
    }

    /// The same placement for every table (for tests and `--plan KIND`).
    pub fn uniform(spec: &ModelSpec, world: usize, kind: &str) -> Result<Plan> {
        let all: Vec<usize> = (0..world).collect();
        let tables = spec
            .tables
            .iter()
            .enumerate()
            .map(|(t, ts)| {
                Ok(match kind {
                    "table" => Placement::Table { rank: t % world },
                    "row_block" => Placement::RowBlock { ranks: all.clone() },
                    "row_cyclic" => Placement::RowCyclic { ranks: all.clone() },
                    "column" => {
                        let k = world.min(ts.dim);
                        Placement::Column {
                            shards: (0..k)
                                .map(|j| {
                                    let (lo, hi) = block_range(ts.dim as u64, k, j);
                                    ColumnShard {
                                        rank: (t + j) % world,
                                        cols: [lo as usize, hi as usize],
                                    }
                                })
                                .collect(),
                        }
                    }
                    "data_parallel" => Placement::DataParallel,
                    _ => {
                        return Err(Error::Config(format!(
                            "unknown placement {kind:?} (table, row_block, row_cyclic, column, \
                             data_parallel)"
                        )))
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Plan {
            world,
            spec_digest: spec.digest(),
            tables,
            modes: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::preset;

    #[test]
    fn rows_local_global_round_trip() {
        let vocab = 23;
        for rows in [
            Rows::All,
            Rows::Block { lo: 5, hi: 12 },
            Rows::Cyclic {
                modulus: 4,
                residue: 3,
            },
            Rows::Cyclic {
                modulus: 30,
                residue: 25,
            },
        ] {
            let held: Vec<u64> = (0..vocab)
                .filter(|&i| match rows {
                    Rows::All => true,
                    Rows::Block { lo, hi } => (lo..hi).contains(&i),
                    Rows::Cyclic { modulus, residue } => i % modulus == residue,
                })
                .collect();
            assert_eq!(rows.len(vocab), held.len() as u64, "{rows:?}");
            for (k, &i) in held.iter().enumerate() {
                assert_eq!(rows.local(i), k as u64);
                assert_eq!(rows.global(k as u64), i);
            }
        }
    }

    #[test]
    fn uniform_plans_validate_and_cover_every_row_once() {
        let spec = preset("tiny", 1.0).unwrap();
        for world in 1..=4 {
            for kind in [
                "table",
                "row_block",
                "row_cyclic",
                "column",
                "data_parallel",
            ] {
                let plan = Plan::uniform(&spec, world, kind).unwrap();
                plan.validate(&spec, world, "test").unwrap();
                for (t, ts) in spec.tables.iter().enumerate() {
                    let shards = plan.table_shards(&spec, t);
                    let cells: u64 = shards
                        .iter()
                        .filter(|s| !s.replica || s.rank == 0)
                        .map(|s| s.rows.len(ts.vocab) * s.width() as u64)
                        .sum();
                    assert_eq!(cells, ts.vocab * ts.dim as u64, "{kind} P={world} t={t}");
                }
            }
        }
        let json = serde_json::to_string(&Plan::uniform(&spec, 3, "column").unwrap()).unwrap();
        let back: Plan = serde_json::from_str(&json).unwrap();
        assert_eq!(back, Plan::uniform(&spec, 3, "column").unwrap());
    }

    #[test]
    fn validate_refuses_bad_plans() {
        let spec = preset("tiny", 1.0).unwrap();
        let mut p = Plan::uniform(&spec, 2, "column").unwrap();
        assert!(p.validate(&spec, 3, "x").is_err());
        if let Placement::Column { shards } = &mut p.tables[0] {
            shards[1].cols[1] -= 1;
        }
        let e = p.validate(&spec, 2, "x").unwrap_err().to_string();
        assert!(e.contains("cover"), "{e}");
        let mut p = Plan::uniform(&spec, 2, "row_block").unwrap();
        p.tables[1] = Placement::RowBlock { ranks: vec![1, 1] };
        assert!(p.validate(&spec, 2, "x").is_err());
        p.tables[1] = Placement::Table { rank: 2 };
        assert!(p.validate(&spec, 2, "x").is_err());
    }
}
