//! From [`Interactions`] to the user x item matrix: ids renumbered in a fixed order,
//! duplicate (user, item) lines summed, and the minimum-interaction filter iterated to
//! a fixed point.
//!
//! Order of the ids on each side: when every id of the side is a decimal integer
//! (`u64`), increasing numeric order; otherwise increasing byte order of the strings.
//! The order depends only on the set of ids, never on the file's line order.

use super::parse::{Interactions, Interner};

/// A user x item matrix in CSR form (rows are users), items sorted within a row.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub indptr: Vec<u64>,
    pub items: Vec<u32>,
    /// The summed weight of each (user, item).
    pub weights: Vec<f32>,
    /// The latest time of each (user, item), when the input had times.
    pub times: Option<Vec<f64>>,
    pub num_items: u32,
    /// Original id of each row (user) and column (item).
    pub user_ids: Ids,
    pub item_ids: Ids,
}

/// The original ids of one side, in the new numbering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ids {
    Ints(Vec<u64>),
    Strings(Vec<String>),
}

impl Ids {
    pub fn len(&self) -> usize {
        match self {
            Ids::Ints(v) => v.len(),
            Ids::Strings(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn select(&self, keep: &[bool]) -> Ids {
        match self {
            Ids::Ints(v) => Ids::Ints(pick(v, keep)),
            Ids::Strings(v) => Ids::Strings(pick(v, keep)),
        }
    }
}

fn pick<T: Clone>(v: &[T], keep: &[bool]) -> Vec<T> {
    v.iter()
        .zip(keep)
        .filter(|(_, &k)| k)
        .map(|(x, _)| x.clone())
        .collect()
}

impl Matrix {
    pub fn num_users(&self) -> usize {
        self.indptr.len() - 1
    }
    pub fn nnz(&self) -> usize {
        self.items.len()
    }
    pub fn row(&self, u: usize) -> std::ops::Range<usize> {
        self.indptr[u] as usize..self.indptr[u + 1] as usize
    }
}

/// The new number of each interned id and the original ids in the new order.
fn order(side: &Interner) -> (Vec<u32>, Ids) {
    let ints: Option<Vec<u64>> = side.names.iter().map(|s| s.parse::<u64>().ok()).collect();
    let mut perm: Vec<u32> = (0..side.names.len() as u32).collect();
    let ids = match ints {
        Some(v) => {
            perm.sort_unstable_by_key(|&i| v[i as usize]);
            Ids::Ints(perm.iter().map(|&i| v[i as usize]).collect())
        }
        None => {
            perm.sort_unstable_by(|&a, &b| side.names[a as usize].cmp(&side.names[b as usize]));
            Ids::Strings(
                perm.iter()
                    .map(|&i| side.names[i as usize].clone())
                    .collect(),
            )
        }
    };
    let mut new = vec![0u32; perm.len()];
    for (k, &i) in perm.iter().enumerate() {
        new[i as usize] = k as u32;
    }
    (new, ids)
}

/// Renumber and sum duplicates: weights added (in f64, then rounded once), the time
/// of a summed entry is the latest of its lines.
pub fn build_matrix(x: &Interactions) -> Matrix {
    let (unew, user_ids) = order(&x.users);
    let (inew, item_ids) = order(&x.items);
    let mut idx: Vec<u32> = (0..x.pairs.len() as u32).collect();
    let key = |k: u32| {
        let (u, i) = x.pairs[k as usize];
        (unew[u as usize], inew[i as usize])
    };
    idx.sort_by_key(|&k| (key(k), k));
    let nu = user_ids.len();
    let mut indptr = vec![0u64; nu + 1];
    let (mut items, mut weights, mut times) = (Vec::new(), Vec::new(), Vec::new());
    let mut acc = 0f64;
    for (n, &k) in idx.iter().enumerate() {
        let (u, i) = key(k);
        let new_pair = n == 0 || key(idx[n - 1]) != (u, i);
        if new_pair {
            if n > 0 {
                weights.push(acc as f32);
            }
            acc = 0.0;
            indptr[u as usize + 1] += 1;
            items.push(i);
            times.push(f64::NEG_INFINITY);
        }
        acc += x.weights[k as usize] as f64;
        if let Some(t) = &x.times {
            let last = times.len() - 1;
            times[last] = times[last].max(t[k as usize]);
        }
    }
    weights.push(acc as f32);
    for u in 0..nu {
        indptr[u + 1] += indptr[u];
    }
    Matrix {
        indptr,
        items,
        weights,
        times: x.times.as_ref().map(|_| times),
        num_items: item_ids.len() as u32,
        user_ids,
        item_ids,
    }
}

/// What [`min_count_filter`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterReport {
    /// Rounds until nothing changed (the last round removes nothing).
    pub rounds: usize,
    pub removed_users: usize,
    pub removed_items: usize,
    pub removed_interactions: usize,
}

/// Keep users with at least `min_user` distinct items and items with at least
/// `min_item` distinct users, repeated until neither removes anything (each round:
/// count on the current matrix, drop both sides' failures at once). The kept ids keep
/// their relative order.
pub fn min_count_filter(m: &Matrix, min_user: u64, min_item: u64) -> (Matrix, FilterReport) {
    let nu = m.num_users();
    let ni = m.num_items as usize;
    let mut ukeep = vec![true; nu];
    let mut ikeep = vec![true; ni];
    let mut rounds = 0;
    loop {
        rounds += 1;
        let mut udeg = vec![0u64; nu];
        let mut ideg = vec![0u64; ni];
        for u in (0..nu).filter(|&u| ukeep[u]) {
            for &i in &m.items[m.row(u)] {
                if ikeep[i as usize] {
                    udeg[u] += 1;
                    ideg[i as usize] += 1;
                }
            }
        }
        let mut changed = false;
        for u in 0..nu {
            if ukeep[u] && udeg[u] < min_user.max(1) {
                ukeep[u] = false;
                changed = true;
            }
        }
        for i in 0..ni {
            if ikeep[i] && ideg[i] < min_item.max(1) {
                ikeep[i] = false;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut inew = vec![u32::MAX; ni];
    let mut next = 0u32;
    for i in 0..ni {
        if ikeep[i] {
            inew[i] = next;
            next += 1;
        }
    }
    let mut out = Matrix {
        indptr: vec![0],
        items: Vec::new(),
        weights: Vec::new(),
        times: m.times.as_ref().map(|_| Vec::new()),
        num_items: next,
        user_ids: m.user_ids.select(&ukeep),
        item_ids: m.item_ids.select(&ikeep),
    };
    for u in (0..nu).filter(|&u| ukeep[u]) {
        for k in m.row(u) {
            let i = inew[m.items[k] as usize];
            if i != u32::MAX {
                out.items.push(i);
                out.weights.push(m.weights[k]);
                if let (Some(t), Some(ot)) = (&m.times, &mut out.times) {
                    ot.push(t[k]);
                }
            }
        }
        out.indptr.push(out.items.len() as u64);
    }
    let report = FilterReport {
        rounds,
        removed_users: nu - out.num_users(),
        removed_items: ni - next as usize,
        removed_interactions: m.nnz() - out.nnz(),
    };
    (out, report)
}
