//! How timed seconds become a point's seconds: the median of calls, rounds and passes,
//! and the slowest rank's seconds of each round (what a synchronized step pays).

/// The median of `v` (the mean of the middle two for an even count; 0 when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Each point's seconds over passes of the same points (`passes[pass][point]`, the
/// points in the same order in every pass): the median of its passes'. A point
/// missing from a pass (a shorter pass) is the median of the passes that have it.
pub fn median_over_passes(passes: &[Vec<f64>]) -> Vec<f64> {
    let n = passes.iter().map(Vec::len).max().unwrap_or(0);
    (0..n)
        .map(|i| median(passes.iter().filter_map(|p| p.get(i).copied()).collect()))
        .collect()
}

/// The seconds a synchronized step pays for a phase timed in rounds on every rank
/// (`per_rank[r][round]`): the slowest rank's seconds of each round, averaged over
/// the rounds (0 without rounds).
pub fn synchronized_seconds(per_rank: &[&[f64]]) -> f64 {
    let rounds = per_rank.iter().map(|t| t.len()).min().unwrap_or(0);
    if rounds == 0 {
        return 0.0;
    }
    let sum: f64 = (0..rounds)
        .map(|k| per_rank.iter().map(|t| t[k]).fold(0.0, f64::max))
        .sum();
    sum / rounds as f64
}
