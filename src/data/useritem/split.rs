//! The three test splits of a user x item matrix (`--split`).
//!
//! - `strong` (ALX's strong generalization, as for link graphs): among the users with
//!   an interaction, the `floor(r/10)` with the smallest `(hash3(seed, 1, user), user)`
//!   are test users; each one's items are shuffled by `(seed, 2, user)` and the first
//!   `max(1, floor(n/4))` are held out, the rest are its fold-in items; test users have
//!   no training interactions.
//! - `last` (leave-last-out): every user with at least 2 interactions holds out its
//!   latest one (largest time; among equal times the largest item number); the rest
//!   stay in training and are also its fold-in items.
//! - `random` (per interaction): among users with at least 2 interactions, an
//!   interaction (u, i) is held out when `hash3(seed, 21, u * 2^32 + i) < 2^64 / 4`
//!   (a quarter); a user all of whose interactions drew "held out" keeps in training
//!   the one with the largest hash. The rest stay in training and are its fold-in items.
//!
//! A held-out or fold-in item carries its summed weight. Every rule is a function of
//! (seed, user, item) only, so the split is the same at any rank count.

use super::filter::Matrix;
use crate::comm::single::SingleComm;
use crate::data::graph::prepare::{global_select_test_rows_by, split_test_row};
use crate::error::Result;
use crate::rng::{hash3, stream};

/// `--split`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitKind {
    Strong,
    Last,
    Random,
}

impl SplitKind {
    pub fn name(self) -> &'static str {
        match self {
            SplitKind::Strong => "strong",
            SplitKind::Last => "last",
            SplitKind::Random => "random",
        }
    }
}

/// Rows of (item, weight), items increasing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WeightedRows {
    pub indptr: Vec<u64>,
    pub items: Vec<u32>,
    pub weights: Vec<f32>,
}

impl WeightedRows {
    fn new() -> Self {
        Self {
            indptr: vec![0],
            ..Self::default()
        }
    }
    fn push_row(&mut self, row: impl IntoIterator<Item = (u32, f32)>) {
        for (i, w) in row {
            self.items.push(i);
            self.weights.push(w);
        }
        self.indptr.push(self.items.len() as u64);
    }
    pub fn num_rows(&self) -> usize {
        self.indptr.len() - 1
    }
    pub fn row(&self, r: usize) -> (&[u32], &[f32]) {
        let s = self.indptr[r] as usize..self.indptr[r + 1] as usize;
        (&self.items[s.clone()], &self.weights[s])
    }
}

/// A split matrix: training rows for every user, and the test users' parts.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    pub train: WeightedRows,
    pub test_rows: Vec<u32>,
    pub fold: WeightedRows,
    pub holdout: WeightedRows,
}

fn pairs(m: &Matrix, u: usize, pick: impl Fn(usize) -> bool) -> Vec<(u32, f32)> {
    m.row(u)
        .filter(|&k| pick(k))
        .map(|k| (m.items[k], m.weights[k]))
        .collect()
}

/// Split `m` by `kind`. `last` needs times (the caller refuses it without them).
pub fn split(m: &Matrix, kind: SplitKind, seed: u64) -> Result<Split> {
    let nu = m.num_users();
    let mut s = Split {
        train: WeightedRows::new(),
        test_rows: Vec::new(),
        fold: WeightedRows::new(),
        holdout: WeightedRows::new(),
    };
    let test = match kind {
        SplitKind::Strong => {
            let nonempty: Vec<bool> = (0..nu).map(|u| !m.row(u).is_empty()).collect();
            global_select_test_rows_by(&SingleComm::new(), 0, &nonempty, seed)?
        }
        SplitKind::Last | SplitKind::Random => (0..nu).map(|u| m.row(u).len() >= 2).collect(),
    };
    for (u, &is_test) in test.iter().enumerate() {
        let r = m.row(u);
        if !is_test {
            s.train.push_row(pairs(m, u, |_| true));
            continue;
        }
        let held: Vec<bool> = match kind {
            SplitKind::Strong => {
                let (_, h) = split_test_row(&m.items[r.clone()], seed, u as u64);
                r.clone().map(|k| h.contains(&m.items[k])).collect()
            }
            SplitKind::Last => {
                let t = m.times.as_deref().unwrap_or_default();
                let key = |k: usize| (t.get(k).copied().unwrap_or(0.0), m.items[k]);
                let last = r
                    .clone()
                    .max_by(|&a, &b| {
                        key(a)
                            .partial_cmp(&key(b))
                            .unwrap_or(std::cmp::Ordering::Equal)
                    })
                    .unwrap_or(r.start);
                r.clone().map(|k| k == last).collect()
            }
            SplitKind::Random => random_held(m, u, seed),
        };
        if !held.iter().any(|&h| h) {
            s.train.push_row(pairs(m, u, |_| true));
            continue;
        }
        let is_held = |k: usize| held[k - r.start];
        let visible = pairs(m, u, |k| !is_held(k));
        if kind == SplitKind::Strong {
            s.train.push_row([]);
        } else {
            s.train.push_row(visible.iter().copied());
        }
        s.test_rows.push(u as u32);
        s.fold.push_row(visible);
        s.holdout.push_row(pairs(m, u, is_held));
    }
    Ok(s)
}

/// The held-out flags of user `u`'s interactions under `--split random`.
fn random_held(m: &Matrix, u: usize, seed: u64) -> Vec<bool> {
    let r = m.row(u);
    let h = |k: usize| {
        hash3(
            seed,
            stream::USERITEM_RANDOM,
            ((u as u64) << 32) | m.items[k] as u64,
        )
    };
    let mut held: Vec<bool> = r.clone().map(|k| h(k) < u64::MAX / 4).collect();
    if held.iter().all(|&x| x) {
        let keep = r
            .clone()
            .max_by_key(|&k| (h(k), m.items[k]))
            .unwrap_or(r.start);
        held[keep - r.start] = false;
    }
    held
}
