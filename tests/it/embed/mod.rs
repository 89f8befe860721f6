//! The sharded embedding model: hash tables, runs under `mpirun`, the model file, and
//! training on the thread communicator.

mod hash;
mod mpi;
mod out;
mod threads;
