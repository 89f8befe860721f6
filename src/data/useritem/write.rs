//! Writing a split user x item matrix as a prepared dataset (docs/prepare.md, "User x
//! item datasets"): the layout of docs/design.md (`/train`, `/train_t`, `/test/...`,
//! `/node_ids`) with `num_rows` users and `num_cols` items, and beside it
//! `/train/weights`, `/train_t/weights`, `/test/fold/weights`, `/test/holdout/weights`
//! (f32, one per index), `/user_ids` and `/item_ids` (u64, or UTF-8 strings when a
//! side's ids are not all integers) and the root attributes `matrix = "user-item"`,
//! `split`, `weighted`, `min_user_interactions`, `min_item_interactions`,
//! `source_users`, `source_items`.

use super::filter::{Ids, Matrix};
use super::split::{Split, SplitKind, WeightedRows};
use crate::comm::Comm;
use crate::data::graph::dataset::{create_layout, write_part, Storage, NUM_DATASETS};
use crate::data::graph::prepare::{LocalSplit, SplitMeta};
use crate::data::graph::rows::LocalRows;
use crate::error::Result;
use crate::io::h5::{ctx as h5, write_attrs, Attr};
use hdf5::types::VarLenUnicode;
use std::path::Path;

/// Facts of the input and the filter that go to the root attributes.
#[derive(Debug, Clone)]
pub struct Provenance {
    pub source: String,
    pub source_users: u64,
    pub source_items: u64,
    pub source_lines: u64,
    pub seed: u64,
    pub split: SplitKind,
    pub weighted: bool,
    pub min_user: u64,
    pub min_item: u64,
}

fn rows(w: &WeightedRows) -> LocalRows {
    LocalRows {
        lo: 0,
        indptr: w.indptr.clone(),
        targets: w.items.clone(),
    }
}

/// The transpose of `w` (`n` columns), rows sorted within each column, weights moved along.
pub fn transpose(w: &WeightedRows, n: usize) -> WeightedRows {
    let mut indptr = vec![0u64; n + 1];
    for &i in &w.items {
        indptr[i as usize + 1] += 1;
    }
    for c in 0..n {
        indptr[c + 1] += indptr[c];
    }
    let mut fill = indptr.clone();
    let mut items = vec![0u32; w.items.len()];
    let mut weights = vec![0f32; w.items.len()];
    for r in 0..w.num_rows() {
        let (it, ws) = w.row(r);
        for (&i, &x) in it.iter().zip(ws) {
            let slot = &mut fill[i as usize];
            items[*slot as usize] = r as u32;
            weights[*slot as usize] = x;
            *slot += 1;
        }
    }
    WeightedRows {
        indptr,
        items,
        weights,
    }
}

fn write_ids(f: &hdf5::File, tmp: &Path, name: &str, ids: &Ids) -> Result<()> {
    match ids {
        Ids::Ints(v) => {
            let ds = h5(
                tmp,
                name,
                f.new_dataset::<u64>().shape(v.len()).create(name),
            )?;
            if !v.is_empty() {
                h5(tmp, name, ds.write(v))?;
            }
        }
        Ids::Strings(v) => {
            let s: Vec<VarLenUnicode> = v
                .iter()
                .map(|x| {
                    x.parse().map_err(|e| {
                        crate::error::Error::input(tmp, format!("{name}: id {x:?}: {e}"))
                    })
                })
                .collect::<Result<_>>()?;
            let ds = h5(
                tmp,
                name,
                f.new_dataset::<VarLenUnicode>().shape(s.len()).create(name),
            )?;
            h5(tmp, name, ds.write(&s))?;
        }
    }
    Ok(())
}

fn write_f32(f: &hdf5::File, tmp: &Path, name: &str, v: &[f32]) -> Result<()> {
    let ds = h5(
        tmp,
        name,
        f.new_dataset::<f32>().shape(v.len()).create(name),
    )?;
    if !v.is_empty() {
        h5(tmp, name, ds.write(v))?;
    }
    Ok(())
}

/// Collective: every rank must call with the same (whole) matrix and split. Rank 0
/// writes the file through `OUT.partial`, renamed when complete
/// ([`crate::ckpt::commit::global_write_atomic`]).
pub fn global_write<C: Comm>(
    comm: &C,
    out: &Path,
    m: &Matrix,
    s: &Split,
    prov: &Provenance,
) -> Result<()> {
    let (nr, nc) = (m.num_users(), m.num_items as usize);
    let train_t = transpose(&s.train, nc);
    let node_ids = match &m.user_ids {
        Ids::Ints(v) => v.clone(),
        Ids::Strings(v) => (0..v.len() as u64).collect(),
    };
    let part = LocalSplit {
        train: rows(&s.train),
        train_t: rows(&train_t),
        test_rows: s.test_rows.clone(),
        fold: rows(&s.fold),
        holdout: rows(&s.holdout),
        node_ids,
    };
    let meta = SplitMeta {
        num_rows: nr as u64,
        num_cols: nc as u64,
        min_links: 0,
        seed: prov.seed,
        source: prov.source.clone(),
        // The row id space, as for graphs: the largest (kept) user id + 1.
        source_nodes: part
            .node_ids
            .iter()
            .max()
            .map_or(0, |&u| u.saturating_add(1)),
        source_arcs: prov.source_lines,
    };
    let t = s.test_rows.len();
    let shapes: [usize; NUM_DATASETS] = [
        nr + 1,
        nc + 1,
        t + 1,
        t + 1,
        nr,
        s.train.items.len(),
        train_t.items.len(),
        t,
        s.fold.items.len(),
        s.holdout.items.len(),
    ];
    let create = |tmp: &Path| -> Result<()> {
        create_layout(tmp, &meta, &shapes, Storage::OnWrite)?;
        write_part(tmp, &part, &|_| 0, meta.num_rows)?;
        let f = h5(tmp, "open for writing", crate::io::h5::open_rw(tmp))?;
        write_f32(&f, tmp, "train/weights", &s.train.weights)?;
        write_f32(&f, tmp, "train_t/weights", &train_t.weights)?;
        write_f32(&f, tmp, "test/fold/weights", &s.fold.weights)?;
        write_f32(&f, tmp, "test/holdout/weights", &s.holdout.weights)?;
        write_ids(&f, tmp, "user_ids", &m.user_ids)?;
        write_ids(&f, tmp, "item_ids", &m.item_ids)?;
        write_attrs(
            &f,
            tmp,
            &[
                ("matrix", Attr::Str("user-item".into())),
                ("split", Attr::Str(prov.split.name().into())),
                ("weighted", Attr::U64(prov.weighted as u64)),
                ("min_user_interactions", Attr::U64(prov.min_user)),
                ("min_item_interactions", Attr::U64(prov.min_item)),
                ("source_users", Attr::U64(prov.source_users)),
                ("source_items", Attr::U64(prov.source_items)),
            ],
        )?;
        h5(tmp, "close", f.close())
    };
    crate::ckpt::commit::global_write_atomic(comm, out, create, |_| Ok(()))
}
