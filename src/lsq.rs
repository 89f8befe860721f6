//! Small least-squares fits of measured seconds on a few cost terms, shared by the
//! planner's calibration (`embed::calibrate`) and the link model of `project
//! measure` (`project::measure`). Numerics only.

/// Least squares through the origin with coefficients >= 0: of the subsets of the
/// three terms that hold the terms of the bit mask `must` and whose fit has no
/// negative coefficient, the one with the least residual (zeros when none has).
pub fn nonneg_least_squares(rows: &[([f64; 3], f64)], must: u32) -> [f64; 3] {
    let mut best: Option<(f64, [f64; 3])> = None;
    for mask in (1..8u32).filter(|m| m & must == must) {
        let cols: Vec<usize> = (0..3).filter(|j| mask & (1 << j) != 0).collect();
        let Some(x) = least_squares(rows, &cols) else {
            continue;
        };
        if x.iter().any(|&v| v < 0.0) {
            continue;
        }
        let mut coef = [0.0; 3];
        for (&j, &v) in cols.iter().zip(&x) {
            coef[j] = v;
        }
        let res: f64 = rows
            .iter()
            .map(|(a, y)| {
                let r = y - (0..3).map(|j| a[j] * coef[j]).sum::<f64>();
                r * r
            })
            .sum();
        if best.is_none_or(|(b, _)| res < b) {
            best = Some((res, coef));
        }
    }
    best.map_or([0.0; 3], |(_, c)| c)
}

/// Least squares of `y` on the columns `cols` of the rows' `a` (normal equations,
/// Gaussian elimination with partial pivoting); `None` when they are singular.
fn least_squares(rows: &[([f64; 3], f64)], cols: &[usize]) -> Option<Vec<f64>> {
    let k = cols.len();
    let mut n = vec![vec![0.0; k + 1]; k];
    for (a, y) in rows {
        for (i, &ci) in cols.iter().enumerate() {
            for (j, &cj) in cols.iter().enumerate() {
                n[i][j] += a[ci] * a[cj];
            }
            n[i][k] += a[ci] * y;
        }
    }
    let scale = (0..k).map(|i| n[i][i]).fold(0.0, f64::max);
    for col in 0..k {
        let piv = (col..k).max_by(|&x, &y| n[x][col].abs().total_cmp(&n[y][col].abs()))?;
        if n[piv][col].abs() <= 1e-12 * scale {
            return None;
        }
        n.swap(col, piv);
        let pivot_row = n[col].clone();
        for (r, row) in n.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| n[i][k] / n[i][i]).collect())
}
