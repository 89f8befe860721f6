//! File helpers below every workload: positional writes into preallocated HDF5
//! datasets ([`positional`]), the preemption check of the streaming passes
//! ([`signals`]) and compressed-input detection ([`compress`]).

pub mod compress;
pub mod positional;
pub mod signals;
