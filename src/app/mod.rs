//! The subcommands, generic over the communicator so that tests run them under the
//! thread backend. Rank 0 prints ordinary output; configs are validated on every rank
//! (identically) before the first collective that depends on them.

pub mod als;
pub mod calibrate;
pub mod clicks;
pub mod embed;
pub mod inspect;
pub mod launch;
pub mod output;
pub mod plot;
pub mod predict;
pub mod prepare;
pub mod prepare_useritem;
pub mod project;
pub mod recommend;
pub mod tune;

use crate::cli::{Command, GenerateClicksFormat, GenerateCommand, PrepareCmd, PrepareCommand};
use crate::comm::Comm;
use crate::error::Result;
/// `1,234,567` style integers (in [`crate::metrics`], below every module that prints).
pub use crate::metrics::group;

/// Collective: every rank must call. Runs one subcommand; returns the lines rank 0
/// printed (for tests), or an error with the agreed exit code on every rank.
pub fn run<C: Comm>(
    comm: &C,
    command: &Command,
    preempt: crate::ckpt::signals::Preemption,
) -> Result<()> {
    match command {
        Command::Prepare(PrepareCmd {
            command: Some(PrepareCommand::Clicks(args)),
            ..
        }) => clicks::global_prepare_clicks(comm, args).map(|_| ()),
        Command::Prepare(PrepareCmd {
            graph: Some(args), ..
        }) if args.matrix == crate::cli::MatrixKind::UserItem => {
            let cfg = comm.agree(prepare_useritem::UserItemConfig::from_args(args))?;
            prepare_useritem::global_run(comm, &cfg).map(|_| ())
        }
        Command::Prepare(PrepareCmd {
            graph: Some(args), ..
        }) => {
            let cfg = comm.agree(prepare::PrepareConfig::from_prepare_args(args))?;
            prepare::global_run(comm, &cfg).map(|_| ())
        }
        Command::Prepare(_) => Err(crate::Error::Config(
            "prepare: give --input, --format and --out, or a subcommand (clicks)".into(),
        )),
        Command::Generate(GenerateCommand::Webgraph(args)) => {
            let cfg = comm.agree(prepare::GenerateConfig::from_args(args))?;
            prepare::global_generate(comm, &cfg).map(|_| ())
        }
        Command::Generate(GenerateCommand::Clicks(args)) => match args.format {
            GenerateClicksFormat::Criteo => clicks::global_generate_criteo(comm, args),
            GenerateClicksFormat::Log => {
                comm.agree(clicks::check_log_args(args))?;
                embed::generate::global_generate_clicks(comm, args)
            }
        },
        Command::Als(args) => als::global_run(comm, args, preempt).map(|_| ()),
        Command::Tune(args) => tune::global_run(comm, args, preempt),
        Command::Embed(args) => embed::run::global_run(comm, args, preempt).map(|_| ()),
        Command::Plan(args) => embed::plan::global_plan(comm, args),
        // One process's work (main runs it before MPI starts); under a launcher, rank 0
        // draws and every rank returns its result.
        Command::Plot(args) => comm.agree(if comm.rank() == 0 {
            plot::run(args)
        } else {
            Ok(())
        }),
        Command::Project(c) => project::global_run(comm, c, preempt),
        Command::Inspect(args) => inspect::global_command(comm, args),
        Command::Recommend(args) => recommend::global_run(comm, args, preempt),
        Command::Predict(args) => predict::global_run(comm, args),
        Command::Calibrate(args) => calibrate::global_run(comm, args),
        Command::Selftest(args) => {
            let lines = crate::comm::selftest::global_selftest(comm)?;
            if comm.rank() == 0 {
                println!("torus {} ({} ranks)", comm.torus().shape(), comm.size());
                for l in lines {
                    println!("  {l}");
                }
                println!("selftest passed: all-reduce, all-to-all-v (and its inverse), all-gather-v, broadcast, torus neighbours");
            }
            if args.bench {
                if args.reps == 0 || args.reps > 1000 {
                    return Err(crate::Error::Config("--reps must be in 1..=1000".into()));
                }
                let sizes = [64 << 10, 1 << 20, 16 << 20, 64 << 20];
                let rows = crate::comm::selftest::global_collective_bench(comm, &sizes, args.reps)?;
                if comm.rank() == 0 {
                    println!("| op | bytes per rank | collectives | ms per call | GB/s per rank |");
                    println!("|---|---|---|---|---|");
                    for r in rows {
                        println!(
                            "| {} | {} | {:?} | {:.3} | {:.2} |",
                            r.op,
                            crate::metrics::human_bytes(r.bytes as u64),
                            r.collectives,
                            r.seconds * 1e3,
                            r.bytes as f64 / r.seconds.max(1e-12) / 1e9
                        );
                    }
                }
            }
            Ok(())
        }
    }
}
