//! iALS: evaluation, input validation, runs under `mpirun`, out-of-core layouts, and
//! training on the thread communicator.

mod confidence;
mod eval;
mod input;
mod mpi;
mod ooc;
mod threads;
