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
    fn due_every_n() {
        assert!(!due(0, 2));
        assert!(!due(1, 2));
        assert!(due(2, 2));
        assert!(due(4, 2));
        assert!(!due(4, 0));
    }
}
