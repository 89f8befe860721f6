//! The integration tests that change the process environment: each plants a fault or
//! a test setting through a variable the library reads at run time
//! (`TORUSREC_PREEMPT_AT`, `TORUSREC_INJECT_NAN_GRAD`, `TORUSREC_FETCH_ROUND_BYTES`).
//! They are apart from `tests/it` because the environment belongs to the whole
//! process: there the variable would reach every test running at the same time (the
//! simulated ranks of the thread communicator read it, and every child a test starts
//! inherits it). Here every test takes [`util::serial`] first and sets its variables
//! through an [`EnvVar`], which removes them when the test ends, failed or not.

#[path = "../util/mod.rs"]
mod util;

mod als_ooc;
mod embed_nonfinite;
mod project;

/// An environment variable of this process, set while the value lives (removed on
/// drop, also when the test panics). Take [`util::serial`] first.
#[must_use = "the variable is removed when this is dropped"]
pub struct EnvVar(&'static str);

impl EnvVar {
    pub fn set(key: &'static str, value: &str) -> Self {
        std::env::set_var(key, value);
        EnvVar(key)
    }
}

impl Drop for EnvVar {
    fn drop(&mut self) {
        std::env::remove_var(self.0);
    }
}
