//! What `embed` trains, from its flags: the model (`--preset`/`--tables` or a click
//! log's, with `--vocab`, `--capacity`, `--admit-after`, `--evict` and `--dim`
//! applied to every table), where its examples come from, and how their ids become
//! the model's rows.

use std::path::Path;

use crate::cli::{EmbedArgs, ModelArgs, VocabArg};
use crate::data::clicks::gen::ClickGen;
use crate::data::clicks::log_file::ClickLog;
use crate::data::clicks::source::Source;
use crate::embed::tables::keys::IdMap;
use crate::spec::{preset, Evict, ModelSpec, VocabKind};
use crate::{Error, Result};

/// The model named by `--preset` or `--tables`.
pub fn resolve_model(m: &ModelArgs) -> Result<ModelSpec> {
    match (&m.preset, &m.tables) {
        (Some(p), None) => preset(p, m.scale),
        (None, Some(t)) => ModelSpec::from_toml_file(t),
        _ => Err(Error::Config(
            "give the model with --preset NAME or --tables T.toml".into(),
        )),
    }
}

/// The model to train, where its examples come from, and how their ids become the
/// model's rows: the click log's model (or `--tables`, which must match its tables
/// and dense features) or `--preset`/`--tables` for generated examples, with
/// `--vocab`, `--capacity`, `--admit-after`, `--evict` and `--dim` applied to every
/// table.
pub(super) fn model_and_source(a: &EmbedArgs) -> Result<(ModelSpec, Source, IdMap)> {
    let (data, mut model, source, keyed) = match &a.data {
        Some(p) => {
            let log = ClickLog::open(p)?;
            let data = log.spec().clone();
            let model = match &a.model.tables {
                Some(t) => match_log_tables(ModelSpec::from_toml_file(t)?, &data, t, p)?,
                None => data.clone(),
            };
            let n = log.examples();
            let eval = match a.eval_day {
                Some(k) => {
                    let days = log.days();
                    let d = days.len().saturating_sub(1);
                    if k >= d {
                        return Err(Error::Config(format!(
                            "--eval-day {k}: {} has {d} day(s), numbered from 0",
                            p.display()
                        )));
                    }
                    let eval = days[k]..days[k + 1];
                    if eval.is_empty() {
                        return Err(Error::Config(format!(
                            "--eval-day {k}: day {k} of {} has no examples",
                            p.display()
                        )));
                    }
                    if eval.end - eval.start == n {
                        return Err(Error::Config(format!(
                            "--eval-day {k}: {} has no other day to train on",
                            p.display()
                        )));
                    }
                    eval
                }
                None => {
                    if a.eval_examples >= n {
                        return Err(Error::Config(format!(
                            "{}: {n} examples, cannot hold out --eval-examples {}",
                            p.display(),
                            a.eval_examples
                        )));
                    }
                    n - a.eval_examples..n
                }
            };
            let keyed = log.keyed();
            let source = Source::Log {
                log,
                eval,
                eval_day: a.eval_day,
            };
            (data, model, source, keyed)
        }
        None => {
            let spec = resolve_model(&a.model)?;
            let g = ClickGen::with_planted(&spec, a.seed, a.planted);
            (spec.clone(), spec, Source::Generated(g), false)
        }
    };
    if let (Some(from), None) = (&a.init_from, &a.capacity) {
        inherit_capacities(&mut model, from)?;
    }
    override_tables(&mut model, a)?;
    if let Some(d) = a.table_dtype {
        model.table_dtype = d;
    }
    model.validate("the model")?;
    let ids = IdMap::new(&data, &model, keyed)?;
    Ok((model, source, ids))
}

/// `--tables` with `--data`: the model file's tables matched to the click log's
/// columns by name and put in the log's order (a model file in the log's order is
/// unchanged). Refused, naming both files (exit 2): a dense-feature count other than
/// the log's, a table the log does not have (a renamed one too), a table of the log
/// the model file leaves out.
fn match_log_tables(
    mut model: ModelSpec,
    data: &ModelSpec,
    toml: &Path,
    log: &Path,
) -> Result<ModelSpec> {
    let log_name = crate::error::short_path(log);
    let data_names: Vec<&str> = data.tables.iter().map(|t| t.name.as_str()).collect();
    if model.n_dense != data.n_dense {
        return Err(Error::input(
            toml,
            format!(
                "n_dense = {}, but the click log {log_name} (--data) has {} dense features",
                model.n_dense, data.n_dense
            ),
        ));
    }
    let position = |name: &str| data.tables.iter().position(|t| t.name == name);
    if let Some(t) = model.tables.iter().find(|t| position(&t.name).is_none()) {
        return Err(Error::input(
            toml,
            format!(
                "table {} is not a table of the click log {log_name} (--data); its tables are {} (tables are matched to the log's columns by name)",
                crate::error::quote(&t.name),
                name_list(&data_names)
            ),
        ));
    }
    let missing: Vec<&str> = data_names
        .iter()
        .copied()
        .filter(|d| !model.tables.iter().any(|t| t.name == *d))
        .collect();
    if !missing.is_empty() {
        return Err(Error::input(
            toml,
            format!(
                "{} table(s), but the click log {log_name} (--data) has {}: no table for its column(s) {} (give every table of the log)",
                model.tables.len(),
                data.tables.len(),
                name_list(&missing)
            ),
        ));
    }
    // Every name is the log's and none is missing (names are unique): a permutation.
    model
        .tables
        .sort_by_key(|t| position(&t.name).unwrap_or(usize::MAX));
    Ok(model)
}

/// Table names for a message, quoted: the first eight, then how many in all.
fn name_list(names: &[&str]) -> String {
    const SHOW: usize = 8;
    let mut s = names
        .iter()
        .take(SHOW)
        .map(|n| crate::error::quote(n))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOW {
        s.push_str(&format!(", ... ({} in all)", names.len()));
    }
    s
}

/// A warm start without `--capacity`: each hash table keeps the capacity it had in
/// the checkpoint (a log's own default, its distinct keys, would otherwise shrink a
/// table trained on a longer history).
fn inherit_capacities(model: &mut ModelSpec, from: &Path) -> Result<()> {
    let path = crate::embed::io::checkpoint::init_from_path(from)?;
    let Some(theirs) = crate::embed::io::checkpoint::local_read_spec(&path)? else {
        return Ok(());
    };
    for (m, t) in model.tables.iter_mut().zip(&theirs.tables) {
        if m.vocab_kind == VocabKind::Hash && t.vocab_kind == VocabKind::Hash && m.name == t.name {
            m.vocab = t.vocab;
        }
    }
    Ok(())
}

/// `--vocab`, `--capacity`, `--admit-after`, `--evict` and `--dim` on every table;
/// each refused where it would not act.
fn override_tables(model: &mut ModelSpec, a: &EmbedArgs) -> Result<()> {
    if let Some(v) = a.vocab {
        let kind = match v {
            VocabArg::Fixed => VocabKind::Fixed,
            VocabArg::Modulo => VocabKind::Modulo,
            VocabArg::Hash => VocabKind::Hash,
        };
        for t in &mut model.tables {
            if kind != VocabKind::Hash {
                t.admit_after = 1;
                t.evict = Evict::Lfu;
            }
            t.vocab_kind = kind;
        }
    }
    let kinds = |k: VocabKind| model.tables.iter().filter(|t| t.vocab_kind == k).count();
    let (hashed, modulo) = (kinds(VocabKind::Hash), kinds(VocabKind::Modulo));
    if let Some(c) = &a.capacity {
        if hashed + modulo == 0 {
            return Err(Error::Config(
                "--capacity sets the rows of modulo and hash tables; the model has none (give --vocab hash or modulo)".into(),
            ));
        }
        let bad = || {
            Error::Config(format!(
                "--capacity {}: give rows (e.g. 1000000) or a factor of each table's vocab (e.g. 1.1x)",
                crate::error::quote(c)
            ))
        };
        let rows = |vocab: u64| -> Result<u64> {
            match c.strip_suffix('x') {
                Some(f) => {
                    let f: f64 = f.parse().map_err(|_| bad())?;
                    if !(f.is_finite() && f > 0.0) {
                        return Err(bad());
                    }
                    Ok((vocab as f64 * f).ceil() as u64)
                }
                None => c.parse().map_err(|_| bad()),
            }
        };
        for t in &mut model.tables {
            if t.vocab_kind != VocabKind::Fixed {
                t.vocab = rows(t.vocab)?;
            }
        }
    }
    if hashed == 0 && (a.admit_after.is_some() || a.evict.is_some()) {
        return Err(Error::Config(
            "--admit-after and --evict act on hash tables; the model has none (give --vocab hash)"
                .into(),
        ));
    }
    let evict = a
        .evict
        .as_deref()
        .map(Evict::parse)
        .transpose()
        .map_err(|e| Error::Config(format!("--evict: {e}")))?;
    for t in &mut model.tables {
        if t.vocab_kind == VocabKind::Hash {
            if let Some(n) = a.admit_after {
                t.admit_after = n;
            }
            if let Some(e) = evict {
                t.evict = e;
            }
        }
        if let Some(d) = a.dim {
            t.dim = d;
        }
    }
    override_arch(model, &a.arch)
}

/// `--arch` and its widths over the TOML's `arch` (checked by `validate` after).
fn override_arch(model: &mut ModelSpec, a: &crate::cli::ArchArgs) -> Result<()> {
    use crate::cli::{ArchArg, DcnStructureArg};
    use crate::spec::{ArchKind, DcnStructure};
    let widths = |flag: &str, v: &str| -> Result<Vec<usize>> {
        if v.trim().is_empty() {
            return Ok(Vec::new());
        }
        v.split(',')
            .map(|w| match w.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(Error::Config(format!(
                    "{flag} {v:?}: widths are whole numbers >= 1, comma-separated"
                ))),
            })
            .collect()
    };
    let arch = &mut model.arch;
    if let Some(k) = a.arch {
        let kind = match k {
            ArchArg::Mlp => ArchKind::Mlp,
            ArchArg::Dlrm => ArchKind::Dlrm,
            ArchArg::Dcnv2 => ArchKind::Dcnv2,
        };
        if kind != arch.kind {
            // Another kind than the TOML's: its widths do not carry over.
            **arch = crate::spec::ArchSpec {
                kind,
                ..Default::default()
            };
        }
    }
    if let Some(v) = &a.bottom_mlp {
        arch.bottom_mlp = Some(widths("--bottom-mlp", v)?);
    }
    if let Some(v) = &a.top_mlp {
        arch.top_mlp = Some(widths("--top-mlp", v)?);
    }
    if a.cross_layers.is_some() {
        arch.cross_layers = a.cross_layers;
    }
    if a.cross_rank.is_some() {
        arch.cross_rank = a.cross_rank;
    }
    if let Some(s) = a.dcn_structure {
        arch.dcn_structure = Some(match s {
            DcnStructureArg::Stacked => DcnStructure::Stacked,
            DcnStructureArg::Parallel => DcnStructure::Parallel,
        });
    }
    Ok(())
}
