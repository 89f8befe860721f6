//! The dense part of the click model: the MLP ([`mlp`]), DLRM's pairwise dot interaction
//! ([`interaction`]), DCN-v2's cross layers ([`cross`]), the optimizers ([`optim`]), their matrix products ([`gemm`]),
//! and the quality measures of the output ([`auc`]). No communication here.

pub mod arch;
pub mod auc;
pub mod cross;
pub mod gemm;
pub mod interaction;
pub mod mlp;
pub mod optim;
