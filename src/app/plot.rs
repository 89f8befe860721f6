//! `torusrec plot`: the subcommand's glue around [`crate::plot`]: which rows and
//! columns of a table its flags chart ([`table_chart`]), the output's checks, and the
//! SVG written atomically.

use crate::cli::{ChartKind, PlotArgs};
use crate::error::{quote, Error, Result};
use crate::plot::*;
use std::path::Path;

/// The column indices of a table chart's `--x`, `--y` and `--series`, and its
/// `--where` filters (column, value).
#[allow(clippy::type_complexity)]
fn chart_columns(
    table: &Table,
    args: &PlotArgs,
) -> Result<(usize, usize, Option<usize>, Vec<(usize, String)>)> {
    let col = |flag: &str, name: &str| -> Result<usize> {
        table.header.iter().position(|h| h == name).ok_or_else(|| {
            Error::Config(format!(
                "{flag} {}: no such column in {} (columns: {})",
                quote(name),
                crate::error::short_path(&table.path),
                table.header.join(", ")
            ))
        })
    };
    let need = |flag: &str, v: &Option<String>| -> Result<usize> {
        let name = v
            .as_deref()
            .ok_or_else(|| Error::Config(format!("--table needs {flag} COL")))?;
        col(flag, name)
    };
    let xi = need("--x", &args.x)?;
    let yi = need("--y", &args.y)?;
    let si = args
        .series
        .as_ref()
        .map(|s| col("--series", s))
        .transpose()?;
    let mut filters = Vec::new();
    for f in &args.filter {
        let (c, v) = f
            .split_once('=')
            .ok_or_else(|| Error::Config(format!("--where {}: expected COL=VALUE", quote(f))))?;
        filters.push((col("--where", c)?, v.to_string()));
    }
    Ok((xi, yi, si, filters))
}

/// The (x cell, series, y) of the rows a table chart keeps, in file order: those that
/// pass the filters, with both cells present and a finite y (positive with
/// `--log-y`); an error when a y cell is not a number or no row is left.
fn kept_rows(
    table: &Table,
    args: &PlotArgs,
    [xi, yi]: [usize; 2],
    si: Option<usize>,
    filters: &[(usize, String)],
) -> Result<Vec<(String, String, f64)>> {
    // (x cell, series, y) of the kept rows, in file order.
    let mut kept: Vec<(String, String, f64)> = Vec::new();
    for (line, cells) in &table.rows {
        if filters.iter().any(|(c, v)| cells[*c] != *v) {
            continue;
        }
        let ycell = &cells[yi];
        if missing(ycell) || missing(&cells[xi]) {
            continue;
        }
        let y: f64 = ycell.parse().map_err(|_| Error::Parse {
            path: table.path.clone(),
            line: *line,
            msg: format!(
                "column {}: {} is not a number",
                table.header[yi],
                quote(ycell)
            ),
        })?;
        if !y.is_finite() || (args.log_y && y <= 0.0) {
            continue;
        }
        let series = si.map(|s| cells[s].clone()).unwrap_or_default();
        kept.push((cells[xi].clone(), series, y));
    }
    if kept.is_empty() {
        return Err(Error::input(
            &table.path,
            format!(
                "no rows to plot (column {}{})",
                table.header[yi],
                if filters.is_empty() {
                    String::new()
                } else {
                    format!(", --where {}", args.filter.join(" --where "))
                }
            ),
        ));
    }
    Ok(kept)
}

/// Chooses the rows and columns of a table chart. Errors (exit 2): an unknown column
/// (the known ones listed), a malformed --where, a y cell that is not a number (file
/// and line named), a line chart of a non-numeric x, nothing left to plot.
pub fn table_chart(table: &Table, args: &PlotArgs) -> Result<TableChart> {
    let (xi, yi, si, filters) = chart_columns(table, args)?;
    let kept = kept_rows(table, args, [xi, yi], si, &filters)?;
    let numeric_x = kept
        .iter()
        .all(|(x, _, _)| x.parse::<f64>().is_ok_and(f64::is_finite));
    let line = match args.kind {
        ChartKind::Line if !numeric_x => {
            return Err(Error::Config(format!(
                "--kind line needs numbers in column {} of {}",
                table.header[xi],
                crate::error::short_path(&table.path)
            )))
        }
        ChartKind::Line => true,
        ChartKind::Bar => false,
        ChartKind::Auto => numeric_x,
    };
    let mut labels: Vec<String> = Vec::new();
    for (_, s, _) in &kept {
        if !labels.contains(s) {
            labels.push(s.clone());
        }
    }
    let label_of = |s: &str| {
        if s.is_empty() {
            table.header[yi].clone()
        } else {
            s.to_string()
        }
    };
    let x_desc = table.header[xi].clone();
    let y_desc = args
        .ylabel
        .clone()
        .unwrap_or_else(|| table.header[yi].clone());
    let title = args
        .title
        .clone()
        .unwrap_or_else(|| format!("{y_desc} by {x_desc}"));
    if line {
        let series = labels
            .iter()
            .map(|l| {
                let mut pts: Vec<(f64, f64)> = kept
                    .iter()
                    .filter(|(_, s, _)| s == l)
                    .filter_map(|(x, _, y)| Some((x.parse::<f64>().ok()?, *y)))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    label: label_of(l),
                    points: thin(&pts, MAX_POINTS),
                }
            })
            .collect();
        return Ok(TableChart::Lines(Panel {
            title,
            x_desc,
            y_desc,
            series,
        }));
    }
    let mut groups: Vec<String> = Vec::new();
    for (x, _, _) in &kept {
        if !groups.contains(x) {
            groups.push(x.clone());
        }
    }
    let series = labels
        .iter()
        .map(|l| {
            let values = groups
                .iter()
                .map(|g| {
                    kept.iter()
                        .rev()
                        .find(|(x, s, _)| x == g && s == l)
                        .map(|r| r.2)
                })
                .collect();
            (label_of(l), values)
        })
        .collect();
    Ok(TableChart::Bars(Bars {
        title,
        x_desc,
        y_desc,
        groups,
        series,
    }))
}

/// Checks --out before any work: an .svg path, not existing unless --force.
fn check_out(args: &PlotArgs) -> Result<()> {
    let ext = args
        .out
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext.as_deref() {
        Some("svg") => {}
        Some("png") => {
            return Err(Error::Config(format!(
                "--out {}: PNG is not built in (plotters' bitmap backend needs system fonts); \
                 write .svg and convert it (rsvg-convert, a browser)",
                crate::error::short_path(&args.out)
            )))
        }
        _ => {
            return Err(Error::Config(format!(
                "--out {}: expected a .svg file",
                crate::error::short_path(&args.out)
            )))
        }
    }
    if args.out.exists() && !args.force {
        return Err(Error::OutputExists(args.out.clone()));
    }
    if !(16..=20_000).contains(&args.width) || !(16..=20_000).contains(&args.height) {
        return Err(Error::Config(format!(
            "--width {} --height {}: expected 16..20000 pixels",
            args.width, args.height
        )));
    }
    Ok(())
}

/// Writes `text` to `out` durably, through a temporary name and a rename
/// ([`crate::io::outfile::write`]), so that a reader never sees half a picture.
pub fn write_atomic(out: &Path, text: &str) -> Result<()> {
    crate::io::outfile::write(out, text.as_bytes())
}

/// The SVG that `args` asks for (no file written).
pub fn render(args: &PlotArgs) -> Result<String> {
    if let Some(table) = &args.table {
        let t = load_table(table)?;
        return match table_chart(&t, args)? {
            TableChart::Lines(p) => {
                render_panels(&[p], None, args.width, args.height, args.log_y, &args.out)
            }
            TableChart::Bars(b) => render_bars(&b, args.width, args.height, args.log_y, &args.out),
        };
    }
    if args.runs.is_empty() {
        return Err(Error::Config(
            "plot: give metrics files (RUN.jsonl...) or --table T.tsv".into(),
        ));
    }
    if !args.label.is_empty() && args.label.len() != args.runs.len() {
        return Err(Error::Config(format!(
            "--label given {} times for {} run files",
            args.label.len(),
            args.runs.len()
        )));
    }
    let runs = args
        .runs
        .iter()
        .map(|p| load_run(p))
        .collect::<Result<Vec<_>>>()?;
    let first = &runs[0];
    if let Some(other) = runs.iter().find(|r| r.kind != first.kind) {
        return Err(Error::Parse {
            path: other.path.clone(),
            line: other.first_line,
            msg: format!(
                "{} metrics, but {} holds {} metrics: plot one kind at a time",
                other.kind.name(),
                crate::error::short_path(&first.path),
                first.kind.name()
            ),
        });
    }
    let labels: Vec<String> = if args.label.is_empty() {
        runs.iter()
            .map(|r| {
                r.path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| r.path.to_string_lossy().into_owned())
            })
            .collect()
    } else {
        args.label.clone()
    };
    let panels = run_panels(&runs, &labels);
    render_panels(
        &panels,
        args.title.as_deref(),
        args.width,
        args.height,
        args.log_y,
        &args.out,
    )
}

/// `torusrec plot`: checks --out, draws, writes the SVG atomically, says what it wrote.
pub fn run(args: &PlotArgs) -> Result<()> {
    check_out(args)?;
    let svg = render(args)?;
    write_atomic(&args.out, &svg)?;
    println!(
        "wrote {} ({} bytes)",
        crate::error::short_path(&args.out),
        svg.len()
    );
    Ok(())
}
