//! Periodic torus geometry: dimensions, coordinates and neighbours of a rank.
//! Pure functions, shared by every backend (the MPI backend checks them against MPI).

use crate::error::{Error, Result};

/// A rank's place in a periodic torus of `dims` (row-major rank order, as MPI's
/// Cartesian communicators number ranks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Torus {
    pub dims: Vec<usize>,
    pub coords: Vec<usize>,
    /// For each dimension, the ranks one step down and one step up (periodic).
    pub neighbours: Vec<(usize, usize)>,
}

impl Torus {
    /// The torus position of `rank` in `dims`.
    pub fn new(dims: &[usize], rank: usize) -> Self {
        let coords = rank_to_coords(dims, rank);
        let neighbours = (0..dims.len())
            .map(|d| {
                let step = |delta: isize| {
                    let mut c = coords.clone();
                    c[d] = (c[d] as isize + delta).rem_euclid(dims[d] as isize) as usize;
                    coords_to_rank(dims, &c)
                };
                (step(-1), step(1))
            })
            .collect();
        Torus {
            dims: dims.to_vec(),
            coords,
            neighbours,
        }
    }

    /// `"4x2"` style name of the dimensions.
    pub fn shape(&self) -> String {
        self.dims
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("x")
    }
}

pub fn rank_to_coords(dims: &[usize], mut rank: usize) -> Vec<usize> {
    let mut c = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        c[d] = rank % dims[d];
        rank /= dims[d];
    }
    c
}

pub fn coords_to_rank(dims: &[usize], coords: &[usize]) -> usize {
    coords.iter().zip(dims).fold(0, |acc, (&c, &n)| acc * n + c)
}

/// Parse `--torus 4x2` or `4x2x2` and check it multiplies to `size`.
pub fn parse_torus(spec: &str, size: usize) -> Result<Vec<usize>> {
    let bad = |why: &str| Error::Config(format!("--torus {}: {why}", crate::error::quote(spec)));
    let dims = spec
        .split(['x', 'X'])
        .map(|p| p.trim().parse::<usize>().ok().filter(|&d| d > 0))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("expected positive integers joined by 'x', e.g. 4x2 or 4x2x2"))?;
    if !(1..=3).contains(&dims.len()) {
        return Err(bad("a torus has 1, 2 or 3 dimensions"));
    }
    let product = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad("the dimensions multiply to more than any job has ranks"))?;
    if product != size {
        return Err(bad(&format!(
            "multiplies to {product} but the job has {size} ranks"
        )));
    }
    Ok(dims)
}

/// A balanced factorization of `size` into `ndims` factors, largest first — the
/// same answer as `MPI_Dims_create` for these cases.
pub fn dims_create(size: usize, ndims: usize) -> Vec<usize> {
    let mut dims = vec![1; ndims];
    let mut factors = Vec::new();
    let mut n = size.max(1);
    let mut f = 2;
    while f * f <= n {
        while n.is_multiple_of(f) {
            factors.push(f);
            n /= f;
        }
        f += 1;
    }
    if n > 1 {
        factors.push(n);
    }
    // Largest prime factors first, each onto the currently smallest dimension.
    for &f in factors.iter().rev() {
        let i = (0..ndims).min_by_key(|&i| dims[i]).unwrap_or(0);
        dims[i] *= f;
    }
    dims.sort_unstable_by(|a, b| b.cmp(a));
    dims
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_of_2x2_and_3x1() {
        let t = Torus::new(&[2, 2], 0);
        assert_eq!(t.coords, vec![0, 0]);
        assert_eq!(t.neighbours, vec![(2, 2), (1, 1)]);
        let t = Torus::new(&[3, 1], 1);
        assert_eq!(t.coords, vec![1, 0]);
        assert_eq!(t.neighbours, vec![(0, 2), (1, 1)]);
    }

    #[test]
    fn coords_round_trip() {
        let dims = [4, 2, 3];
        for r in 0..24 {
            assert_eq!(coords_to_rank(&dims, &rank_to_coords(&dims, r)), r);
        }
    }

    #[test]
    fn dims_create_matches_mpi() {
        assert_eq!(dims_create(1, 2), vec![1, 1]);
        assert_eq!(dims_create(2, 2), vec![2, 1]);
        assert_eq!(dims_create(3, 2), vec![3, 1]);
        assert_eq!(dims_create(4, 2), vec![2, 2]);
        assert_eq!(dims_create(6, 2), vec![3, 2]);
        assert_eq!(dims_create(8, 2), vec![4, 2]);
        assert_eq!(dims_create(12, 2), vec![4, 3]);
        assert_eq!(dims_create(16, 3), vec![4, 2, 2]);
    }

    #[test]
    fn parse_torus_checks_the_product() {
        assert_eq!(parse_torus("4x2", 8).unwrap(), vec![4, 2]);
        assert_eq!(parse_torus("2x2x2", 8).unwrap(), vec![2, 2, 2]);
        let e = parse_torus("3x2", 4).unwrap_err().to_string();
        assert!(
            e.contains("multiplies to 6") && e.contains("4 ranks"),
            "{e}"
        );
        assert!(parse_torus("4xa", 4).is_err());
        // 3 x 12297829382473034411 wraps to 1 in 64-bit arithmetic.
        let e = parse_torus("3x12297829382473034411", 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiply to more than"), "{e}");
        assert!(parse_torus("0x4", 0).is_err());
    }
}
