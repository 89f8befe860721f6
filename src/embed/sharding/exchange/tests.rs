//! Per-id weights in the `rows` output mode ([`pool`], [`StepGrads::accumulate`]): a
//! weighted bag pools `sum_i w_i row_i` (a mean divides it by the bag's id count),
//! weights of 1.0 give the unweighted bits, and each table row's gradient is the
//! loss's, checked against central differences of the loss in that row (through the
//! real lookup, pooling and dense model), with and without dedup, for a sharded and a
//! data-parallel table.

use ndarray::ArrayView2;

use super::*;
use crate::comm::single::SingleComm;
use crate::data::clicks::batch::Bags;
use crate::embed::dense::arch::{DenseModel, DenseWorkspace};
use crate::embed::tables::placement::Plan;
use crate::embed::tables::store::TableOpt;
use crate::spec::ModelSpec;

/// Table `a` (6 rows of 3, sum pooling), table `b` (5 rows of 2, mean pooling), one
/// dense feature, a hidden layer of 4.
fn spec() -> ModelSpec {
    let s: ModelSpec = toml::from_str(
        "n_dense = 1\nhidden = [4]\n\
         [[table]]\nname = \"a\"\nvocab = 6\ndim = 3\n\
         [[table]]\nname = \"b\"\nvocab = 5\ndim = 2\npooling = \"mean\"\n",
    )
    .unwrap();
    s.validate("test").unwrap();
    s
}

fn bags(b: &[&[u32]]) -> Bags {
    let mut offsets = vec![0u32];
    let mut ids = Vec::new();
    for bag in b {
        ids.extend_from_slice(bag);
        offsets.push(ids.len() as u32);
    }
    Bags { offsets, ids }
}

const A: [&[u32]; 4] = [&[0, 2, 0], &[], &[5], &[2, 3]];
const B: [&[u32]; 4] = [&[1, 1, 4], &[0], &[], &[3, 2]];
/// The weights of [`A`] and [`B`], bag by bag (2 and 0.5 among them, a repeated id
/// with two weights, a negative one).
const WA: [f32; 6] = [2.0, 0.5, -1.0, 1.5, 0.25, 3.0];
const WB: [f32; 6] = [0.5, 2.0, 1.0, 3.0, 1.0, -0.5];

/// Four examples of [`A`] and [`B`], weighted by `w` (none when `None`).
fn batch(w: Option<[Vec<f32>; 2]>) -> Batch {
    Batch {
        n: 4,
        n_dense: 1,
        dense: vec![0.5, -1.0, 0.25, 2.0],
        labels: vec![1.0, 0.0, 1.0, 0.0],
        bags: vec![bags(&A), bags(&B)],
        keys: Vec::new(),
        weights: w.map_or(Vec::new(), |w| w.to_vec()),
    }
}

fn weighted() -> Batch {
    batch(Some([WA.to_vec(), WB.to_vec()]))
}

fn store(kind: &str) -> Store {
    let spec = spec();
    let plan = Plan::uniform(&spec, 1, kind).unwrap();
    Store::new(&spec, &plan, 0, TableOpt::Sgd { lr: 0.1, wd: 0.0 }, 7, None).unwrap()
}

/// The batch's MLP input through the real lookup and pooling.
fn input(st: &Store, b: &Batch, dedup: bool) -> Lookup {
    let (mut lk, _) = global_lookup(&SingleComm::new(), st, b, dedup).unwrap();
    pool(st, b, &mut lk);
    lk
}

/// Row `id` of table `t` (every local copy) plus `by` in column `j`.
fn nudge(st: &mut Store, t: usize, id: u64, j: usize, by: f32) {
    for l in st.local.iter_mut().filter(|l| l.shard.table == t) {
        let w = l.shard.width();
        for r in 0..l.rows {
            if l.shard.rows.global(r) == id && l.shard.cols.contains(&j) {
                l.data[r as usize * w + j - l.shard.cols.start] += by;
            }
        }
    }
}

fn row(st: &Store, t: usize, id: u64) -> Vec<f32> {
    let (_, _, v) = st
        .local_pieces(t)
        .into_iter()
        .find(|(g, _, _)| *g == id)
        .unwrap();
    v
}

/// `(1 / n) sum_e logloss_e` of the batch, and `d loss / d x`.
fn loss(m: &DenseModel, st: &Store, b: &Batch, dedup: bool) -> (f64, Vec<f32>) {
    let lk = input(st, b, dedup);
    let w = st.spec.mlp_input();
    let x = ArrayView2::from_shape((b.n, w), &lk.x).unwrap();
    let (mut g, mut dx) = (vec![0.0; m.n_params()], vec![0.0; b.n * w]);
    let weight = 1.0 / b.n as f32;
    let l = m.forward_backward(
        x,
        &b.labels,
        weight,
        &mut g,
        &mut dx,
        &mut DenseWorkspace::new(),
    );
    (weight as f64 * l, dx)
}

/// Per table, the `vocab x dim` gradient the step accumulates (summed per id).
fn table_grads(st: &Store, b: &Batch, dedup: bool, dx: &[f32]) -> Vec<Vec<f32>> {
    let lk = input(st, b, dedup);
    let mut sg = StepGrads::new(st, dedup);
    sg.accumulate(st, b, &lk, dx);
    sg.tables
        .iter()
        .enumerate()
        .map(|(t, tg)| {
            let ts = &st.spec.tables[t];
            if st.is_replicated(t) {
                return tg.dense.clone();
            }
            let mut g = vec![0.0f32; ts.vocab as usize * ts.dim];
            for (k, &id) in tg.ids.iter().enumerate() {
                let at = id as usize * ts.dim;
                for j in 0..ts.dim {
                    g[at + j] += tg.grads[k * ts.dim + j];
                }
            }
            g
        })
        .collect()
}

#[test]
fn a_weighted_bag_pools_the_weighted_sum_and_a_mean_divides_by_its_id_count() {
    for kind in ["table", "row_cyclic", "data_parallel"] {
        let st = store(kind);
        let (a, b) = (|id| row(&st, 0, id), |id| row(&st, 1, id));
        let lk = input(&st, &weighted(), true);
        let w = st.spec.mlp_input();
        let x = |e: usize, lo: usize, n: usize| &lk.x[e * w + lo..e * w + lo + n];
        // Example 0: a = 2 a0 + 0.5 a2 - a0 (summed in bag order), b = (0.5 b1 + 2 b1 + b4) / 3.
        let want_a: Vec<f32> = (0..3)
            .map(|j| 0.0 + 2.0 * a(0)[j] + 0.5 * a(2)[j] - a(0)[j])
            .collect();
        assert_eq!(x(0, 0, 3), &want_a[..], "{kind}");
        let want_b: Vec<f32> = (0..2)
            .map(|j| (0.0 + 0.5 * b(1)[j] + 2.0 * b(1)[j] + 1.0 * b(4)[j]) * (1.0 / 3.0))
            .collect();
        assert_eq!(x(0, 3, 2), &want_b[..], "{kind}");
        // An empty bag pools zeros; the dense feature follows the tables.
        assert_eq!(x(1, 0, 3), &[0.0; 3], "{kind}");
        assert_eq!(x(2, 3, 2), &[0.0; 2], "{kind}");
        assert_eq!(x(3, 5, 1), &[2.0], "{kind}");
    }
}

#[test]
fn weights_of_one_give_the_unweighted_bits() {
    let spec = spec();
    let m = DenseModel::new(&spec, 3).unwrap();
    let ones = batch(Some([vec![1.0; 6], vec![1.0; 6]]));
    for kind in ["table", "data_parallel"] {
        let st = store(kind);
        for dedup in [true, false] {
            let (l0, dx0) = loss(&m, &st, &batch(None), dedup);
            let (l1, dx1) = loss(&m, &st, &ones, dedup);
            assert_eq!(l0.to_bits(), l1.to_bits(), "{kind} dedup {dedup}");
            assert_eq!(dx0, dx1);
            let bits = |g: Vec<Vec<f32>>| -> Vec<u32> {
                g.into_iter().flatten().map(f32::to_bits).collect()
            };
            assert_eq!(
                bits(table_grads(&st, &batch(None), dedup, &dx0)),
                bits(table_grads(&st, &ones, dedup, &dx1)),
                "{kind} dedup {dedup}"
            );
        }
    }
}

#[test]
fn weighted_row_gradients_match_finite_differences_of_the_loss() {
    let spec = spec();
    let m = DenseModel::new(&spec, 3).unwrap();
    let b = weighted();
    for kind in ["table", "data_parallel"] {
        for dedup in [true, false] {
            let mut st = store(kind);
            let (_, dx) = loss(&m, &st, &b, dedup);
            let grads = table_grads(&st, &b, dedup, &dx);
            let mut fd = |t: usize, id: u64, j: usize, h: f32| {
                nudge(&mut st, t, id, j, h);
                let lp = loss(&m, &st, &b, dedup).0;
                nudge(&mut st, t, id, j, -2.0 * h);
                let lm = loss(&m, &st, &b, dedup).0;
                nudge(&mut st, t, id, j, h);
                (lp - lm) / (2.0 * h as f64)
            };
            let mut nonzero = 0;
            for (t, ts) in spec.tables.iter().enumerate() {
                for id in 0..ts.vocab {
                    for j in 0..ts.dim {
                        let an = grads[t][id as usize * ts.dim + j] as f64;
                        let tol = |fd: f64| 1e-4 + 2e-2 * fd.abs().max(an.abs());
                        let mut d = fd(t, id, j, 1e-2);
                        // A ReLU kink inside the step spoils a central difference; a
                        // step a quarter as long then decides (as the dense checks do).
                        if (d - an).abs() >= tol(d) {
                            d = fd(t, id, j, 2.5e-3);
                        }
                        assert!(
                            (d - an).abs() < tol(d),
                            "{kind} dedup {dedup}: table {t} row {id} col {j}: fd {d} vs {an}"
                        );
                        nonzero += usize::from(an != 0.0);
                    }
                }
            }
            // Rows a and b of ids never looked up have no gradient; the others do.
            // a: ids 0, 2, 3, 5 (4 x 3 values); b: ids 0..=4 (5 x 2).
            assert_eq!(nonzero, 4 * 3 + 5 * 2, "{kind} dedup {dedup}");
        }
    }
}
