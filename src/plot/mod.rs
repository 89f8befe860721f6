//! SVG charts of training runs (the `--metrics` JSON lines of `als` and `embed`) or of
//! a small benchmark table (TSV/CSV), through plotters' SVG backend (no fonts, no
//! system libraries; text is drawn by the viewer). The `plot` subcommand
//! (`app::plot`) chooses what to draw from its flags.
//!
//! Reading and checking the input ([`load_run`], [`load_table`]) is separate from
//! drawing ([`render_panels`], [`render_bars`]), which is separate from writing the
//! file (the subcommand's).

use crate::error::{quote, read_text, Error, Result};
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// At most this many points per series are drawn (evenly thinned, the last kept), so
/// that a long run still gives a small SVG.
pub const MAX_POINTS: usize = 400;

/// Series colours (Tableau 10): distinct, and readable on white.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// Which subcommand wrote a metrics file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    /// `als --metrics`: one line per epoch.
    Als,
    /// `embed --metrics`: one line per log interval, keyed by step.
    Embed,
}

impl RunKind {
    fn x_key(self) -> &'static str {
        match self {
            RunKind::Als => "epoch",
            RunKind::Embed => "step",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            RunKind::Als => "als",
            RunKind::Embed => "embed",
        }
    }
}

/// One run's curves, keyed by epoch or step (a resumed run that logged a point twice
/// keeps the later value).
#[derive(Debug, Clone)]
pub struct Run {
    pub path: PathBuf,
    pub kind: RunKind,
    /// The first line with a record, for messages.
    pub first_line: u64,
    pub loss: BTreeMap<u64, f64>,
    /// Recall@20 (als) or eval AUC (embed).
    pub quality: BTreeMap<u64, f64>,
    /// Edges/s (als) or examples/s (embed).
    pub throughput: BTreeMap<u64, f64>,
}

impl Run {
    fn is_empty(&self) -> bool {
        self.loss.is_empty() && self.quality.is_empty() && self.throughput.is_empty()
    }
}

fn number(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64).filter(|x| x.is_finite())
}

/// Reads one metrics file. Errors (exit 2) name the file and line: a missing or empty
/// file, a line that is not a JSON object, a line with neither "epoch" nor "step", a
/// file that mixes them, or a file with nothing to plot.
pub fn load_run(path: &Path) -> Result<Run> {
    let text = read_text(path)?;
    let parse = |line: u64, msg: String| Error::Parse {
        path: path.into(),
        line,
        msg,
    };
    let mut run = Run {
        path: path.into(),
        kind: RunKind::Als,
        first_line: 0,
        loss: BTreeMap::new(),
        quality: BTreeMap::new(),
        throughput: BTreeMap::new(),
    };
    let mut kind: Option<RunKind> = None;
    let mut final_obj: Option<(u64, serde_json::Map<String, Value>)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = i as u64 + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let obj = match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(o)) => o,
            Ok(_) => return Err(parse(line, "not a JSON object".into())),
            Err(e) => return Err(parse(line, format!("not JSON ({e}): {}", quote(raw)))),
        };
        if obj.get("final").and_then(Value::as_bool) == Some(true) {
            final_obj = Some((line, obj));
            continue;
        }
        let this = match (obj.contains_key("epoch"), obj.contains_key("step")) {
            (true, false) => RunKind::Als,
            (false, true) => RunKind::Embed,
            _ => return Err(parse(
                line,
                "expected exactly one of \"epoch\" (als --metrics) or \"step\" (embed --metrics)"
                    .into(),
            )),
        };
        match kind {
            None => {
                kind = Some(this);
                run.first_line = line;
            }
            Some(k) if k != this => {
                return Err(parse(
                    line,
                    format!(
                        "{} metrics (\"{}\") after {} metrics (\"{}\" on line {})",
                        this.name(),
                        this.x_key(),
                        k.name(),
                        k.x_key(),
                        run.first_line
                    ),
                ))
            }
            Some(_) => {}
        }
        let x = obj
            .get(this.x_key())
            .and_then(Value::as_u64)
            .ok_or_else(|| parse(line, format!("\"{}\" is not a count", this.x_key())))?;
        if let Some(v) = number(obj.get("loss")) {
            run.loss.insert(x, v);
        }
        let (quality, throughput) = match this {
            RunKind::Als => (
                number(obj.get("recall").and_then(|r| r.get("at20"))),
                number(obj.get("edges_per_second")),
            ),
            RunKind::Embed => (
                number(obj.get("eval_auc")),
                number(obj.get("examples_per_s")),
            ),
        };
        if let Some(v) = quality {
            run.quality.insert(x, v);
        }
        if let Some(v) = throughput {
            run.throughput.insert(x, v);
        }
    }
    let Some(kind) = kind else {
        return Err(match final_obj {
            Some((line, _)) => parse(line, "only a final line: no epochs or steps to plot".into()),
            None => Error::input(path, "empty: no metrics lines"),
        });
    };
    run.kind = kind;
    // The final line's evaluation, when the last interval did not carry it.
    if let Some((_, fin)) = final_obj {
        let at = match kind {
            RunKind::Als => run.loss.keys().chain(run.throughput.keys()).max().copied(),
            RunKind::Embed => fin.get("steps").and_then(Value::as_u64),
        };
        let v = match kind {
            RunKind::Als => number(fin.get("recall_at_20")),
            RunKind::Embed => number(fin.get("auc")),
        };
        if let (Some(at), Some(v)) = (at, v) {
            run.quality.entry(at).or_insert(v);
        }
    }
    if run.is_empty() {
        return Err(parse(
            run.first_line,
            "no plottable values (loss, quality, throughput) on any line".into(),
        ));
    }
    Ok(run)
}

/// One line or bar series.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart panel: its series against a numeric x.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub series: Vec<Series>,
}

/// `points` thinned to at most `max` evenly spaced ones, the first and last kept.
pub fn thin(points: &[(f64, f64)], max: usize) -> Vec<(f64, f64)> {
    if points.len() <= max || max < 2 {
        return points.to_vec();
    }
    let n = points.len();
    (0..max).map(|i| points[i * (n - 1) / (max - 1)]).collect()
}

/// The panels of a set of runs (all of one kind), empty panels left out.
pub fn run_panels(runs: &[Run], labels: &[String]) -> Vec<Panel> {
    let Some(kind) = runs.first().map(|r| r.kind) else {
        return Vec::new();
    };
    let (x_desc, quality, throughput) = match kind {
        RunKind::Als => ("epoch", "Recall@20", "edges/s"),
        RunKind::Embed => ("step", "eval AUC", "examples/s"),
    };
    type Pick = fn(&Run) -> &BTreeMap<u64, f64>;
    let metrics: [(&str, Pick); 3] = [
        ("loss", |r| &r.loss),
        (quality, |r| &r.quality),
        (throughput, |r| &r.throughput),
    ];
    metrics
        .iter()
        .filter_map(|(name, pick)| {
            let series: Vec<Series> = runs
                .iter()
                .zip(labels)
                .map(|(r, l)| Series {
                    label: l.clone(),
                    points: thin(
                        &pick(r)
                            .iter()
                            .map(|(&x, &y)| (x as f64, y))
                            .collect::<Vec<_>>(),
                        MAX_POINTS,
                    ),
                })
                .collect();
            series.iter().any(|s| !s.points.is_empty()).then(|| Panel {
                title: format!("{name} by {x_desc}"),
                x_desc: x_desc.into(),
                y_desc: (*name).into(),
                series,
            })
        })
        .collect()
}

/// A short label for an axis value: 1.2M, 35k, 0.52, 1e-4.
pub fn short_number(v: f64) -> String {
    let a = v.abs();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if a == 0.0 {
        "0".into()
    } else if a >= 1e9 {
        format!("{}G", trim(format!("{:.2}", v / 1e9)))
    } else if a >= 1e6 {
        format!("{}M", trim(format!("{:.2}", v / 1e6)))
    } else if a >= 1e4 {
        format!("{}k", trim(format!("{:.1}", v / 1e3)))
    } else if a >= 1.0 {
        trim(format!("{v:.2}"))
    } else if a >= 1e-3 {
        trim(format!("{v:.4}"))
    } else {
        format!("{v:.0e}")
    }
}

/// A range around `lo..hi` with a margin, never empty.
fn padded(lo: f64, hi: f64, log: bool) -> (f64, f64) {
    if log {
        let (lo, hi) = if lo == hi {
            (lo / 2.0, hi * 2.0)
        } else {
            (lo, hi)
        };
        (lo / 1.3, hi * 1.3)
    } else if lo == hi {
        let d = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        (lo - d, hi + d)
    } else {
        let d = (hi - lo) * 0.05;
        (lo - d, hi + d)
    }
}

/// The top of a y axis over `lo..hi` raised so that the data stays below a legend of
/// `entries` lines in the upper right of a chart `height` pixels tall.
fn legend_top(lo: f64, hi: f64, entries: usize, height: u32, log: bool) -> f64 {
    let plot = (height as f64 - 95.0).max(40.0);
    let f = ((22.0 * entries as f64 + 16.0) / plot).min(0.6);
    if log {
        (lo.ln() + (hi.ln() - lo.ln()) / (1.0 - f)).exp()
    } else {
        lo + (hi - lo) / (1.0 - f)
    }
}

/// 1, 2 or 5 times a power of ten, near `span / target`.
fn nice_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(f64::MIN_POSITIVE);
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m < 1.5 {
        1.0
    } else if m < 3.5 {
        2.0
    } else if m < 7.5 {
        5.0
    } else {
        10.0
    }
}

/// A chart axis with the ticks chosen here: linear or logarithmic, or categories
/// (group i centred on i, labelled with its name).
#[derive(Clone, Debug)]
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
    ticks: Vec<f64>,
    /// Decimals of the tick labels (linear axes).
    decimals: usize,
    names: Option<Vec<String>>,
}

impl Axis {
    /// About six ticks at 1, 2, 5 times a power of ten (whole numbers when `integral`).
    fn linear(lo: f64, hi: f64, integral: bool) -> Self {
        let mut step = nice_step(hi - lo, 6.0);
        if integral {
            step = step.max(1.0);
        }
        let first = (lo / step).ceil() as i64;
        let last = (hi / step).floor() as i64;
        let ticks = (first..=last).map(|k| k as f64 * step).collect();
        let decimals = (-step.log10().floor()).clamp(0.0, 12.0) as usize;
        Axis {
            lo,
            hi,
            log: false,
            ticks,
            decimals,
            names: None,
        }
    }

    /// Ticks at powers of ten, with 2 and 5 (then evenly spaced) when too few fall inside.
    fn log(lo: f64, hi: f64) -> Self {
        let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        let at = |mults: &[f64]| -> Vec<f64> {
            (a..=b)
                .flat_map(|e| mults.iter().map(move |m| m * 10f64.powi(e)))
                .filter(|v| *v >= lo && *v <= hi)
                .collect()
        };
        let mut ticks = at(&[1.0]);
        if ticks.len() < 3 {
            ticks = at(&[1.0, 2.0, 5.0]);
        }
        if ticks.len() < 3 {
            // Less than a decade or so: evenly spaced values read better.
            let step = nice_step(hi - lo, 5.0);
            let first = (lo / step).ceil() as i64;
            let last = (hi / step).floor() as i64;
            ticks = (first..=last).map(|k| k as f64 * step).collect();
        }
        Axis {
            lo,
            hi,
            log: true,
            ticks,
            decimals: 0,
            names: None,
        }
    }

    fn groups(names: Vec<String>) -> Self {
        Axis {
            lo: -0.5,
            hi: names.len() as f64 - 0.5,
            log: false,
            ticks: (0..names.len()).map(|i| i as f64).collect(),
            decimals: 0,
            names: Some(names),
        }
    }

    fn y(lo: f64, hi: f64, log: bool) -> Self {
        if log {
            Axis::log(lo, hi)
        } else {
            Axis::linear(lo, hi, false)
        }
    }
}

impl Ranged for Axis {
    type FormatOption = plotters::coord::ranged1d::NoDefaultFormatting;
    type ValueType = f64;
    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let (a, b, x) = if self.log {
            (self.lo.ln(), self.hi.ln(), v.max(f64::MIN_POSITIVE).ln())
        } else {
            (self.lo, self.hi, *v)
        };
        let f = (x - a) / (b - a);
        limit.0 + (f * (limit.1 - limit.0) as f64).round() as i32
    }
    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }
    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

impl ValueFormatter<f64> for Axis {
    fn format_ext(&self, v: &f64) -> String {
        match &self.names {
            Some(names) => {
                let i = v.round();
                if (v - i).abs() < 1e-6 && i >= 0.0 {
                    names.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            }
            None if self.log || v.abs() >= 1e4 => short_number(*v),
            None => format!("{:.*}", self.decimals, v),
        }
    }
}

fn draw_error<E: std::error::Error + Send + Sync>(
    out: &Path,
    e: plotters::drawing::DrawingAreaErrorKind<E>,
) -> Error {
    Error::Io {
        path: out.into(),
        source: std::io::Error::other(format!("drawing the chart: {e}")),
    }
}

const FONT: &str = "sans-serif";

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<Axis, Axis>>;

/// A chart with its caption, axes and light grid.
fn chart_on<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    x: Axis,
    y: Axis,
    x_mesh: bool,
) -> std::result::Result<Chart<'a, DB>, DrawingAreaErrorKind<DB::ErrorType>> {
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 22))
        .margin(10)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(x, y)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc)
        .y_desc(y_desc)
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 16))
        .bold_line_style(BLACK.mix(0.12));
    if !x_mesh {
        mesh.disable_x_mesh();
    }
    mesh.draw()?;
    Ok(chart)
}

fn draw_legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 16))
        .draw()
}

/// Draws one panel's lines (and points, when few) on `area`.
fn draw_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
    x: Axis,
    y: Axis,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (y0, y1) = (y.lo, y.hi);
    let mut chart = chart_on(
        area,
        &panel.title,
        (&panel.x_desc, &panel.y_desc),
        x,
        y,
        true,
    )?;
    for (i, s) in panel.series.iter().enumerate() {
        let c = color(i);
        // Points off the axis (values <= 0 on a log axis) are left out.
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|p| y0 <= p.1 && p.1 <= y1)
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        if pts.len() <= 40 {
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
        }
    }
    draw_legend(&mut chart)
}

/// The SVG of `panels` stacked top to bottom, each `width` x `height` pixels (and a
/// title line above them when given).
pub fn render_panels(
    panels: &[Panel],
    title: Option<&str>,
    width: u32,
    height: u32,
    log_y: bool,
    out: &Path,
) -> Result<String> {
    let drawable = panels
        .iter()
        .flat_map(|p| p.series.iter().flat_map(|s| s.points.iter()))
        .any(|p| !log_y || p.1 > 0.0);
    if !drawable {
        return Err(Error::Config(format!(
            "nothing to plot into {}{}",
            out.display(),
            if log_y {
                " (--log-y: no value above 0)"
            } else {
                ""
            }
        )));
    }
    let mut svg = String::new();
    let title_h = if title.is_some() { 30 } else { 0 };
    let total = (height * panels.len() as u32) + title_h;
    {
        let root = SVGBackend::with_string(&mut svg, (width, total)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_error(out, e))?;
        let body = match title {
            Some(t) => root.titled(t, (FONT, 26)).map_err(|e| draw_error(out, e))?,
            None => root.clone(),
        };
        let areas = body.split_evenly((panels.len(), 1));
        for (area, panel) in areas.iter().zip(panels) {
            let pts: Vec<(f64, f64)> = panel
                .series
                .iter()
                .flat_map(|s| s.points.iter())
                .filter(|p| !log_y || p.1 > 0.0)
                .copied()
                .collect();
            if pts.is_empty() {
                continue;
            }
            let min = |v: &mut dyn Iterator<Item = f64>| v.fold(f64::INFINITY, f64::min);
            let max = |v: &mut dyn Iterator<Item = f64>| v.fold(f64::NEG_INFINITY, f64::max);
            let (x0, x1) = padded(
                min(&mut pts.iter().map(|p| p.0)),
                max(&mut pts.iter().map(|p| p.0)),
                false,
            );
            let (y0, y1) = padded(
                min(&mut pts.iter().map(|p| p.1)),
                max(&mut pts.iter().map(|p| p.1)),
                log_y,
            );
            let y1 = legend_top(y0, y1, panel.series.len(), height, log_y);
            let integral = pts.iter().all(|p| p.0.fract() == 0.0);
            let x = Axis::linear(x0, x1, integral);
            draw_lines(area, panel, x, Axis::y(y0, y1, log_y)).map_err(|e| draw_error(out, e))?;
        }
        root.present().map_err(|e| draw_error(out, e))?;
    }
    Ok(svg)
}

/// A bar chart: groups on x (in order), one bar per series in each group.
#[derive(Debug, Clone)]
pub struct Bars {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub groups: Vec<String>,
    /// Per series: its label and a value per group (None: no bar).
    pub series: Vec<(String, Vec<Option<f64>>)>,
}

fn draw_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    bars: &Bars,
    y: Axis,
    base: f64,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let x = Axis::groups(bars.groups.clone());
    let mut chart = chart_on(area, &bars.title, (&bars.x_desc, &bars.y_desc), x, y, false)?;
    let w = 0.8 / bars.series.len().max(1) as f64;
    for (j, (label, values)) in bars.series.iter().enumerate() {
        let c = color(j);
        let rects = values.iter().enumerate().filter_map(|(g, v)| {
            let v = (*v)?;
            let x0 = g as f64 - 0.4 + j as f64 * w;
            Some(Rectangle::new([(x0, base), (x0 + w * 0.9, v)], c.filled()))
        });
        chart
            .draw_series(rects)?
            .label(label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    draw_legend(&mut chart)
}

/// The SVG of a bar chart, `width` x `height` pixels.
pub fn render_bars(
    bars: &Bars,
    width: u32,
    height: u32,
    log_y: bool,
    out: &Path,
) -> Result<String> {
    let vals: Vec<f64> = bars
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .filter(|v| !log_y || *v > 0.0)
        .collect();
    let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let n = bars.series.len();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_error(out, e))?;
        let r = if log_y {
            let (y0, y1) = padded(lo, hi, true);
            let y1 = legend_top(y0, y1, n, height, true);
            draw_bars(&root, bars, Axis::log(y0, y1), y0)
        } else {
            // Bars start at zero (or at the lowest value when it is negative).
            let (lo, hi) = (lo.min(0.0), hi.max(0.0));
            let hi = if hi == lo { lo + 1.0 } else { hi };
            let y1 = legend_top(lo, hi + (hi - lo) * 0.05, n, height, false);
            draw_bars(&root, bars, Axis::linear(lo, y1, false), 0.0)
        };
        r.map_err(|e| draw_error(out, e))?;
        root.present().map_err(|e| draw_error(out, e))?;
    }
    Ok(svg)
}

/// A table read from a TSV or CSV file: its header and rows, with line numbers.
#[derive(Debug, Clone)]
pub struct Table {
    pub path: PathBuf,
    pub header: Vec<String>,
    /// (line number, cells)
    pub rows: Vec<(u64, Vec<String>)>,
}

/// Reads a table: the first line that is not blank or a `#` comment is the header;
/// tab-separated, or comma-separated for a `.csv` file. A row with another number of
/// cells than the header is an error naming the line.
pub fn load_table(path: &Path) -> Result<Table> {
    let text = read_text(path)?;
    let csv = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    let sep = if csv { ',' } else { '\t' };
    let mut header: Option<Vec<String>> = None;
    let mut rows = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i as u64 + 1;
        if raw.trim().is_empty() || raw.starts_with('#') {
            continue;
        }
        let cells: Vec<String> = raw.split(sep).map(|c| c.trim().to_string()).collect();
        match &header {
            None => header = Some(cells),
            Some(h) if h.len() != cells.len() => {
                return Err(Error::Parse {
                    path: path.into(),
                    line,
                    msg: format!("{} cells, the header has {}", cells.len(), h.len()),
                })
            }
            Some(_) => rows.push((line, cells)),
        }
    }
    let header = header.ok_or_else(|| Error::input(path, "empty: no header line"))?;
    Ok(Table {
        path: path.into(),
        header,
        rows,
    })
}

/// A table chart: lines (numeric x) or grouped bars.
#[derive(Debug, Clone)]
pub enum TableChart {
    Lines(Panel),
    Bars(Bars),
}

/// An empty or not-a-number table cell (`-`, `n/a`, `nan`, ...).
pub fn missing(cell: &str) -> bool {
    matches!(
        cell.to_ascii_lowercase().as_str(),
        "" | "-" | "n/a" | "na" | "nan" | "none" | "null"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thin_keeps_ends_and_bound() {
        let pts: Vec<(f64, f64)> = (0..1000).map(|i| (i as f64, 0.0)).collect();
        let t = thin(&pts, 400);
        assert_eq!(t.len(), 400);
        assert_eq!(t[0].0, 0.0);
        assert_eq!(t[399].0, 999.0);
        assert!(t.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(thin(&pts[..10], 400).len(), 10);
    }

    #[test]
    fn short_numbers() {
        assert_eq!(short_number(0.0), "0");
        assert_eq!(short_number(1_234_567.0), "1.23M");
        assert_eq!(short_number(35_000.0), "35k");
        assert_eq!(short_number(0.52), "0.52");
        assert_eq!(short_number(2.0), "2");
        assert_eq!(short_number(3.5e9), "3.5G");
        assert_eq!(short_number(0.0001), "1e-4");
    }

    #[test]
    fn axis_ticks() {
        assert_eq!(Axis::linear(0.5, 4.5, true).ticks, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(Axis::linear(3.6, 4.4, true).ticks, [4.0]);
        let a = Axis::linear(0.5184, 0.5206, false);
        assert_eq!(a.decimals, 4);
        assert_eq!(a.format_ext(&0.519), "0.5190");
        assert_eq!(Axis::linear(0.0, 100.0, false).ticks.len(), 6);
        assert_eq!(Axis::log(0.8, 1200.0).ticks, [1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(Axis::log(3.0, 40.0).ticks, [5.0, 10.0, 20.0]);
        assert_eq!(Axis::log(0.0075, 0.042).ticks.len(), 7); // 0.01, 0.015, .., 0.04
        let g = Axis::groups(vec!["a".into(), "b".into()]);
        assert_eq!(
            (g.format_ext(&1.0), g.format_ext(&0.5)),
            ("b".into(), String::new())
        );
    }

    #[test]
    fn legend_headroom_grows_with_entries() {
        let two = legend_top(0.0, 100.0, 2, 300, false);
        let six = legend_top(0.0, 100.0, 6, 300, false);
        assert!(100.0 < two && two < six, "{two} {six}");
        let log = legend_top(1.0, 100.0, 2, 300, true);
        assert!(log > 100.0);
    }

    #[test]
    fn padded_ranges_are_not_empty() {
        for (lo, hi, log) in [(0.0, 0.0, false), (5.0, 5.0, false), (3.0, 3.0, true)] {
            let (a, b) = padded(lo, hi, log);
            assert!(a < lo && b > hi, "{lo} {hi} {log}: {a} {b}");
        }
    }
}
