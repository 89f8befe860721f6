//! `--basis eigen`: rotating both tables into the eigenbasis of the fixed side's
//! Gramian before a half, restoring a checkpoint's basis, and turning the tables back
//! into the starting basis when training ends.

use super::report::PhaseTimes;
use super::trainer::Trainer;
use crate::als::checkpoint::Basis;
use crate::als::model::TableScalar;
use crate::als::solve::{eigenbasis, gramian, matmul64, rotate_rows, transpose64};
use crate::comm::Comm;
use std::time::Instant;

/// A row-major `d x d` matrix with `diag` on its diagonal.
pub(super) fn diag_matrix(diag: &[f64]) -> Vec<f64> {
    let d = diag.len();
    let mut m = vec![0.0f64; d * d];
    for (k, &x) in diag.iter().enumerate() {
        m[k * d + k] = x;
    }
    m
}

impl<T: TableScalar> Trainer<T> {
    /// After [`Trainer::restore`]: the basis a checkpoint's tables are in. A restored
    /// diagonal replaces the fixed side's recomputed Gramian (the run it continues
    /// solved and measured its loss with exactly that diagonal).
    pub fn restore_basis(&mut self, basis: Basis) {
        if let Some(diag) = &basis.fixed_diag {
            let g = diag_matrix(diag);
            if self.pos.half == 0 {
                self.gram_h = g;
            } else {
                self.gram_w = g;
            }
        }
        self.basis = basis;
    }

    /// Collective: every rank must call (no communication: `G` is the same on every
    /// rank). Rotates both tables into the eigenbasis of the fixed side's Gramian
    /// `G = V diag V^T`: `W <- W V`, `H <- H V`, so the fixed side's Gramian becomes the
    /// diagonal `V^T G V` (computed in f64 with the f32 `V` applied; its off-diagonal
    /// elements are at f32 rounding and dropped) and the solved side's warm start is in
    /// the same basis. The model and the objective do not change (see `solve::basis`).
    pub(super) fn rotate_into_eigenbasis(&mut self) -> std::result::Result<(), String> {
        let d = self.cfg.dim;
        let g = if self.pos.half == 0 {
            &self.gram_h
        } else {
            &self.gram_w
        };
        let (v, _) = eigenbasis(g, d)?;
        let v32: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        let applied: Vec<f64> = v32.iter().map(|&x| f64::from(x)).collect();
        // diag(V^T G V): column c is sum_k V[k, c] (G V)[k, c].
        let gv = matmul64(g, &applied, d);
        let mut diag = vec![0.0f64; d];
        for (vk, gvk) in applied.chunks_exact(d).zip(gv.chunks_exact(d)) {
            for ((s, &v), &x) in diag.iter_mut().zip(vk).zip(gvk) {
                *s += v * x;
            }
        }
        for table in [&mut self.w, &mut self.h] {
            let t = T::as_f32_mut(table).ok_or("the eigenbasis needs f32 tables")?;
            rotate_rows(t, d, &v32);
        }
        self.basis.rotation = Some(match &self.basis.rotation {
            Some(r) => matmul64(r, &applied, d),
            None => applied,
        });
        let gd = diag_matrix(&diag);
        if self.pos.half == 0 {
            self.gram_h = gd;
        } else {
            self.gram_w = gd;
        }
        self.basis.fixed_diag = Some(diag);
        Ok(())
    }

    /// Collective: every rank must call. Turns the tables back into the starting basis
    /// (`T <- T R^T`) and their Gramians with them.
    pub fn global_to_starting_basis<C: Comm>(&mut self, comm: &C) {
        let Some(r) = self.basis.rotation.take() else {
            return;
        };
        let d = self.cfg.dim;
        let back: Vec<f32> = transpose64(&r, d).iter().map(|&x| x as f32).collect();
        for table in [&mut self.w, &mut self.h] {
            if let Some(t) = T::as_f32_mut(table) {
                rotate_rows(t, d, &back);
            }
        }
        // H's Gramian as a restore computes it, the bits of `global_gramian` (the
        // evaluation folds test rows in against H, and a run resumed after its last
        // epoch evaluates the restored tables), its all-reduce counted as the
        // once-per-run phase "basis"; W's, which nothing uses after the last epoch,
        // turned in f64.
        let mut gram_h = gramian(&self.h, d);
        {
            let _p = comm.stats().phase("basis");
            comm.all_reduce_sum(&mut gram_h);
        }
        self.gram_h = gram_h;
        self.gram_w = matmul64(&matmul64(&r, &self.gram_w, d), &transpose64(&r, d), d);
        self.basis.fixed_diag = None;
    }

    /// Collective: every rank must call. After the last epoch's column half: the
    /// model leaves in the basis it started in.
    pub(super) fn global_end_of_training<C: Comm>(&mut self, comm: &C, times: &mut PhaseTimes) {
        if self.pos.epoch >= self.cfg.epochs {
            let t = Instant::now();
            self.global_to_starting_basis(comm);
            times.basis += t.elapsed().as_secs_f64();
        }
    }
}
