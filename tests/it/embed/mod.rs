//! The sharded embedding model: hash tables, runs under `mpirun`, a click log's tables
//! matched by name, the model file, and training on the thread communicator.

mod arch;
mod dtype;
mod hash;
mod log_tables;
mod mpi;
mod optim;
mod out;
mod predict;
mod threads;
