//! A check of every collective with answers computable from rank and size alone,
//! plus the torus geometry. Run by `torusrec selftest` under mpirun and by the
//! thread-backend tests.

use super::{Comm, Torus};
use crate::error::{Error, Result};

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::Comm(format!("selftest: {}", what())))
    }
}

/// How many elements rank `from` sends to rank `to` in the all-to-all-v check
/// (some are zero, so empty contributions are exercised).
fn pair_count(from: usize, to: usize) -> usize {
    (from + 2 * to) % 3
}

fn pair_value(from: usize, to: usize, k: usize) -> u32 {
    (from * 10_000 + to * 100 + k) as u32
}

/// Collective: every rank must call. Returns, on rank 0, one line per rank with its
/// torus coordinates and neighbours (empty elsewhere); an error on every rank if any
/// rank's check failed.
pub fn global_selftest<C: Comm>(comm: &C) -> Result<Vec<String>> {
    let p = comm.size();
    let me = comm.rank();
    let local = (|| -> Result<()> {
        // All-reduce: the sum of rank + 1 is p(p+1)/2, in every type.
        let want = (p * (p + 1) / 2) as u64;
        let mut u = [me as u64 + 1, 1];
        comm.all_reduce_sum(&mut u);
        check(u == [want, p as u64], || {
            format!("all_reduce_sum u64 gave {u:?}, expected [{want}, {p}]")
        })?;
        let mut f = [me as f32 + 1.0];
        comm.all_reduce_sum(&mut f);
        check(f[0] == want as f32, || {
            format!("all_reduce_sum f32 gave {}", f[0])
        })?;
        let mut d = [me as f64 + 1.0, -(me as f64)];
        comm.all_reduce_sum(&mut d);
        check(
            d[0] == want as f64 && d[1] == -((want - p as u64) as f64),
            || format!("all_reduce_sum f64 gave {d:?}"),
        )?;
        let mut empty: [f64; 0] = [];
        comm.all_reduce_sum(&mut empty);
        let m = comm.all_reduce_max(me as u64);
        check(m == p as u64 - 1, || format!("all_reduce_max gave {m}"))?;

        // All-to-all-v with uneven and empty parts, then its inverse.
        let counts: Vec<usize> = (0..p).map(|q| pair_count(me, q)).collect();
        let send: Vec<u32> = (0..p)
            .flat_map(|q| (0..pair_count(me, q)).map(move |k| pair_value(me, q, k)))
            .collect();
        let got = comm.all_to_all_v(&send, &counts)?;
        for q in 0..p {
            let want: Vec<u32> = (0..pair_count(q, me))
                .map(|k| pair_value(q, me, k))
                .collect();
            check(got.from_rank(q) == want.as_slice(), || {
                format!(
                    "all_to_all_v: from rank {q} got {:?}, expected {want:?}",
                    got.from_rank(q)
                )
            })?;
        }
        let back = comm.all_to_all_v(&got.data, &got.counts)?;
        check(back.data == send && back.counts == counts, || {
            "all_to_all_v followed by its inverse is not the identity".into()
        })?;
        let floats: Vec<f32> = send.iter().map(|&v| v as f32 * 0.5).collect();
        let gotf = comm.all_to_all_v(&floats, &counts)?;
        check(gotf.data.len() == got.data.len(), || {
            "all_to_all_v f32 length".into()
        })?;

        // All-gather-v: rank r contributes r copies of r.
        let mine: Vec<u64> = vec![me as u64; me];
        let all = comm.all_gather_v(&mine)?;
        let want: Vec<u64> = (0..p)
            .flat_map(|r| std::iter::repeat_n(r as u64, r))
            .collect();
        check(all.data == want, || {
            format!("all_gather_v gave {:?}", all.data)
        })?;

        // Broadcast from the last rank, of a length only it knows.
        let mut v: Vec<u8> = if me == p - 1 {
            b"torus".to_vec()
        } else {
            Vec::new()
        };
        comm.broadcast_vec(p - 1, &mut v)?;
        check(v == b"torus", || format!("broadcast_vec gave {v:?}"))?;
        comm.barrier();
        Ok(())
    })();
    comm.agree(local)?;

    // Torus: gather every rank's coordinates and neighbours, check they are mutual.
    let t = comm.torus();
    let mut mine: Vec<u64> = t.coords.iter().map(|&c| c as u64).collect();
    for &(down, up) in &t.neighbours {
        mine.extend_from_slice(&[down as u64, up as u64]);
    }
    let all = comm.all_gather_v(&mine)?;
    let nd = t.dims.len();
    let mut lines = Vec::new();
    let local = (|| -> Result<()> {
        for r in 0..p {
            let part = all.from_rank(r);
            let expect = Torus::new(&t.dims, r);
            let coords: Vec<usize> = part[..nd].iter().map(|&c| c as usize).collect();
            let nbrs: Vec<(usize, usize)> = part[nd..]
                .chunks(2)
                .map(|c| (c[0] as usize, c[1] as usize))
                .collect();
            check(coords == expect.coords && nbrs == expect.neighbours, || {
                format!("rank {r} reports {coords:?} {nbrs:?}")
            })?;
            for (d, &(down, up)) in nbrs.iter().enumerate() {
                let up_part = all.from_rank(up);
                check(up_part[nd + 2 * d] as usize == r, || {
                    format!("rank {r}'s up-neighbour {up} in dimension {d} does not have it as down-neighbour")
                })?;
                let _ = down;
            }
            if me == 0 {
                let n = nbrs
                    .iter()
                    .enumerate()
                    .map(|(d, (down, up))| format!("d{d}: -{down} +{up}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                lines.push(format!("rank {r}: coords {coords:?}, neighbours {n}"));
            }
        }
        Ok(())
    })();
    comm.agree(local)?;
    Ok(lines)
}

/// One collective microbenchmark result.
#[derive(Debug, Clone, PartialEq)]
pub struct CollBench {
    pub op: &'static str,
    /// Bytes per rank (all-reduce: the buffer; all-to-all-v: what each rank sends).
    pub bytes: usize,
    pub collectives: super::Collectives,
    /// Mean seconds per call, the slowest rank's.
    pub seconds: f64,
}

/// Collective: every rank must call. Times all-reduce (f32) and a uniform
/// all-to-all-v of each size in `sizes` (bytes per rank) with both algorithms, `reps`
/// calls each after one warm-up call, and restores the algorithm in use.
pub fn global_collective_bench<C: Comm>(
    comm: &C,
    sizes: &[usize],
    reps: usize,
) -> Result<Vec<CollBench>> {
    use super::Collectives;
    let keep = comm.stats().collectives();
    let p = comm.size();
    let mut out = Vec::new();
    for &bytes in sizes {
        let n = (bytes / 4).max(1);
        for mode in [Collectives::Mpi, Collectives::Torus] {
            comm.stats().set_collectives(mode);
            let mut buf = vec![1.0f32; n];
            let per = n / p.max(1);
            let counts = vec![per; p];
            let send = vec![2u32; per * p];
            for op in ["all-reduce", "all-to-all-v"] {
                let mut run = || -> Result<()> {
                    match op {
                        "all-reduce" => comm.all_reduce_sum(&mut buf),
                        _ => {
                            comm.all_to_all_v(&send, &counts)?;
                        }
                    }
                    Ok(())
                };
                run()?;
                comm.barrier();
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    run()?;
                }
                let secs = t.elapsed().as_secs_f64() / reps.max(1) as f64;
                let slowest = f64::from_bits(comm.all_reduce_max(secs.to_bits()));
                out.push(CollBench {
                    op,
                    bytes,
                    collectives: mode,
                    seconds: slowest,
                });
            }
        }
    }
    comm.stats().set_collectives(keep);
    Ok(out)
}
