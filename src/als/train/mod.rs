//! The training loop: alternating half-epochs over the distributed tables, cut into
//! steps (row batches) at whose boundaries the ranks agree on preemption and on
//! non-finite values. One job per file:
//!
//! - [`run`]: a training run on the run driver (iALS as its workload), the entry points;
//! - [`trainer`]: one rank's model state and one half-epoch;
//! - [`steps`]: the steps of a half, in memory or from the spilled CSR;
//! - [`gather`]: the fixed table's rows gathered for a half, whole or in blocks;
//! - [`solve_range`]: one run of rows solved with the configured solver;
//! - [`loss`]: the exact loss after a half, its pieces and their assembly;
//! - [`eigenbasis`]: `--basis eigen`'s rotations of the tables;
//! - [`side`]: one side of the alternation (its rows, plan, steps and spill);
//! - [`shards`]: this run's shards read under its memory limit;
//! - [`tables`]: the tables' starting values and a distributed table's Gramian;
//! - [`ranges`]: the sorted disjoint ranges of rows already solved;
//! - [`report`]: the epoch's and the run's reports;
//! - [`epoch`]: what an epoch measured, and its report;
//! - [`save`]: the checksum, the checkpoint and the model file.

pub mod eigenbasis;
pub mod epoch;
pub mod gather;
pub mod loss;
pub mod ranges;
pub mod report;
pub mod run;
pub mod save;
pub mod shards;
pub mod side;
pub mod solve_range;
pub mod steps;
pub mod tables;
pub mod trainer;
