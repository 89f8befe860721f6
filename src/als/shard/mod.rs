//! One rank's share of the matrix and how the fixed table's rows reach it. Each file
//! one job, each importing only the ones listed before it:
//!
//! - [`bounds`]: contiguous ranges balanced by non-zeros, and which range owns an id;
//! - [`csr`]: one side's CSR shard and the arc checksum that checks the transpose;
//! - [`exchange`]: the plans and fetches that move the fixed table's rows each half;
//! - [`memory`]: the memory a rank's share needs and the layout chosen to fit it
//!   (the CSR in memory or spilled, the gather in blocks);
//! - [`spill`]: a side's CSR out of core, written once and read back in chunks;
//! - [`read`]: reading and checking one rank's shards of a prepared dataset.

pub mod bounds;
pub mod csr;
pub mod exchange;
pub mod memory;
pub mod read;
pub mod spill;
