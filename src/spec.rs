//! The model definition: sparse features with their tables, dense features, the MLP,
//! and the click distribution the generator draws from. Read from a TOML file or
//! taken from a preset; validated once, before anything runs.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::bf16::EmbDtype;
use crate::rng::{stream, SplitMix64};
use crate::{Error, Result};

/// Eviction policy of a full table (default: `Lfu`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Evict {
    /// Least frequently used first: `(count, last_seen, key)` ascending.
    #[default]
    Lfu,
    /// Entries unseen for more than this many steps expire; when none has expired, the
    /// least recently used go first: `(last_seen, count, key)` ascending. Steps >= 1.
    Ttl(u64),
}

impl Evict {
    /// Parses `"lfu"` or `"ttl:STEPS"` (STEPS a decimal integer >= 1).
    pub fn parse(s: &str) -> Result<Evict, String> {
        let bad = |why: &str| format!("bad eviction policy {s:?}: {why}");
        if s == "lfu" {
            return Ok(Evict::Lfu);
        }
        let Some(steps) = s.strip_prefix("ttl:") else {
            return Err(bad("expected \"lfu\" or \"ttl:STEPS\""));
        };
        if steps.is_empty() || !steps.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("STEPS must be a decimal integer >= 1"));
        }
        match steps.parse::<u64>() {
            Ok(0) => Err(bad("STEPS must be >= 1")),
            Ok(t) => Ok(Evict::Ttl(t)),
            Err(e) => Err(bad(&format!("STEPS: {e}"))),
        }
    }
}

impl fmt::Display for Evict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Evict::Lfu => f.write_str("lfu"),
            Evict::Ttl(t) => write!(f, "ttl:{t}"),
        }
    }
}

/// How a bag of looked-up rows becomes one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    Sum,
    Mean,
}

/// How many ids an example carries for one feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValencyDist {
    /// Exactly `round(valency)` ids.
    Fixed,
    /// `1 + Poisson(valency - 1)` ids (the TorchRec peer's definition).
    Poisson,
}

/// How a table's ids map to its rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VocabKind {
    /// Ids are the rows `0..vocab`; an id out of range is an input error.
    #[default]
    Fixed,
    /// Row `id mod vocab` (the hashing trick: distinct ids may share a row).
    Modulo,
    /// A hash table of `vocab` rows (over all ranks) keyed by the raw 64-bit id: an id
    /// gets a row of its own once seen `admit_after` times; a full table evicts
    /// (`evict`). See [`crate::embed::tables::hashtab`].
    Hash,
}

impl VocabKind {
    pub fn is_fixed(&self) -> bool {
        *self == VocabKind::Fixed
    }
}

fn default_admit_after() -> u32 {
    1
}
fn is_one(x: &u32) -> bool {
    *x == 1
}
fn is_lfu(e: &Evict) -> bool {
    *e == Evict::Lfu
}

fn ser_evict<S: serde::Serializer>(e: &Evict, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&e.to_string())
}

fn de_evict<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Evict, D::Error> {
    let s = String::deserialize(d)?;
    Evict::parse(&s).map_err(serde::de::Error::custom)
}

fn default_pooling() -> Pooling {
    Pooling::Sum
}
fn default_valency_dist() -> ValencyDist {
    ValencyDist::Poisson
}
fn default_valency() -> f64 {
    1.0
}

/// One sparse feature and its embedding table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    pub name: String,
    /// Rows of the table (ids are `0..vocab`).
    pub vocab: u64,
    /// Width of a row.
    pub dim: usize,
    #[serde(default = "default_pooling")]
    pub pooling: Pooling,
    /// Mean number of ids per example (the pooling factor), at least 1.
    #[serde(default = "default_valency")]
    pub valency: f64,
    #[serde(default = "default_valency_dist")]
    pub valency_dist: ValencyDist,
    /// `fixed` (default), `modulo` or `hash`; with `hash`, `vocab` is the capacity.
    #[serde(default, skip_serializing_if = "VocabKind::is_fixed")]
    pub vocab_kind: VocabKind,
    /// Hash tables: occurrences before an id gets a trained row (1: at once).
    #[serde(default = "default_admit_after", skip_serializing_if = "is_one")]
    pub admit_after: u32,
    /// Hash tables: `lfu` (default) or `ttl:STEPS`.
    #[serde(
        default,
        skip_serializing_if = "is_lfu",
        serialize_with = "ser_evict",
        deserialize_with = "de_evict"
    )]
    pub evict: Evict,
}

impl TableSpec {
    /// Bytes of the table's rows at f32.
    pub fn bytes(&self) -> u64 {
        self.bytes_at(EmbDtype::F32)
    }

    /// Bytes of the table's rows stored at `dtype`.
    pub fn bytes_at(&self, dtype: EmbDtype) -> u64 {
        self.vocab * self.dim as u64 * dtype.bytes() as u64
    }
}

fn default_dense() -> usize {
    13
}
fn default_hidden() -> Vec<usize> {
    vec![512, 256]
}
fn default_zipf() -> f64 {
    1.05
}

/// The whole model and click distribution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Dense (real-valued) features per example.
    #[serde(default = "default_dense")]
    pub n_dense: usize,
    /// Hidden layer widths of the MLP (ReLU); the output layer (width 1) is implied.
    #[serde(default = "default_hidden")]
    pub hidden: Vec<usize>,
    /// Exponent of the Zipf distribution of ids within each table.
    #[serde(default = "default_zipf")]
    pub zipf: f64,
    /// The dense model on top of the pooled embeddings (`arch = "dlrm"`, or an `[arch]`
    /// table with `kind` and the widths); absent: today's MLP. Written only when not
    /// the plain MLP, so an MLP model's digest is what it always was.
    /// (Boxed: it is rarely set and large next to the rest.)
    #[serde(default, skip_serializing_if = "arch_is_mlp")]
    pub arch: Box<ArchSpec>,
    /// The element type of every embedding table (`table_dtype = "bf16"`; one for the
    /// whole model, `embed --table-dtype` overrides it). Written only when not f32,
    /// so an f32 model's digest is what it always was.
    #[serde(default, skip_serializing_if = "EmbDtype::is_f32")]
    pub table_dtype: EmbDtype,
    #[serde(rename = "table")]
    pub tables: Vec<TableSpec>,
}

fn arch_is_mlp(a: &ArchSpec) -> bool {
    a.is_mlp()
}

/// The dense architecture's kind (`--arch`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArchKind {
    /// One MLP over `[pooled embeddings | dense features]` (widths `hidden`).
    #[default]
    Mlp,
    /// DLRM: bottom MLP, pairwise dot interaction, top MLP.
    Dlrm,
    /// DCN-v2: cross layers and a deep MLP (widths `hidden`).
    Dcnv2,
}

impl ArchKind {
    pub fn name(self) -> &'static str {
        match self {
            ArchKind::Mlp => "mlp",
            ArchKind::Dlrm => "dlrm",
            ArchKind::Dcnv2 => "dcnv2",
        }
    }
}

/// DCN-v2's combination of the cross network and the deep MLP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DcnStructure {
    /// Cross layers on `x0`, the deep MLP on their output, ending in the logit.
    #[default]
    Stacked,
    /// Cross layers and a deep ReLU tower both on `x0`, outputs concatenated, one
    /// linear layer to the logit.
    Parallel,
}

impl DcnStructure {
    pub fn name(self) -> &'static str {
        match self {
            DcnStructure::Stacked => "stacked",
            DcnStructure::Parallel => "parallel",
        }
    }
}

/// MLPerf DLRM's top MLP hidden widths (the logit is implied).
pub const MLPERF_TOP: [usize; 4] = [1024, 1024, 512, 256];
/// MLPerf DLRM's bottom MLP hidden widths before `D`.
pub const MLPERF_BOTTOM_HIDDEN: [usize; 2] = [512, 256];
/// DCN-v2's default number of cross layers (MLPerf DLRM-DCNv2's 3).
pub const DEFAULT_CROSS_LAYERS: usize = 3;

/// The dense architecture and its widths; `None` fields take the defaults of
/// [`ArchSpec::bottom`], [`ArchSpec::top`], [`ArchSpec::cross_layers`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "ArchRepr")]
pub struct ArchSpec {
    pub kind: ArchKind,
    /// DLRM: the bottom MLP's widths after the dense input, ending in `D`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bottom_mlp: Option<Vec<usize>>,
    /// DLRM: the top MLP's hidden widths (the logit implied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_mlp: Option<Vec<usize>>,
    /// DCN-v2: the number of cross layers `L`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_layers: Option<usize>,
    /// DCN-v2: low rank `r` of the cross layers (absent: full rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_rank: Option<usize>,
    /// DCN-v2: stacked or parallel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dcn_structure: Option<DcnStructure>,
}

/// `arch = "dlrm"` or an `[arch]` table.
#[derive(Deserialize)]
#[serde(untagged)]
enum ArchRepr {
    Name(ArchKind),
    Table(ArchTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArchTable {
    kind: ArchKind,
    #[serde(default)]
    bottom_mlp: Option<Vec<usize>>,
    #[serde(default)]
    top_mlp: Option<Vec<usize>>,
    #[serde(default)]
    cross_layers: Option<usize>,
    #[serde(default)]
    cross_rank: Option<usize>,
    #[serde(default)]
    dcn_structure: Option<DcnStructure>,
}

impl From<ArchRepr> for ArchSpec {
    fn from(r: ArchRepr) -> Self {
        match r {
            ArchRepr::Name(kind) => ArchSpec {
                kind,
                ..ArchSpec::default()
            },
            ArchRepr::Table(t) => ArchSpec {
                kind: t.kind,
                bottom_mlp: t.bottom_mlp,
                top_mlp: t.top_mlp,
                cross_layers: t.cross_layers,
                cross_rank: t.cross_rank,
                dcn_structure: t.dcn_structure,
            },
        }
    }
}

impl ArchSpec {
    /// The plain MLP with nothing else set (today's model).
    pub fn is_mlp(&self) -> bool {
        *self == ArchSpec::default()
    }

    /// DLRM's bottom widths after the dense input: as given, else MLPerf's 512, 256
    /// followed by the tables' width `dim`.
    pub fn bottom(&self, dim: usize) -> Vec<usize> {
        self.bottom_mlp.clone().unwrap_or_else(|| {
            let mut v = MLPERF_BOTTOM_HIDDEN.to_vec();
            v.push(dim);
            v
        })
    }

    /// DLRM's top hidden widths: as given, else MLPerf's 1024, 1024, 512, 256.
    pub fn top(&self) -> Vec<usize> {
        self.top_mlp.clone().unwrap_or_else(|| MLPERF_TOP.to_vec())
    }

    /// DCN-v2's cross layers: as given, else 3.
    pub fn cross_layers(&self) -> usize {
        self.cross_layers.unwrap_or(DEFAULT_CROSS_LAYERS)
    }

    pub fn structure(&self) -> DcnStructure {
        self.dcn_structure.unwrap_or_default()
    }

    /// Check the fields against the kind and the tables (`names`, `dims`): a field of
    /// another kind, a width of 0, DLRM tables of a width other than `D`.
    pub fn check(&self, names: &[&str], dims: &[usize]) -> std::result::Result<(), String> {
        let set: Vec<(&str, bool, ArchKind)> = vec![
            (
                "bottom_mlp (--bottom-mlp)",
                self.bottom_mlp.is_some(),
                ArchKind::Dlrm,
            ),
            (
                "top_mlp (--top-mlp)",
                self.top_mlp.is_some(),
                ArchKind::Dlrm,
            ),
            (
                "cross_layers (--cross-layers)",
                self.cross_layers.is_some(),
                ArchKind::Dcnv2,
            ),
            (
                "cross_rank (--cross-rank)",
                self.cross_rank.is_some(),
                ArchKind::Dcnv2,
            ),
            (
                "dcn_structure (--dcn-structure)",
                self.dcn_structure.is_some(),
                ArchKind::Dcnv2,
            ),
        ];
        for (what, given, kind) in set {
            if given && kind != self.kind {
                return Err(format!(
                    "{what} applies to arch {} only, not arch {}",
                    kind.name(),
                    self.kind.name()
                ));
            }
        }
        // The top may be empty (one linear layer to the logit); the bottom ends in D.
        for (what, v, min) in [
            ("bottom_mlp", &self.bottom_mlp, 1),
            ("top_mlp", &self.top_mlp, 0),
        ] {
            if let Some(v) = v {
                if v.len() < min || v.contains(&0) {
                    return Err(format!(
                        "{what} {v:?}: need widths of at least 1{}",
                        if min > 0 { ", ending in D" } else { "" }
                    ));
                }
            }
        }
        if self.cross_layers == Some(0) {
            return Err("cross_layers 0: DCN-v2 needs at least one cross layer".into());
        }
        if self.cross_rank == Some(0) {
            return Err(
                "cross_rank 0: a low rank must be at least 1 (leave it unset for full rank)".into(),
            );
        }
        if self.kind == ArchKind::Dlrm {
            let d = match &self.bottom_mlp {
                Some(b) => b[b.len() - 1],
                None => dims[0],
            };
            let other: Vec<String> = names
                .iter()
                .zip(dims)
                .filter(|(_, &w)| w != d)
                .map(|(n, w)| format!("{n:?} (dim {w})"))
                .collect();
            if !other.is_empty() {
                return Err(format!(
                    "arch dlrm needs every table as wide as the bottom MLP's output D = {d}; \
                     not so: {}",
                    other.join(", ")
                ));
            }
        }
        Ok(())
    }
}

/// Largest vocabulary a table may have (ids travel as u32 on the wire).
pub const MAX_VOCAB: u64 = u32::MAX as u64;
/// Largest mean valency and width accepted.
pub const MAX_VALENCY: f64 = 10_000.0;
pub const MAX_DIM: usize = 4096;

impl ModelSpec {
    /// Width of the MLP's input: every pooled vector and the dense features.
    pub fn mlp_input(&self) -> usize {
        self.tables.iter().map(|t| t.dim).sum::<usize>() + self.n_dense
    }

    /// The dense architecture in words, for the run's header: `MLP [widths]` for the
    /// plain MLP (as always), else the arch and its widths.
    pub fn arch_summary(&self) -> String {
        let a = &self.arch;
        match a.kind {
            ArchKind::Mlp => format!("MLP {:?}", self.mlp_layers()),
            ArchKind::Dlrm => {
                let d = self.tables.first().map_or(0, |t| t.dim);
                format!(
                    "DLRM bottom {:?} (ReLU), interaction of {} vectors of {d}, top {:?} + logit",
                    std::iter::once(self.n_dense)
                        .chain(a.bottom(d))
                        .collect::<Vec<_>>(),
                    self.tables.len() + 1,
                    a.top()
                )
            }
            ArchKind::Dcnv2 => format!(
                "DCN-v2 {} on x0 of {}: {} cross layer(s) ({}), deep {:?}",
                a.structure().name(),
                self.mlp_input(),
                a.cross_layers(),
                a.cross_rank
                    .map_or("full rank".to_string(), |r| format!("rank {r}")),
                self.hidden
            ),
        }
    }

    /// Layer widths of the MLP from input to the single logit.
    pub fn mlp_layers(&self) -> Vec<usize> {
        let mut v = vec![self.mlp_input()];
        v.extend(&self.hidden);
        v.push(1);
        v
    }

    pub fn total_rows(&self) -> u64 {
        self.tables.iter().map(|t| t.vocab).sum()
    }

    /// Bytes of every table's rows at the model's [`ModelSpec::table_dtype`].
    pub fn total_bytes(&self) -> u64 {
        self.tables
            .iter()
            .map(|t| t.bytes_at(self.table_dtype))
            .sum()
    }

    /// Check every field; `origin` names the file or preset in the message.
    pub fn validate(&self, origin: &str) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(format!("{origin}: {msg}")));
        if self.tables.is_empty() {
            return bad("no tables".into());
        }
        if !(self.zipf.is_finite() && self.zipf > 0.0) {
            return bad(format!("zipf exponent must be > 0, got {}", self.zipf));
        }
        if self.hidden.contains(&0) {
            return bad("hidden layer of width 0".into());
        }
        let names: Vec<&str> = self.tables.iter().map(|t| t.name.as_str()).collect();
        let dims: Vec<usize> = self.tables.iter().map(|t| t.dim).collect();
        if let Err(m) = self.arch.check(&names, &dims) {
            return bad(m);
        }
        let mut names = std::collections::HashSet::new();
        for (i, t) in self.tables.iter().enumerate() {
            let at = format!("table {i} ({:?})", t.name);
            if !names.insert(t.name.as_str()) {
                return bad(format!("{at}: duplicate name"));
            }
            if t.vocab == 0 || t.vocab > MAX_VOCAB {
                return bad(format!(
                    "{at}: vocab must be in 1..={MAX_VOCAB}, got {}",
                    t.vocab
                ));
            }
            if t.dim == 0 || t.dim > MAX_DIM {
                return bad(format!("{at}: dim must be in 1..={MAX_DIM}, got {}", t.dim));
            }
            if !(t.valency.is_finite() && (1.0..=MAX_VALENCY).contains(&t.valency)) {
                return bad(format!(
                    "{at}: valency must be in 1..={MAX_VALENCY}, got {}",
                    t.valency
                ));
            }
            if t.vocab_kind != VocabKind::Hash && (t.admit_after != 1 || t.evict != Evict::Lfu) {
                return bad(format!(
                    "{at}: admit_after and evict apply to vocab_kind = \"hash\" only"
                ));
            }
            if t.admit_after == 0 {
                return bad(format!("{at}: admit_after must be at least 1"));
            }
            if t.vocab_kind == VocabKind::Hash && !self.table_dtype.is_f32() {
                return bad(format!(
                    "{at}: a hash table's rows are f32 (table_dtype = \"{}\" applies to fixed and modulo tables only)",
                    self.table_dtype
                ));
            }
        }
        Ok(())
    }

    /// Read and validate a TOML model file.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = crate::error::read_text(path)?;
        let spec: ModelSpec = toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .map(|s| {
                    text.as_bytes()[..s.start.min(text.len())]
                        .iter()
                        .filter(|&&b| b == b'\n')
                        .count() as u64
                        + 1
                })
                .unwrap_or(0);
            Error::Parse {
                path: path.to_path_buf(),
                line,
                msg: e.message().to_string(),
            }
        })?;
        spec.validate(&path.display().to_string())?;
        Ok(spec)
    }

    /// A stable digest of the definition, for stats files, plans and checkpoints.
    pub fn digest(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        format!("{:016x}", crate::ckpt::hash_str(&json))
    }
}

/// The names `--preset` accepts.
pub const PRESETS: &[&str] = &[
    "torchrec-peer",
    "dlrm-synthetic",
    "google-ads",
    "tiny",
    "small",
];

/// A named model. `scale` multiplies vocabularies (at least 64 rows stay) and, for
/// the pools with hundreds of tables, the table count (at least 8 stay), so that the
/// published shapes fit this machine.
pub fn preset(name: &str, scale: f64) -> Result<ModelSpec> {
    if !(scale.is_finite() && scale > 0.0 && scale <= 1.0) {
        return Err(Error::Config(format!(
            "--scale must be in (0, 1], got {scale}"
        )));
    }
    let scale_vocab = |v: u64| ((v as f64 * scale).round() as u64).max(64);
    let spec = match name {
        "torchrec-peer" => torchrec_peer(scale_vocab),
        "dlrm-synthetic" => dlrm_synthetic(scale, scale_vocab),
        "google-ads" => google_ads(scale, scale_vocab),
        "tiny" => tiny(),
        "small" => small(scale_vocab),
        _ => {
            return Err(Error::Config(format!(
                "unknown preset {name:?} (known: {})",
                PRESETS.join(", ")
            )))
        }
    };
    spec.validate(&format!("preset {name}"))?;
    Ok(spec)
}

/// The TorchRec peer's tables (`bench/peers/torchrec_peer.py`, seed 1): 26 tables,
/// vocabularies log-uniform in [1e3, 1e6] (4,373,502 rows), width 64, mean pooling
/// factors from triangular(1, 4, 40) rescaled to mean 15, sum pooling, 1 + Poisson(p-1)
/// ids, Zipf(1.05); 13 dense features; MLP 1677-512-256-1.
fn torchrec_peer(scale_vocab: impl Fn(u64) -> u64) -> ModelSpec {
    const VOCAB: [u64; 26] = [
        34313, 710217, 2706, 701371, 8619, 18619, 304163, 16888, 44543, 1209, 182196, 41155, 9754,
        231892, 8120, 22934, 2524, 16193, 4077, 6122, 178276, 6937, 28547, 875410, 767311, 149406,
    ];
    const POOL: [u32; 26] = [
        14, 8, 5, 32, 13, 5, 16, 21, 16, 28, 3, 14, 12, 4, 17, 24, 15, 7, 24, 13, 13, 20, 5, 23,
        18, 22,
    ];
    ModelSpec {
        arch: Default::default(),
        table_dtype: Default::default(),
        n_dense: 13,
        hidden: vec![512, 256],
        zipf: 1.05,
        tables: (0..26)
            .map(|t| TableSpec {
                name: format!("t{t}"),
                vocab: scale_vocab(VOCAB[t]),
                dim: 64,
                pooling: Pooling::Sum,
                valency: POOL[t] as f64,
                valency_dist: ValencyDist::Poisson,
                vocab_kind: VocabKind::Fixed,
                admit_after: 1,
                evict: Evict::Lfu,
            })
            .collect(),
    }
}

/// Draws for the generated pools, from (seed 0 of the preset stream, table index).
fn pool_rng(t: usize) -> SplitMix64 {
    SplitMix64::for_id(0x7072_6573_6574, stream::PRESET_TABLES, t as u64)
}

fn log_uniform(rng: &mut SplitMix64, lo: f64, hi: f64) -> f64 {
    (lo.ln() + rng.next_f64() * (hi.ln() - lo.ln())).exp()
}

/// Meta's DLRM synthetic table pool: 856 tables, vocabulary mean 4.1M and max 12.5M,
/// pooling factor mean 15 and max 193 (log-normal draws clipped to those maxima and
/// rescaled to those means), width 64.
fn dlrm_synthetic(scale: f64, scale_vocab: impl Fn(u64) -> u64) -> ModelSpec {
    let n = ((856.0 * scale).round() as usize).clamp(8, 856);
    let mut vocab = Vec::with_capacity(n);
    let mut pool = Vec::with_capacity(n);
    for t in 0..n {
        let mut r = pool_rng(t);
        vocab.push((1.2 * r.next_normal()).exp());
        pool.push((1.0 * r.next_normal()).exp());
    }
    let vocab = rescale_clipped(&vocab, 4.1e6, 12.5e6, 1.0);
    let pool = rescale_clipped(&pool, 15.0, 193.0, 1.0);
    ModelSpec {
        arch: Default::default(),
        table_dtype: Default::default(),
        n_dense: 13,
        hidden: vec![512, 256],
        zipf: 1.05,
        tables: (0..n)
            .map(|t| TableSpec {
                name: format!("t{t}"),
                vocab: scale_vocab(vocab[t].round() as u64),
                dim: 64,
                pooling: Pooling::Sum,
                valency: pool[t].round().max(1.0),
                valency_dist: ValencyDist::Poisson,
                vocab_kind: VocabKind::Fixed,
                admit_after: 1,
                evict: Evict::Lfu,
            })
            .collect(),
    }
}

/// Google's ads ranges: hundreds of tables (300), vocabularies log-uniform from 64 to
/// 300M, widths log-uniform from 1 to 380, 1 to 230 ids per example (log-uniform).
fn google_ads(scale: f64, scale_vocab: impl Fn(u64) -> u64) -> ModelSpec {
    let n = ((300.0 * scale).round() as usize).clamp(8, 300);
    ModelSpec {
        arch: Default::default(),
        table_dtype: Default::default(),
        n_dense: 13,
        hidden: vec![512, 256],
        zipf: 1.05,
        tables: (0..n)
            .map(|t| {
                let mut r = pool_rng(10_000 + t);
                let vocab = log_uniform(&mut r, 64.0, 3e8).round() as u64;
                let dim = log_uniform(&mut r, 1.0, 381.0).floor() as usize;
                let valency = log_uniform(&mut r, 1.0, 231.0).floor();
                TableSpec {
                    name: format!("t{t}"),
                    vocab: scale_vocab(vocab),
                    dim: dim.clamp(1, 380),
                    pooling: if t % 2 == 0 {
                        Pooling::Sum
                    } else {
                        Pooling::Mean
                    },
                    valency: valency.clamp(1.0, 230.0),
                    valency_dist: ValencyDist::Poisson,
                    vocab_kind: VocabKind::Fixed,
                    admit_after: 1,
                    evict: Evict::Lfu,
                }
            })
            .collect(),
    }
}

/// Rescale positive draws so that, after clipping to `max` (and `min`), their mean is
/// `mean` (a few fixed-point rounds; exact enough for a table pool).
fn rescale_clipped(x: &[f64], mean: f64, max: f64, min: f64) -> Vec<f64> {
    let mut f = mean / (x.iter().sum::<f64>() / x.len() as f64);
    for _ in 0..50 {
        let m = x.iter().map(|v| (v * f).clamp(min, max)).sum::<f64>() / x.len() as f64;
        f *= mean / m;
    }
    x.iter().map(|v| (v * f).clamp(min, max)).collect()
}

/// A few small tables for tests and quick runs: every pooling and valency kind.
fn tiny() -> ModelSpec {
    let t = |name: &str, vocab, dim, pooling, valency, valency_dist| TableSpec {
        name: name.into(),
        vocab,
        dim,
        pooling,
        valency,
        valency_dist,
        vocab_kind: VocabKind::Fixed,
        admit_after: 1,
        evict: Evict::Lfu,
    };
    ModelSpec {
        arch: Default::default(),
        table_dtype: Default::default(),
        n_dense: 4,
        hidden: vec![16, 8],
        zipf: 1.05,
        tables: vec![
            t("a", 1000, 8, Pooling::Sum, 4.0, ValencyDist::Poisson),
            t("b", 50, 4, Pooling::Mean, 3.0, ValencyDist::Fixed),
            t("c", 20000, 6, Pooling::Sum, 1.0, ValencyDist::Fixed),
            t("d", 300, 8, Pooling::Mean, 6.0, ValencyDist::Poisson),
            t("e", 7, 2, Pooling::Sum, 2.0, ValencyDist::Poisson),
        ],
    }
}

/// The peer's shape at a size that trains in seconds: 8 tables, width 16.
fn small(scale_vocab: impl Fn(u64) -> u64) -> ModelSpec {
    let mut s = torchrec_peer(scale_vocab);
    s.tables.truncate(8);
    for t in &mut s.tables {
        t.dim = 16;
    }
    s.hidden = vec![64, 32];
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_have_the_published_shapes() {
        let p = preset("torchrec-peer", 1.0).unwrap();
        assert_eq!(p.tables.len(), 26);
        assert_eq!(p.total_rows(), 4_373_502);
        assert_eq!(p.mlp_layers(), vec![1677, 512, 256, 1]);
        let mean = p.tables.iter().map(|t| t.valency).sum::<f64>() / 26.0;
        assert!((mean - 15.0).abs() < 0.2, "{mean}");

        let d = preset("dlrm-synthetic", 1.0).unwrap();
        assert_eq!(d.tables.len(), 856);
        let vm = d.total_rows() as f64 / 856.0;
        assert!((vm / 4.1e6 - 1.0).abs() < 0.01, "vocab mean {vm}");
        assert!(d.tables.iter().all(|t| t.vocab <= 12_500_000));
        let pm = d.tables.iter().map(|t| t.valency).sum::<f64>() / 856.0;
        assert!((pm / 15.0 - 1.0).abs() < 0.05, "pool mean {pm}");
        assert!(d.tables.iter().all(|t| t.valency <= 193.0));

        let g = preset("google-ads", 1.0).unwrap();
        assert!(g.tables.iter().all(|t| (1..=380).contains(&t.dim)
            && (64..=300_000_000).contains(&t.vocab)
            && (1.0..=230.0).contains(&t.valency)));
    }

    #[test]
    fn scale_shrinks_and_bad_names_are_refused() {
        let d = preset("dlrm-synthetic", 0.01).unwrap();
        assert_eq!(d.tables.len(), 9);
        assert!(d.tables.iter().all(|t| t.vocab >= 64));
        assert!(preset("nope", 1.0).is_err());
        assert!(preset("tiny", 0.0).is_err());
    }

    #[test]
    fn toml_round_trip_and_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.toml");
        std::fs::write(
            &p,
            "n_dense = 2\nhidden = [4]\n[[table]]\nname = \"x\"\nvocab = 10\ndim = 3\n\
             pooling = \"mean\"\nvalency = 2.5\n",
        )
        .unwrap();
        let s = ModelSpec::from_toml_file(&p).unwrap();
        assert_eq!(s.tables[0].pooling, Pooling::Mean);
        assert_eq!(s.mlp_layers(), vec![5, 4, 1]);

        std::fs::write(
            &p,
            "n_dense = 2\n[[table]]\nname = \"x\"\nvocab = 10\ndimm = 3\n",
        )
        .unwrap();
        let e = ModelSpec::from_toml_file(&p).unwrap_err().to_string();
        assert!(e.contains("m.toml:5"), "{e}");

        std::fs::write(&p, "[[table]]\nname = \"x\"\nvocab = 0\ndim = 3\n").unwrap();
        let e = ModelSpec::from_toml_file(&p).unwrap_err().to_string();
        assert!(e.contains("vocab must be"), "{e}");
    }
}
