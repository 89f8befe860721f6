//! The `torusrec` binary: initializes MPI, builds the torus, runs one subcommand and
//! maps its result to the exit codes of docs/design.md. Everything else is library code.

use clap::Parser;
use std::io::Write;
use torusrec::cli::Cli;
use torusrec::comm::mpi_backend::{MpiComm, MpiWorld};
use torusrec::comm::{global_link_summary, global_stats_summary, parse_torus, Collectives, Comm};
use torusrec::error::{exit, Error};
use torusrec::metrics::human_bytes;

fn main() {
    std::process::exit(real_main());
}

fn init_logging(rank: usize, size: usize) {
    let default = if rank == 0 { "info" } else { "warn" };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format(move |buf, rec| writeln!(buf, "[{rank}/{size}] {:<5} {}", rec.level(), rec.args()))
        .init();
}

/// Training allocates and frees the same large buffers every step (exchange payloads,
/// pooled vectors, gradients). glibc hands blocks above its mmap threshold (128 KiB, adapting
/// up to 32 MiB) back to the kernel on free, so each step faults them in again and the kernel
/// zeroes every page: on the TorchRec workload at 2 ranks that was 2.4 M page faults and
/// 7 s of system time per rank in 30 steps, a third of the step time. Keep freed memory in
/// the process instead (the heap then stays at the high-water mark of one step, which the
/// next step needs again). An explicit `MALLOC_*_` variable or `GLIBC_TUNABLES` wins.
///
/// iALS (`als`, `tune`) keeps only blocks below [`ALS_MMAP_THRESHOLD`]: its large buffers
/// live for a half-epoch (the gathered fixed rows, the spilled CSR's chunks, a fetch
/// round's payloads), so faulting them in costs little, while keeping them in the heap
/// fragments it: a half's gathered rows no longer fit the hole the previous half's left,
/// and de-dense bf16 at P = 2 grew from 3.8 GB to 4.8 GB per rank in its second epoch.
fn keep_freed_memory(command: &torusrec::cli::Command) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let user_set = std::env::vars_os().any(|(k, _)| {
            let k = k.to_string_lossy();
            k == "GLIBC_TUNABLES" || (k.starts_with("MALLOC_") && k.ends_with('_'))
        });
        let threshold = match command {
            torusrec::cli::Command::Als(_) | torusrec::cli::Command::Tune(_) => ALS_MMAP_THRESHOLD,
            _ => i32::MAX,
        };
        if !user_set {
            // SAFETY: mallopt only changes allocator parameters; called before MPI and
            // the thread pools start.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, threshold);
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
                libc::mallopt(libc::M_TOP_PAD, 64 << 20);
            }
        }
    }
}

/// iALS's mmap threshold: blocks of at least this many bytes go back to the kernel when
/// freed (see [`keep_freed_memory`]).
const ALS_MMAP_THRESHOLD: i32 = 4 << 20;

fn real_main() -> i32 {
    torusrec::cpu::blas_single_thread();
    // First of all, so that a preemption signal during start-up only sets the flag.
    let preempt = match torusrec::ckpt::signals::Preemption::install() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("torusrec: cannot install signal handlers: {e}");
            return exit::OTHER;
        }
    };
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            if torusrec::node::launcher_rank() == 0 {
                if e.use_stderr() {
                    // Clap echoes the offending token whole; cut it like our own errors.
                    eprint!("{}", shorten_tokens(&e.render().to_string()));
                } else {
                    let _ = e.print();
                }
            }
            return code;
        }
    };
    keep_freed_memory(&cli.command);
    // Drawing charts is one process's work: no MPI, no torus. Under a launcher, the
    // first rank draws and the others exit at once.
    if let torusrec::cli::Command::Plot(args) = &cli.command {
        if torusrec::node::launcher_rank() != 0 {
            return exit::OK;
        }
        return match torusrec::app::plot::run(args) {
            Ok(()) => exit::OK,
            Err(e) => {
                eprintln!("torusrec: {}", error_chain(&e));
                e.exit_code()
            }
        };
    }
    let world = match MpiWorld::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("torusrec: {e}");
            return exit::OTHER;
        }
    };
    let (rank, size) = (world.rank(), world.size());
    init_logging(rank, size);
    // Before any other collective: every rank runs the same command line and binary.
    if size > 1 {
        if let Err(code) = check_same_launch(&world, rank, size) {
            return code;
        }
    }
    let dims = match &cli.torus {
        Some(spec) => match parse_torus(spec, size) {
            Ok(d) => d,
            Err(e) => {
                // Identical on every rank: say it once.
                if rank == 0 {
                    eprintln!("torusrec: {e}");
                }
                return e.exit_code();
            }
        },
        None => world.dims_create(2),
    };
    let comm = match world.into_torus(&dims) {
        Ok(c) => c,
        Err(e) => {
            eprint_line(format!("[{rank}/{size}] torusrec: {e}"));
            return exit::OTHER;
        }
    };
    let collectives = match choose_collectives(cli.collectives.as_deref(), &dims, rank) {
        Ok(c) => c,
        Err(code) => return code,
    };
    comm.stats().set_collectives(collectives);
    if let Err(code) = install_failure_handlers(&comm, cli.comm_timeout) {
        return code;
    }
    log::debug!(
        "torus {} coords {:?} neighbours {:?}",
        comm.torus().shape(),
        comm.torus().coords,
        comm.torus().neighbours
    );

    let result = torusrec::app::run(&comm, &cli.command, preempt);
    print_comm_summary(&comm);
    match result {
        Ok(()) => exit::OK,
        Err(Error::Remote { code, .. }) => code,
        // The same on every rank: say it once.
        Err(
            e @ (Error::Preempted(_) | Error::Hold(_) | Error::Corrupt(_) | Error::Interrupted(_)),
        ) => {
            if rank == 0 {
                eprint_line(format!("[{rank}/{size}] torusrec: {e}"));
            }
            e.exit_code()
        }
        Err(e) => {
            eprint_line(format!("[{rank}/{size}] torusrec: {}", error_chain(&e)));
            e.exit_code()
        }
    }
}

/// `--collectives`, or the default for torus `dims` (torus algorithms once a dimension
/// has 3 or more chips); a bad value is a usage error, said once by rank 0.
fn choose_collectives(arg: Option<&str>, dims: &[usize], rank: usize) -> Result<Collectives, i32> {
    match arg.map(str::parse::<Collectives>) {
        Some(Ok(c)) => Ok(c),
        Some(Err(e)) => {
            if rank == 0 {
                eprintln!("torusrec: --collectives: {e}");
            }
            Err(exit::USAGE)
        }
        None if dims.iter().any(|&n| n >= 3) => Ok(Collectives::Torus),
        None => Ok(Collectives::Mpi),
    }
}

/// Collective over the world: every rank must call. The launch check
/// ([`torusrec::app::launch`]): on a mismatch rank 0 names the groups of ranks, every
/// rank not in rank 0's group prints its own arguments, and every rank returns exit 2.
fn check_same_launch(world: &MpiWorld, rank: usize, size: usize) -> Result<(), i32> {
    use torusrec::app::launch;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let binary = launch::binary_identity();
    let hashes = world.all_gather_u64(launch::launch_hash(&binary, &args));
    let Err(e) = launch::check_same_launch(&hashes) else {
        return Ok(());
    };
    let line = shorten_tokens(
        &args
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
    );
    if rank == 0 {
        eprint_line(format!(
            "[0/{size}] torusrec: {e}; rank 0 runs {binary}: {line}"
        ));
    } else if hashes[rank] != hashes[0] {
        eprint_line(format!(
            "[{rank}/{size}] torusrec: this rank differs from rank 0; it runs {binary}: {line}"
        ));
    }
    Err(e.exit_code())
}

/// `line` and a newline on stderr in one write. `eprintln!` writes the pieces of its
/// format one by one (stderr is unbuffered), so the lines of ranks that print at the
/// same moment interleave mid-line in mpirun's forwarded output; one write of a line
/// shorter than the pipe buffer (4 kB) is not split.
fn eprint_line(line: String) {
    use std::io::Write;
    let mut s = line;
    s.push('\n');
    let _ = std::io::stderr().lock().write_all(s.as_bytes());
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}

/// A panic on one rank (a bug) must stop every rank, not leave them waiting in a
/// collective: print it and abort the MPI job.
fn install_panic_abort(size: usize) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if torusrec::panic_guard::is_expected() {
            return;
        }
        default(info);
        if size > 1 {
            MpiWorld::abort_world(exit::OTHER);
        }
    }));
}

/// Collective: every rank must call. The panic hook that aborts the job, then (on more
/// than one rank) `--comm-timeout` checked, identically on every rank, and the
/// communication watchdog started; rank 0 prints the timeout in force.
fn install_failure_handlers(comm: &MpiComm, flag: Option<f64>) -> Result<(), i32> {
    use torusrec::comm::watchdog::DEFAULT_TIMEOUT;
    install_panic_abort(comm.size());
    if comm.size() == 1 {
        return Ok(());
    }
    let timeout = match flag {
        None => Some(DEFAULT_TIMEOUT),
        Some(0.0) => None,
        Some(s) if s.is_finite() && s > 0.0 && s <= 1e9 => {
            Some(std::time::Duration::from_secs_f64(s))
        }
        Some(s) => {
            if comm.rank() == 0 {
                eprintln!("torusrec: --comm-timeout {s}: expected seconds > 0, or 0 for none");
            }
            return Err(exit::USAGE);
        }
    };
    match comm.start_watchdog(timeout) {
        Ok(hosts) => {
            // The hosts in rank order, each once.
            let mut distinct: Vec<&str> = Vec::new();
            for h in &hosts {
                if !distinct.contains(&h.as_str()) {
                    distinct.push(h);
                }
            }
            log::info!(
                "comm timeout {} (--comm-timeout); {} ranks on {} host(s): {}",
                timeout.map_or("off".to_string(), |t| format!("{} s", t.as_secs_f64())),
                hosts.len(),
                distinct.len(),
                distinct.join(" ")
            );
            Ok(())
        }
        Err(e) => {
            eprint_line(format!("[{}/{}] torusrec: {e}", comm.rank(), comm.size()));
            Err(exit::OTHER)
        }
    }
}

/// Rank 0 prints the bytes, calls and time of every communication phase.
fn print_comm_summary(comm: &MpiComm) {
    if comm.size() == 1 {
        return;
    }
    match global_stats_summary(comm) {
        Ok(phases) if comm.rank() == 0 => {
            for (name, s) in phases {
                log::info!(
                    "comm {name}: {} calls, {} sent, {} received (all ranks), {:.3} s (slowest rank)",
                    s.calls,
                    human_bytes(s.bytes_sent),
                    human_bytes(s.bytes_recv),
                    s.seconds
                );
            }
        }
        Ok(_) => {}
        Err(e) => log::warn!("comm summary: {e}"),
    }
    match global_link_summary(comm) {
        Ok(phases) if comm.rank() == 0 => {
            log::info!(
                "links (torus {}, {}): per phase, the busiest outgoing link and the mean over links",
                comm.torus().shape(),
                match comm.stats().collectives() {
                    Collectives::Torus => "torus collectives, measured",
                    Collectives::Mpi => "MPI collectives; computed as the torus algorithms would route them",
                },
            );
            for (name, s) in phases {
                log::info!(
                    "links {name}: busiest {} {} on rank {}, mean {}{}",
                    s.busiest_link,
                    human_bytes(s.busiest_bytes),
                    s.busiest_rank,
                    human_bytes(s.mean_bytes as u64),
                    s.mean_hops
                        .map(|h| format!(", all-to-all {h:.2} hops"))
                        .unwrap_or_default()
                );
            }
        }
        Ok(_) => {}
        Err(e) => log::warn!("link summary: {e}"),
    }
}

/// `text` with every run of more than 100 non-blank characters cut to its first 100
/// (and the number of bytes left out), so that one huge argument cannot flood a log.
fn shorten_tokens(text: &str) -> String {
    const MAX: usize = 100;
    let mut out = String::with_capacity(text.len().min(4096));
    let mut run = 0usize;
    let mut skipped = 0usize;
    for c in text.chars() {
        if c.is_whitespace() {
            if skipped > 0 {
                out.push_str(&format!("... ({skipped} more bytes)"));
                skipped = 0;
            }
            run = 0;
            out.push(c);
        } else if run < MAX {
            run += 1;
            out.push(c);
        } else {
            skipped += c.len_utf8();
        }
    }
    if skipped > 0 {
        out.push_str(&format!("... ({skipped} more bytes)"));
    }
    out
}
