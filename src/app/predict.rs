//! `torusrec predict`: the flags checked, the text input converted (`--input`, by
//! `prepare clicks` to a temporary log next to `--out`), the model loaded and every
//! example scored ([`crate::embed::predict`]), and rank 0's output: the scores file,
//! written atomically, and the summary line.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;

use crate::cli::{PredictArgs, PrepareClicksArgs};
use crate::comm::Comm;
use crate::data::clicks::log_file::ClickLog;
use crate::data::clicks::source::Source;
use crate::embed::dense::auc::{auc, logloss};
use crate::embed::predict::{
    global_load, global_score, local_check_data, local_read_header, probability, ModelHeader,
};
use crate::embed::tables::keys::IdMap;
use crate::io::outfile::{check_apart, check_output, commit, probe_writable, temp_path};
use crate::{Error, Result};

/// Collective: every rank must call. `torusrec predict` (module docs).
pub fn global_run<C: Comm>(comm: &C, a: &PredictArgs) -> Result<()> {
    let threads = crate::node::resolve_threads(a.threads);
    comm.agree(crate::node::install_threads(threads))?;
    comm.agree(local_check_args(a))?;
    let Some(data) = &a.data else {
        let log = converted_path(&a.out);
        comm.agree(check_output(&log, false).map_err(|_| {
            Error::Config(format!(
                "--input: the temporary click log {} exists; remove it or choose another --out",
                log.display()
            ))
        }))?;
        let made = global_convert(comm, a, &log);
        let r = made.and_then(|_| global_predict(comm, a, &log));
        comm.barrier();
        if comm.rank() == 0 {
            let _ = std::fs::remove_file(&log);
        }
        return r;
    };
    global_predict(comm, a, data)
}

/// Rank-local: the flags every rank checks before any work.
fn local_check_args(a: &PredictArgs) -> Result<()> {
    if a.chunk == 0 {
        return Err(Error::Config("--chunk must be at least 1".into()));
    }
    if !a.input.is_empty() && a.format.is_none() {
        return Err(Error::Config(
            "--input needs --format (criteo, tsv: as `prepare clicks --format`)".into(),
        ));
    }
    check_output(&a.out, a.force)?;
    let mut inputs: Vec<(&str, &Path)> = vec![("--model", &a.model)];
    if let Some(d) = &a.data {
        inputs.push(("--data", d));
    }
    inputs.extend(a.input.iter().map(|p| ("--input", p.as_path())));
    check_apart(&a.out, &inputs)?;
    probe_writable(&a.out)
}

/// The temporary click log of `--input`: next to `--out`.
fn converted_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".input.h5");
    PathBuf::from(s)
}

/// `prepare clicks`' flags, parsed as its command line would be.
#[derive(Parser)]
struct PrepareLine {
    #[command(flatten)]
    a: PrepareClicksArgs,
}

/// Collective: every rank must call. `--input` through `prepare clicks` (its parser,
/// its formats) into the click log `log`.
fn global_convert<C: Comm>(comm: &C, a: &PredictArgs, log: &Path) -> Result<()> {
    let mut argv: Vec<std::ffi::OsString> = vec!["predict --input".into(), "--input".into()];
    argv.extend(a.input.iter().map(|p| p.as_os_str().to_owned()));
    argv.push("--out".into());
    argv.push(log.as_os_str().to_owned());
    if let Some(f) = &a.format {
        argv.push("--format".into());
        argv.push(f.into());
    }
    if let Some(c) = &a.columns {
        argv.push("--columns".into());
        argv.push(c.into());
    }
    let line = PrepareLine::try_parse_from(argv)
        .map_err(|e| Error::Config(format!("--input, --format, --columns: {e}")));
    let line = comm.agree(line)?;
    crate::app::clicks::global_prepare_clicks(comm, &line.a).map(|_| ())
}

/// Rank-local: the model's header, the click log and the id map, checked against
/// each other.
fn local_open(a: &PredictArgs, data: &Path) -> Result<(ModelHeader, ClickLog, IdMap)> {
    let h = local_read_header(&a.model)?;
    let log = ClickLog::open(data)?;
    local_check_data(&h.spec, &a.model, log.spec(), data)?;
    let ids = IdMap::new(log.spec(), &h.spec, log.keyed())?;
    Ok((h, log, ids))
}

/// Collective: every rank must call. Score every example of the click log `data`
/// and write `--out` (rank 0).
fn global_predict<C: Comm>(comm: &C, a: &PredictArgs, data: &Path) -> Result<()> {
    let (h, log, ids) = comm.agree(local_open(a, data))?;
    let all = log.examples();
    let n = match a.eval_examples {
        0 => all,
        k if k <= all => k,
        k => {
            return Err(Error::Config(format!(
                "--eval-examples {k}: {} has {all} examples",
                data.display()
            )))
        }
    };
    let source = Source::Log {
        log,
        eval: all - n..all,
        eval_day: None,
    };
    let mut tr = global_load(comm, &h, &a.model, source, ids, a.chunk)?;
    comm.barrier();
    let t = Instant::now();
    let scored = global_score(comm, &mut tr)?;
    let secs = f64::from_bits(comm.all_reduce_max(t.elapsed().as_secs_f64().to_bits()));
    let logits = comm.all_gather_v(&scored.logits)?.data;
    let labels = comm.all_gather_v(&scored.labels)?.data;
    let written = if comm.rank() == 0 {
        local_write_scores(&a.out, &logits, &labels)
    } else {
        Ok(())
    };
    comm.agree(written)?;
    if comm.rank() == 0 {
        let p = comm.size();
        let fmt = |v: Option<f64>| v.map_or("n/a".to_string(), |x| format!("{x:.6}"));
        println!(
            "predict: {} examples on {p} rank(s): AUC {}, log loss {}; {:.0} examples/s per rank (scoring {secs:.3} s) -> {}",
            crate::app::group(n),
            fmt(auc(&logits, &labels)),
            fmt(logloss(&logits, &labels)),
            n as f64 / secs.max(1e-9) / p as f64,
            a.out.display()
        );
    }
    Ok(())
}

/// Rank 0: the scores file, one line per example, `probability<TAB>label`, through
/// its temporary name (nothing at `out` until it is complete).
fn local_write_scores(out: &Path, logits: &[f32], labels: &[f32]) -> Result<()> {
    let tmp = temp_path(out);
    let write = || -> std::io::Result<()> {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        for (&z, &y) in logits.iter().zip(labels) {
            writeln!(w, "{:.9}\t{y}", probability(z))?;
        }
        w.into_inner().map_err(|e| e.into_error())?.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(&tmp, e));
    }
    commit(&tmp, out)
}
