//! The preemption check of a pass that saves nothing to resume (a prepare, an
//! ingestion, a statistics run): a signal, or the test hook `TORUSREC_PREEMPT_IN`
//! naming the pass, stops it with [`Error::Interrupted`] (exit 1).

use crate::error::{Error, Result};

/// `Err(Error::Interrupted(message()))` when a preemption signal arrived or
/// `TORUSREC_PREEMPT_IN` names `phase`; checked per chunk, so every rank then meets
/// the others at the pass's agreement. The caller words the message (its job and
/// what is left behind).
pub fn check_preempted(phase: &str, message: impl FnOnce() -> String) -> Result<()> {
    if crate::ckpt::signals::signalled() || crate::faults::preempt_in(phase) {
        return Err(Error::Interrupted(message()));
    }
    Ok(())
}
