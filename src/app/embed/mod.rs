//! `torusrec embed`, `torusrec plan` and `torusrec generate clicks`, a file a job:
//!
//! - `config.rs`: the flags to validated configs (the trainer's, the planner's,
//!   the cost files'), one path for `embed` and `plan`;
//! - `model.rs`: the model, the examples' source and the id map the flags name;
//! - `run.rs`: `embed` (the plan, the run, its progress and final lines);
//! - `plan.rs`: `plan` (the planner against the heuristics, the output modes, the
//!   predicted steps; `--tasks`);
//! - `generate.rs`: `generate clicks`;
//! - `report.rs`: the lines `embed` and `plan` both print.
//!
//! The measured step `embed --costs` reports beside its prediction is the library's
//! ([`crate::embed::calibrate::measured`]).

pub mod config;
pub mod generate;
pub mod model;
pub mod plan;
pub mod report;
pub mod run;
