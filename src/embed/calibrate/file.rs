//! The costs file: a calibration as JSON ([`Costs::to_json`]) and read back with
//! every field checked ([`Costs::from_file`]), by parts: the conditions, each kind of
//! point, and the fit (checked, then recomputed from the points).

use std::path::Path;

use serde_json::Value;

use super::fit::fit;
use super::json::{Obj, R};
use super::points::{
    CollPoint, Conditions, Costs, Fit, KernelPoint, MlpPoint, PooledPoint, POOLED_MODES,
    POOLED_PLACEMENTS, SCHEMA,
};
use crate::error::{Error, Result};

impl Costs {
    /// The calibration in file `path`, every field checked (see the module doc); the
    /// fit recomputed from the points.
    pub fn from_file(path: &Path) -> Result<Costs> {
        let text = crate::error::read_text(path)?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Error::input(path, format!("not a costs file (JSON): {e}")))?;
        let mut c = parse(&v).map_err(|msg| Error::input(path, msg))?;
        c.fit = fit(&c);
        c.fit
            .model
            .check()
            .map_err(|msg| Error::input(path, format!("the fit of the points: {msg}")))?;
        Ok(c)
    }

    /// JSON text of the calibration.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).map_err(|e| Error::Config(format!("costs: {e}")))
    }
}

/// The calibration of JSON value `v`, every field checked; the fit recomputed from
/// the points.
pub(super) fn parse(v: &Value) -> R<Costs> {
    let top = Obj::of(v, "")?;
    top.only(&[
        "schema",
        "conditions",
        "gather",
        "scatter",
        "mlp",
        "all_to_all",
        "all_reduce",
        "pooled",
        "fit",
    ])?;
    let schema = top.string("schema")?;
    if schema != SCHEMA {
        return Err(format!("schema {schema:?}: must be {SCHEMA:?}"));
    }
    let conditions = conditions(&Obj::of(top.get("conditions")?, "conditions")?)?;
    let gather = kernel_points(&top, "gather")?;
    let scatter = kernel_points(&top, "scatter")?;
    let mlp = mlp_points(&top)?;
    let all_to_all = coll_points(&top, "all_to_all")?;
    let all_reduce = coll_points(&top, "all_reduce")?;
    // Optional: files written before the pooled steps were measured have none.
    let pooled = match top.map.get("pooled") {
        None => Vec::new(),
        Some(_) => top
            .objs("pooled")?
            .iter()
            .map(pooled_point)
            .collect::<R<Vec<_>>>()?,
    };
    check_fit(&Obj::of(top.get("fit")?, "fit")?)?;
    let mut out = Costs {
        schema,
        conditions,
        gather,
        scatter,
        mlp,
        all_to_all,
        all_reduce,
        pooled,
        fit: Fit::unfitted(),
    };
    if !out
        .gather
        .iter()
        .any(|p| p.tables == 1 && p.dist == "uniform")
    {
        return Err("gather: needs a uniform single-table point".into());
    }
    out.fit = fit(&out);
    Ok(out)
}

/// The conditions (object `c`).
fn conditions(c: &Obj) -> R<Conditions> {
    c.only(&[
        "ranks",
        "torus",
        "threads",
        "cpu",
        "avx512",
        "avx2",
        "commit",
        "quick",
        "reps",
        "table_bytes",
    ])?;
    Ok(Conditions {
        ranks: c.usize("ranks", 1)?,
        torus: c.string("torus")?,
        threads: c.usize("threads", 1)?,
        cpu: c.string("cpu")?,
        avx512: c.bool("avx512")?,
        avx2: c.bool("avx2")?,
        commit: c.string("commit")?,
        quick: c.bool("quick")?,
        reps: c.usize("reps", 1)?,
        table_bytes: c.int("table_bytes", 4)?,
    })
}

/// The kernel points of field `k` of `top`.
fn kernel_points(top: &Obj, k: &str) -> R<Vec<KernelPoint>> {
    top.objs(k)?
        .iter()
        .map(|o| {
            o.only(&["dim", "pooling", "dist", "tables", "rows", "ids", "seconds"])?;
            let dist = o.string("dist")?;
            if dist != "uniform" && dist != "zipf" {
                return Err(format!(
                    "{} {dist:?}: must be uniform or zipf",
                    o.at("dist")
                ));
            }
            Ok(KernelPoint {
                dim: o.usize("dim", 1)?,
                pooling: o.usize("pooling", 1)?,
                dist,
                tables: o.usize("tables", 1)?,
                rows: o.int("rows", 1)?,
                ids: o.int("ids", 1)?,
                seconds: o.num("seconds", true)?,
            })
        })
        .collect()
}

/// The MLP points.
fn mlp_points(top: &Obj) -> R<Vec<MlpPoint>> {
    top.objs("mlp")?
        .iter()
        .map(|o| {
            o.only(&["layers", "batch", "seconds"])?;
            let layers: Vec<usize> = o
                .get("layers")?
                .as_array()
                .filter(|a| a.len() >= 2)
                .and_then(|a| {
                    a.iter()
                        .map(|x| x.as_u64().filter(|&n| n >= 1).map(|n| n as usize))
                        .collect()
                })
                .ok_or_else(|| format!("{}: must be at least two widths >= 1", o.at("layers")))?;
            Ok(MlpPoint {
                layers,
                batch: o.usize("batch", 1)?,
                seconds: o.num("seconds", true)?,
            })
        })
        .collect()
}

/// The collective points of field `k` of `top`.
fn coll_points(top: &Obj, k: &str) -> R<Vec<CollPoint>> {
    top.objs(k)?
        .iter()
        .map(|o| {
            o.only(&["bytes", "seconds"])?;
            Ok(CollPoint {
                bytes: o.int("bytes", 1)?,
                seconds: o.num("seconds", true)?,
            })
        })
        .collect()
}

/// One pooled point (object `o`): its placement and mode known, its pieces possible.
fn pooled_point(o: &Obj) -> R<PooledPoint> {
    o.only(&[
        "dim",
        "pooling",
        "tables",
        "rows",
        "batch",
        "placement",
        "pieces",
        "mode",
        "seconds",
    ])?;
    let placement = o.string("placement")?;
    let mode = match o.map.get("mode") {
        None => "pooled".to_string(),
        Some(_) => o.string("mode")?,
    };
    if !POOLED_MODES.contains(&mode.as_str()) {
        return Err(format!(
            "{} {mode:?}: must be one of {}",
            o.at("mode"),
            POOLED_MODES.join(", ")
        ));
    }
    if !POOLED_PLACEMENTS.contains(&placement.as_str()) {
        return Err(format!(
            "{} {placement:?}: must be one of {}",
            o.at("placement"),
            POOLED_PLACEMENTS.join(", ")
        ));
    }
    let q = PooledPoint {
        dim: o.usize("dim", 1)?,
        pooling: o.usize("pooling", 1)?,
        tables: o.usize("tables", 1)?,
        rows: o.int("rows", 1)?,
        batch: o.usize("batch", 1)?,
        placement,
        pieces: o.usize("pieces", 1)?,
        mode,
        seconds: o.num("seconds", true)?,
    };
    if q.placement == "column" && (q.pieces > q.dim || !q.dim.is_multiple_of(q.pieces)) {
        return Err(format!(
            "{} {}: must divide dim {}",
            o.at("pieces"),
            q.pieces,
            q.dim
        ));
    }
    if q.placement != "table" && q.pieces as u64 > q.rows {
        return Err(format!(
            "{} {}: more than the rows",
            o.at("pieces"),
            q.pieces
        ));
    }
    Ok(q)
}

/// The fit (object `f`): every field checked, none kept (the fit is recomputed from
/// the points).
fn check_fit(f: &Obj) -> R<()> {
    f.only(&[
        "model",
        "all_to_all_latency_s",
        "all_reduce_latency_s",
        "mlp_flops",
        "zipf_ratio",
        "together_ratio",
        "kernel_interference",
    ])?;
    // Optional: files from before the together points have none.
    if f.map.contains_key("kernel_interference") {
        f.num("kernel_interference", false)?;
    }
    let m = Obj::of(f.get("model")?, "fit.model")?;
    m.only(&[
        "net_bw",
        "allreduce_bw",
        "mem_bw",
        "lookup_s",
        "shard_s",
        "line_bytes",
        "interference",
        "interference_count",
        "interference_rows",
        "ask_row_access",
        "width_factor",
        "size_factor",
        "pooled_measured",
        "pooled_occ_s",
        "pooled_occ_float_s",
        "pooled_example_s",
        "pooled_size_factor",
        "ask_zipf_factor",
        "ask_measured",
        "ask_occ_s",
        "ask_occ_float_s",
        "ask_example_s",
        "rows_size_factor",
    ])?;
    for k in ["net_bw", "allreduce_bw", "mem_bw", "line_bytes"] {
        m.num(k, true)?;
    }
    for k in ["lookup_s", "shard_s", "interference"] {
        m.num(k, false)?;
    }
    // Optional: files from before the `rows` mode's own interference have none.
    if m.map.contains_key("interference_rows") {
        m.num("interference_rows", false)?;
    }
    m.get("width_factor")?
        .as_array()
        .ok_or_else(|| format!("{}: must be an array", m.at("width_factor")))?;
    f.num("all_to_all_latency_s", false)?;
    f.num("all_reduce_latency_s", false)?;
    f.num("mlp_flops", true)?;
    f.get("zipf_ratio")?
        .as_array()
        .ok_or_else(|| format!("{}: must be an array", f.at("zipf_ratio")))?;
    Ok(())
}
