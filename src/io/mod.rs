//! File helpers below every workload: the HDF5 helpers every reader and writer shares
//! ([`h5`]: opening, error context, attributes, checked range reads), output files
//! written atomically and never overwritten by accident ([`outfile`]), positional
//! writes into preallocated HDF5 datasets ([`positional`]) and compressed-input
//! detection ([`compress`]).

pub mod compress;
pub mod h5;
pub mod outfile;
pub mod positional;
