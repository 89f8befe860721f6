//! A rank's slice of a directed graph: the out-arcs of a contiguous range of source
//! nodes, in CSR form. Node ids are u32 (graphs with 2^32 or more nodes are refused).

/// Out-arcs of rows `lo .. lo + num_rows()`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalRows {
    pub lo: u64,
    /// `num_rows() + 1` offsets into `targets`, starting at 0.
    pub indptr: Vec<u64>,
    pub targets: Vec<u32>,
}

impl LocalRows {
    /// An empty slice starting at `lo`.
    pub fn empty(lo: u64) -> Self {
        Self {
            lo,
            indptr: vec![0],
            targets: Vec::new(),
        }
    }

    pub fn num_rows(&self) -> usize {
        self.indptr.len() - 1
    }

    pub fn num_arcs(&self) -> u64 {
        self.targets.len() as u64
    }

    /// Targets of local row `i` (global id `lo + i`).
    pub fn row(&self, i: usize) -> &[u32] {
        &self.targets[self.indptr[i] as usize..self.indptr[i + 1] as usize]
    }

    /// Build from (source, target) pairs whose sources lie in `lo..hi`, in any order.
    pub fn from_pairs(lo: u64, hi: u64, pairs: &[(u32, u32)]) -> Self {
        let n = (hi - lo) as usize;
        let mut indptr = vec![0u64; n + 1];
        for &(s, _) in pairs {
            indptr[(s as u64 - lo) as usize + 1] += 1;
        }
        for i in 0..n {
            indptr[i + 1] += indptr[i];
        }
        let mut fill = indptr.clone();
        let mut targets = vec![0u32; pairs.len()];
        for &(s, t) in pairs {
            let slot = &mut fill[(s as u64 - lo) as usize];
            targets[*slot as usize] = t;
            *slot += 1;
        }
        Self {
            lo,
            indptr,
            targets,
        }
    }

    /// Step 1 of the variant protocol: sort every row, drop duplicate arcs and
    /// self-loops. Parallel over rows.
    pub fn local_clean(&mut self) {
        use rayon::prelude::*;
        let lo = self.lo;
        let rows: Vec<Vec<u32>> = (0..self.num_rows())
            .into_par_iter()
            .map(|i| {
                let mut r = self.row(i).to_vec();
                r.sort_unstable();
                r.dedup();
                let me = lo + i as u64;
                r.retain(|&t| t as u64 != me);
                r
            })
            .collect();
        *self = Self::from_rows(lo, rows);
    }

    /// [`local_clean`](Self::local_clean), skipping the copy when every row is
    /// already sorted, distinct and free of self-loops (the generators' rows are).
    pub fn local_clean_if_needed(&mut self) {
        use rayon::prelude::*;
        let lo = self.lo;
        let clean = (0..self.num_rows()).into_par_iter().all(|i| {
            let r = self.row(i);
            r.windows(2).all(|w| w[0] < w[1]) && r.binary_search(&((lo + i as u64) as u32)).is_err()
        });
        if !clean {
            self.local_clean();
        }
    }

    /// Build from one vector per row.
    pub fn from_rows(lo: u64, rows: Vec<Vec<u32>>) -> Self {
        let mut indptr = Vec::with_capacity(rows.len() + 1);
        indptr.push(0u64);
        let total: usize = rows.iter().map(|r| r.len()).sum();
        let mut targets = Vec::with_capacity(total);
        for r in rows {
            targets.extend_from_slice(&r);
            indptr.push(targets.len() as u64);
        }
        Self {
            lo,
            indptr,
            targets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_sorts_dedups_and_drops_self_loops() {
        let mut g = LocalRows::from_pairs(10, 13, &[(10, 5), (10, 10), (10, 5), (12, 1), (12, 0)]);
        g.local_clean();
        assert_eq!(g.row(0), &[5]);
        assert_eq!(g.row(1), &[] as &[u32]);
        assert_eq!(g.row(2), &[0, 1]);
        assert_eq!(g.num_arcs(), 3);
    }
}
