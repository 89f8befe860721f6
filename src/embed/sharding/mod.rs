//! Between ranks: the exchange of rows and gradients with the tables' owners
//! ([`exchange`]), and the `pooled` output mode, where the owners pool ([`pooled`]).

pub mod exchange;
pub mod pooled;
