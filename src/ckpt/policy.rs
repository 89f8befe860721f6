//! Which checkpoints to keep: a pure function over the committed steps.

/// Given the committed checkpoint steps (any order) and the step `just` committed,
/// return the steps to delete so that `keep` remain (`keep >= 1`): `just`, which is
/// never deleted, and the highest of the others. `just` need not be the highest: a run
/// resumed from an older checkpoint (`--resume PATH`) writes below the steps of the
/// run it branched from, and its own newest checkpoint is the one to keep.
pub fn to_delete(committed: &[u64], just: u64, keep: usize) -> Vec<u64> {
    let mut others: Vec<u64> = committed.iter().copied().filter(|&s| s != just).collect();
    others.sort_unstable();
    others.dedup();
    let room = keep.max(1) - 1;
    let n = others.len().saturating_sub(room);
    others.truncate(n);
    others
}

/// [`to_delete`] that never breaks a chain: `base_of(step)` is the checkpoint an
/// incremental checkpoint was written on (`None` for a full one); every base a kept
/// checkpoint needs, directly or through other deltas, is kept too.
pub fn to_delete_chained(
    committed: &[u64],
    just: u64,
    keep: usize,
    base_of: impl Fn(u64) -> Option<u64>,
) -> Vec<u64> {
    let plain = to_delete(committed, just, keep);
    let mut needed = std::collections::BTreeSet::new();
    for &s in committed.iter().filter(|s| !plain.contains(s)) {
        let mut cur = s;
        while let Some(b) = base_of(cur) {
            if b >= cur || !needed.insert(b) {
                break;
            }
            cur = b;
        }
    }
    plain.into_iter().filter(|s| !needed.contains(s)).collect()
}

/// Whether a checkpoint is due after `half_epochs` completed half-epochs.
pub fn due(half_epochs: u64, every: u64) -> bool {
    every > 0 && half_epochs > 0 && half_epochs.is_multiple_of(every)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest() {
        assert_eq!(to_delete(&[3, 1, 2], 3, 3), Vec::<u64>::new());
        assert_eq!(to_delete(&[5, 1, 9, 3], 9, 2), vec![1, 3]);
        assert_eq!(to_delete(&[5, 5, 7], 7, 1), vec![5]);
        assert_eq!(
            to_delete(&[4], 4, 0),
            Vec::<u64>::new(),
            "keep 0 still keeps the newest"
        );
        assert_eq!(to_delete(&[], 3, 3), Vec::<u64>::new());
    }

    #[test]
    fn the_checkpoint_just_written_is_kept_below_higher_steps() {
        // Resumed from 20 with 30 and 40 of an earlier run in the directory.
        assert_eq!(to_delete(&[20, 25, 30, 40], 25, 1), vec![20, 30, 40]);
        assert_eq!(to_delete(&[20, 25, 30, 40], 25, 2), vec![20, 30]);
        assert_eq!(to_delete(&[20, 25, 30, 40], 25, 4), Vec::<u64>::new());
    }

    #[test]
    fn a_kept_checkpoint_keeps_its_chain() {
        // 10 full, 20 on 10, 30 on 20, 40 full, 50 on 40.
        let base = |s: u64| match s {
            20 => Some(10),
            30 => Some(20),
            50 => Some(40),
            _ => None,
        };
        let all = [10, 20, 30, 40, 50];
        assert_eq!(to_delete_chained(&all, 50, 1, base), vec![10, 20, 30]);
        assert_eq!(to_delete_chained(&all, 50, 2, base), vec![10, 20, 30]);
        // Keeping 30 keeps 20 and 10.
        assert_eq!(to_delete_chained(&all, 50, 3, base), Vec::<u64>::new());
        assert_eq!(to_delete_chained(&all, 30, 1, base), vec![40, 50]);
        // Full checkpoints only: the plain policy.
        assert_eq!(to_delete_chained(&all, 50, 2, |_| None), vec![10, 20, 30]);
        // A base that is not committed (already gone) is not asked for.
        assert_eq!(to_delete_chained(&[30, 40], 40, 2, base), Vec::<u64>::new());
    }

    #[test]
    fn due_every_n() {
        assert!(!due(0, 2));
        assert!(!due(1, 2));
        assert!(due(2, 2));
        assert!(due(4, 2));
        assert!(!due(4, 0));
    }
}
