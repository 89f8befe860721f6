//! The cost model: the cost of every piece of a placement on its rank, the checked
//! inputs it is computed from, and the report of a plan.

use serde::{Deserialize, Serialize};

use super::{PlanOptions, PlanReport};
use crate::blocks::block_range;
use crate::embed::tables::placement::{OutputMode, Placement, Plan, Rows};
use crate::embed::train::batch_stats::{BatchStats, TableStats};
use crate::spec::ModelSpec;
use crate::{Error, Result};

/// The machine constants of the cost model; calibrate them to a cluster (`--cost-model`
/// reads them from a JSON file, [`CostModel::from_file`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostModel {
    /// Bytes per second a rank exchanges over the network (all-to-all).
    pub net_bw: f64,
    /// Bytes per second of a rank's share of an all-reduce, counted as a ring
    /// all-reduce's `2 (n - 1) / n` times the vector (the replicated tables'
    /// gradients).
    pub allreduce_bw: f64,
    /// Bytes per second of a rank's table memory traffic.
    pub mem_bw: f64,
    /// Seconds per row lookup or update (hashing, indexing, a likely cache miss).
    pub lookup_s: f64,
    /// Fixed seconds per shard per step.
    pub shard_s: f64,
    /// Smallest memory access, in bytes (a cache line).
    pub line_bytes: f64,
    /// Multi-table interference: a rank holding `k` pieces of `B` bytes costs `1 +
    /// interference x` times the sum of their costs, `x`
    /// [`CostModel::interference_x_sized`]: the size factor of `B` over that of the
    /// pieces' cost-weighted mean size `sum c_i b_i / sum c_i`, less 1 (`1 - 1/k`
    /// without a size factor). A piece that does most of the rank's work has already
    /// paid its own size's factor; the pieces it shares the caches with raise its
    /// price only by the bytes they add. Fitted by `torusrec calibrate` (0: costs add
    /// up). Priced per table count alone (`1 - 1/k`, 0.89 on an AVX-512 Xeon at 2
    /// ranks), the 43 tables of about 100 MiB a rank of dlrm-synthetic holds were
    /// predicted at 1.4 times their measured embedding phases; priced at the plain
    /// mean size `B / k`, a rank of the skewed workload (a few large hot tables doing
    /// the work, many small cold ones) was charged the cold tables' small size and
    /// predicted 80 % above its measured embedding phases (`docs/calibrate.md`).
    pub interference: f64,
    /// The interference law's variable is `1 - 1/k` (the table count) even with a
    /// size factor. `torusrec calibrate`'s fit sets it when the size law cannot see
    /// the interference its together training steps measure: on an AMD EPYC at 2
    /// ranks the size points fell beyond the reference size (268 MB at 0.59 of 67
    /// MB), so the 8 tables of 67 MB a rank had no variable under the size law,
    /// while their steps took 18 % (pooled) and 21 % (`rows`) more than the model
    /// without interference. False by default.
    pub interference_count: bool,
    /// The interference of the owners' pieces in the `rows` mode (and of replicas),
    /// where it differs from [`CostModel::interference`], which then prices the
    /// `pooled` pieces only; the same law and variable. `torusrec calibrate` fits
    /// each mode's from its together point: at 2 ranks on an AMD EPYC, 8 tables of 64
    /// MiB a rank cost 1.26-1.29 times one table's step in the `rows` mode and
    /// 1.01-1.10 times in the `pooled` mode in three calibrations, so one shared
    /// value under-priced the all-`rows` plans (lookup-greedy's) by 24-36 % at
    /// skewed (`docs/calibrate.md`). None (the default): `interference` for both.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interference_rows: Option<f64>,
    /// The asking side of a `rows` table pays, per occurrence, what the calibrated
    /// kernels pay per id: a gather to pool it from the received rows (`lookup_s +
    /// a / mem_bw`) and a scatter to add its gradient (`lookup_s + 2 a / mem_bw`), `a`
    /// the bytes of a row access. Without it (the defaults) an occurrence costs
    /// `2 a / mem_bw`, streamed bytes only. `torusrec calibrate`'s fit sets it: its
    /// per-id seconds are those kernels' (pool_bags, scatter_bags). At 2 ranks, the
    /// all-`rows` plans' embedding phases took 58 (torchrec-peer) and 81 (skewed) ns
    /// per occurrence more than the streamed-bytes price; the kernels' per-id
    /// seconds add about 50 at width 64.
    pub ask_row_access: bool,
    /// Measured correction of the row-access seconds (memory traffic and lookups) per
    /// embedding width: `[width, factor]` pairs, sorted by width; a piece of width `w`
    /// takes the factor of the nearest width (in log scale). Empty: factor 1.
    pub width_factor: Vec<[f64; 2]>,
    /// Measured correction of the row-access seconds per table size: `[bytes,
    /// factor]` pairs, sorted by bytes, the factor 1 at the size the rest was
    /// calibrated at. A piece whose rows take `b` bytes (`rows x width x 4`) takes
    /// the factor interpolated linearly in `ln b`, clamped to the end points beyond
    /// them. Caches and the TLB make a row of a small table far cheaper than a row
    /// of a large one: at 2 ranks on this project's machine a uniform id cost 0.4,
    /// 0.6, 1 and 1.7 times as much in tables of 1, 8, 64 and 256 MB. Empty:
    /// factor 1.
    pub size_factor: Vec<[f64; 2]>,
    /// Whether a `pooled` piece's owner seconds are the measured path's
    /// (`pooled_occ_s` per occurrence it sees, `pooled_example_s` per example it
    /// serves, its exchange and `shard_s`) instead of row accesses and bytes.
    /// `torusrec calibrate` sets it when it measured pooled training steps
    /// ([`crate::embed::calibrate::PooledPoint`]); false by default.
    pub pooled_measured: bool,
    /// Seconds per occurrence a `pooled` piece sees (with `pooled_measured`): the
    /// row's gather and scatter, the request's index, the merge over sources, the
    /// index the asking rank builds per piece. A table cut into `k` column pieces
    /// pays it `k` times per occurrence (every piece sees every occurrence); the
    /// pooled steps measured at 2 ranks took about twice as long in 2 column pieces
    /// as whole, where the row-access pricing gave 1.6 times.
    pub pooled_occ_s: f64,
    /// Seconds per occurrence and float of the piece's width (with
    /// `pooled_measured`): an occurrence of a piece of width `w` costs
    /// `pooled_occ_s + w pooled_occ_float_s`.
    pub pooled_occ_float_s: f64,
    /// Seconds per example a `pooled` piece serves (with `pooled_measured`): the
    /// per-example counts and offsets, the partial sum written, sent and added, the
    /// gradient scattered back. Every piece serves every example of the batch, so a
    /// table cut into `k` pieces (columns or row blocks) pays it `k` times.
    pub pooled_example_s: f64,
    /// Measured correction of a `pooled` piece's per-occurrence seconds by its
    /// table's bytes (`vocab x dim x 4`, whatever the piece): `[bytes, factor]`
    /// sorted by bytes, 1 at the size the rest was calibrated at, interpolated as
    /// [`CostModel::size_factor`]. A pooled step of two 1M-row tables of width 64
    /// took 1.5 times as long as one of two 262k-row tables. Empty: factor 1.
    pub pooled_size_factor: Vec<[f64; 2]>,
    /// Measured correction, per width, of the asking side's per-occurrence row
    /// accesses of a `rows` table (with `ask_row_access`): `[width, factor]`, a
    /// width taking the nearest measured one's. The occurrences of a batch repeat
    /// its hot ids, whose rows the asking rank finds in cache: the calibrated Zipf
    /// ids' per-id seconds over uniform ids' (`calibrate`'s `fit.zipf_ratio`, 0.5
    /// to 0.75 at 2 ranks). Without it an all-`rows` plan of torchrec-peer was
    /// predicted 24 % slower than measured. Empty: factor 1.
    pub ask_zipf_factor: Vec<[f64; 2]>,
    /// Whether the asking side of a `rows` table is priced from measured `rows`
    /// training steps (`ask_occ_s + w ask_occ_float_s` per occurrence of a table of
    /// width `w`, `ask_example_s` per example) instead of the kernels' row accesses.
    /// `torusrec calibrate` sets it when it measured `rows` steps
    /// ([`crate::embed::calibrate::PooledPoint`] with mode `rows`): what those steps took beyond
    /// the owners' modelled work, which is placing the received rows, pooling every
    /// occurrence from them, adding every occurrence's gradient and sending the
    /// distinct ones back. At 2 ranks the all-`rows` plan of the skewed workload (4
    /// tables of 30 ids per example) measured 85 to 92 ms per step in the embedding
    /// phases against 63 ms priced from the kernels. False by default.
    pub ask_measured: bool,
    /// Seconds per occurrence the asking rank of a `rows` table pays (with
    /// `ask_measured`).
    pub ask_occ_s: f64,
    /// Seconds per occurrence and float of the table's width (with `ask_measured`).
    pub ask_occ_float_s: f64,
    /// Seconds per example (with `ask_measured`): the example's output row of the
    /// table written and its gradient read.
    pub ask_example_s: f64,
    /// Measured correction of a `rows` table's owner seconds (its row accesses and
    /// lookups, on top of the per-id [`CostModel::size_factor`]) by the table's bytes
    /// (`vocab x dim x 4`, whatever the piece): `[bytes, factor]` sorted by bytes, 1
    /// at the size the rest was calibrated at and below it, interpolated as
    /// [`CostModel::size_factor`]. `torusrec calibrate` fits it to whole `rows`
    /// tables trained at larger sizes than the reference. The owners look up a
    /// batch's distinct ids, new rows every step, where the kernel points behind the
    /// per-id size factor time the same ids in every call. At 2 ranks (width 64,
    /// pooling 32, Zipf ids) a 256 MiB table's step measured 43.5 ms against 41.4 ms
    /// modelled without it, a factor of 1.41 on the owners. Smaller tables' steps
    /// cost less than modelled too (1 and 4 MiB: 7.8 and 15.7 ms against 25.4 and
    /// 29.0), but that is their asking side's (it pools from few distinct rows), and
    /// priced by it, the skewed workload's 28 cold tables (pooling 1) went to `rows`
    /// and measured slower than pooled (docs/calibrate.md). Empty: factor 1.
    pub rows_size_factor: Vec<[f64; 2]>,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            net_bw: 5e9,
            allreduce_bw: 5e9,
            mem_bw: 10e9,
            lookup_s: 20e-9,
            shard_s: 10e-6,
            line_bytes: 64.0,
            interference: 0.0,
            interference_count: false,
            interference_rows: None,
            ask_row_access: false,
            width_factor: Vec::new(),
            size_factor: Vec::new(),
            pooled_measured: false,
            pooled_occ_s: 0.0,
            pooled_occ_float_s: 0.0,
            pooled_example_s: 0.0,
            pooled_size_factor: Vec::new(),
            ask_zipf_factor: Vec::new(),
            ask_measured: false,
            ask_occ_s: 0.0,
            ask_occ_float_s: 0.0,
            ask_example_s: 0.0,
            rows_size_factor: Vec::new(),
        }
    }
}

impl CostModel {
    /// The constants in JSON file `path` (an object with any of the fields; a missing
    /// one keeps its default), checked: bandwidths and the line finite and > 0, the
    /// seconds finite and >= 0.
    pub fn from_file(path: &std::path::Path) -> Result<CostModel> {
        let text = crate::error::read_text(path)?;
        let m: CostModel = serde_json::from_str(&text)
            .map_err(|e| Error::input(path, format!("not a cost model: {e}")))?;
        m.check().map_err(|msg| Error::input(path, msg))?;
        Ok(m)
    }

    /// Every constant usable: the name and value of the first that is not.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        let positive = [
            ("net_bw", self.net_bw),
            ("allreduce_bw", self.allreduce_bw),
            ("mem_bw", self.mem_bw),
            ("line_bytes", self.line_bytes),
        ];
        for (name, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{name} {v}: must be a finite number > 0"));
            }
        }
        for (name, v) in [
            ("lookup_s", self.lookup_s),
            ("shard_s", self.shard_s),
            ("interference", self.interference),
            ("interference_rows", self.rows_interference()),
            ("pooled_occ_s", self.pooled_occ_s),
            ("pooled_occ_float_s", self.pooled_occ_float_s),
            ("pooled_example_s", self.pooled_example_s),
            ("ask_occ_s", self.ask_occ_s),
            ("ask_occ_float_s", self.ask_occ_float_s),
            ("ask_example_s", self.ask_example_s),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} {v}: must be a finite number >= 0"));
            }
        }
        for (name, v) in [
            ("width_factor", &self.width_factor),
            ("ask_zipf_factor", &self.ask_zipf_factor),
        ] {
            check_pairs(name, v, "width", "widths")?;
        }
        for (name, v) in [
            ("size_factor", &self.size_factor),
            ("pooled_size_factor", &self.pooled_size_factor),
            ("rows_size_factor", &self.rows_size_factor),
        ] {
            check_pairs(name, v, "bytes", "sizes")?;
        }
        Ok(())
    }

    /// The measured correction of row-access seconds at width `w` (1 without one).
    pub fn factor(&self, w: usize) -> f64 {
        nearest_width(&self.width_factor, w)
    }

    /// The asking side's per-occurrence correction at width `w`
    /// ([`CostModel::ask_zipf_factor`]; 1 without one).
    pub fn ask_zipf_at(&self, w: usize) -> f64 {
        nearest_width(&self.ask_zipf_factor, w)
    }

    /// The measured correction of row-access seconds in a table piece of `bytes`
    /// bytes of rows (1 without one): linear in `ln bytes` between the measured
    /// sizes, the end factors beyond them.
    pub fn size_factor_at(&self, bytes: f64) -> f64 {
        interpolate_ln(&self.size_factor, bytes)
    }

    /// The measured correction of a `pooled` piece's per-occurrence seconds in a
    /// table of `bytes` ([`CostModel::pooled_size_factor`]; 1 without one).
    pub fn pooled_size_factor_at(&self, bytes: f64) -> f64 {
        interpolate_ln(&self.pooled_size_factor, bytes)
    }

    /// The measured correction of a `rows` table's owner seconds in a table of
    /// `bytes` ([`CostModel::rows_size_factor`]; 1 without one).
    pub fn rows_size_factor_at(&self, bytes: f64) -> f64 {
        interpolate_ln(&self.rows_size_factor, bytes)
    }

    /// The cost of a rank whose pieces cost `sum` seconds together, `pieces` of them
    /// of equal size holding `bytes`, under multi-table interference: `sum (1 +
    /// interference x)` with `x` [`CostModel::interference_x`].
    pub fn with_interference(&self, sum: f64, pieces: usize, bytes: f64) -> f64 {
        self.with_interference_sized(sum, pieces, bytes, bytes / pieces.max(1) as f64)
    }

    /// The interference of the `rows` pieces: [`CostModel::interference_rows`], or
    /// [`CostModel::interference`] without one.
    pub fn rows_interference(&self) -> f64 {
        self.interference_rows.unwrap_or(self.interference)
    }

    /// [`CostModel::with_interference`] for pieces all in the `rows` mode (`rows`)
    /// or all in the `pooled` mode: at that mode's interference.
    pub fn with_interference_mode(&self, sum: f64, pieces: usize, bytes: f64, rows: bool) -> f64 {
        let beta = if rows {
            self.rows_interference()
        } else {
            self.interference
        };
        self.interfered(beta, sum, pieces, bytes, bytes / pieces.max(1) as f64)
    }

    /// The cost of a rank whose pieces cost `sum` seconds, `rows` of them in the
    /// `rows` mode (or replicas), `pieces` in all of cost-weighted mean size `size`
    /// holding `bytes`: each mode's pieces at `1 +` that mode's interference times
    /// `x` ([`CostModel::interference_x_sized`], the same for both: they share the
    /// caches).
    pub fn with_interference_split(
        &self,
        sum: f64,
        rows: f64,
        pieces: usize,
        bytes: f64,
        size: f64,
    ) -> f64 {
        let (bp, br) = (self.interference, self.rows_interference());
        if (bp == 0.0 && br == 0.0) || pieces < 2 {
            return sum;
        }
        if self.interference_rows.is_none() {
            return self.with_interference_sized(sum, pieces, bytes, size);
        }
        let x = self.interference_x_sized(pieces, bytes, size);
        (sum - rows) * (1.0 + bp * x) + rows * (1.0 + br * x)
    }

    /// [`CostModel::with_interference`] for pieces of cost-weighted mean size `size`
    /// (`sum c_i b_i / sum c_i`): `x` is [`CostModel::interference_x_sized`].
    pub fn with_interference_sized(&self, sum: f64, pieces: usize, bytes: f64, size: f64) -> f64 {
        self.interfered(self.interference, sum, pieces, bytes, size)
    }

    /// `sum (1 + beta x)`, `x` [`CostModel::interference_x_sized`]; `sum` for one
    /// piece or `beta` 0.
    fn interfered(&self, beta: f64, sum: f64, pieces: usize, bytes: f64, size: f64) -> f64 {
        if beta == 0.0 || pieces < 2 {
            sum
        } else {
            sum * (1.0 + beta * self.interference_x_sized(pieces, bytes, size))
        }
    }

    /// The variable of the interference law for `k` pieces of equal size holding
    /// `bytes` together: [`CostModel::interference_x_sized`] at size `bytes / k`.
    pub fn interference_x(&self, k: usize, bytes: f64) -> f64 {
        self.interference_x_sized(k, bytes, bytes / k.max(1) as f64)
    }

    /// The variable of the interference law for `k` pieces holding `bytes` together
    /// on a rank, of cost-weighted mean size `size`: how much more a row access costs
    /// in a table of all their bytes than in one of `size`, `size_factor(bytes) /
    /// size_factor(size) - 1` (the pieces share the caches as one table of their
    /// bytes would), at least 0; without a size factor, or with
    /// [`CostModel::interference_count`], `1 - 1/k`. 0 for one piece. A `size` that
    /// is not a finite number > 0 is taken as `bytes / k`.
    pub fn interference_x_sized(&self, k: usize, bytes: f64, size: f64) -> f64 {
        if k < 2 {
            return 0.0;
        }
        if self.interference_count || self.size_factor.is_empty() || bytes.is_nan() || bytes <= 0.0
        {
            return interference_x(k);
        }
        let size = if size.is_finite() && size > 0.0 {
            size
        } else {
            bytes / k as f64
        };
        let together = self.size_factor_at(bytes);
        let alone = self.size_factor_at(size);
        (together / alone - 1.0).max(0.0)
    }

    /// Bytes moved by one access to a row of `w` floats.
    fn access(&self, w: usize) -> f64 {
        (4.0 * w as f64).max(self.line_bytes)
    }
}

/// `[x, factor]` pairs of field `name` usable: each `x` (a `key`) finite and >= 1 and
/// increasing (`keys` must increase), each factor finite and > 0.
fn check_pairs(
    name: &str,
    v: &[[f64; 2]],
    key: &str,
    keys: &str,
) -> std::result::Result<(), String> {
    for (i, [x, f]) in v.iter().enumerate() {
        if !(x.is_finite() && *x >= 1.0) {
            return Err(format!("{name}[{i}] {key} {x}: must be >= 1"));
        }
        if !(f.is_finite() && *f > 0.0) {
            return Err(format!(
                "{name}[{i}] factor {f}: must be a finite number > 0"
            ));
        }
        if i > 0 && v[i - 1][0] >= *x {
            return Err(format!("{name}[{i}] {key} {x}: {keys} must increase"));
        }
    }
    Ok(())
}

/// The factor of the width nearest `w` (in log scale) among `[width, factor]`
/// pairs; 1 when empty.
fn nearest_width(v: &[[f64; 2]], w: usize) -> f64 {
    let lw = (w.max(1) as f64).ln();
    let mut best = (f64::INFINITY, 1.0);
    for &[mw, f] in v {
        let d = (mw.ln() - lw).abs();
        if d < best.0 {
            best = (d, f);
        }
    }
    best.1
}

/// `[x, factor]` pairs sorted by `x`, at `x`: linear in `ln x` between them, the end
/// factors beyond them; 1 when empty.
fn interpolate_ln(sf: &[[f64; 2]], bytes: f64) -> f64 {
    let (Some(first), Some(last)) = (sf.first(), sf.last()) else {
        return 1.0;
    };
    if bytes <= first[0] {
        return first[1];
    }
    if bytes >= last[0] {
        return last[1];
    }
    let x = bytes.ln();
    for w in sf.windows(2) {
        let ([b0, f0], [b1, f1]) = (w[0], w[1]);
        if bytes <= b1 {
            let t = (x - b0.ln()) / (b1.ln() - b0.ln());
            return f0 + t * (f1 - f0);
        }
    }
    last[1]
}

/// The variable of the interference law for `k` tables together: `1 - 1/k` (0 for
/// one table, tending to 1); [`CostModel::with_interference`] and the fit
/// ([`crate::embed::calibrate::fit`]) share it.
pub(crate) fn interference_x(k: usize) -> f64 {
    1.0 - 1.0 / k.max(1) as f64
}

/// One piece of a placement: the rank, rows and width it holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Piece {
    pub(super) rank: usize,
    pub(super) rows: u64,
    pub(super) width: usize,
    pub(super) replica: bool,
}

/// The pieces of placement `p` of a table of `vocab` rows and width `dim` (the same
/// shards as [`Plan::table_shards`]).
pub(super) fn pieces(vocab: u64, dim: usize, world: usize, p: &Placement) -> Vec<Piece> {
    let piece = |rank, rows, width| Piece {
        rank,
        rows,
        width,
        replica: false,
    };
    match p {
        Placement::Table { rank } => vec![piece(*rank, vocab, dim)],
        Placement::RowBlock { ranks } => ranks
            .iter()
            .enumerate()
            .map(|(j, &r)| {
                let (lo, hi) = block_range(vocab, ranks.len(), j);
                piece(r, hi - lo, dim)
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
                piece(r, rows.len(vocab), dim)
            })
            .collect(),
        Placement::Column { shards } => shards
            .iter()
            .map(|s| piece(s.rank, vocab, s.cols[1] - s.cols[0]))
            .collect(),
        Placement::DataParallel => (0..world)
            .map(|r| Piece {
                replica: true,
                ..piece(r, vocab, dim)
            })
            .collect(),
    }
}

/// The modelled cost of a table's two output modes, summed over all ranks, per step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ModeCosts {
    pub rows_seconds: f64,
    pub pooled_seconds: f64,
    /// Bytes exchanged (all ranks, both directions of lookup and backward).
    pub rows_bytes: f64,
    pub pooled_bytes: f64,
}

impl ModeCosts {
    /// The seconds of `mode`.
    pub fn seconds(&self, mode: OutputMode) -> f64 {
        match mode {
            OutputMode::Rows => self.rows_seconds,
            OutputMode::Pooled => self.pooled_seconds,
        }
    }
}

/// What each rank gains from one placement: `(rank, seconds, bytes, rows)`, `rows`
/// when the piece is priced in the `rows` mode (or is a replica).
pub(super) type Contrib = Vec<(usize, f64, u64, bool)>;

/// Per rank, what the owners' pieces placed so far add up to: their seconds, bytes
/// and number, and the sum of each piece's seconds times its bytes (the
/// interference law's cost-weighted mean size is `weighted / cost`).
#[derive(Clone, Debug)]
pub(super) struct Load {
    pub(super) cost: Vec<f64>,
    pub(super) bytes: Vec<u64>,
    pub(super) count: Vec<usize>,
    pub(super) weighted: Vec<f64>,
    /// The seconds of the pieces in the `rows` mode (or replicas).
    pub(super) rows: Vec<f64>,
}

impl Load {
    pub(super) fn new(world: usize) -> Load {
        Load {
            cost: vec![0.0; world],
            bytes: vec![0; world],
            count: vec![0; world],
            weighted: vec![0.0; world],
            rows: vec![0.0; world],
        }
    }

    /// Adds pieces `c`.
    pub(super) fn add(&mut self, c: &Contrib) {
        for &(r, x, y, rows) in c {
            self.cost[r] += x;
            self.bytes[r] += y;
            self.count[r] += 1;
            self.weighted[r] += x * y as f64;
            if rows {
                self.rows[r] += x;
            }
        }
    }

    /// Removes pieces `c` (added before).
    pub(super) fn remove(&mut self, c: &Contrib) {
        for &(r, x, y, rows) in c {
            self.cost[r] -= x;
            self.bytes[r] -= y;
            self.count[r] -= 1;
            self.weighted[r] -= x * y as f64;
            if rows {
                self.rows[r] -= x;
            }
        }
    }

    /// This load with pieces `c` added.
    pub(super) fn with(&self, c: &Contrib) -> Load {
        let mut l = self.clone();
        l.add(c);
        l
    }
}

/// The model, the stats and the world, checked against each other.
pub(super) struct Ctx<'a> {
    pub(super) spec: &'a ModelSpec,
    pub(super) stats: &'a [TableStats],
    pub(super) world: usize,
    batch_per_rank: f64,
    state: u64,
    model: &'a CostModel,
    /// The output mode each table's owner cost is charged in while placements are
    /// searched ([`Ctx::contrib`]); empty: `rows` for every table.
    pub(super) search_modes: Vec<OutputMode>,
}

impl<'a> Ctx<'a> {
    fn new(
        spec: &'a ModelSpec,
        stats: &'a BatchStats,
        world: usize,
        state: u64,
        model: &'a CostModel,
    ) -> Self {
        Ctx {
            spec,
            stats: &stats.tables,
            world,
            batch_per_rank: stats.batch_per_rank as f64,
            state,
            model,
            search_modes: Vec::new(),
        }
    }

    /// This context with the placement search charging table `t` in `modes[t]`.
    pub(super) fn searching_in(&self, modes: Vec<OutputMode>) -> Ctx<'a> {
        Ctx {
            search_modes: modes,
            ..*self
        }
    }

    /// Per table, the mode that costs less over all ranks when the table is placed
    /// whole on one rank (the placement the search starts from): what the search
    /// charges on its mode-aware pass. Data-parallel tables are never pooled.
    pub(super) fn preferred_modes(&self) -> Vec<OutputMode> {
        let whole = Placement::Table { rank: 0 };
        (0..self.n_tables())
            .map(|t| {
                let c = self.mode_costs(t, &whole);
                if c.seconds(OutputMode::Pooled) < c.seconds(OutputMode::Rows) {
                    OutputMode::Pooled
                } else {
                    OutputMode::Rows
                }
            })
            .collect()
    }

    pub(super) fn n_tables(&self) -> usize {
        self.spec.tables.len()
    }

    /// Owner-side seconds and bytes exchanged of piece `p` of table `t` in the
    /// `pooled` mode (see the module documentation of `planner`).
    fn pooled_piece(&self, t: usize, p: &Piece) -> (f64, f64) {
        let (ts, st, m) = (&self.spec.tables[t], &self.stats[t], self.model);
        let n = self.world as f64;
        let f = p.rows as f64 / ts.vocab as f64;
        let n_in = n * st.unique_per_rank_batch * f;
        let o_in = n * self.batch_per_rank * st.mean_valency * f;
        let examples = n * self.batch_per_rank;
        let w = p.width as f64;
        let exchanged = 4.0 * n_in + 4.0 * o_in + 4.0 * examples + 8.0 * examples * w;
        let transfer = self.exchange_seconds(exchanged);
        let secs = if m.pooled_measured {
            // At the whole table's bytes: a row block's ids are no fewer misses when
            // the hot ids are few (at skewed, row blocks measured 1.6-1.8 times
            // busier on one rank than the other).
            let size = m.pooled_size_factor_at(ts.bytes_at(self.spec.table_dtype) as f64);
            let per_occ = (m.pooled_occ_s + w * m.pooled_occ_float_s) * size;
            transfer + o_in * per_occ + examples * m.pooled_example_s + m.shard_s
        } else {
            let memory = o_in * (m.access(p.width) + 4.0 * w)
                + n_in * (2.0 * m.access(p.width) + 4.0 * self.state as f64);
            // Distinct rows are looked up (a likely miss) once to pool and once to
            // update; repeated occurrences hit the cache, as in the asking side of
            // `rows`.
            let lookups = 2.0 * n_in;
            self.owner_seconds(transfer, memory, lookups, p)
        };
        (secs, exchanged)
    }

    /// Seconds every rank spends asking for sharded table `t` under placement `p` in
    /// `mode`: deduplicating its ids (both modes); `rows`: placing the received rows,
    /// pooling every occurrence from them, adding every occurrence's gradient and
    /// reading the distinct gradients to send; `pooled`: adding the partial sums of
    /// the table's pieces and scaling the gradient per example.
    pub(super) fn ask_cost(&self, t: usize, p: &Placement, mode: OutputMode) -> f64 {
        if *p == Placement::DataParallel {
            return 0.0;
        }
        let (ts, st, m) = (&self.spec.tables[t], &self.stats[t], self.model);
        let (b, v, u) = (
            self.batch_per_rank,
            st.mean_valency,
            st.unique_per_rank_batch,
        );
        let dedup = b * v * m.lookup_s;
        if mode == OutputMode::Rows && m.ask_measured {
            // Measured whole (deduplication included): no kernel corrections.
            let w = ts.dim as f64;
            return b * v * (m.ask_occ_s + w * m.ask_occ_float_s) + b * m.ask_example_s;
        }
        let secs = match mode {
            OutputMode::Rows if m.ask_row_access => {
                // Per occurrence a gather and a scatter of a row, as calibrated (at
                // the Zipf ids' rate when measured).
                let a = m.access(ts.dim);
                let z = m.ask_zipf_at(ts.dim);
                b * v * (2.0 * m.lookup_s + 3.0 * a / m.mem_bw) * z + 2.0 * u * a / m.mem_bw + dedup
            }
            OutputMode::Rows => {
                let a = m.access(ts.dim);
                (2.0 * b * v * a + 2.0 * u * a) / m.mem_bw + dedup
            }
            OutputMode::Pooled => {
                let k = pieces(ts.vocab, ts.dim, self.world, p).len() as f64;
                (k + 1.0) * b * 4.0 * ts.dim as f64 / m.mem_bw + dedup
            }
        };
        if m.width_factor.is_empty() {
            secs
        } else {
            secs * m.factor(ts.dim)
        }
    }

    /// Both output modes of table `t` under placement `p`, over all ranks per step,
    /// the asking ranks' work included.
    pub(super) fn mode_costs(&self, t: usize, p: &Placement) -> ModeCosts {
        let (ts, st) = (&self.spec.tables[t], &self.stats[t]);
        let n = self.world as f64;
        let u = st.unique_per_rank_batch;
        let ps = pieces(ts.vocab, ts.dim, self.world, p);
        let mut c = ModeCosts {
            rows_seconds: n * self.ask_cost(t, p, OutputMode::Rows),
            pooled_seconds: n * self.ask_cost(t, p, OutputMode::Pooled),
            ..ModeCosts::default()
        };
        for pc in &ps {
            let f = pc.rows as f64 / ts.vocab as f64;
            let n_in = n * u * f;
            c.rows_seconds += self.piece_cost(t, pc);
            c.rows_bytes += n_in * (4.0 + self.row_and_grad_bytes() * pc.width as f64);
            let (secs, bytes) = self.pooled_piece(t, pc);
            c.pooled_seconds += secs;
            c.pooled_bytes += bytes;
        }
        c
    }

    /// Bytes per column that the `rows` mode moves for one distinct id: its row at
    /// the table's dtype forward, its f32 gradient back (8 at f32, 6 at bf16/f16).
    fn row_and_grad_bytes(&self) -> f64 {
        self.spec.table_dtype.bytes() as f64 + 4.0
    }

    fn piece_cost(&self, t: usize, p: &Piece) -> f64 {
        let (ts, st, m) = (&self.spec.tables[t], &self.stats[t], self.model);
        let n = self.world as f64;
        let state_bytes = 4.0 * self.state as f64;
        if p.replica {
            let (v, d) = (ts.vocab as f64, ts.dim as f64);
            let ids = self.batch_per_rank * st.mean_valency;
            let reduced = 2.0 * v * d * 4.0 * (n - 1.0) / n;
            let memory = ids * m.access(ts.dim) + v * (3.0 * m.access(ts.dim) + state_bytes);
            return self.owner_seconds(reduced / m.allreduce_bw, memory, ids, p);
        }
        let n_in = n * st.unique_per_rank_batch * p.rows as f64 / ts.vocab as f64;
        let exchanged = n_in * (4.0 + self.row_and_grad_bytes() * p.width as f64);
        let memory = n_in * (3.0 * m.access(p.width) + state_bytes);
        let transfer = self.exchange_seconds(exchanged);
        if m.rows_size_factor.is_empty() {
            return self.owner_seconds(transfer, memory, 2.0 * n_in, p);
        }
        let rows = m.rows_size_factor_at(ts.bytes_at(self.spec.table_dtype) as f64);
        self.owner_seconds_at(transfer, memory * rows, 2.0 * n_in * rows, p)
    }

    /// Piece `p`'s seconds on its owner: `transfer` seconds of communication,
    /// `memory` bytes of table traffic, `lookups` row lookups or updates (priced at
    /// the piece's width and size), and the fixed cost of one shard.
    fn owner_seconds(&self, transfer: f64, memory: f64, lookups: f64, p: &Piece) -> f64 {
        let m = self.model;
        if m.width_factor.is_empty() && m.size_factor.is_empty() {
            // The analytic model's sum, in its order (its plans keep their bits).
            return transfer + memory / m.mem_bw + lookups * m.lookup_s + m.shard_s;
        }
        self.owner_seconds_at(transfer, memory, lookups, p)
    }

    /// [`Ctx::owner_seconds`] with the measured corrections of width and size.
    fn owner_seconds_at(&self, transfer: f64, memory: f64, lookups: f64, p: &Piece) -> f64 {
        let m = self.model;
        let bytes = p.rows as f64 * p.width as f64 * self.spec.table_dtype.bytes() as f64;
        let factor = m.factor(p.width) * m.size_factor_at(bytes);
        transfer + factor * (memory / m.mem_bw + lookups * m.lookup_s) + m.shard_s
    }

    /// Seconds to exchange `bytes` that the ranks send in equal shares to every rank,
    /// themselves included: the share `(N - 1) / N` crosses the network at `net_bw`;
    /// the share a rank sends itself is a copy in memory (read and written, at
    /// `mem_bw`). On one rank nothing crosses a network.
    fn exchange_seconds(&self, bytes: f64) -> f64 {
        let (m, n) = (self.model, self.world as f64);
        bytes * (n - 1.0) / n / m.net_bw + 2.0 * bytes / n / m.mem_bw
    }

    /// The owner side of table `t` under `p`, in the mode the search charges it.
    pub(super) fn contrib(&self, t: usize, p: &Placement) -> Contrib {
        let mode = self.search_modes.get(t).copied().unwrap_or_default();
        self.contrib_mode(t, p, mode)
    }

    /// [`Ctx::contrib`] in output mode `mode` (owner side).
    pub(super) fn contrib_mode(&self, t: usize, p: &Placement, mode: OutputMode) -> Contrib {
        let ts = &self.spec.tables[t];
        pieces(ts.vocab, ts.dim, self.world, p)
            .iter()
            .map(|pc| {
                let bytes = pc.rows * (pc.width as u64 + self.state) * 4;
                let pooled = mode == OutputMode::Pooled && !pc.replica;
                let secs = if pooled {
                    self.pooled_piece(t, pc).0
                } else {
                    self.piece_cost(t, pc)
                };
                (pc.rank, secs, bytes, !pooled)
            })
            .collect()
    }

    /// Both modes' costs of every table under `tables`.
    pub(super) fn all_mode_costs(&self, tables: &[Placement]) -> Vec<ModeCosts> {
        tables
            .iter()
            .enumerate()
            .map(|(t, p)| self.mode_costs(t, p))
            .collect()
    }

    /// Output modes for `tables`, starting from `start` (per table; data-parallel
    /// tables stay `rows`): tables whose other mode saves the most (over all ranks)
    /// first, each switched when that lowers the plan's (maximum, total) cost, so the
    /// result is never worse than `start`.
    pub(super) fn choose_modes(&self, tables: Vec<Placement>, start: &[OutputMode]) -> Plan {
        let costs = self.all_mode_costs(&tables);
        let mut plan = self.plan(tables).with_modes(OutputMode::Rows);
        for (t, m) in plan.modes.iter_mut().enumerate() {
            if plan.tables[t] != Placement::DataParallel {
                *m = start.get(t).copied().unwrap_or_default();
            }
        }
        let other = |m: OutputMode| match m {
            OutputMode::Rows => OutputMode::Pooled,
            OutputMode::Pooled => OutputMode::Rows,
        };
        // What switching table t from mode m saves over all ranks.
        let gain = |t: usize, m: OutputMode| costs[t].seconds(m) - costs[t].seconds(other(m));
        let mut order: Vec<usize> = (0..costs.len())
            .filter(|&t| plan.tables[t] != Placement::DataParallel && gain(t, plan.modes[t]) > 0.0)
            .collect();
        order.sort_by(|&a, &b| {
            gain(b, plan.modes[b])
                .total_cmp(&gain(a, plan.modes[a]))
                .then(a.cmp(&b))
        });
        let mut best = report(self, &plan);
        for t in order {
            let was = plan.modes[t];
            plan.modes[t] = other(was);
            let r = report(self, &plan);
            if r.better_than(&best) {
                best = r;
            } else {
                plan.modes[t] = was;
            }
        }
        plan
    }

    /// Per rank, the cost of its pieces under the model's multi-table interference
    /// (their summed seconds without interference).
    pub(super) fn effective(&self, load: &Load) -> Vec<f64> {
        if !self.interference() {
            return load.cost.clone();
        }
        (0..load.cost.len())
            .map(|r| {
                let (c, k, b) = (load.cost[r], load.count[r], load.bytes[r] as f64);
                let size = load.weighted[r] / c;
                self.model
                    .with_interference_split(c, load.rows[r], k, b, size)
            })
            .collect()
    }

    pub(super) fn interference(&self) -> bool {
        self.model.interference != 0.0 || self.model.rows_interference() != 0.0
    }

    /// Bytes of the whole table with its optimizer state.
    pub(super) fn table_bytes(&self, t: usize) -> u64 {
        let ts = &self.spec.tables[t];
        ts.vocab * (ts.dim as u64 + self.state) * 4
    }

    /// Bytes of the largest share of a row-wise placement over all ranks.
    pub(super) fn row_share(&self, t: usize) -> u64 {
        let ts = &self.spec.tables[t];
        ts.vocab.div_ceil(self.world as u64) * (ts.dim as u64 + self.state) * 4
    }

    /// Seconds of the table placed whole on one rank.
    pub(super) fn table_cost(&self, t: usize) -> f64 {
        let ts = &self.spec.tables[t];
        let whole = Piece {
            rank: 0,
            rows: ts.vocab,
            width: ts.dim,
            replica: false,
        };
        self.piece_cost(t, &whole)
    }

    pub(super) fn plan(&self, tables: Vec<Placement>) -> Plan {
        Plan {
            world: self.world,
            spec_digest: self.spec.digest(),
            tables,
            modes: Vec::new(),
        }
    }
}

/// Model cost and memory of every rank under `plan`.
///
/// # Panics
/// If `stats` or `plan` do not have one entry per table of `spec`.
pub fn evaluate(
    spec: &ModelSpec,
    stats: &BatchStats,
    plan: &Plan,
    model: &CostModel,
    state_per_row: u64,
) -> PlanReport {
    assert_eq!(stats.tables.len(), spec.tables.len(), "stats per table");
    assert_eq!(plan.tables.len(), spec.tables.len(), "placements per table");
    let ctx = Ctx::new(spec, stats, plan.world, state_per_row, model);
    report(&ctx, plan)
}

/// Both output modes' modelled cost of every table under `plan`'s placements.
///
/// # Panics
/// If `stats` or `plan` do not have one entry per table of `spec`.
pub fn mode_costs(
    spec: &ModelSpec,
    stats: &BatchStats,
    plan: &Plan,
    model: &CostModel,
    state_per_row: u64,
) -> Vec<ModeCosts> {
    assert_eq!(stats.tables.len(), spec.tables.len(), "stats per table");
    let ctx = Ctx::new(spec, stats, plan.world, state_per_row, model);
    ctx.all_mode_costs(&plan.tables)
}

pub(super) fn check_inputs<'a>(
    spec: &'a ModelSpec,
    stats: &'a BatchStats,
    opts: &'a PlanOptions,
) -> Result<Ctx<'a>> {
    let bad = |msg: String| Err(Error::Config(format!("planner: {msg}")));
    if opts.world == 0 {
        return bad("world must be at least 1".into());
    }
    if stats.tables.len() != spec.tables.len() {
        return bad(format!(
            "batch stats have {} tables, the model {}",
            stats.tables.len(),
            spec.tables.len()
        ));
    }
    if stats.spec_digest != spec.digest() {
        return bad(format!(
            "batch stats were made for model {}, this model is {}",
            stats.spec_digest,
            spec.digest()
        ));
    }
    if stats.batch_per_rank == 0 {
        return bad("batch stats have batch per rank 0".into());
    }
    for (t, s) in stats.tables.iter().enumerate() {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        if !(ok(s.mean_valency) && ok(s.unique_per_rank_batch) && ok(s.unique_per_global_batch)) {
            return bad(format!(
                "batch stats of table {t} are not finite and >= 0: {s:?}"
            ));
        }
    }
    let m = &opts.model;
    if !([m.net_bw, m.mem_bw]
        .iter()
        .all(|&x| x.is_finite() && x > 0.0)
        && [m.lookup_s, m.shard_s, m.line_bytes]
            .iter()
            .all(|&x| x.is_finite() && x >= 0.0))
    {
        return bad(format!("cost model constants out of range: {m:?}"));
    }
    let ctx = Ctx::new(spec, stats, opts.world, opts.state_per_row, &opts.model);
    let total: u128 = (0..ctx.n_tables())
        .map(|t| ctx.table_bytes(t) as u128)
        .sum();
    let capacity = opts.world as u128 * opts.mem_per_rank as u128;
    if total > capacity {
        return bad(format!(
            "the tables need {total} bytes (rows and {} optimizer floats per row), more than \
             {} ranks x {} bytes = {capacity} bytes",
            opts.state_per_row, opts.world, opts.mem_per_rank
        ));
    }
    Ok(ctx)
}

pub(super) fn report(ctx: &Ctx, plan: &Plan) -> PlanReport {
    let mut load = Load::new(ctx.world);
    // The owners' pieces share a rank's caches (interference); the asking side
    // works on the rows it received and is added after (without interference in
    // the order the sums always had, so that those plans keep their bits).
    let split = ctx.interference();
    let mut ask = vec![0.0; ctx.world];
    for (t, p) in plan.tables.iter().enumerate() {
        let mode = plan.mode(t);
        load.add(&ctx.contrib_mode(t, p, mode));
        let a = ctx.ask_cost(t, p, mode);
        let into = if split { &mut ask } else { &mut load.cost };
        into.iter_mut().for_each(|c| *c += a);
    }
    let mut cost = ctx.effective(&load);
    if split {
        cost.iter_mut().zip(&ask).for_each(|(c, a)| *c += a);
    }
    PlanReport::new(cost, plan.bytes_per_rank(ctx.spec, ctx.state))
}

pub(super) fn finish(ctx: &Ctx, tables: Vec<Placement>, name: &str) -> Result<(Plan, PlanReport)> {
    let plan = ctx.plan(tables);
    plan.validate(ctx.spec, ctx.world, name)?;
    let r = report(ctx, &plan);
    Ok((plan, r))
}
