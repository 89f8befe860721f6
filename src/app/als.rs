//! `torusrec als`: training with people-facing progress and machine-readable metrics.

use super::output::RunOutput;
use crate::als::defaults::MatrixKind;
use crate::als::eval::{EvalRows, KList, Ranking};
use crate::als::train::report::{EpochReport, TrainReport};
use crate::als::train::run::{global_train_as, TrainEvent};
use crate::bf16::{Bf16, TableDtype};
use crate::ckpt::signals::Preemption;
use crate::cli::AlsArgs;
use crate::comm::Comm;
use crate::error::Result;
use crate::metrics::{group, human_bytes, peak_rss_bytes};

use crate::node::resolve_threads;

/// What the epoch and final lines say instead of a recall when an evaluation scored
/// no row (a dataset without test rows): its 0 is no measurement.
pub(super) const NOTHING_TO_SCORE: &str = "no test rows to score";

/// Whether an evaluation scored no row.
pub(super) fn nothing_scored(r: &crate::als::eval::Recall) -> bool {
    r.test_rows == 0
}

fn epoch_line(r: &EpochReport, epochs: usize) -> String {
    let recall = match r.recall {
        Some(x) if nothing_scored(&x) => format!("  {NOTHING_TO_SCORE}"),
        Some(x) => format!("  R@20 {:.4}  R@50 {:.4}", x.at20, x.at50),
        None => String::new(),
    };
    let eval = if r.recall.is_some_and(|x| !nothing_scored(&x)) {
        let share = crate::als::eval::AUTO_EPOCH_SHARE * 100.0;
        let how = match r.eval_auto {
            Some(a) if a.epoch_seconds.is_none() => ", auto: no epoch timed".to_string(),
            Some(a) if a.first && a.probe_rows > 0 => format!(
                ", auto: <= {share:.0}% of epoch, from {} rows in {:.2} s",
                group(a.probe_rows),
                a.probe_seconds
            ),
            Some(a) if a.rows == a.available => ", auto: all".to_string(),
            Some(_) => format!(", auto: <= {share:.0}% of epoch"),
            None => String::new(),
        };
        format!(
            "  eval {:.2} s ({} rows{how}, {:.1} GFLOP/s)",
            r.eval_seconds,
            group(r.eval_rows),
            r.eval_flops_per_second / 1e9
        )
    } else {
        String::new()
    };
    let read = if r.read_bytes > 0 {
        format!("  read {}", human_bytes(r.read_bytes))
    } else {
        String::new()
    };
    format!(
        "epoch {:>3}/{epochs}  loss {:.6e}{recall}  {:.2} s  {:.2}M edges/s  exchanged {}{read}{eval}",
        r.epoch,
        r.loss,
        r.seconds,
        r.edges_per_second / 1e6,
        human_bytes(r.exchange_bytes)
    )
}

/// `--eval-rows` for the first line, with the rows it scores of the dataset's test
/// rows when the file tells (an unreadable file is reported when it is read).
fn eval_rows_desc(data: &std::path::Path, which: EvalRows) -> String {
    let tests = crate::io::h5::open(data)
        .ok()
        .and_then(|f| crate::io::h5::dataset_len(&f, data, "test/rows").ok());
    match (which, tests) {
        (EvalRows::Sample(n), Some(t)) => {
            format!("{n} ({} of {} test rows)", group(n.min(t)), group(t))
        }
        (EvalRows::All, Some(t)) => format!("all ({} test rows)", group(t)),
        (w, _) => w.to_string(),
    }
}

/// The kind of matrix `data` holds (its root attribute `matrix`), which picks the
/// defaults of `--reg` and `--unobserved-weight`. A file that cannot be read counts as
/// a link graph here: training opens it next and reports what is wrong with it.
/// Collective, so every rank picks the same defaults.
fn global_matrix_kind<C: Comm>(comm: &C, data: &std::path::Path) -> MatrixKind {
    let user_item = crate::io::h5::open(data)
        .ok()
        .and_then(|f| crate::io::h5::read_str_attr(&f, data, "matrix").ok())
        .is_some_and(|m| m == "user-item");
    if comm.all_reduce_max(u64::from(user_item)) == 1 {
        MatrixKind::UserItem
    } else {
        MatrixKind::LinkGraph
    }
}

/// Collective: every rank must call.
/// `preempt` is installed by `main` before MPI starts, so an early signal is not lost.
pub fn global_run<C: Comm>(comm: &C, args: &AlsArgs, preempt: Preemption) -> Result<TrainReport> {
    comm.agree(args.check_solver_flags())?;
    let kind = global_matrix_kind(comm, &args.data);
    let cfg = args.to_config(kind);
    let defaulted = if args.reg.is_none() || args.unobserved_weight.is_none() {
        format!(" ({} defaults)", kind.name())
    } else {
        String::new()
    };
    let threads = resolve_threads(args.threads);
    comm.agree(crate::node::install_threads(threads))?;
    let root = comm.rank() == 0;
    let mut out = RunOutput::global_open(comm, cfg.metrics.as_deref())?;
    if root {
        println!(
            "als: {} d={} tables={} epochs={} reg={} alpha0={}{defaulted}{} solver={:?} cg_steps={} exchange={:?} eval_rows={} on {} rank(s) (torus {}) x {threads} thread(s)",
            cfg.data.display(),
            cfg.dim,
            cfg.table_dtype,
            cfg.epochs,
            cfg.reg,
            cfg.unobserved_weight,
            if cfg.confidence.weighted() {
                format!(" confidence={}", cfg.confidence)
            } else {
                String::new()
            },
            cfg.solver,
            cfg.cg_steps,
            cfg.exchange,
            eval_rows_desc(&cfg.data, cfg.eval_rows),
            comm.size(),
            comm.torus().shape()
        );
    }
    let epochs = cfg.epochs;
    let on_event = |e: TrainEvent| match e {
        TrainEvent::Resumed {
            path,
            manifest,
            steps_per_half,
            seconds,
        } => log_resumed(root, path, manifest, steps_per_half, seconds),
        TrainEvent::Epoch(r) => {
            out.line(&epoch_line(r, epochs));
            out.record(r);
            if r.epoch < epochs {
                out.progress(r.epoch as u64, epochs as u64);
            }
        }
    };
    let (meta, report, ranking) = match cfg.table_dtype {
        TableDtype::F32 => {
            let (tr, rep) = global_train_as::<C, f32>(comm, &cfg, preempt, on_event)?;
            (tr.shards.meta.clone(), rep, tr.last_ranking())
        }
        TableDtype::Bf16 => {
            let (tr, rep) = global_train_as::<C, Bf16>(comm, &cfg, preempt, on_event)?;
            (tr.shards.meta.clone(), rep, tr.last_ranking())
        }
    };
    let peak = comm.all_reduce_max(peak_rss_bytes().unwrap_or(0));
    if root {
        println!(
            "shards: {} rows, {} cols; nnz imbalance rows {:.3}, cols {:.3}; peak RSS {} per rank",
            meta.num_rows,
            meta.num_cols,
            report.row_imbalance,
            report.col_imbalance,
            human_bytes(peak)
        );
        let r = report.recall.expect("the last epoch evaluates");
        if nothing_scored(&r) {
            println!(
                "final: {NOTHING_TO_SCORE} (no Recall@20/50)  loss {:.6e}  checksum {:016x}",
                report.loss, report.checksum
            );
        } else {
            println!(
                "final: Recall@20 {:.4}  Recall@50 {:.4}  over {} test rows  loss {:.6e}  checksum {:016x}{}",
                r.at20, r.at50, r.test_rows, report.loss, report.checksum,
                ranking.map_or(String::new(), |x| ranking_words(&x, &args.k))
            );
        }
        {
            let mut v = serde_json::json!({"final": true, "recall_at_20": r.at20, "recall_at_50": r.at50, "eval_rows": r.test_rows, "loss": report.loss,
                "checksum": format!("{:016x}", report.checksum), "peak_rss_bytes": peak, "ranks": comm.size(), "threads": threads});
            if let (Some(x), Some(obj)) = (ranking, v.as_object_mut()) {
                add_ranking_keys(obj, &x, &args.k);
            }
            out.record(&v);
        }
    }
    Ok(report)
}

/// The `final:` line's ranking metrics at each `--k` (Recall@20/50 are already on it).
fn ranking_words(x: &Ranking, ks: &KList) -> String {
    let mut s = String::new();
    for a in ks.0.iter().filter_map(|&k| x.at(k)) {
        if a.k != 20 && a.k != 50 {
            s += &format!("  Recall@{} {:.4}", a.k, a.recall);
        }
        s += &format!(
            "  Precision@{k} {:.4}  MAP@{k} {:.4}  NDCG@{k} {:.4}",
            a.precision,
            a.map,
            a.ndcg,
            k = a.k
        );
    }
    s
}

/// The final record's keys `precision_at_K`, `map_at_K`, `ndcg_at_K` and
/// `recall_at_K` for each `--k` (`recall_at_20`/`_50` are kept as they are), and
/// `ranking_k` (the list).
fn add_ranking_keys(obj: &mut serde_json::Map<String, serde_json::Value>, x: &Ranking, ks: &KList) {
    for a in ks.0.iter().filter_map(|&k| x.at(k)) {
        let k = a.k;
        obj.entry(format!("recall_at_{k}"))
            .or_insert(a.recall.into());
        obj.insert(format!("precision_at_{k}"), a.precision.into());
        obj.insert(format!("map_at_{k}"), a.map.into());
        obj.insert(format!("ndcg_at_{k}"), a.ndcg.into());
    }
    obj.insert("ranking_k".into(), ks.0.clone().into());
}

/// Rank 0 logs where a run resumed: the checkpoint, its position and the read rate.
pub(super) fn log_resumed(
    root: bool,
    path: &std::path::Path,
    manifest: &crate::als::checkpoint::Manifest,
    steps_per_half: usize,
    seconds: f64,
) {
    if !root {
        return;
    }
    let mb = std::fs::metadata(path).map_or(0, |m| m.len()) as f64 / 1e6;
    log::info!(
        "resumed from {} (written by {} rank(s)): epoch {}, half {}, step {}/{}; read and verified {:.1} MB in {:.3} s, {:.0} MB/s",
        path.display(),
        manifest.world_size,
        manifest.position.epoch,
        manifest.position.half,
        manifest.position.step,
        steps_per_half,
        mb,
        seconds,
        mb / seconds.max(1e-9)
    );
}

#[cfg(test)]
mod tests {
    use crate::metrics::group;

    /// The epoch line's row counts are grouped by thousands.
    #[test]
    fn grouped_digits() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1234567), "1,234,567");
    }
}
