//! Sorted disjoint ranges of row ids: the rows of a half already solved (merged as
//! steps finish, gathered into a checkpoint) and the parts of a step not yet covered.

/// Intersect `[a, b)` with a sorted list of disjoint ranges; returns the parts of
/// `[a, b)` *not* covered.
pub fn uncovered(a: u64, b: u64, done: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut cur = a;
    for &(x, y) in done {
        if y <= cur || x >= b {
            continue;
        }
        if x > cur {
            out.push((cur, x.min(b)));
        }
        cur = cur.max(y);
        if cur >= b {
            break;
        }
    }
    if cur < b {
        out.push((cur, b));
    }
    out
}

/// Merge ranges into a sorted list of disjoint ones.
pub fn merge_ranges(mut r: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    r.retain(|(a, b)| a < b);
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
    for (a, b) in r {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncovered_and_merge() {
        assert_eq!(uncovered(0, 10, &[]), vec![(0, 10)]);
        assert_eq!(uncovered(0, 10, &[(2, 4), (6, 12)]), vec![(0, 2), (4, 6)]);
        assert_eq!(uncovered(5, 8, &[(0, 100)]), vec![]);
        assert_eq!(
            merge_ranges(vec![(5, 7), (0, 2), (2, 3), (7, 7), (6, 9)]),
            vec![(0, 3), (5, 9)]
        );
    }
}
