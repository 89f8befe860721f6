//! The node this rank runs on, as the launcher and the kernel describe it: its cores,
//! the ranks that share it, its memory (the smaller of `MemTotal` and a cgroup limit),
//! this process's rank before MPI is up, and the CPU's model name. The only module that
//! reads the launcher's environment, `/proc/meminfo`, `/proc/cpuinfo` and the cgroup
//! files (tests/it/layers.rs checks it); each workload keeps its own memory estimate and
//! refuses a run through [`check_fits`].

/// Cores this process may use (1 if unknown).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Ranks that share this node, from the launcher's environment (1 if unknown).
pub fn ranks_on_node() -> usize {
    [
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "SLURM_NTASKS_PER_NODE",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
    .unwrap_or(1)
    .max(1)
}

/// The launcher's rank of this process before MPI is up (0 if unknown), to print
/// command-line errors once.
pub fn launcher_rank() -> usize {
    [
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "PMIX_RANK",
        "SLURM_PROCID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
    .unwrap_or(0)
}

/// Rayon threads per rank: `--threads`, else the cores divided by the ranks on this node.
pub fn resolve_threads(flag: Option<usize>) -> usize {
    flag.unwrap_or_else(|| (cores() / ranks_on_node()).max(1))
}

/// Makes `threads` the size of this process's global rayon pool, once for every
/// subcommand. The pool can be built once per process: if a caller (a library user, a
/// test) built it already with another size, that is refused rather than ignored.
pub fn install_threads(threads: usize) -> crate::Result<()> {
    if threads == 0 {
        return Err(crate::Error::Config(
            "--threads 0: need at least one".into(),
        ));
    }
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global();
    if built.is_err() && rayon::current_num_threads() != threads {
        return Err(crate::Error::Config(format!(
            "--threads {threads}: this process's thread pool already has {}",
            rayon::current_num_threads()
        )));
    }
    Ok(())
}

/// The node's memory: the smaller of `MemTotal` and a cgroup limit, if readable.
pub fn memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let total = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()?
        * 1024;
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok());
    Some(cgroup.map_or(total, |c| c.min(total)))
}

/// The memory one rank may use: `flag` (`--mem-per-rank`), else the node's memory
/// divided by the ranks on it; `None` when neither is known.
pub fn mem_limit(flag: Option<u64>) -> Option<u64> {
    flag.or_else(|| memory_bytes().map(|m| m / ranks_on_node() as u64))
}

/// The generic refusal of a run that does not fit: `Err(refusal(limit))` when the
/// estimated `need` (bytes per rank) exceeds `limit`; no limit admits everything. The
/// caller turns the message into a configuration error (exit 2) before anything large
/// is allocated.
pub fn check_fits(
    need: u64,
    limit: Option<u64>,
    refusal: impl FnOnce(u64) -> String,
) -> Result<(), String> {
    match limit {
        Some(l) if need > l => Err(refusal(l)),
        _ => Ok(()),
    }
}

/// This CPU's model name (`/proc/cpuinfo`), or `unknown`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_fits_refuses_only_above_the_limit() {
        assert_eq!(check_fits(10, None, |_| unreachable!()), Ok(()));
        assert_eq!(check_fits(10, Some(10), |_| unreachable!()), Ok(()));
        assert_eq!(
            check_fits(11, Some(10), |l| format!("over {l}")),
            Err("over 10".to_string())
        );
    }

    #[test]
    fn thread_default_divides_the_cores_and_a_flag_wins() {
        assert_eq!(resolve_threads(Some(3)), 3);
        let t = resolve_threads(None);
        assert!(t >= 1 && t <= cores(), "{t} threads of {} cores", cores());
    }
}
