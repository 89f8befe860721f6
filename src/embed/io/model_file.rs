//! The embedding model's state by global id in HDF5, as one file whatever the rank
//! count and the placement: the trained model (`torusrec embed --out`) and the
//! checkpoints ([`super::checkpoint`]) share this layout and this writer.
//!
//! Layout: `/tables/<t>/rows` [vocab, dim] f32 (attribute `name`: the table's name),
//! `/tables/<t>/state` [vocab, s] f32 (s = optimizer floats per row, absent for SGD),
//! `/mlp/params` [n] f32 (attribute `layers`: the widths; per layer the weight
//! `in x out` row-major, then the bias), `/mlp/state` [m] f32 (the dense optimizer's
//! state), and root attributes given by the caller. A model file's root attributes:
//! `format = "torusrec-embed-model"`, `version`, `config_hash`, `spec_digest`, `spec`
//! (JSON), `table_opt`, `dense_opt`, `seed`, `step`, `checksum` (the placement-independent
//! checksum of the tables, their state, the MLP and its state), `input_layout`,
//! `dense_transform`, `keys` (what the inputs are, `docs/predict.md`), and `auc`,
//! `logloss` when they were evaluated. Each table's group also has the attributes
//! `vocab_kind`, `pooling`, `dim` (hash tables: `admit_after`, `evict`).
//!
//! Committed by [`crate::ckpt::commit::global_write_atomic`]: rank 0 creates
//! `<path>.partial`, every rank writes its shards in turn (a replicated table: rank 0
//! only; column shards: their columns; the row state: the first column shard), rank 0
//! renames it. Nothing is written to `path` until the file is complete.

use std::path::Path;

use ndarray::{s, ArrayView2};

use crate::bf16::EmbDtype;
use crate::ckpt::commit::global_write_atomic;
use crate::comm::Comm;
use crate::embed::tables::placement::Rows;
use crate::embed::train::trainer::EmbedTrainer;
use crate::io::h5::ctx as h5;
use crate::io::h5::{write_attr, write_attrs, Attr};
use crate::{Error, Result};

/// The `format` attribute of a model file.
pub const FORMAT: &str = "torusrec-embed-model";
/// The `version` attribute of a model file.
pub const VERSION: u64 = 1;

/// The rows of a shard as a hyperslab of the global table: `(start, step, count)`.
pub(crate) fn row_slab(rows: Rows, n: u64) -> (usize, usize, usize) {
    match rows {
        Rows::All => (0, 1, n as usize),
        Rows::Block { lo, .. } => (lo as usize, 1, n as usize),
        Rows::Cyclic { modulus, residue } => (residue as usize, modulus as usize, n as usize),
    }
}

/// Rank 0: create `tmp` with every dataset (the MLP's written) and the attributes.
fn local_create(
    tr: &EmbedTrainer,
    tmp: &Path,
    attrs: &[(&str, Attr)],
    hash_entries: &[Vec<u64>],
) -> Result<()> {
    let spec = &tr.cfg.spec;
    let f = h5(tmp, "create", crate::io::h5::create(tmp))?;
    for (t, ts) in spec.tables.iter().enumerate() {
        let sp = tr.store.state_per_row(t);
        if tr.store.is_hash(t) {
            super::hashio::local_create(&f, tmp, &tr.store, t, &hash_entries[t], true)?;
            let g = h5(tmp, "group", f.group(&format!("tables/{t}")))?;
            write_attrs(&g, tmp, &table_attrs(ts))?;
            continue;
        }
        let g = h5(tmp, "group", f.create_group(&format!("tables/{t}")))?;
        write_attr(&g, tmp, "name", &Attr::Str(ts.name.clone()))?;
        write_attrs(&g, tmp, &table_attrs(ts))?;
        h5(
            tmp,
            format!("/tables/{t}/rows"),
            g.new_dataset::<f32>()
                .shape((ts.vocab as usize, ts.dim))
                .create("rows"),
        )?;
        if sp > 0 {
            h5(
                tmp,
                format!("/tables/{t}/state"),
                g.new_dataset::<f32>()
                    .shape((ts.vocab as usize, sp))
                    .create("state"),
            )?;
        }
    }
    let g = h5(tmp, "group", f.create_group("mlp"))?;
    let flat = tr.mlp.flat();
    let params = h5(
        tmp,
        "/mlp/params",
        g.new_dataset_builder().with_data(&flat).create("params"),
    )?;
    let subnets = tr.mlp.subnets();
    if tr.mlp.kind() == crate::spec::ArchKind::Mlp {
        write_u64s(
            tmp,
            &params,
            "/mlp/params layers",
            "layers",
            &subnets[0].layers,
        )?;
    } else {
        write_dense(&f, tmp, tr)?;
    }
    h5(
        tmp,
        "/mlp/state",
        g.new_dataset_builder()
            .with_data(tr.dense_state.state())
            .create("state"),
    )?;
    write_attrs(&f, tmp, attrs)?;
    // Rows are written as f32 whatever the dtype (exact); a bf16 or f16 run records
    // its dtype (absent: f32).
    if !spec.table_dtype.is_f32() {
        let d = Attr::Str(spec.table_dtype.name().into());
        write_attr(&f, tmp, "table_dtype", &d)?;
    }
    h5(tmp, "close", f.close())
}

/// Rank-local: the dtype the tables of the checkpoint or model file at `path` were
/// trained at (root attribute `table_dtype`; absent: f32).
pub fn local_read_table_dtype(path: &Path) -> Result<EmbDtype> {
    let f = crate::ckpt::commit::local_open(path)?;
    let Ok(name) = crate::io::h5::read_str_attr(&f, path, "table_dtype") else {
        return Ok(EmbDtype::F32);
    };
    EmbDtype::parse(&name).ok_or_else(|| {
        Error::Config(format!(
            "{}: unknown table_dtype {name:?} (f32, bf16 or f16)",
            path.display()
        ))
    })
}

/// A resume must keep the tables' dtype: refused (exit 2) with both named, before
/// the configuration hash (which also covers it) gives a vaguer refusal.
pub fn check_table_dtype(path: &Path, want: EmbDtype) -> Result<()> {
    let got = local_read_table_dtype(path)?;
    if got != want {
        return Err(Error::Config(format!(
            "{}: the checkpoint's tables are {got}, this run's are {want}: resume with --table-dtype {got}, or start a new run from it with --init-from (which converts the rows)",
            path.display()
        )));
    }
    Ok(())
}

/// What a scorer needs of a table beside its rows (the spec's, as attributes):
/// `vocab_kind`, `pooling`, `dim`; hash tables also `admit_after` and `evict`.
fn table_attrs(ts: &crate::spec::TableSpec) -> Vec<(&'static str, Attr)> {
    use crate::spec::{Evict, Pooling, VocabKind};
    let kind = match ts.vocab_kind {
        VocabKind::Fixed => "fixed",
        VocabKind::Modulo => "modulo",
        VocabKind::Hash => "hash",
    };
    let pooling = match ts.pooling {
        Pooling::Sum => "sum",
        Pooling::Mean => "mean",
    };
    let mut v = vec![
        ("vocab_kind", Attr::Str(kind.into())),
        ("pooling", Attr::Str(pooling.into())),
        ("dim", Attr::U64(ts.dim as u64)),
    ];
    if ts.vocab_kind == VocabKind::Hash {
        v.push(("admit_after", Attr::U64(u64::from(ts.admit_after))));
        let evict = match ts.evict {
            Evict::Lfu => "lfu".to_string(),
            Evict::Ttl(t) => format!("ttl:{t}"),
        };
        v.push(("evict", Attr::Str(evict)));
    }
    v
}

/// `values` as the u64 attribute `name` of `ds`.
fn write_u64s(
    tmp: &Path,
    ds: &hdf5::Dataset,
    what: &str,
    name: &str,
    values: &[usize],
) -> Result<()> {
    let v: Vec<u64> = values.iter().map(|&w| w as u64).collect();
    h5(
        tmp,
        what,
        ds.new_attr::<u64>()
            .shape(v.len())
            .create(name)
            .and_then(|a| a.write_raw(&v)),
    )
}

/// A DLRM's or DCN-v2's architecture and its dense weights per sub-network under
/// `/dense` (the layout in `docs/embed.md`).
fn write_dense(f: &hdf5::File, tmp: &Path, tr: &EmbedTrainer) -> Result<()> {
    let spec = &tr.cfg.spec;
    let g = h5(tmp, "group", f.create_group("dense"))?;
    let a = &spec.arch;
    let mut attrs: Vec<(&str, Attr)> = vec![("arch", Attr::Str(a.kind.name().into()))];
    match &tr.mlp {
        crate::embed::dense::arch::DenseModel::Dlrm { inter, .. } => {
            attrs.push(("dim", Attr::U64(inter.dim() as u64)));
            attrs.push(("n_sparse", Attr::U64(inter.n_sparse() as u64)));
            attrs.push((
                "interaction_order",
                Attr::Str(
                    "lower triangle by rows: (1,0), (2,0), (2,1), (3,0), ... (MLPerf)".into(),
                ),
            ));
        }
        crate::embed::dense::arch::DenseModel::Dcn { cross, .. } => {
            attrs.push(("structure", Attr::Str(a.structure().name().into())));
            attrs.push(("cross_layers", Attr::U64(cross.arch().n_layers() as u64)));
            attrs.push((
                "cross_rank",
                Attr::U64(cross.arch().rank().unwrap_or(0) as u64),
            ));
            attrs.push(("cross_dim", Attr::U64(cross.arch().dim() as u64)));
        }
        crate::embed::dense::arch::DenseModel::Mlp(_) => {}
    }
    write_attrs(&g, tmp, &attrs)?;
    for sn in tr.mlp.subnets() {
        let what = format!("/dense/{}", sn.name);
        let ds = h5(
            tmp,
            &what,
            g.new_dataset_builder().with_data(sn.params).create(sn.name),
        )?;
        if !sn.layers.is_empty() {
            write_u64s(tmp, &ds, &format!("{what} layers"), "layers", &sn.layers)?;
            write_u64s(
                tmp,
                &ds,
                &format!("{what} relu_last"),
                "relu_last",
                &[sn.tower as usize],
            )?;
        }
    }
    Ok(())
}

/// This rank's turn: write its shards (and their row state) into `tmp`.
fn local_write_shards<C: Comm>(
    comm: &C,
    tr: &EmbedTrainer,
    tmp: &Path,
    hash_entries: &[Vec<u64>],
) -> Result<()> {
    let f = h5(tmp, "open", crate::io::h5::open_rw(tmp))?;
    for (t, per_rank) in hash_entries.iter().enumerate() {
        if tr.store.is_hash(t) {
            let first: u64 = per_rank[..comm.rank()].iter().sum();
            super::hashio::local_write(&f, tmp, &tr.store, t, first as usize, true)?;
        }
    }
    for ls in &tr.store.local {
        let hashed = tr.store.is_hash(ls.shard.table);
        if (ls.shard.replica && comm.rank() != 0) || ls.rows == 0 || hashed {
            continue;
        }
        let t = ls.shard.table;
        let sp = tr.store.state_per_row(t);
        let (a, step, n) = row_slab(ls.shard.rows, ls.rows);
        let cols = ls.shard.cols.clone();
        let name = format!("/tables/{t}/rows");
        let ds = h5(tmp, &name, f.dataset(&name))?;
        // bf16 and f16 rows are written widened to f32 (exactly).
        let data = ls.rows_f32();
        let view = ArrayView2::from_shape((n, cols.len()), &data[..])
            .map_err(|e| Error::Comm(format!("{name}: {e}")))?;
        h5(
            tmp,
            &name,
            ds.write_slice(view, s![a..a + (n - 1) * step + 1;step, cols.clone()]),
        )?;
        // Every column shard holds the same row statistic: the first writes it.
        if sp > 0 && cols.start == 0 {
            let name = format!("/tables/{t}/state");
            let ds = h5(tmp, &name, f.dataset(&name))?;
            let view = ArrayView2::from_shape((n, sp), &ls.state)
                .map_err(|e| Error::Comm(format!("{name}: {e}")))?;
            h5(
                tmp,
                &name,
                ds.write_slice(view, s![a..a + (n - 1) * step + 1;step, ..]),
            )?;
        }
    }
    h5(tmp, "close", f.close())
}

/// Collective: every rank must call. Writes the whole state of `tr` (see the module
/// docs) with the root attributes `attrs` to `path`, atomically
/// ([`crate::ckpt::commit::global_write_atomic`]): through `<path>.partial`, renamed by
/// rank 0 once every rank has written its shards. On failure `path` is untouched and
/// the temporary is removed.
pub(crate) fn global_write_state<C: Comm>(
    comm: &C,
    tr: &EmbedTrainer,
    path: &Path,
    attrs: &[(&str, Attr)],
) -> Result<()> {
    // Entries of each hash table on each rank (their offsets in the file).
    let mine: Vec<u64> = tr
        .store
        .hash
        .iter()
        .map(|h| h.as_ref().map_or(0, |h| h.len() as u64))
        .collect();
    let all = comm.all_gather_v(&mine)?.data;
    let n = mine.len();
    let hash_entries: Vec<Vec<u64>> = (0..n)
        .map(|t| (0..comm.size()).map(|r| all[r * n + t]).collect())
        .collect();
    global_write_atomic(
        comm,
        path,
        |tmp| local_create(tr, tmp, attrs, &hash_entries),
        |tmp| local_write_shards(comm, tr, tmp, &hash_entries),
    )
}

/// Whether the examples are a keyed click log's (`prepare clicks`).
fn keyed_log(source: &crate::data::clicks::source::Source) -> bool {
    use crate::data::clicks::source::Source;
    match source {
        Source::Log { log, .. } => log.keyed(),
        Source::Preloaded { inner, .. } => keyed_log(inner),
        Source::Generated(_) => false,
    }
}

/// The root attributes that say what the model's inputs are (`docs/predict.md`):
/// `input_layout`, `dense_transform` and `keys`, for a model trained on a keyed click
/// log (`prepare clicks`) or not (generated examples, a v1 log).
fn scoring_attrs(keyed: bool) -> Vec<(&'static str, Attr)> {
    let (transform, keys) = if keyed {
        (
            "ln(1 + max(v, 0)) of each integer column, applied by prepare clicks (the log's /dense as stored)",
            "prepare clicks: the u64 value of each categorical field's hex digits (Criteo), hash tables keyed by it",
        )
    } else {
        (
            "none (the log's /dense as stored)",
            "the examples' ids (u32: generated, or a v1 click log) are the keys",
        )
    };
    vec![
        (
            "input_layout",
            Attr::Str("x = [pooled table 0 | ... | pooled table F-1 | dense features]".into()),
        ),
        ("dense_transform", Attr::Str(transform.into())),
        ("keys", Attr::Str(keys.into())),
    ]
}

/// What the run measured at the end, for the model's attributes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Evaluation {
    pub auc: Option<f64>,
    pub logloss: Option<f64>,
}

/// Collective: every rank must call. Writes the trained model to `out` (see the module
/// docs): the same tables whatever the rank count and the placement.
pub fn global_write_model<C: Comm>(
    comm: &C,
    tr: &EmbedTrainer,
    out: &Path,
    eval: Evaluation,
) -> Result<()> {
    let t0 = std::time::Instant::now();
    let _p = comm.stats().phase("io");
    let checksum = format!("{:016x}", tr.global_checksum(comm)?);
    let c = &tr.cfg;
    let spec = serde_json::to_string(&c.spec).map_err(|e| Error::Config(e.to_string()))?;
    let mut attrs = vec![
        ("format", Attr::Str(FORMAT.into())),
        ("version", Attr::U64(VERSION)),
        (
            "config_hash",
            Attr::Str(super::config_hash::config_hash(tr)),
        ),
        ("spec_digest", Attr::Str(c.spec.digest())),
        ("spec", Attr::Str(spec)),
        ("table_opt", Attr::Str(format!("{:?}", c.table_opt))),
        ("dense_opt", Attr::Str(format!("{:?}", c.dense_opt))),
        ("seed", Attr::U64(c.seed)),
        ("step", Attr::U64(tr.step)),
        ("checksum", Attr::Str(checksum)),
    ];
    attrs.extend(scoring_attrs(keyed_log(&tr.source)));
    if let Some(a) = eval.auc {
        attrs.push(("auc", Attr::F64(a)));
    }
    if let Some(l) = eval.logloss {
        attrs.push(("logloss", Attr::F64(l)));
    }
    global_write_state(comm, tr, out, &attrs)?;
    if comm.rank() == 0 {
        let bytes = std::fs::metadata(out).map_or(0, |m| m.len());
        log::info!(
            "model {} (step {}): {:.1} MB in {:.3} s",
            out.display(),
            tr.step,
            bytes as f64 / 1e6,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
