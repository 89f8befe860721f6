//! Quality measures of a click model: exact ROC AUC and mean log loss.
//!
//! Local only: callers gather scores (or sum losses) across ranks themselves.

use std::cmp::Ordering;

/// Log loss of one example from its logit, in the stable BCE-with-logits form:
/// `max(z, 0) - z y + ln(1 + exp(-|z|))`.
#[inline]
pub fn bce_with_logits(z: f64, y: f64) -> f64 {
    z.max(0.0) - z * y + (-z.abs()).exp().ln_1p()
}

/// `1 / (1 + exp(-z))` without overflow for large `|z|`.
///
/// The one overflow-safe logistic of the crate. Two plain `1 / (1 + exp(-x))` remain
/// on purpose: `clicks::sample::logistic` (the generators' labels) and
/// `data::webgraph_fit::logistic` (the fitted graph parameters). For `z < 0` this form
/// (`e / (1 + e)`, `e = exp(z)`) can round differently from theirs, so calling this one
/// there would change generated data and fitted parameters bit for bit.
#[inline]
pub fn sigmoid(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// Exact area under the ROC curve of `scores` against binary `labels` (positive when
/// `label > 0.5`), in `O(n log n)`.
///
/// This is the Mann-Whitney U with average ranks: a positive and a negative with equal
/// scores count one half. `-0.0` and `0.0` are equal; NaN scores are ordered by
/// [`f32::total_cmp`] (deterministic, but meaningless). `None` when `labels` holds only
/// one class (or nothing), where the AUC is undefined.
///
/// # Panics
/// If `scores` and `labels` differ in length.
pub fn auc(scores: &[f32], labels: &[f32]) -> Option<f64> {
    assert_eq!(
        scores.len(),
        labels.len(),
        "auc: scores and labels differ in length"
    );
    // Canonical zero, so that -0.0 and 0.0 fall into one tie group.
    let key = |s: f32| if s == 0.0 { 0.0 } else { s };
    let mut pairs: Vec<(f32, bool)> = scores
        .iter()
        .zip(labels)
        .map(|(&s, &y)| (key(s), y > 0.5))
        .collect();
    let n_pos = pairs.iter().filter(|p| p.1).count();
    let n_neg = pairs.len() - n_pos;
    if n_pos == 0 || n_neg == 0 {
        return None;
    }
    pairs.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));

    // Sum of the (1-based, tie-averaged) ranks of the positives.
    let mut rank_sum = 0.0f64;
    let mut start = 0;
    while start < pairs.len() {
        let mut end = start + 1;
        while end < pairs.len() && pairs[end].0.total_cmp(&pairs[start].0) == Ordering::Equal {
            end += 1;
        }
        let pos_in_group = pairs[start..end].iter().filter(|p| p.1).count();
        // Ranks start+1 ..= end, averaged.
        let avg_rank = (start + 1 + end) as f64 / 2.0;
        rank_sum += pos_in_group as f64 * avg_rank;
        start = end;
    }
    let (p, q) = (n_pos as f64, n_neg as f64);
    let u = rank_sum - p * (p + 1.0) / 2.0;
    Some(u / (p * q))
}

/// Mean log loss of `logits` against `labels` (stable BCE-with-logits, f64 sums);
/// `None` for no examples.
///
/// # Panics
/// If `logits` and `labels` differ in length.
pub fn logloss(logits: &[f32], labels: &[f32]) -> Option<f64> {
    assert_eq!(
        logits.len(),
        labels.len(),
        "logloss: logits and labels differ in length"
    );
    if logits.is_empty() {
        return None;
    }
    let sum: f64 = logits
        .iter()
        .zip(labels)
        .map(|(&z, &y)| bce_with_logits(z as f64, y as f64))
        .sum();
    Some(sum / logits.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// `O(n^2)` AUC: the fraction of (positive, negative) pairs ordered correctly, ties
    /// counting one half.
    fn auc_pairwise(scores: &[f32], labels: &[f32]) -> Option<f64> {
        let (mut num, mut pairs) = (0.0f64, 0u64);
        for (i, &si) in scores.iter().enumerate() {
            if labels[i] <= 0.5 {
                continue;
            }
            for (j, &sj) in scores.iter().enumerate() {
                if labels[j] > 0.5 {
                    continue;
                }
                pairs += 1;
                if si > sj {
                    num += 1.0;
                } else if si == sj {
                    num += 0.5;
                }
            }
        }
        (pairs > 0).then(|| num / pairs as f64)
    }

    #[test]
    fn auc_matches_pairwise_reference_with_ties() {
        let mut r = SplitMix64::new(42);
        for &(n, levels) in &[
            (2usize, 2u64),
            (10, 3),
            (57, 5),
            (300, 20),
            (1000, 1_000_000),
        ] {
            for _ in 0..5 {
                let scores: Vec<f32> = (0..n)
                    .map(|_| r.below(levels) as f32 / levels as f32 - 0.5)
                    .collect();
                // Labels correlated with the score, so the AUC is away from 1/2.
                let labels: Vec<f32> = scores
                    .iter()
                    .map(|&s| f32::from(r.next_f64() < 0.5 + 0.8 * s as f64))
                    .collect();
                let want = auc_pairwise(&scores, &labels);
                let got = auc(&scores, &labels);
                match (want, got) {
                    (Some(w), Some(g)) => assert!((w - g).abs() < 1e-12, "n {n}: {w} vs {g}"),
                    (w, g) => assert_eq!(w, g, "n {n}"),
                }
            }
        }
    }

    #[test]
    fn auc_extremes_and_known_values() {
        let labels = [0.0, 0.0, 1.0, 1.0, 0.0, 1.0];
        let perfect = [0.1, 0.2, 0.8, 0.9, 0.3, 0.7];
        let inverted: Vec<f32> = perfect.iter().map(|s| -s).collect();
        assert_eq!(auc(&perfect, &labels), Some(1.0));
        assert_eq!(auc(&inverted, &labels), Some(0.0));
        assert_eq!(auc(&[0.5; 6], &labels), Some(0.5));
        // scikit-learn's roc_auc_score example.
        assert_eq!(
            auc(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0]),
            Some(0.75)
        );
        // One tie between a positive and a negative: 3 of 4 pairs won, 1 tied.
        assert_eq!(
            auc(&[0.0, 1.0, 1.0, 2.0], &[0.0, 0.0, 1.0, 1.0]),
            Some(0.875)
        );
        // -0.0 ties with 0.0.
        assert_eq!(auc(&[-0.0, 0.0], &[1.0, 0.0]), Some(0.5));
        assert_eq!(auc(&[0.3, 0.1], &[1.0, 1.0]), None);
        assert_eq!(auc(&[0.3, 0.1], &[0.0, 0.0]), None);
        assert_eq!(auc(&[], &[]), None);
    }

    #[test]
    fn logloss_known_values_and_stability() {
        assert_eq!(logloss(&[], &[]), None);
        let ln2 = std::f64::consts::LN_2;
        assert!((logloss(&[0.0, 0.0], &[0.0, 1.0]).unwrap() - ln2).abs() < 1e-15);
        // Large logits: no overflow, the loss of a confident mistake is |z|.
        assert!((logloss(&[100.0], &[0.0]).unwrap() - 100.0).abs() < 1e-12);
        assert!((logloss(&[-100.0], &[1.0]).unwrap() - 100.0).abs() < 1e-12);
        assert!(logloss(&[100.0], &[1.0]).unwrap() < 1e-40);
        // The naive formula where it is accurate.
        let (z, y) = ([-2.0f32, -0.3, 0.7, 3.0], [1.0f32, 0.0, 1.0, 0.0]);
        let naive = z
            .iter()
            .zip(&y)
            .map(|(&z, &y)| {
                let p = 1.0 / (1.0 + (-(z as f64)).exp());
                -(y as f64 * p.ln() + (1.0 - y as f64) * (1.0 - p).ln())
            })
            .sum::<f64>()
            / 4.0;
        assert!((logloss(&z, &y).unwrap() - naive).abs() < 1e-12);
    }

    #[test]
    fn sigmoid_is_stable_and_symmetric() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert_eq!(sigmoid(1000.0), 1.0);
        assert_eq!(sigmoid(-1000.0), 0.0);
        for z in [-30.0, -3.0, -0.1, 0.2, 4.0, 25.0] {
            assert!((sigmoid(z) + sigmoid(-z) - 1.0).abs() < 1e-15);
        }
    }
}
