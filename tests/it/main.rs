//! The integration tests of `torusrec`, one test binary with a module per feature
//! (after ripgrep's `tests/`): run one feature with `cargo test --release --features
//! testing --test it als::`, one test by its name.
//!
//! Tests that change the process environment to plant faults live apart, in
//! `tests/faults/` (a second binary): the library reads those variables at run time,
//! so here they would reach every test running at the same time.
//!
//! The tests that start `mpirun` jobs of several ranks take [`util::serial`] first, so
//! no two of them overlap (they oversubscribe the cores; the signal tests depend on
//! timing).

#[path = "../util/mod.rs"]
mod util;

mod als;
mod ckpt;
mod cli;
mod cluster;
mod comm;
mod costs;
mod data;
mod embed;
mod layers;
mod plot;
mod project;
mod recommend;
mod recommend_useritem;
mod tune;
