//! The learning-rate schedule: one multiplier of the base rates, a function of the
//! 0-based global step `s` alone, shared by the tables' and the MLP's optimizers (so a
//! resume, which restores the step, continues it exactly). No I/O here.
//!
//! `mult(s) = warm(s) * decay(max(s - W, 0))` with a linear warm-up over `W` steps,
//! `warm(s) = (s + 1) / W` for `s < W` and 1 after, and a decay counted from the end
//! of the warm-up: none (1), polynomial `end + (1 - end) (1 - min(u, T) / T)^p` (the
//! rate falls from the base to `end` times it over `T` steps, then stays), or step
//! `factor^floor(u / K)`. Computed in f64, rounded to f32 once; the constant schedule
//! is exactly 1.0, which leaves every update's bits as without a schedule.

/// The decay after the warm-up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decay {
    None,
    /// To `end` (a fraction of the base rate) over `steps` steps with power `power`.
    Poly {
        steps: u64,
        power: f64,
        end: f64,
    },
    /// Times `factor` every `every` steps.
    Step {
        every: u64,
        factor: f64,
    },
}

/// A learning-rate schedule (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    pub warmup: u64,
    pub decay: Decay,
}

impl Default for LrSchedule {
    fn default() -> Self {
        LrSchedule {
            warmup: 0,
            decay: Decay::None,
        }
    }
}

impl LrSchedule {
    /// Whether the multiplier is 1 at every step.
    pub fn is_constant(&self) -> bool {
        self.warmup == 0 && self.decay == Decay::None
    }

    /// The multiplier of the base rates at 0-based global step `s`.
    pub fn mult(&self, s: u64) -> f32 {
        if self.is_constant() {
            return 1.0;
        }
        let warm = if s < self.warmup {
            (s + 1) as f64 / self.warmup as f64
        } else {
            1.0
        };
        let u = s.saturating_sub(self.warmup);
        let decay = match self.decay {
            Decay::None => 1.0,
            Decay::Poly { steps, power, end } => {
                let frac = u.min(steps) as f64 / steps.max(1) as f64;
                end + (1.0 - end) * (1.0 - frac).powf(power)
            }
            Decay::Step { every, factor } => factor.powf((u / every.max(1)) as f64),
        };
        (warm * decay) as f32
    }

    /// The schedule as canonical JSON for the configuration hash (`None` when
    /// constant, so runs without one keep their hash).
    pub fn resume_key(&self) -> Option<serde_json::Value> {
        if self.is_constant() {
            return None;
        }
        let b = |x: f64| format!("{:016x}", x.to_bits());
        let decay = match self.decay {
            Decay::None => serde_json::json!({"kind": "none"}),
            Decay::Poly { steps, power, end } => serde_json::json!({
                "kind": "poly", "steps": steps, "power": b(power), "end": b(end)
            }),
            Decay::Step { every, factor } => serde_json::json!({
                "kind": "step", "every": every, "factor": b(factor)
            }),
        };
        Some(serde_json::json!({"warmup": self.warmup, "decay": decay}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_constant() {
        let s = LrSchedule {
            warmup: 4,
            decay: Decay::None,
        };
        let got: Vec<f32> = (0..6).map(|i| s.mult(i)).collect();
        assert_eq!(got, [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]);
        assert_eq!(LrSchedule::default().mult(12345), 1.0);
        assert!(LrSchedule::default().resume_key().is_none());
        assert!(s.resume_key().is_some());
    }

    #[test]
    fn polynomial_decay_after_warmup_reaches_its_end() {
        let s = LrSchedule {
            warmup: 2,
            decay: Decay::Poly {
                steps: 4,
                power: 2.0,
                end: 0.1,
            },
        };
        // u = s - 2: 0, 1, 2, 3, 4, 5 -> 0.1 + 0.9 (1 - u/4)^2.
        let want = [0.5, 1.0, 1.0, 0.60625, 0.325, 0.15625, 0.1, 0.1];
        for (i, w) in want.iter().enumerate() {
            let got = s.mult(i as u64);
            assert!((got - w).abs() < 1e-6, "step {i}: {got} vs {w}");
        }
    }

    #[test]
    fn step_decay_every_k() {
        let s = LrSchedule {
            warmup: 0,
            decay: Decay::Step {
                every: 3,
                factor: 0.5,
            },
        };
        let got: Vec<f32> = (0..8).map(|i| s.mult(i)).collect();
        assert_eq!(got, [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]);
    }
}
