//! The embedding tables on one rank: where each table lives ([`placement`]), this
//! rank's pieces and their optimizers ([`store`]), hash-table shards ([`hashtab`]), the
//! resolution of ids and keys to rows ([`keys`]), and the row kernels that pool and
//! update them ([`row_kernels`]).

pub mod dirty;
pub mod hashtab;
pub mod keys;
pub mod placement;
pub mod row_kernels;
pub mod store;
pub mod table_opt;
