//! Collective logic under the thread communicator at 1-4 ranks: closed-form answers,
//! empty contributions, all-to-all-v and its inverse, the agreement protocol, and the
//! distributed prepare pipeline giving the same dataset at every rank count.

use torusrec::blocks::block_range;
use torusrec::comm::threads::{run, run_on};
use torusrec::comm::{selftest::global_selftest, Collectives, Comm};
use torusrec::data::graph::prepare::global_prepare;
use torusrec::data::graph::readers::SourceInfo;
use torusrec::data::graph::rows::LocalRows;
use torusrec::error::Error;
use torusrec::rng::SplitMix64;

#[test]
fn selftest_passes_at_1_to_4_ranks_and_on_3d_tori() {
    for p in 1..=4 {
        let lines = run(p, |c| global_selftest(&c).unwrap());
        assert_eq!(lines[0].len(), p, "rank 0 reports every rank");
        assert!(lines[1..].iter().all(|l| l.is_empty()));
    }
    let lines = run_on(&[2, 2, 2], |c| global_selftest(&c).unwrap());
    assert_eq!(
        lines[0][7],
        "rank 7: coords [1, 1, 1], neighbours d0: -3 +3, d1: -5 +5, d2: -6 +6"
    );
}

#[test]
fn all_reduce_sums_in_closed_form() {
    for p in 1..=4usize {
        let out = run(p, |c| {
            let r = c.rank() as u64;
            let mut u = vec![r + 1, r * r, 7];
            c.all_reduce_sum(&mut u);
            let mut f = vec![0.5f32; 1000];
            c.all_reduce_sum(&mut f);
            (u, f[999], c.all_reduce_max(r * 3))
        });
        let p64 = p as u64;
        for (u, f, m) in out {
            assert_eq!(
                u,
                vec![
                    p64 * (p64 + 1) / 2,
                    (p64 - 1) * p64 * (2 * p64 - 1) / 6,
                    7 * p64
                ]
            );
            assert_eq!(f, 0.5 * p as f32);
            assert_eq!(m, 3 * (p64 - 1));
        }
    }
}

#[test]
fn all_to_all_v_random_counts_round_trip() {
    for p in 1..=4usize {
        run(p, |c| {
            let mut rng = SplitMix64::new(100 + c.rank() as u64);
            // Random sizes including zeros; rank 0 sends nothing at all.
            let counts: Vec<usize> = (0..p)
                .map(|_| {
                    if c.rank() == 0 {
                        0
                    } else {
                        rng.below(4) as usize * 17
                    }
                })
                .collect();
            let send: Vec<u64> = (0..counts.iter().sum::<usize>())
                .map(|_| rng.next_u64())
                .collect();
            let got = c.all_to_all_v(&send, &counts).unwrap();
            assert_eq!(got.counts.len(), p);
            assert_eq!(got.counts[0], 0, "rank 0 sent nothing");
            let back = c.all_to_all_v(&got.data, &got.counts).unwrap();
            assert_eq!(back.data, send);
            assert_eq!(back.counts, counts);
        });
    }
}

#[test]
fn all_to_all_v_into_and_move_reuse_buffers_and_equal_the_plain_call() {
    for p in 1..=4usize {
        run(p, |c| {
            let mut rng = SplitMix64::new(7 + c.rank() as u64);
            // A received buffer and a send buffer reused over rounds of other sizes.
            let mut out = torusrec::comm::Received::default();
            let mut moved = torusrec::comm::Received::default();
            let mut send_buf: Vec<u32> = Vec::new();
            for round in 0..4 {
                let counts: Vec<usize> = (0..p).map(|_| rng.below(50) as usize).collect();
                let send: Vec<u32> = (0..counts.iter().sum::<usize>())
                    .map(|i| (round * 1000 + i) as u32 ^ rng.next_u64() as u32)
                    .collect();
                let want = c.all_to_all_v(&send, &counts).unwrap();
                c.all_to_all_v_into(&send, &counts, &mut out).unwrap();
                assert_eq!(out, want, "into, round {round}");
                send_buf.clear();
                send_buf.extend_from_slice(&send);
                c.all_to_all_v_move(&mut send_buf, &counts, &mut moved)
                    .unwrap();
                assert_eq!(moved, want, "move, round {round}");
            }
        });
    }
}

#[test]
fn all_gather_v_with_empty_parts_and_byte_counters() {
    for p in 1..=4usize {
        let out = run(p, |c| {
            let mine: Vec<f64> = (0..c.rank() % 2)
                .map(|i| (c.rank() * 10 + i) as f64)
                .collect();
            let all = c.all_gather_v(&mine).unwrap();
            (all, c.stats().total())
        });
        let want: Vec<f64> = (0..p)
            .filter(|r| r % 2 == 1)
            .map(|r| (r * 10) as f64)
            .collect();
        for (all, stats) in out {
            assert_eq!(all.data, want);
            assert_eq!(stats.calls, 1);
            if p == 1 {
                assert_eq!(stats.bytes_sent, 0);
            }
        }
    }
}

#[test]
fn agree_names_the_failing_rank_everywhere() {
    let out = run(3, |c| {
        let local = if c.rank() == 1 {
            Err(Error::Config("bad on 1".into()))
        } else {
            Ok(())
        };
        c.agree(local)
    });
    assert!(matches!(&out[1], Err(Error::Config(m)) if m == "bad on 1"));
    for r in [0, 2] {
        assert!(
            matches!(out[r], Err(Error::Remote { rank: 1, code: 2 })),
            "{:?}",
            out[r]
        );
    }
    // Several failing ranks: only the lowest keeps its error.
    let out = run(3, |c| {
        c.agree::<()>(Err(Error::Config(format!("bad on {}", c.rank()))))
    });
    assert!(matches!(&out[0], Err(Error::Config(m)) if m == "bad on 0"));
    assert!(matches!(out[2], Err(Error::Remote { rank: 0, code: 2 })));
}

/// Rank 2 panics before the barrier the others wait in: they give up waiting and
/// panic too, and `run` re-raises the panic of the first rank in rank order (rank 0:
/// one of the ranks that was waiting, so this message shows that they were woken).
#[test]
#[should_panic(expected = "another simulated rank panicked")]
fn a_panicking_rank_does_not_hang_the_others() {
    run(3, |c| {
        if c.rank() == 2 {
            panic!("boom");
        }
        c.barrier();
    });
}

/// A random graph with hubs, self-loops and duplicates.
fn random_graph(n: u64, seed: u64) -> Vec<(u32, u32)> {
    let mut rng = SplitMix64::new(seed);
    let mut arcs = Vec::new();
    for u in 0..n {
        let d = if u % 17 == 0 { 60 } else { rng.below(12) };
        for _ in 0..d {
            let v = if rng.below(3) == 0 {
                rng.below(10)
            } else {
                rng.below(n)
            };
            arcs.push((u as u32, v as u32));
        }
    }
    arcs
}

#[test]
fn prepare_is_the_same_at_every_rank_count() {
    let n = 600;
    let arcs = random_graph(n, 4);
    let info = SourceInfo {
        name: "test".into(),
        nodes: n,
        arcs: arcs.len() as u64,
    };
    for k in [0, 1, 3] {
        let reference = run(1, |c| {
            let rows = LocalRows::from_pairs(0, n, &arcs);
            global_prepare(&c, &info, rows, k, 9).unwrap()
        })
        .remove(0);
        for p in 2..=4 {
            let parts = run(p, |c| {
                let (lo, hi) = block_range(n, p, c.rank());
                let mine: Vec<(u32, u32)> = arcs
                    .iter()
                    .copied()
                    .filter(|&(s, _)| (s as u64) >= lo && (s as u64) < hi)
                    .collect();
                global_prepare(&c, &info, LocalRows::from_pairs(lo, hi, &mine), k, 9).unwrap()
            });
            // Concatenating the ranks' parts gives the single-rank answer.
            let (meta, one) = &reference;
            assert!(parts.iter().all(|(m, _)| m == meta));
            let cat = |f: &dyn Fn(&torusrec::data::graph::prepare::LocalSplit) -> Vec<Vec<u32>>| -> Vec<Vec<u32>> {
                parts.iter().flat_map(|(_, s)| f(s)).collect()
            };
            let rows_of = |r: &LocalRows| {
                (0..r.num_rows())
                    .map(|i| r.row(i).to_vec())
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                cat(&|s| rows_of(&s.train)),
                rows_of(&one.train),
                "train, K={k}, P={p}"
            );
            assert_eq!(
                cat(&|s| rows_of(&s.train_t)),
                rows_of(&one.train_t),
                "train_t, K={k}, P={p}"
            );
            assert_eq!(cat(&|s| vec![s.test_rows.clone()]).concat(), one.test_rows);
            assert_eq!(cat(&|s| rows_of(&s.holdout)), rows_of(&one.holdout));
            assert_eq!(cat(&|s| rows_of(&s.fold)), rows_of(&one.fold));
            let ids: Vec<u64> = parts.iter().flat_map(|(_, s)| s.node_ids.clone()).collect();
            assert_eq!(ids, one.node_ids);
        }
    }
}

#[test]
fn filter_that_empties_the_graph_fails_on_every_rank() {
    let n = 50;
    let arcs = random_graph(n, 1);
    let info = SourceInfo {
        name: "tiny".into(),
        nodes: n,
        arcs: arcs.len() as u64,
    };
    let out = run(2, |c| {
        let (lo, hi) = block_range(n, 2, c.rank());
        let mine: Vec<(u32, u32)> = arcs
            .iter()
            .copied()
            .filter(|&(s, _)| (s as u64) >= lo && (s as u64) < hi)
            .collect();
        global_prepare(
            &c,
            &info,
            LocalRows::from_pairs(lo, hi, &mine),
            1_000_000,
            1,
        )
        .map(|_| ())
    });
    // Every rank fails with exit code 2; rank 0 carries the message (printed once).
    for r in &out {
        assert_eq!(r.as_ref().unwrap_err().exit_code(), 2);
    }
    let e = out[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("empty graph"), "{e}");
    assert!(matches!(
        out[1],
        Err(torusrec::Error::Remote { rank: 0, code: 2 })
    ));
}

/// Shapes the torus collectives are checked on: rings, 2-D and 3-D tori, odd sizes.
const SHAPES: [&[usize]; 8] = [
    &[2, 1],
    &[3, 1],
    &[1, 5],
    &[2, 2],
    &[2, 4],
    &[3, 3],
    &[2, 2, 2],
    &[4, 1, 3],
];

/// Every counted collective, with the given algorithms, on random data of rank `r`:
/// (sums f64, sums u64, max, all-to-all result and counts, all-gather result and counts).
#[allow(clippy::type_complexity)]
fn collectives_on<C: Comm>(
    c: &C,
    mode: Collectives,
) -> (
    Vec<f64>,
    Vec<u64>,
    u64,
    Vec<u32>,
    Vec<usize>,
    Vec<f32>,
    Vec<usize>,
) {
    c.stats().set_collectives(mode);
    let p = c.size();
    let r = c.rank();
    let mut rng = SplitMix64::new(1000 + r as u64);
    let mut f: Vec<f64> = (0..1003).map(|_| rng.next_f64() - 0.5).collect();
    c.all_reduce_sum(&mut f);
    let mut u: Vec<u64> = (0..7).map(|i| (r * 10 + i) as u64).collect();
    c.all_reduce_sum(&mut u);
    let m = c.all_reduce_max((r as u64 * 7919) % 13);
    let counts: Vec<usize> = (0..p).map(|_| rng.below(5) as usize).collect();
    let send: Vec<u32> = (0..counts.iter().sum::<usize>())
        .map(|i| (r * 1000 + i) as u32)
        .collect();
    let got = c.all_to_all_v(&send, &counts).unwrap();
    let part: Vec<f32> = (0..r % 3).map(|i| (r * 10 + i) as f32).collect();
    let all = c.all_gather_v(&part).unwrap();
    (f, u, m, got.data, got.counts, all.data, all.counts)
}

#[test]
fn torus_collectives_equal_mpi_style_ones_on_every_shape() {
    for dims in SHAPES {
        let torus = run_on(dims, |c| collectives_on(&c, Collectives::Torus));
        let raw = run_on(dims, |c| collectives_on(&c, Collectives::Mpi));
        for (rank, (t, m)) in torus.iter().zip(&raw).enumerate() {
            let what = format!("{dims:?} rank {rank}");
            // Sums: the same up to reassociation; integers exactly.
            for (a, b) in t.0.iter().zip(&m.0) {
                assert!(
                    (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                    "{what}: {a} vs {b}"
                );
            }
            assert_eq!(t.1, m.1, "{what}");
            assert_eq!(t.2, m.2, "{what}");
            assert_eq!((&t.3, &t.4), (&m.3, &m.4), "{what}: all-to-all");
            assert_eq!((&t.5, &t.6), (&m.5, &m.6), "{what}: all-gather");
            // Every rank ends an all-reduce with the same bits.
            assert_eq!(
                t.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                torus[0].0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{what}: ranks disagree"
            );
        }
        // Deterministic: the same shape gives the same bits again.
        let again = run_on(dims, |c| collectives_on(&c, Collectives::Torus));
        assert_eq!(
            again[0].0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            torus[0].0.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn link_counters_of_torus_runs_equal_the_routing_model() {
    // All-reduce of 1000 f32 and an all-to-all with known counts: the measured
    // (torus) payload bytes per link equal the model computed for MPI runs, on the
    // all-reduce exactly; the all-to-all's torus run also carries headers.
    for dims in [&[2usize, 2][..], &[2, 4], &[2, 2, 2], &[3, 3]] {
        let links = |mode: Collectives| {
            run_on(dims, move |c| {
                c.stats().set_collectives(mode);
                {
                    let _p = c.stats().phase("reduce");
                    let mut f = vec![1.0f32; 1000];
                    c.all_reduce_sum(&mut f);
                }
                {
                    let _p = c.stats().phase("a2a");
                    let counts: Vec<usize> = (0..c.size()).map(|d| 10 + d).collect();
                    let send = vec![7u32; counts.iter().sum()];
                    c.all_to_all_v(&send, &counts).unwrap();
                }
                c.stats().links()
            })
        };
        let torus = links(Collectives::Torus);
        let model = links(Collectives::Mpi);
        for (rank, (t, m)) in torus.iter().zip(&model).enumerate() {
            let get = |v: &Vec<(String, torusrec::comm::Links)>, ph: &str| {
                v.iter()
                    .find(|(n, _)| n == ph)
                    .map(|(_, l)| *l)
                    .unwrap_or_default()
            };
            let (tr, mr) = (get(t, "reduce"), get(m, "reduce"));
            for l in 0..6 {
                assert_eq!(tr[l].bytes, mr[l].bytes, "{dims:?} rank {rank} link {l}");
            }
            // Every link a torus dimension has carries all-reduce traffic.
            let used: usize = dims.iter().filter(|&&n| n > 1).count();
            assert!(
                tr[..2 * used].iter().all(|s| s.bytes > 0),
                "{dims:?}: {tr:?}"
            );
        }
        let total = |v: &Vec<Vec<(String, torusrec::comm::Links)>>| -> u64 {
            v.iter()
                .flat_map(|r| r.iter().filter(|(n, _)| n == "a2a"))
                .flat_map(|(_, l)| l.iter().map(|s| s.bytes))
                .sum()
        };
        let p: usize = dims.iter().product();
        let (tt, mt) = (total(&torus), total(&model));
        assert!(tt >= mt, "{dims:?}: torus {tt} < model {mt}");
        // Headers: 3 u64 per message per hop at most.
        let (hops, _) = (0..p)
            .map(|r| {
                let counts: Vec<usize> = (0..p).map(|d| 10 + d).collect();
                torusrec::comm::torus_coll::routed_hops(dims, r, &counts)
            })
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        assert_eq!(mt, 4 * hops, "{dims:?}: the model counts payload x hops");
        assert!(tt - mt <= 24 * (p * p) as u64 * dims.iter().sum::<usize>() as u64);
    }
}
