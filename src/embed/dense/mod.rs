//! The dense part of the click model: the MLP ([`mlp`]), its matrix products
//! ([`gemm`]), and the quality measures of its output ([`auc`]). No communication here.

pub mod auc;
pub mod gemm;
pub mod mlp;
