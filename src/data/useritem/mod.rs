//! User x item interaction matrices for iALS (`prepare --matrix user-item`): the text
//! reader ([`parse`]), renumbering, duplicate summing and the minimum-interaction
//! filter ([`filter`]), the three test splits ([`split`]) and the dataset they are
//! written to ([`write`]): the prepared-dataset layout of docs/design.md with rows the
//! users and columns the items, plus the weights beside every CSR's indices and the
//! original ids of both sides.

pub mod filter;
pub mod parse;
pub mod split;
#[cfg(test)]
mod tests;
pub mod write;
