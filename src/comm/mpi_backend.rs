//! The MPI backend: a periodic Cartesian communicator over `MPI_COMM_WORLD`.
//! This file and `main` are the only places that touch the `mpi` crate.

use super::{watchdog, Comm, CommStats, Elem, ElemKind, Summable, Torus};
use crate::error::{Error, Result};
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::{CartesianCommunicator, Communicator};
use mpi::traits::Equivalence;
use mpi::Count;

/// One rank of an MPI job on a periodic torus.
pub struct MpiComm {
    // Dropped before `universe`, which finalizes MPI.
    cart: CartesianCommunicator,
    torus: Torus,
    stats: CommStats,
    /// The all-reduce's copy of its input, kept between calls.
    scratch: std::cell::RefCell<Vec<u128>>,
    _universe: mpi::environment::Universe,
}

/// The world size, known right after initialization (needed to check `--torus`).
pub struct MpiWorld {
    universe: mpi::environment::Universe,
}

impl MpiWorld {
    /// Initialize MPI (once per process). Rayon threads never call MPI, so the
    /// funneled level is enough.
    pub fn init() -> Result<Self> {
        let (universe, _level) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or_else(|| Error::Comm("MPI was already initialized in this process".into()))?;
        Ok(Self { universe })
    }

    pub fn size(&self) -> usize {
        self.universe.world().size() as usize
    }

    pub fn rank(&self) -> usize {
        self.universe.world().rank() as usize
    }

    /// Collective over the world: every rank must call. Every rank's `value`, by rank
    /// (one fixed-size `MPI_Allgather`, for the launch check before the torus exists).
    pub fn all_gather_u64(&self, value: u64) -> Vec<u64> {
        let mut out = vec![0u64; self.size()];
        self.universe.world().all_gather_into(&value, &mut out[..]);
        out
    }

    /// `MPI_Dims_create` for `ndims` dimensions.
    pub fn dims_create(&self, ndims: usize) -> Vec<usize> {
        let mut dims: Vec<Count> = vec![0; ndims];
        // SAFETY: `dims` has `ndims` writable entries, as MPI_Dims_create requires.
        unsafe {
            mpi::ffi::MPI_Dims_create(self.size() as Count, ndims as Count, dims.as_mut_ptr());
        }
        dims.into_iter().map(|d| d as usize).collect()
    }

    /// Build the periodic Cartesian communicator of `dims` (which must multiply to the
    /// world size; the caller validated it on every rank).
    pub fn into_torus(self, dims: &[usize]) -> Result<MpiComm> {
        let world = self.universe.world();
        let cdims: Vec<Count> = dims.iter().map(|&d| d as Count).collect();
        let periods = vec![true; dims.len()];
        let cart = world
            .create_cartesian_communicator(&cdims, &periods, false)
            .ok_or_else(|| Error::Comm(format!("MPI_Cart_create refused dims {dims:?}")))?;
        let rank = cart.rank() as usize;
        let torus = Torus::new(dims, rank);
        // Our geometry must agree with MPI's own.
        let layout = cart.get_layout();
        let mpi_coords: Vec<usize> = layout.coords.iter().map(|&c| c as usize).collect();
        if mpi_coords != torus.coords {
            return Err(Error::Comm(format!(
                "rank {rank}: MPI coordinates {mpi_coords:?} differ from {:?}",
                torus.coords
            )));
        }
        for (d, &(down, up)) in torus.neighbours.iter().enumerate() {
            let (src, dst) = cart.shift(d as Count, 1);
            if src.map(|r| r as usize) != Some(down) || dst.map(|r| r as usize) != Some(up) {
                return Err(Error::Comm(format!(
                    "rank {rank}: MPI neighbours in dimension {d} are {src:?}/{dst:?}, expected {down}/{up}"
                )));
            }
        }
        Ok(MpiComm {
            cart,
            torus,
            stats: CommStats::default(),
            scratch: Default::default(),
            _universe: self.universe,
        })
    }

    /// Abort every rank of the job with `code` (for unrecoverable errors).
    pub fn abort_world(code: i32) -> ! {
        mpi::topology::SimpleCommunicator::world().abort(code)
    }
}

impl MpiComm {
    /// Collective: every rank must call. Start the communication watchdog
    /// ([`watchdog`]): open this rank's liveness port, gather every rank's host name
    /// (`MPI_Get_processor_name`) and port, and watch every later MPI call for
    /// `timeout` (None: only the exit hook). Returns the host names, by rank.
    pub fn start_watchdog(&self, timeout: Option<std::time::Duration>) -> Result<Vec<String>> {
        let host = mpi::environment::processor_name()
            .map_err(|e| Error::Comm(format!("MPI_Get_processor_name: {e}")))?;
        // Uncounted, like the other start-up collectives: the run's counters stay as
        // they were without the watchdog.
        let local = watchdog::listen();
        let failed = self.raw_all_reduce_max_u64(local.is_err() as u64);
        let port = match (local, failed) {
            (Ok(p), 0) => p,
            (Err(e), _) => {
                return Err(Error::Comm(format!(
                    "watchdog: cannot open a liveness port: {e}"
                )))
            }
            (Ok(_), _) => {
                return Err(Error::Comm(
                    "watchdog: another rank cannot open a liveness port".into(),
                ))
            }
        };
        let ports: Vec<u16> = self
            .raw_all_gather_u64(port as u64)
            .into_iter()
            .map(|p| p as u16)
            .collect();
        let bytes = host.as_bytes();
        let counts: Vec<usize> = self
            .raw_all_gather_u64(bytes.len() as u64)
            .into_iter()
            .map(|c| c as usize)
            .collect();
        let all = self.raw_all_gather_v(bytes, &counts)?;
        let mut hosts = Vec::with_capacity(counts.len());
        let mut at = 0;
        for c in counts {
            hosts.push(String::from_utf8_lossy(&all[at..at + c]).into_owned());
            at += c;
        }
        let peers = watchdog::Peers {
            hosts: hosts.clone(),
            ports,
        };
        watchdog::start(self.rank(), self.size(), timeout, peers);
        Ok(hosts)
    }

    /// Abort every rank of the job with `code`.
    pub fn abort(&self, code: i32) -> ! {
        self.cart.abort(code)
    }
}

fn count(n: usize, what: &str) -> Result<Count> {
    Count::try_from(n).map_err(|_| {
        Error::Comm(format!(
            "{what}: {n} elements exceed MPI's count limit; split the collective"
        ))
    })
}

/// [`count`] where only this rank may be over the limit (per-rank counts of an
/// all-to-all or a shift): an error here would leave the other ranks waiting in the
/// collective, so it stops every rank (the panic hook aborts the job) with the reason.
fn count_or_abort(n: usize, what: &str) -> Count {
    match count(n, what) {
        Ok(c) => c,
        Err(e) => panic!("{e} (this rank alone is over MPI's 32-bit counts, so every rank stops)"),
    }
}

fn displs(counts: &[Count]) -> Result<Vec<Count>> {
    let mut acc: i64 = 0;
    let mut out = Vec::with_capacity(counts.len());
    for &c in counts {
        out.push(count(acc as usize, "displacement")?);
        acc += c as i64;
    }
    Ok(out)
}

/// Reinterpret a slice of a sealed [`Elem`] as the concrete type named by its kind.
macro_rules! with_concrete {
    ($t:ty, $kind:expr, |$u:ident| $body:expr) => {
        match $kind {
            ElemKind::U8 => {
                type $u = u8;
                $body
            }
            ElemKind::U16 => {
                type $u = u16;
                $body
            }
            ElemKind::U32 => {
                type $u = u32;
                $body
            }
            ElemKind::U64 => {
                type $u = u64;
                $body
            }
            ElemKind::F32 => {
                type $u = f32;
                $body
            }
            ElemKind::F64 => {
                type $u = f64;
                $body
            }
        }
    };
}

/// # Safety
/// `U` must be the type `T` is (guaranteed by the sealed `Elem::KIND`).
unsafe fn cast<T, U>(s: &[T]) -> &[U] {
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<U>());
    std::slice::from_raw_parts(s.as_ptr() as *const U, s.len())
}

/// # Safety
/// As [`cast`].
unsafe fn cast_mut<T, U>(s: &mut [T]) -> &mut [U] {
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<U>());
    std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut U, s.len())
}

/// The sum into `buf`, its input copied to `scratch` first (the `mpi` crate has no
/// `MPI_IN_PLACE`); `scratch`'s allocation is kept for the next call.
fn all_reduce_sum_typed<U: Equivalence + Copy>(
    cart: &CartesianCommunicator,
    buf: &mut [U],
    scratch: &mut Vec<u128>,
) {
    let bytes = std::mem::size_of_val(buf);
    // Every byte the reduction reads is copied in below: no zero fill. The scratch
    // only grows: the small all-reduces between two large ones (a loss, a status)
    // would otherwise shorten it, and the next large one fill it again.
    let need = bytes.div_ceil(16);
    if scratch.len() < need {
        crate::allocs::resize_for_overwrite(scratch, need);
    }
    debug_assert!(std::mem::align_of::<U>() <= 16);
    // SAFETY: `scratch` holds at least `bytes` bytes, 16-aligned (enough for every
    // element kind), and `U` is plain data (`Copy`, an MPI equivalence).
    let send =
        unsafe { std::slice::from_raw_parts_mut(scratch.as_mut_ptr().cast::<U>(), buf.len()) };
    send.copy_from_slice(buf);
    // In pieces that MPI's 32-bit counts can name; every rank has the same length, so
    // every rank makes the same calls.
    let max = max_count();
    for (s, b) in send.chunks(max).zip(buf.chunks_mut(max)) {
        cart.all_reduce_into(s, b, SystemOperation::sum());
    }
}

/// The most elements one all-reduce or all-gather call gives MPI: 2^30, under its
/// 32-bit counts; larger collectives go in pieces. `TORUSREC_MPI_MAX_COUNT` lowers it
/// (read once), so that tests exercise the pieces with small data.
fn max_count() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("TORUSREC_MPI_MAX_COUNT")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .map_or(1 << 30, |n| n.min(1 << 30))
    })
}

/// Into `recv` (resized to the total; its allocation is reused when large enough).
fn all_to_all_v_typed_into<U: Equivalence + Copy + Default>(
    cart: &CartesianCommunicator,
    send: &[U],
    send_counts: &[usize],
    recv_counts: &[usize],
    recv: &mut Vec<U>,
) -> Result<()> {
    let sc: Vec<Count> = send_counts
        .iter()
        .map(|&c| count_or_abort(c, "all_to_all_v send"))
        .collect();
    let rc: Vec<Count> = recv_counts
        .iter()
        .map(|&c| count_or_abort(c, "all_to_all_v recv"))
        .collect();
    count_or_abort(send_counts.iter().sum(), "all_to_all_v send total");
    count_or_abort(recv_counts.iter().sum(), "all_to_all_v recv total");
    let sd = displs(&sc)?;
    let rd = displs(&rc)?;
    // MPI writes every element (the counts are exact): a reused buffer keeps its old
    // values until then instead of a zero fill.
    let n: usize = recv_counts.iter().sum();
    crate::allocs::resize_for_overwrite(recv, n);
    {
        let sp = Partition::new(send, &sc[..], &sd[..]);
        let mut rp = PartitionMut::new(&mut recv[..], &rc[..], &rd[..]);
        cart.all_to_all_varcount_into(&sp, &mut rp);
    }
    Ok(())
}

fn all_gather_v_typed<U: Equivalence + Copy + Default>(
    cart: &CartesianCommunicator,
    send: &[U],
    counts: &[usize],
) -> Result<Vec<U>> {
    let total: usize = counts.iter().sum();
    let max = max_count();
    if total <= max {
        let c: Vec<Count> = counts
            .iter()
            .map(|&n| count(n, "all_gather_v"))
            .collect::<Result<_>>()?;
        let d = displs(&c)?;
        let mut recv = vec![U::default(); total];
        {
            let mut rp = PartitionMut::new(&mut recv[..], &c[..], &d[..]);
            cart.all_gather_varcount_into(send, &mut rp);
        }
        return Ok(recv);
    }
    // In rounds of at most `max / P` elements per rank (every rank knows every count,
    // so every rank makes the same calls), each round's pieces copied into place.
    let piece = (max / counts.len()).max(1);
    let rounds = counts.iter().map(|&n| n.div_ceil(piece)).max().unwrap_or(0);
    let starts: Vec<usize> = counts
        .iter()
        .scan(0, |acc, &n| {
            let s = *acc;
            *acc += n;
            Some(s)
        })
        .collect();
    let mut recv = vec![U::default(); total];
    let mut round_buf = Vec::new();
    for r in 0..rounds {
        let part = |n: usize| n.saturating_sub(r * piece).min(piece);
        let c: Vec<Count> = counts.iter().map(|&n| part(n) as Count).collect();
        let d = displs(&c)?;
        round_buf.clear();
        round_buf.resize(c.iter().map(|&x| x as usize).sum(), U::default());
        let lo = (r * piece).min(send.len());
        let mine = &send[lo..lo + part(send.len())];
        {
            let mut rp = PartitionMut::new(&mut round_buf[..], &c[..], &d[..]);
            cart.all_gather_varcount_into(mine, &mut rp);
        }
        for (i, (&ci, &di)) in c.iter().zip(&d).enumerate() {
            let (ci, di) = (ci as usize, di as usize);
            if ci == 0 {
                continue; // this rank's part ended in an earlier round
            }
            let at = starts[i] + r * piece;
            recv[at..at + ci].copy_from_slice(&round_buf[di..di + ci]);
        }
    }
    Ok(recv)
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.cart.rank() as usize
    }
    fn size(&self) -> usize {
        self.cart.size() as usize
    }
    fn torus(&self) -> &Torus {
        &self.torus
    }
    fn stats(&self) -> &CommStats {
        &self.stats
    }
    fn raw_barrier(&self) {
        let _w = watchdog::enter(0);
        self.cart.barrier();
    }
    fn raw_all_reduce_sum<T: Summable>(&self, buf: &mut [T]) {
        let _w = watchdog::enter(1);
        // SAFETY: U is T (sealed kinds).
        let mut scratch = self.scratch.borrow_mut();
        with_concrete!(T, T::KIND, |U| all_reduce_sum_typed::<U>(
            &self.cart,
            unsafe { cast_mut::<T, U>(buf) },
            &mut scratch
        ))
    }
    fn raw_all_reduce_max_u64(&self, value: u64) -> u64 {
        let _w = watchdog::enter(1);
        let mut out = 0u64;
        self.cart
            .all_reduce_into(&value, &mut out, SystemOperation::max());
        out
    }
    fn raw_all_to_all_counts(&self, send: &[usize]) -> Result<Vec<usize>> {
        let _w = watchdog::enter(2);
        let s: Vec<u64> = send.iter().map(|&c| c as u64).collect();
        let mut r = vec![0u64; s.len()];
        self.cart.all_to_all_into(&s[..], &mut r[..]);
        Ok(r.into_iter().map(|c| c as usize).collect())
    }
    fn raw_all_to_all_v_into<T: Elem>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv_counts: &[usize],
        recv: &mut Vec<T>,
    ) -> Result<()> {
        let _w = watchdog::enter(2);
        with_concrete!(T, T::KIND, |U| {
            // SAFETY: U is T (sealed kinds); the Vec<T> is lent as a Vec<U> and taken back.
            let mut v: Vec<U> = unsafe { retype::<T, U>(std::mem::take(recv)) };
            let r = all_to_all_v_typed_into::<U>(
                &self.cart,
                unsafe { cast::<T, U>(send) },
                send_counts,
                recv_counts,
                &mut v,
            );
            *recv = unsafe { retype::<U, T>(v) };
            r
        })
    }
    fn raw_all_gather_u64(&self, value: u64) -> Vec<u64> {
        let _w = watchdog::enter(3);
        let mut out = vec![0u64; self.size()];
        self.cart.all_gather_into(&value, &mut out[..]);
        out
    }
    fn raw_all_gather_v<T: Elem>(&self, send: &[T], counts: &[usize]) -> Result<Vec<T>> {
        let _w = watchdog::enter(3);
        with_concrete!(T, T::KIND, |U| {
            // SAFETY: U is T (sealed kinds).
            let v = all_gather_v_typed::<U>(&self.cart, unsafe { cast::<T, U>(send) }, counts)?;
            Ok(unsafe { retype::<U, T>(v) })
        })
    }
    fn raw_shift<T: Elem>(&self, dim: usize, up: bool, send: &[T]) -> Result<Vec<T>> {
        let _w = watchdog::enter(5);
        let (down, upn) = self.torus.neighbours[dim];
        let (dst, src) = if up { (upn, down) } else { (down, upn) };
        with_concrete!(T, T::KIND, |U| {
            // SAFETY: U is T (sealed kinds).
            let v = shift_typed::<U>(&self.cart, dst, src, unsafe { cast::<T, U>(send) })?;
            Ok(unsafe { retype::<U, T>(v) })
        })
    }
    fn raw_broadcast<T: Elem>(&self, root: usize, buf: &mut [T]) -> Result<()> {
        let _w = watchdog::enter(4);
        count(buf.len(), "broadcast")?;
        if buf.is_empty() {
            // Every rank has the same length, so every rank returns here; MPI rejects
            // the dangling pointer of an empty slice.
            return Ok(());
        }
        let root = self.cart.process_at_rank(root as Count);
        with_concrete!(T, T::KIND, |U| {
            // SAFETY: U is T (sealed kinds).
            root.broadcast_into(unsafe { cast_mut::<T, U>(buf) });
            Ok(())
        })
    }
}

/// Send `send` to `dst` and receive from `src` (lengths first, then the data).
fn shift_typed<U: Equivalence + Copy + Default>(
    cart: &CartesianCommunicator,
    dst: usize,
    src: usize,
    send: &[U],
) -> Result<Vec<U>> {
    use mpi::point_to_point as p2p;
    let to = cart.process_at_rank(dst as Count);
    let from = cart.process_at_rank(src as Count);
    let mut n = 0u64;
    p2p::send_receive_into(&(send.len() as u64), &to, &mut n, &from);
    // Either side over the limit stops every rank: an error would leave the
    // partner waiting for the data message.
    count_or_abort(send.len(), "shift send");
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    count_or_abort(n, "shift recv");
    let mut recv = vec![U::default(); n];
    // Both sides always exchange the data message, empty or not (a receive of 0
    // elements still matches a message). Empty slices are cut from a local array so
    // that MPI never sees a dangling pointer.
    let mut dummy_in = [U::default(); 1];
    let dummy_out = [U::default(); 1];
    let out: &[U] = if send.is_empty() {
        &dummy_out[..0]
    } else {
        send
    };
    if recv.is_empty() {
        p2p::send_receive_into(out, &to, &mut dummy_in[..0], &from);
    } else {
        p2p::send_receive_into(out, &to, &mut recv[..], &from);
    }
    Ok(recv)
}

/// # Safety
/// `U` and `T` must be the same type.
unsafe fn retype<U, T>(v: Vec<U>) -> Vec<T> {
    let mut v = std::mem::ManuallyDrop::new(v);
    Vec::from_raw_parts(v.as_mut_ptr() as *mut T, v.len(), v.capacity())
}
