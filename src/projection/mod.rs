//! Projection of a run onto a TPU-like torus: the chip and link model
//! ([`chip`]), the link traffic of the torus collectives computed without running
//! them ([`traffic`]), the iALS workload from data or from the generator's degree
//! model ([`als`]), and the measurement that calibrates this machine and checks the
//! projection against a real run ([`measure`]).
//!
//! Time per epoch = compute + communication. Compute: the busiest rank's solve
//! FLOPs (CG on every row: `(steps + 1) (2 d^2 n + 4 d nnz)`, plus its Gramian
//! `2 d^2 n`) over the chip's rate, which is this machine's measured solve rate
//! scaled by the ratio of the chip's peak to this machine's matrix-multiply peak.
//! Communication: every collective as the chain of synchronous neighbour shifts the
//! torus algorithms run, each costing the link latency plus its largest message over
//! the link bandwidth. Nothing overlaps (as in torusrec's own epoch).

pub mod als;
pub mod chip;
pub mod embed;
pub mod measure;
pub mod traffic;
