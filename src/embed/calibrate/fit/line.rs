//! Straight lines through measured points: least squares, weighted, and the link
//! model of a collective (latency plus bytes over bandwidth).

/// Least squares `y = a + b x`; `None` with fewer than two distinct `x`.
pub(super) fn line(pts: &[(f64, f64)]) -> Option<(f64, f64)> {
    let w = vec![1.0; pts.len()];
    weighted_line(pts, &w)
}

/// Weighted least squares `y = a + b x` (weights `w`); `None` with fewer than two
/// distinct `x`.
fn weighted_line(pts: &[(f64, f64)], w: &[f64]) -> Option<(f64, f64)> {
    let sw: f64 = w.iter().sum();
    if pts.len() < 2 || sw <= 0.0 {
        return None;
    }
    let mx = pts.iter().zip(w).map(|(p, w)| w * p.0).sum::<f64>() / sw;
    let my = pts.iter().zip(w).map(|(p, w)| w * p.1).sum::<f64>() / sw;
    let sxx: f64 = pts
        .iter()
        .zip(w)
        .map(|(p, w)| w * (p.0 - mx) * (p.0 - mx))
        .sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = pts
        .iter()
        .zip(w)
        .map(|(p, w)| w * (p.0 - mx) * (p.1 - my))
        .sum();
    let b = sxy / sxx;
    Some((my - b * mx, b))
}

/// `(latency, bandwidth)` of `seconds = latency + x / bandwidth` by least relative
/// squares (weights `1 / seconds^2`, so that the small messages that show the
/// latency count as much as the large ones); `None` when the points give no
/// positive slope. A negative intercept is clamped to 0.
pub(super) fn link_fit(pts: &[(f64, f64)]) -> Option<(f64, f64)> {
    let w: Vec<f64> = pts.iter().map(|p| 1.0 / (p.1 * p.1).max(1e-300)).collect();
    let (a, b) = weighted_line(pts, &w)?;
    (b > 0.0).then_some((a.max(0.0), 1.0 / b))
}
