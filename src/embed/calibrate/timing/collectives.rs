//! The collective points: all-to-all-v and all-reduce per message size, each the
//! slowest rank's mean seconds.

use std::time::Instant;

use crate::comm::Comm;
use crate::embed::calibrate::options::CalibOptions;
use crate::embed::calibrate::points::CollPoint;
use crate::error::Result;

/// Collective: every rank must call. The mean over ranks of each value.
pub(super) fn global_mean<C: Comm>(comm: &C, v: &mut [f64]) {
    comm.all_reduce_sum(v);
    let n = comm.size() as f64;
    v.iter_mut().for_each(|x| *x /= n);
}

/// Collective: every rank must call. The slowest rank's mean seconds of `reps` calls
/// of `f`, started together after a barrier (one untimed call first).
fn global_time<C: Comm>(comm: &C, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    comm.barrier();
    let t = Instant::now();
    for _ in 0..reps.max(1) {
        f();
    }
    let mine = t.elapsed().as_secs_f64() / reps.max(1) as f64;
    f64::from_bits(comm.all_reduce_max(mine.to_bits()))
}

/// Collective: every rank must call. All-to-all-v and all-reduce per message size.
pub fn global_collectives<C: Comm>(
    comm: &C,
    o: &CalibOptions,
) -> Result<(Vec<CollPoint>, Vec<CollPoint>)> {
    let _phase = comm.stats().phase("calibrate");
    let p = comm.size();
    let (mut a2a, mut ar) = (Vec::new(), Vec::new());
    for &bytes in &o.coll_bytes {
        let per = ((bytes / 4) as usize / p).max(1);
        let send = vec![1.0f32; per * p];
        let counts = vec![per; p];
        let mut err = Ok(());
        let s = global_time(comm, o.reps, || {
            if let Err(e) = comm.all_to_all_v(&send, &counts) {
                err = Err(e);
            }
        });
        err?;
        a2a.push(CollPoint {
            bytes: (per * p * 4) as u64,
            seconds: s,
        });
        let mut buf = vec![1.0f32; (bytes / 4).max(1) as usize];
        let s = global_time(comm, o.reps, || comm.all_reduce_sum(&mut buf));
        ar.push(CollPoint {
            bytes: buf.len() as u64 * 4,
            seconds: s,
        });
    }
    Ok((a2a, ar))
}
