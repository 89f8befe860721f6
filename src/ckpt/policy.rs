//! Which checkpoints to keep: a pure function over the committed steps.

/// Given the committed checkpoint steps (any order) and the one just committed,
/// return the steps to delete so that the newest `keep` remain (`keep >= 1`; the
/// newest is never deleted).
pub fn to_delete(committed: &[u64], keep: usize) -> Vec<u64> {
    let mut s = committed.to_vec();
    s.sort_unstable();
    s.dedup();
    let keep = keep.max(1);
    if s.len() <= keep {
        return Vec::new();
    }
    s[..s.len() - keep].to_vec()
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
        assert_eq!(to_delete(&[3, 1, 2], 3), Vec::<u64>::new());
        assert_eq!(to_delete(&[5, 1, 9, 3], 2), vec![1, 3]);
        assert_eq!(to_delete(&[5, 5, 7], 1), vec![5]);
        assert_eq!(
            to_delete(&[4], 0),
            Vec::<u64>::new(),
            "keep 0 still keeps the newest"
        );
        assert_eq!(to_delete(&[], 3), Vec::<u64>::new());
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
