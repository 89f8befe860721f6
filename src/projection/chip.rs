//! Chips and their links: presets from public figures, each value overridable, and
//! the machine this runs on, from a measured calibration.
//!
//! Sources of the presets (per chip): Google Cloud's TPU system architecture pages
//! (peak bf16 rate, HBM capacity and bandwidth, torus shapes) and the ICI figures of "How to Scale
//! Your Model" (Austin et al., 2025; one-way bandwidth per link). The per-message
//! latency (1 us) is an assumption of this model, not a published figure; override
//! it with `--link-latency-us`.

use serde::{Deserialize, Serialize};

/// One chip (one rank of the torus) and its links.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chip {
    pub name: String,
    /// Peak rate (FLOP/s) the compute model scales to.
    pub peak_flops: f64,
    /// Memory per chip (bytes).
    pub memory_bytes: u64,
    /// Memory bandwidth per chip (bytes/s), bounding the solve's row gathers; `None`
    /// for this machine, whose measured solve rate already includes them.
    pub memory_bandwidth: Option<f64>,
    /// One-way bandwidth of one link (bytes/s).
    pub link_bandwidth: f64,
    /// Seconds per message on a link.
    pub link_latency: f64,
    /// Cores per chip (ALX counts TPU v3 cores: two per chip).
    pub cores: usize,
    /// Torus dimensions of the pod (2 or 3) and its largest shape.
    pub max_shape: Vec<usize>,
}

const GIB: u64 = 1 << 30;

/// The presets: `v3`, `v4`, `v5e`.
pub fn preset(name: &str) -> Option<Chip> {
    let c = |name: &str, tflops: f64, gib: u64, hbm: f64, gbs: f64, cores, max: &[usize]| Chip {
        name: name.to_string(),
        peak_flops: tflops * 1e12,
        memory_bytes: gib * GIB,
        memory_bandwidth: Some(hbm * 1e9),
        link_bandwidth: gbs * 1e9,
        link_latency: 1e-6,
        cores,
        max_shape: max.to_vec(),
    };
    match name.to_ascii_lowercase().as_str() {
        "v3" | "tpu-v3" => Some(c("TPU v3", 123.0, 32, 900.0, 100.0, 2, &[32, 32])),
        "v4" | "tpu-v4" => Some(c("TPU v4", 275.0, 32, 1200.0, 45.0, 2, &[16, 16, 16])),
        "v5e" | "tpu-v5e" => Some(c("TPU v5e", 197.0, 16, 819.0, 45.0, 1, &[16, 16])),
        _ => None,
    }
}

pub const PRESETS: &[&str] = &["v3", "v4", "v5e"];

/// What `project measure` found on this machine at one torus shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The torus shape measured (e.g. `2x2`).
    pub shape: String,
    /// Seconds per shift message (fitted intercept).
    pub link_latency: f64,
    /// Bytes/s of one shift (fitted slope).
    pub link_bandwidth: f64,
    /// Bytes/s of every link's bytes together (fitted slope of their sum), when the
    /// fit found such a term: the ranks of this machine share its cores and memory,
    /// so a collective also costs what all its messages together cost them. A pod's
    /// chips share nothing, so [`Calibration::chip`] leaves it out. Absent in files
    /// written before it (read as none).
    #[serde(default)]
    pub node_bandwidth: Option<f64>,
    /// Achieved FLOP/s of one rank on the iALS solve (the compute model's flops over
    /// the slowest rank's solve seconds).
    pub solve_flops: f64,
    /// One rank's single-precision matrix-multiply rate (its threads together).
    pub peak_flops: f64,
    /// Memory per rank (bytes): the machine's, divided by the ranks.
    pub memory_bytes: u64,
    pub threads: usize,
}

impl Calibration {
    /// This machine as a chip.
    pub fn chip(&self) -> Chip {
        Chip {
            name: format!("this machine ({})", self.shape),
            peak_flops: self.peak_flops,
            memory_bytes: self.memory_bytes,
            memory_bandwidth: None,
            link_bandwidth: self.link_bandwidth,
            link_latency: self.link_latency,
            cores: self.threads,
            max_shape: vec![8, 8, 8],
        }
    }

    /// The iALS solve rate on `chip`: the measured efficiency times its peak.
    pub fn solve_rate_on(&self, chip: &Chip) -> f64 {
        self.solve_flops / self.peak_flops * chip.peak_flops
    }
}

/// Torus shapes from 4 chips up to `max` (each step doubles the smallest dimension,
/// the pod's slices).
pub fn default_shapes(max: &[usize]) -> Vec<Vec<usize>> {
    let mut s: Vec<usize> = vec![1; max.len()];
    s[0] = 2;
    if s.len() > 1 {
        s[1] = 2;
    }
    let mut out = vec![s.clone()];
    loop {
        // Double the smallest dimension that can still grow (the last such on ties).
        let pick = (0..s.len())
            .filter(|&i| s[i] * 2 <= max[i])
            .min_by_key(|&i| (s[i], std::cmp::Reverse(i)));
        match pick {
            Some(i) => {
                s[i] *= 2;
                out.push(s.clone());
            }
            None => return out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_double_up_to_the_pod() {
        let s = default_shapes(&[32, 32]);
        assert_eq!(s.first().unwrap(), &vec![2, 2]);
        assert_eq!(s.last().unwrap(), &vec![32, 32]);
        assert_eq!(s.len(), 9);
        let v4 = default_shapes(&[16, 16, 16]);
        assert_eq!(v4[0], vec![2, 2, 1]);
        assert_eq!(v4[1], vec![2, 2, 2]);
        assert_eq!(v4.last().unwrap(), &vec![16, 16, 16]);
        for w in s.windows(2) {
            let (a, b): (usize, usize) = (w[0].iter().product(), w[1].iter().product());
            assert_eq!(b, 2 * a);
        }
    }

    #[test]
    fn presets_and_scaling() {
        let v3 = preset("v3").unwrap();
        assert_eq!(v3.memory_bytes, 32 * GIB);
        assert!(preset("v9").is_none());
        let c = Calibration {
            shape: "2x2".into(),
            link_latency: 1e-5,
            link_bandwidth: 1e9,
            node_bandwidth: None,
            solve_flops: 1e10,
            peak_flops: 4e10,
            memory_bytes: GIB,
            threads: 1,
        };
        assert_eq!(c.solve_rate_on(&v3), 0.25 * 123e12);
    }
}
