//! The one agreement on how a training step ended, shared by every workload: did some
//! rank see a non-finite value (and which, the lowest), did a preemption signal reach
//! some rank. One all-reduce (max) of one u64 per step boundary.

use crate::comm::Comm;

/// How a step ended, the same on every rank after [`StepStatus::global_agree`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepStatus {
    Done,
    /// A preemption signal reached some rank (and no rank saw a non-finite value).
    Preempt,
    /// Some rank saw a non-finite value or a failed solve (`rank` is the lowest that
    /// did): the run stops with a hold. Outranks a preemption: nothing is to be saved.
    NonFinite {
        rank: usize,
    },
    /// Some rank failed (an I/O error: `rank` is the lowest): every rank stops with
    /// exit 1, the failing one naming the error. Outranks everything else.
    Failed {
        rank: usize,
    },
}

/// The key of a rank's status in the maximum: bit 34 failed, bit 33 non-finite (then `u32::MAX -
/// rank` in the low 32 bits, so the maximum names the lowest such rank), bit 32
/// preemption.
const FAILED: u64 = 1 << 34;
const NON_FINITE: u64 = 1 << 33;
const PREEMPT: u64 = 1 << 32;
const RANK: u64 = u32::MAX as u64;

impl StepStatus {
    /// Collective: every rank must call, with what it saw in this step.
    pub fn global_agree<C: Comm>(comm: &C, non_finite: bool, preempt: bool) -> StepStatus {
        Self::global_agree_all(comm, false, non_finite, preempt)
    }

    /// Collective: every rank must call. [`StepStatus::global_agree`] with a local
    /// failure as well.
    pub fn global_agree_all<C: Comm>(
        comm: &C,
        failed: bool,
        non_finite: bool,
        preempt: bool,
    ) -> StepStatus {
        Self::decode(comm.all_reduce_max(Self::local_key(comm.rank(), failed, non_finite, preempt)))
    }

    fn local_key(rank: usize, failed: bool, non_finite: bool, preempt: bool) -> u64 {
        if failed {
            FAILED | (RANK - (rank as u64).min(RANK))
        } else if non_finite {
            NON_FINITE | (RANK - (rank as u64).min(RANK))
        } else if preempt {
            PREEMPT
        } else {
            0
        }
    }

    fn decode(key: u64) -> StepStatus {
        if key & FAILED != 0 {
            StepStatus::Failed {
                rank: (RANK - (key & RANK)) as usize,
            }
        } else if key & NON_FINITE != 0 {
            StepStatus::NonFinite {
                rank: (RANK - (key & RANK)) as usize,
            }
        } else if key & PREEMPT != 0 {
            StepStatus::Preempt
        } else {
            StepStatus::Done
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::threads::run;

    #[test]
    fn the_lowest_non_finite_rank_wins_and_outranks_preemption() {
        for (nf, pre, want) in [
            (vec![], vec![], StepStatus::Done),
            (vec![], vec![2, 3], StepStatus::Preempt),
            (vec![3, 1], vec![0], StepStatus::NonFinite { rank: 1 }),
            (vec![2], vec![], StepStatus::NonFinite { rank: 2 }),
            (vec![0, 1, 2, 3], vec![], StepStatus::NonFinite { rank: 0 }),
        ] {
            let got = run(4, |comm| {
                let r = comm.rank();
                StepStatus::global_agree(&comm, nf.contains(&r), pre.contains(&r))
            });
            assert!(got.iter().all(|s| *s == want), "{nf:?} {pre:?}: {got:?}");
        }
    }
}
