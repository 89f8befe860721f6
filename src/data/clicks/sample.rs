//! The exact samplers the generator draws with: the bounded Zipf law (bag ids) and the
//! Poisson law (bag lengths), and the logistic function of the labels.

use crate::rng::SplitMix64;

/// The logistic `1 / (1 + exp(-x))` the generators draw labels with. Not the
/// overflow-safe form of `embed::dense::auc::sigmoid`: for `x < 0` the two can round
/// differently, and the generated labels are kept bit for bit.
#[inline]
pub fn logistic(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

// ---------------------------------------------------------------------------------
// Zipf

/// The bounded Zipf law over ranks `0..n`, `P(r) ∝ (r + 1)^-s`, sampled exactly in
/// O(1) expected time by rejection-inversion (Hörmann & Derflinger 1996, "Rejection-
/// inversion to generate variates from monotone discrete distributions"; the same
/// scheme as Apache Commons RNG's `RejectionInversionZipfSampler` and
/// `rand_distr::Zipf`). Works for any `s > 0`, including `s == 1` and `s` near 1
/// (through `log1p`/`expm1` helpers), and `n` up to 2^53.
#[derive(Clone, Copy, Debug)]
pub struct Zipf {
    n: f64,
    s: f64,
    /// `H(1.5) - h(1)`.
    h_x1: f64,
    /// `H(n + 0.5)`.
    h_n: f64,
    /// Squeeze: accept `k` at once when `k - x <= sv`.
    sv: f64,
}

/// `log1p(x) / x`, continuous at 0.
fn log1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `expm1(x) / x`, continuous at 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
    }
}

impl Zipf {
    /// Panics unless `n >= 1` and `s > 0` (the spec validates both).
    pub fn new(n: u64, s: f64) -> Zipf {
        assert!(n >= 1, "Zipf over an empty range");
        assert!(s.is_finite() && s > 0.0, "Zipf exponent {s}");
        let mut z = Zipf {
            n: n as f64,
            s,
            h_x1: 0.0,
            h_n: 0.0,
            sv: 0.0,
        };
        z.h_x1 = z.h_integral(1.5) - 1.0;
        z.h_n = z.h_integral(n as f64 + 0.5);
        z.sv = 2.0 - z.h_integral_inv(z.h_integral(2.5) - z.h(2.0));
        z
    }

    /// `h(x) = x^-s`.
    #[inline]
    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// `H(x) = (x^(1-s) - 1) / (1 - s)` (`ln x` at `s == 1`), a primitive of `h`.
    #[inline]
    fn h_integral(&self, x: f64) -> f64 {
        let lx = x.ln();
        expm1_over_x((1.0 - self.s) * lx) * lx
    }

    /// The inverse of `H`.
    #[inline]
    fn h_integral_inv(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (log1p_over_x(t) * x).exp()
    }

    /// A rank in `0..n`.
    #[inline]
    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        loop {
            let u = self.h_n + rng.next_f64() * (self.h_x1 - self.h_n);
            let x = self.h_integral_inv(u);
            let k = (x + 0.5).floor();
            // Also maps a NaN (impossible for valid parameters) to rank 0.
            let k = if k >= 1.0 { k.min(self.n) } else { 1.0 };
            if k - x <= self.sv || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64 - 1;
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Poisson

/// The Poisson law with mean `mu`, sampled exactly: sequential inversion for
/// `mu < 10`, Hörmann's transformed rejection with squeeze (PTRS, "The transformed
/// rejection method for generating Poisson random variables", 1993; as in NumPy)
/// for larger means.
#[derive(Clone, Copy, Debug)]
pub struct Poisson {
    mu: f64,
    kind: PoissonKind,
}

#[derive(Clone, Copy, Debug)]
enum PoissonKind {
    Zero,
    Inversion {
        p0: f64,
    },
    Ptrs {
        ln_mu: f64,
        a: f64,
        b: f64,
        ln_inv_alpha: f64,
        vr: f64,
    },
}

/// Means from here on use PTRS.
const PTRS_MIN_MEAN: f64 = 10.0;

/// `ln Γ(x)` for `x >= 1` (Stirling series, shifted up to 7 for small `x`; NumPy's
/// `random_loggam`).
fn ln_gamma(x: f64) -> f64 {
    const A: [f64; 10] = [
        8.333333333333333e-02,
        -2.777777777777778e-03,
        7.936507936507937e-04,
        -5.952380952380952e-04,
        8.417508417508418e-04,
        -1.917526917526918e-03,
        6.41025641025641e-03,
        -2.955065359477124e-02,
        1.796443723688307e-01,
        -1.39243221690590e+00,
    ];
    if x == 1.0 || x == 2.0 {
        return 0.0;
    }
    let n = if x <= 7.0 { (7.0 - x).floor() } else { 0.0 };
    let mut x0 = x + n;
    let x2 = 1.0 / (x0 * x0);
    let mut gl0 = A[9];
    for &a in A[..9].iter().rev() {
        gl0 = gl0 * x2 + a;
    }
    let mut gl = gl0 / x0 + 0.5 * (2.0 * std::f64::consts::PI).ln() + (x0 - 0.5) * x0.ln() - x0;
    for _ in 0..n as u32 {
        gl -= (x0 - 1.0).ln();
        x0 -= 1.0;
    }
    gl
}

impl Poisson {
    /// Panics unless `mu` is finite and `>= 0`.
    pub fn new(mu: f64) -> Poisson {
        assert!(mu.is_finite() && mu >= 0.0, "Poisson mean {mu}");
        let kind = if mu == 0.0 {
            PoissonKind::Zero
        } else if mu < PTRS_MIN_MEAN {
            PoissonKind::Inversion { p0: (-mu).exp() }
        } else {
            let b = 0.931 + 2.53 * mu.sqrt();
            PoissonKind::Ptrs {
                ln_mu: mu.ln(),
                a: -0.059 + 0.02483 * b,
                b,
                ln_inv_alpha: (1.1239 + 1.1328 / (b - 3.4)).ln(),
                vr: 0.9277 - 3.6224 / (b - 2.0),
            }
        };
        Poisson { mu, kind }
    }

    pub fn mean(&self) -> f64 {
        self.mu
    }

    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        match self.kind {
            PoissonKind::Zero => 0,
            PoissonKind::Inversion { p0 } => {
                let u = rng.next_f64();
                let (mut k, mut p, mut f) = (0u64, p0, p0);
                // Stops when the CDF passes u, or (rounding) when the terms vanish.
                while u >= f && p > 0.0 {
                    k += 1;
                    p *= self.mu / k as f64;
                    f += p;
                }
                k
            }
            PoissonKind::Ptrs {
                ln_mu,
                a,
                b,
                ln_inv_alpha,
                vr,
            } => loop {
                let u = rng.next_f64() - 0.5;
                let v = rng.next_f64();
                let us = 0.5 - u.abs();
                let k = ((2.0 * a / us + b) * u + self.mu + 0.43).floor();
                if us >= 0.07 && v <= vr {
                    return k as u64;
                }
                if k < 0.0 || (us < 0.013 && v > us) {
                    continue;
                }
                if v.ln() + ln_inv_alpha - (a / (us * us) + b).ln()
                    <= -self.mu + k * ln_mu - ln_gamma(k + 1.0)
                {
                    return k as u64;
                }
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn exact_zipf_pmf(n: usize, s: f64) -> Vec<f64> {
        let w: Vec<f64> = (0..n).map(|r| (r as f64 + 1.0).powf(-s)).collect();
        let z: f64 = w.iter().sum();
        w.iter().map(|x| x / z).collect()
    }

    /// Pearson's statistic over cells with expected count >= 5 (the rest pooled);
    /// returns (statistic, degrees of freedom).
    pub(crate) fn chi_square(counts: &[u64], pmf: &[f64], samples: u64) -> (f64, usize) {
        let (mut stat, mut cells) = (0.0, 0usize);
        let (mut obs_rest, mut exp_rest) = (0.0, 0.0);
        for (&c, &p) in counts.iter().zip(pmf) {
            let e = p * samples as f64;
            if e >= 5.0 {
                stat += (c as f64 - e).powi(2) / e;
                cells += 1;
            } else {
                obs_rest += c as f64;
                exp_rest += e;
            }
        }
        if exp_rest > 0.0 {
            stat += (obs_rest - exp_rest).powi(2) / exp_rest.max(1e-300);
            cells += 1;
        }
        (stat, cells - 1)
    }

    /// A loose upper quantile of chi-square with `df` degrees of freedom (far beyond
    /// p = 1e-6 for the sizes used here).
    pub(crate) fn chi_bound(df: usize) -> f64 {
        let df = df as f64;
        df + 7.0 * (2.0 * df).sqrt() + 20.0
    }

    #[test]
    fn zipf_matches_the_exact_pmf() {
        let samples = 400_000u64;
        for (i, &s) in [0.5, 1.0, 1.0 + 1e-10, 1.0 - 1e-7, 1.05, 2.0]
            .iter()
            .enumerate()
        {
            for n in [2usize, 13, 200] {
                let z = Zipf::new(n as u64, s);
                let mut rng = SplitMix64::new(100 + i as u64 * 7 + n as u64);
                let mut counts = vec![0u64; n];
                for _ in 0..samples {
                    let r = z.sample(&mut rng);
                    assert!(r < n as u64);
                    counts[r as usize] += 1;
                }
                let (stat, df) = chi_square(&counts, &exact_zipf_pmf(n, s), samples);
                assert!(
                    stat < chi_bound(df),
                    "s={s} n={n}: chi2 {stat:.1} with {df} df"
                );
            }
        }
    }

    #[test]
    fn zipf_edge_cases() {
        // vocab = 1: always rank 0.
        for s in [0.5, 1.0, 1.05, 3.0] {
            let z = Zipf::new(1, s);
            let mut rng = SplitMix64::new(1);
            assert!((0..1000).all(|_| z.sample(&mut rng) == 0));
        }
        // The largest vocabulary: ranks stay below it, and rank 0 has its mass.
        let n = crate::spec::MAX_VOCAB;
        for s in [0.5, 1.0, 1.05, 2.0] {
            let z = Zipf::new(n, s);
            let mut rng = SplitMix64::new(2);
            let m = 200_000;
            let mut zeros = 0;
            let mut max = 0;
            for _ in 0..m {
                let r = z.sample(&mut rng);
                assert!(r < n);
                zeros += (r == 0) as u64;
                max = max.max(r);
            }
            if s == 2.0 {
                // P(0) = 1 / zeta(2) = 0.6079...
                let p = zeros as f64 / m as f64;
                assert!(
                    (p - 6.0 / std::f64::consts::PI.powi(2)).abs() < 0.005,
                    "{p}"
                );
            }
            if s <= 1.0 {
                assert!(max > n / 1000, "s={s}: max rank {max}");
            }
        }
    }

    #[test]
    fn ln_gamma_matches_factorials() {
        let mut f = 0.0f64;
        for k in 1..200u32 {
            f += (k as f64).ln();
            let g = ln_gamma(k as f64 + 1.0);
            assert!((g - f).abs() < 1e-9 * f.max(1.0), "k={k}: {g} vs {f}");
        }
    }

    #[test]
    fn poisson_moments() {
        for (i, &mu) in [0.5, 3.0, 9.99, 10.0, 40.0, 500.0, 9999.0]
            .iter()
            .enumerate()
        {
            let p = Poisson::new(mu);
            let mut rng = SplitMix64::new(40 + i as u64);
            let n = 200_000;
            let xs: Vec<f64> = (0..n).map(|_| p.sample(&mut rng) as f64).collect();
            let mean = xs.iter().sum::<f64>() / n as f64;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            let se = (mu / n as f64).sqrt();
            assert!((mean - mu).abs() < 5.0 * se, "mu={mu}: mean {mean}");
            assert!((var / mu - 1.0).abs() < 0.03, "mu={mu}: var {var}");
        }
        let mut rng = SplitMix64::new(1);
        assert!((0..100).all(|_| Poisson::new(0.0).sample(&mut rng) == 0));
    }

    #[test]
    fn poisson_matches_the_exact_pmf() {
        for &mu in &[0.5, 3.0, 12.0, 40.0, 500.0] {
            let p = Poisson::new(mu);
            let mut rng = SplitMix64::new(mu.to_bits());
            let samples = 400_000u64;
            let top = (mu + 12.0 * mu.sqrt() + 20.0) as usize;
            let mut counts = vec![0u64; top + 1];
            for _ in 0..samples {
                let k = (p.sample(&mut rng) as usize).min(top);
                counts[k] += 1;
            }
            let pmf: Vec<f64> = (0..=top)
                .map(|k| (k as f64 * mu.ln() - mu - ln_gamma(k as f64 + 1.0)).exp())
                .collect();
            let (stat, df) = chi_square(&counts, &pmf, samples);
            assert!(stat < chi_bound(df), "mu={mu}: chi2 {stat:.1} with {df} df");
        }
    }
}
