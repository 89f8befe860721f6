//! Reading a user-item interaction file (TSV, CSV or Matrix Market) into
//! [`Interactions`]: one entry per line, ids interned in first-seen order (renumbered
//! later by [`super::filter`]), weights and times checked. Errors name the file and
//! line (exit 2).

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// The text layout (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextFormat {
    /// Fields separated by tabs or spaces.
    Tsv,
    /// Fields separated by commas.
    Csv,
    /// Matrix Market coordinate: `user item [weight]`, 1-based integers, a size line.
    Mtx,
}

/// What a column of the input holds (`--columns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    User,
    Item,
    Weight,
    Time,
    Skip,
}

/// Whether the first data line is a header (`--header`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// A header when a weight or time field of the first line is not a number.
    Auto,
    Yes,
    No,
}

/// `--columns`: comma-separated `user`, `item`, `weight`, `time`, `skip`; exactly one
/// user and one item, at most one weight and one time.
pub fn parse_columns(spec: &str) -> std::result::Result<Vec<Column>, String> {
    let cols: Vec<Column> = spec
        .split(',')
        .map(|s| match s.trim() {
            "user" => Ok(Column::User),
            "item" => Ok(Column::Item),
            "weight" => Ok(Column::Weight),
            "time" => Ok(Column::Time),
            "skip" => Ok(Column::Skip),
            o => Err(format!(
                "unknown column {o:?} (expected user, item, weight, time or skip)"
            )),
        })
        .collect::<std::result::Result<_, _>>()?;
    for (c, name, need) in [
        (Column::User, "user", true),
        (Column::Item, "item", true),
        (Column::Weight, "weight", false),
        (Column::Time, "time", false),
    ] {
        let n = cols.iter().filter(|&&x| x == c).count();
        if n > 1 || (need && n == 0) {
            return Err(format!(
                "--columns {spec:?} must name {} {name} column",
                if need { "exactly one" } else { "at most one" }
            ));
        }
    }
    Ok(cols)
}

/// Interns ids in first-seen order.
#[derive(Debug, Default, Clone)]
pub struct Interner {
    pub names: Vec<String>,
    index: HashMap<String, u32>,
}

impl Interner {
    pub fn id(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// Every line of the input, in file order (duplicates not yet summed).
#[derive(Debug, Default, Clone)]
pub struct Interactions {
    pub users: Interner,
    pub items: Interner,
    /// (user, item) in interned ids, one per line.
    pub pairs: Vec<(u32, u32)>,
    /// One per line (1 when there is no weight column).
    pub weights: Vec<f32>,
    /// One per line when there is a time column.
    pub times: Option<Vec<f64>>,
    /// Whether the input had a weight column.
    pub weighted: bool,
}

fn bad(path: &Path, line: usize, msg: impl std::fmt::Display) -> Error {
    Error::input(path, format!("line {line}: {msg}"))
}

fn number(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Read `path` (plain text; `.gz` is decompressed) as `format` with the given columns
/// (`None`: user, item, then optional weight and time by the first line's field count).
pub fn read_interactions(
    path: &Path,
    format: TextFormat,
    columns: Option<&[Column]>,
    header: Header,
) -> Result<Interactions> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    parse_text(BufReader::new(reader), path, format, columns, header)
}

/// The default columns for a line of `n` fields.
fn default_columns(n: usize) -> Option<Vec<Column>> {
    use Column::*;
    match n {
        2 => Some(vec![User, Item]),
        3 => Some(vec![User, Item, Weight]),
        4 => Some(vec![User, Item, Weight, Time]),
        _ => None,
    }
}

fn split_fields(line: &str, format: TextFormat) -> Vec<&str> {
    match format {
        TextFormat::Csv => line.split(',').map(str::trim).collect(),
        TextFormat::Tsv | TextFormat::Mtx => line.split_whitespace().collect(),
    }
}

/// [`read_interactions`] over any reader (`path` names it in errors).
pub fn parse_text(
    reader: impl BufRead,
    path: &Path,
    format: TextFormat,
    columns: Option<&[Column]>,
    header: Header,
) -> Result<Interactions> {
    let mut out = Interactions::default();
    let mut cols: Option<Vec<Column>> = columns.map(<[Column]>::to_vec);
    let mut first_data = true;
    let mut mtx_size_seen = format != TextFormat::Mtx;
    for (k, line) in reader.lines().enumerate() {
        let no = k + 1;
        let line = line.map_err(|e| bad(path, no, format!("read error: {e}")))?;
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with('%') {
            if format == TextFormat::Mtx && no == 1 && !t.starts_with("%%MatrixMarket") {
                return Err(bad(
                    path,
                    no,
                    "not a Matrix Market file (no %%MatrixMarket banner)",
                ));
            }
            continue;
        }
        if !mtx_size_seen {
            // The size line `rows cols nnz`: checked, the counts are not needed.
            let f = split_fields(t, format);
            if f.len() != 3 || f.iter().any(|x| x.parse::<u64>().is_err()) {
                return Err(bad(
                    path,
                    no,
                    format!("expected the size line `rows cols nnz`, found {t:?}"),
                ));
            }
            mtx_size_seen = true;
            continue;
        }
        let fields = split_fields(t, format);
        if cols.is_none() {
            cols = Some(default_columns(fields.len()).ok_or_else(|| {
                bad(
                    path,
                    no,
                    format!(
                        "{} fields; without --columns a line is user, item[, weight[, time]] (2 to 4 fields)",
                        fields.len()
                    ),
                )
            })?);
        }
        let spec = cols.as_deref().unwrap_or_default();
        if fields.len() != spec.len() {
            return Err(bad(
                path,
                no,
                format!(
                    "{} fields, expected {} ({spec:?})",
                    fields.len(),
                    spec.len()
                ),
            ));
        }
        if first_data {
            first_data = false;
            let is_header = match header {
                Header::Yes => true,
                Header::No => false,
                Header::Auto => spec.iter().zip(&fields).any(|(c, f)| {
                    matches!(c, Column::Weight | Column::Time) && number(f).is_none()
                }),
            };
            if is_header && format != TextFormat::Mtx {
                continue;
            }
        }
        push_line(&mut out, path, no, spec, &fields, format)?;
    }
    if out.pairs.is_empty() {
        return Err(Error::input(path, "no interactions (empty file)"));
    }
    Ok(out)
}

fn push_line(
    out: &mut Interactions,
    path: &Path,
    no: usize,
    spec: &[Column],
    fields: &[&str],
    format: TextFormat,
) -> Result<()> {
    let (mut u, mut i, mut w, mut tm) = (0u32, 0u32, 1f32, None);
    for (c, f) in spec.iter().zip(fields) {
        match c {
            Column::User | Column::Item => {
                if format == TextFormat::Mtx && !f.parse::<u64>().is_ok_and(|v| v >= 1) {
                    return Err(bad(path, no, format!("id {f:?} is not a 1-based integer")));
                }
                if *c == Column::User {
                    u = out.users.id(f);
                } else {
                    i = out.items.id(f);
                }
            }
            Column::Weight => {
                let v = number(f)
                    .ok_or_else(|| bad(path, no, format!("weight {f:?} is not a number")))?;
                if v < 0.0 {
                    return Err(bad(path, no, format!("negative weight {f}")));
                }
                if v > f32::MAX as f64 {
                    return Err(bad(path, no, format!("weight {f} is too large for f32")));
                }
                w = v as f32;
            }
            Column::Time => {
                tm = Some(
                    number(f)
                        .ok_or_else(|| bad(path, no, format!("time {f:?} is not a number")))?,
                );
            }
            Column::Skip => {}
        }
    }
    if out.pairs.len() as u64 >= u32::MAX as u64 {
        return Err(bad(path, no, "more than 2^32 - 1 interactions"));
    }
    out.weighted = spec.contains(&Column::Weight);
    out.pairs.push((u, i));
    out.weights.push(w);
    if let Some(t) = tm {
        out.times.get_or_insert_with(Vec::new).push(t);
    }
    Ok(())
}
