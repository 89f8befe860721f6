//! The gather-pool and scatter-update points: which settings are measured, one
//! setting timed on one rank, every setting timed in rounds on every rank.

use std::time::Instant;

use super::collectives::global_mean;
use crate::comm::Comm;
use crate::embed::calibrate::options::CalibOptions;
use crate::embed::calibrate::points::{rows_of, KernelPoint, ZIPF_S};
use crate::embed::calibrate::reduce::median;
use crate::embed::tables::row_kernels::{self, Bags, Isa};
use crate::rng::{mix64, SplitMix64};

/// Median seconds of `reps` calls of `f` after one untimed call.
fn time_median(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    median(t)
}

/// Rows `ids` of a table of `rows` rows under `dist` (deterministic from `seed`).
fn local_ids(dist: &str, rows: u64, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    if dist == "zipf" {
        let z = crate::data::clicks::sample::Zipf::new(rows, ZIPF_S);
        (0..n)
            .map(|_| (mix64(z.sample(&mut rng) ^ seed) % rows) as u32)
            .collect()
    } else {
        (0..n).map(|_| rng.below(rows) as u32).collect()
    }
}

/// One kernel setting: `k` tables of `bytes` bytes each, width `dim`, `pooling` ids
/// per example, ids under `dist`.
#[derive(Clone, Copy)]
pub(super) struct Setting<'a> {
    bytes: u64,
    dim: usize,
    pooling: usize,
    dist: &'a str,
    k: usize,
}

/// The settings of `o`'s kernel points, in the order they are timed: every width,
/// pooling and distribution alone; the interference points (several tables per
/// call) with their single-table references; the table-size points with theirs.
pub(super) fn settings(o: &CalibOptions) -> Vec<Setting<'static>> {
    let mut settings: Vec<Setting> = Vec::new();
    let at = |dim, pooling, dist, k| Setting {
        bytes: o.table_bytes,
        dim,
        pooling,
        dist,
        k,
    };
    for &d in &o.dims {
        for &pl in &o.poolings {
            for dist in ["uniform", "zipf"] {
                settings.push(at(d, pl, dist, 1));
            }
        }
    }
    for &d in &o.together_dims {
        for dist in ["uniform", "zipf"] {
            if !o.poolings.contains(&o.together_pooling) || !o.dims.contains(&d) {
                settings.push(at(d, o.together_pooling, dist, 1));
            }
            for &k in &o.together {
                settings.push(at(d, o.together_pooling, dist, k));
            }
        }
    }
    // Table sizes: against the reference size's point of the same width and pooling.
    let size_ref = !o.poolings.contains(&o.size_pooling);
    for &d in &o.dims {
        if size_ref {
            settings.push(at(d, o.size_pooling, "uniform", 1));
        }
        for &bytes in o.sizes.iter().filter(|&&b| b != o.table_bytes) {
            settings.push(Setting {
                bytes,
                ..at(d, o.size_pooling, "uniform", 1)
            });
        }
    }
    settings
}

/// Collective: every rank must call (a barrier before every point). The gather and
/// scatter points of `settings`, each the median of its `o.kernel_rounds` rounds,
/// this rank's seconds.
pub(super) fn global_kernel_rounds<C: Comm>(
    comm: &C,
    o: &CalibOptions,
    settings: &[Setting<'_>],
) -> (Vec<KernelPoint>, Vec<KernelPoint>) {
    let (mut gather, mut scatter) = (Vec::new(), Vec::new());
    // Every point once per round, the rounds one after another: a slow spell of a
    // shared machine (a second or two) then falls on one round of the points timed
    // during it, and the median of the rounds leaves it out. Every point starts after
    // a barrier, so that all ranks time the same kernel together, sharing the memory
    // system as the ranks of a training step do (unsynchronized, one rank's 8-table
    // point ran beside another's small one, and the interference fit moved from 0.02
    // to 0.68 between two calibrations).
    let rounds = o.kernel_rounds.max(1);
    let mut secs_of: Vec<[Vec<f64>; 2]> = vec![[Vec::new(), Vec::new()]; settings.len()];
    for round in 0..rounds {
        for (i, &st) in settings.iter().enumerate() {
            comm.barrier();
            let (g, s) = local_kernel_pair(o, st);
            secs_of[i][0].push(g.seconds);
            secs_of[i][1].push(s.seconds);
            if round + 1 == rounds {
                gather.push(KernelPoint {
                    seconds: median(std::mem::take(&mut secs_of[i][0])),
                    ..g
                });
                scatter.push(KernelPoint {
                    seconds: median(std::mem::take(&mut secs_of[i][1])),
                    ..s
                });
            }
        }
    }
    (gather, scatter)
}

/// Collective: every rank must call. Each kernel point's seconds: the mean over
/// ranks.
pub(super) fn global_mean_seconds<C: Comm>(
    comm: &C,
    gather: &mut [KernelPoint],
    scatter: &mut [KernelPoint],
) {
    let mut secs: Vec<f64> = gather.iter().chain(&*scatter).map(|p| p.seconds).collect();
    global_mean(comm, &mut secs);
    let ng = gather.len();
    for (p, s) in gather.iter_mut().zip(&secs[..ng]) {
        p.seconds = *s;
    }
    for (p, s) in scatter.iter_mut().zip(&secs[ng..]) {
        p.seconds = *s;
    }
}

/// Rank-local: the gather-pool and scatter-update points of setting `st`.
fn local_kernel_pair(o: &CalibOptions, st: Setting<'_>) -> (KernelPoint, KernelPoint) {
    let Setting {
        bytes,
        dim,
        pooling,
        dist,
        k,
    } = st;
    let isa = Isa::detect();
    let rows = rows_of(bytes, dim);
    let examples = (o.ids / pooling).max(1);
    let n_ids = examples * pooling;
    // On huge pages where the kernel allows it, as the shards of a training run are
    // (`huge_vec`): on 4 KiB pages every random row would also miss the TLB, and
    // the points would price a kernel training never runs.
    let mut tables: Vec<Vec<f32>> = (0..k)
        .map(|j| {
            let mut t = crate::hugepages::huge_vec(rows as usize * dim, 0.0f32);
            for (i, x) in t.iter_mut().enumerate() {
                *x = ((i + j) % 97) as f32 * 1e-3;
            }
            t
        })
        .collect();
    let ids: Vec<Vec<u32>> = (0..k)
        .map(|j| local_ids(dist, rows, n_ids, o.seed ^ mix64(j as u64 + 1)))
        .collect();
    let offsets: Vec<u32> = (0..=examples).map(|e| (e * pooling) as u32).collect();
    let mut out = vec![0.0f32; examples * dim];
    let g = vec![1e-6f32; examples * dim];
    let gather = time_median(o.reps, || {
        for (tab, id) in tables.iter().zip(&ids) {
            let bags = Bags {
                offsets: &offsets,
                idx: id,
                map: None,
            };
            row_kernels::pool_bags(isa, tab, dim, bags, &mut out);
        }
        std::hint::black_box(&out);
    });
    let scatter = time_median(o.reps, || {
        for (tab, id) in tables.iter_mut().zip(&ids) {
            let bags = Bags {
                offsets: &offsets,
                idx: id,
                map: None,
            };
            row_kernels::scatter_bags(isa, &g, dim, bags, tab);
        }
        std::hint::black_box(&tables);
    });
    let point = |seconds| KernelPoint {
        dim,
        pooling,
        dist: dist.to_string(),
        tables: k,
        rows,
        ids: (n_ids * k) as u64,
        seconds,
    };
    (point(gather), point(scatter))
}
