//! A batch of click examples in columnar form: the dense features, the labels and one
//! bag of ids per table, as the generator ([`super::gen`]), the click-log file
//! ([`super::log_file`]) and the Criteo readers produce it and every consumer takes it.

use crate::allocs::reserve_with_room as reserve_total;
use crate::spec::ModelSpec;

/// One feature's bags: example e has ids[offsets[e]..offsets[e+1]]. Rows of a table
/// are `u32` ids; the raw 64-bit feature ids of a hash-table vocabulary are
/// [`KeyBags`] until they are resolved to rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Bags<I = u32> {
    pub offsets: Vec<u32>,
    pub ids: Vec<I>,
}

/// Bags of raw 64-bit feature ids (keys of a hash-table vocabulary).
pub type KeyBags = Bags<u64>;

impl<I> Default for Bags<I> {
    fn default() -> Self {
        Bags {
            offsets: Vec::new(),
            ids: Vec::new(),
        }
    }
}

impl<I: Copy> Bags<I> {
    /// Examples held (`offsets.len() - 1`; 0 for a default value).
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids of example `e`.
    pub fn bag(&self, e: usize) -> &[I] {
        &self.ids[self.offsets[e] as usize..self.offsets[e + 1] as usize]
    }

    /// No examples (one offset), keeping the buffers.
    fn clear(&mut self) {
        self.offsets.clear();
        self.offsets.push(0);
        self.ids.clear();
    }

    /// Make room for `others` appended.
    fn reserve_for<'a>(&mut self, others: impl Iterator<Item = &'a Bags<I>> + Clone)
    where
        I: 'a,
    {
        let (no, ni) = (self.offsets.len(), self.ids.len());
        reserve_total(
            &mut self.offsets,
            no + others.clone().map(|b| b.offsets.len()).sum::<usize>(),
        );
        reserve_total(
            &mut self.ids,
            ni + others.map(|b| b.ids.len()).sum::<usize>(),
        );
    }

    /// Append `other`'s bags (an empty `other`, without offsets, appends nothing).
    fn append(&mut self, other: &Bags<I>) {
        if other.offsets.is_empty() {
            return;
        }
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        let base = self.ids.len();
        let first = other.offsets.first().copied().unwrap_or(0) as usize;
        let last = other.offsets.last().copied().unwrap_or(0) as usize;
        let no = self.offsets.len();
        reserve_total(&mut self.offsets, no + other.offsets.len());
        reserve_total(&mut self.ids, base + (last - first));
        self.offsets.extend(
            other
                .offsets
                .iter()
                .skip(1)
                .map(|&o| to_u32_offset(base + (o as usize - first))),
        );
        self.ids.extend_from_slice(&other.ids[first..last]);
    }

    /// Examples `lo..hi` (offsets start at 0); an empty `self` gives an empty value.
    fn slice(&self, lo: usize, hi: usize) -> Bags<I> {
        if self.offsets.is_empty() {
            return Bags::default();
        }
        let (a, z) = (self.offsets[lo], self.offsets[hi]);
        Bags {
            offsets: self.offsets[lo..=hi].iter().map(|&o| o - a).collect(),
            ids: self.ids[a as usize..z as usize].to_vec(),
        }
    }
}

/// Examples in columnar form.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub n: usize,
    pub n_dense: usize,
    /// `n * n_dense`, row-major.
    pub dense: Vec<f32>,
    /// 0.0 or 1.0.
    pub labels: Vec<f32>,
    /// One per table: the rows looked up (for a hash-table vocabulary, filled when
    /// the step's keys are resolved to rows).
    pub bags: Vec<Bags>,
    /// The raw 64-bit ids of the tables with a hash-table vocabulary, one per table
    /// (default, without offsets, for every other table); empty when no table has one.
    pub keys: Vec<KeyBags>,
    /// Per-id weights, one list per table when the examples carry any (else empty):
    /// a weighted table's list has one weight per id of its bags (of `keys[t]` until
    /// a hash table's keys are resolved, then of `bags[t]`), another table's is empty.
    pub weights: Vec<Vec<f32>>,
}

pub(crate) fn to_u32_offset(x: usize) -> u32 {
    u32::try_from(x).expect("more than u32::MAX ids of one table in one batch")
}

impl Batch {
    /// No examples, shaped for `spec`.
    pub fn empty(spec: &ModelSpec) -> Batch {
        Batch {
            n: 0,
            n_dense: spec.n_dense,
            dense: Vec::new(),
            labels: Vec::new(),
            bags: vec![
                Bags {
                    offsets: vec![0],
                    ids: Vec::new(),
                };
                spec.tables.len()
            ],
            keys: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// No examples, keeping the shape and the buffers.
    pub fn clear(&mut self) {
        self.n = 0;
        self.dense.clear();
        self.labels.clear();
        for b in &mut self.bags {
            b.clear();
        }
        for k in &mut self.keys {
            if !k.offsets.is_empty() {
                k.clear();
            }
        }
        for w in &mut self.weights {
            w.clear();
        }
    }

    /// Table `t`'s weights, if it has any (one per id of its bags).
    pub fn weights_of(&self, t: usize) -> Option<&[f32]> {
        self.weights
            .get(t)
            .filter(|w| !w.is_empty())
            .map(|w| w.as_slice())
    }

    /// Make room for `others` appended after this batch's examples.
    pub fn reserve_for(&mut self, others: &[&Batch]) {
        let (nd, nl) = (self.dense.len(), self.labels.len());
        reserve_total(
            &mut self.dense,
            nd + others.iter().map(|b| b.dense.len()).sum::<usize>(),
        );
        reserve_total(
            &mut self.labels,
            nl + others.iter().map(|b| b.labels.len()).sum::<usize>(),
        );
        for (t, mine) in self.bags.iter_mut().enumerate() {
            mine.reserve_for(others.iter().filter_map(|b| b.bags.get(t)));
        }
        for (t, mine) in self.keys.iter_mut().enumerate() {
            mine.reserve_for(others.iter().filter_map(|b| b.keys.get(t)));
        }
    }

    /// Append `other`'s examples after this batch's. A default (shapeless) batch
    /// takes `other`'s shape.
    ///
    /// Panics if the shapes differ or one table's ids would exceed `u32::MAX`.
    pub fn append(&mut self, other: &Batch) {
        if self.n == 0 && self.bags.is_empty() && self.dense.is_empty() {
            self.n_dense = other.n_dense;
            self.bags = vec![Bags::default(); other.bags.len()];
        }
        assert_eq!(self.n_dense, other.n_dense, "appending batches: n_dense");
        assert_eq!(
            self.bags.len(),
            other.bags.len(),
            "appending batches: table count"
        );
        self.n += other.n;
        let (nd, nl) = (self.dense.len(), self.labels.len());
        reserve_total(&mut self.dense, nd + other.dense.len());
        reserve_total(&mut self.labels, nl + other.labels.len());
        self.dense.extend_from_slice(&other.dense);
        self.labels.extend_from_slice(&other.labels);
        for (mine, theirs) in self.bags.iter_mut().zip(&other.bags) {
            if mine.offsets.is_empty() {
                mine.offsets.push(0);
            }
            mine.append(theirs);
        }
        if self.keys.len() < other.keys.len() {
            self.keys.resize_with(other.keys.len(), Bags::default);
        }
        for (mine, theirs) in self.keys.iter_mut().zip(&other.keys) {
            mine.append(theirs);
        }
        self.append_weights(other);
    }

    /// [`Self::append`]'s weights: each weighted table's weights of `other`'s bags.
    fn append_weights(&mut self, other: &Batch) {
        if self.weights.len() < other.weights.len() {
            self.weights.resize_with(other.weights.len(), Vec::new);
        }
        for (t, (mine, theirs)) in self.weights.iter_mut().zip(&other.weights).enumerate() {
            let b = if other.keys.get(t).is_some_and(|k| !k.offsets.is_empty()) {
                &other.keys[t].offsets
            } else {
                &other.bags[t].offsets
            };
            if let (Some(&lo), Some(&hi)) = (b.first(), b.last()) {
                if !theirs.is_empty() {
                    mine.extend_from_slice(&theirs[lo as usize..hi as usize]);
                }
            }
        }
    }

    /// Examples `lo..hi` as a batch of their own (offsets start at 0).
    pub fn slice(&self, lo: usize, hi: usize) -> Batch {
        assert!(lo <= hi && hi <= self.n, "slice {lo}..{hi} of {}", self.n);
        let nd = self.n_dense;
        Batch {
            n: hi - lo,
            n_dense: nd,
            dense: self.dense[lo * nd..hi * nd].to_vec(),
            labels: self.labels[lo..hi].to_vec(),
            bags: self.bags.iter().map(|b| b.slice(lo, hi)).collect(),
            keys: self.keys.iter().map(|k| k.slice(lo, hi)).collect(),
            weights: (0..self.weights.len())
                .map(|t| self.weights_slice(t, lo, hi))
                .collect(),
        }
    }

    /// Table `t`'s weights of examples `lo..hi` (empty for an unweighted table).
    fn weights_slice(&self, t: usize, lo: usize, hi: usize) -> Vec<f32> {
        let w = &self.weights[t];
        if w.is_empty() {
            return Vec::new();
        }
        let o = match self.keys.get(t) {
            Some(k) if !k.offsets.is_empty() => &k.offsets,
            _ => &self.bags[t].offsets,
        };
        w[o[lo] as usize..o[hi] as usize].to_vec()
    }

    /// Ids over all tables and examples.
    pub fn ids_total(&self) -> usize {
        self.bags.iter().map(|b| b.ids.len()).sum()
    }
}
