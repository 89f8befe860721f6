//! The copying model's parameters: the shape, independent of the graph's size, its
//! file format (TOML or JSON, versioned) and the built-in cnr-2000 fit.

use serde::{Deserialize, Serialize};

/// Format version of the parameter file.
pub const PARAMS_VERSION: u32 = 4;

/// The copying model's shape, independent of the graph's size; see the module doc.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyingParams {
    /// [`PARAMS_VERSION`].
    pub version: u32,
    /// What the parameters were fitted to (informational).
    #[serde(default)]
    pub fitted_to: String,
    pub zero_out: f64,
    /// `[survival, degree / mean positive degree]`, survival decreasing from 1.
    pub out_knots: Vec<[f64; 2]>,
    pub out_tail: f64,
    pub out_cap: f64,
    pub host_mean: f64,
    pub host_sigma: f64,
    /// The largest host, in pages (host sizes are clamped to it).
    pub host_max: f64,
    pub dir_mean: f64,
    /// Probability that a page takes its directory's degree draw.
    pub degree_corr: f64,
    pub template: f64,
    pub template_pages: f64,
    pub copy: f64,
    pub copy_sibling: f64,
    /// Probability that a page links to its directory's index.
    pub up_link: f64,
    pub local: f64,
    pub local_gap: f64,
    pub host_zipf: f64,
    pub global_zipf: f64,
    /// Probability that a page takes only discovery links.
    pub hidden: f64,
    /// Share of the mutual links among a page's other links.
    pub mutual: f64,
    /// Probability that a page's parent (the page that links to it first) comes
    /// after it in id order.
    pub parent_back: f64,
    /// Exponent of the power law of the gap between a page and its parent.
    pub parent_zipf: f64,
    /// Probability that a page with links (not its directory's index) is a clone:
    /// it takes the degree, parent and link list of the previous page with links of
    /// its directory that is not a clone.
    pub clone: f64,
    /// Share of the pages that place global links (outward pages): the global share
    /// of such a page is the global share over `global_pages` (at most 1), the
    /// others place none, so a crawl's few hub pages hold its long links.
    pub global_pages: f64,
    /// Probability that a hidden page comes first in the order the pages without
    /// links are taken from (the others, hidden or not, come after them, template
    /// pages last): it sets the share of arcs into pages without links.
    pub zero_hidden: f64,
}

impl CopyingParams {
    /// Checks every field; `Err` names the first bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.version != PARAMS_VERSION {
            return Err(format!(
                "version {} (this build reads version {PARAMS_VERSION})",
                self.version
            ));
        }
        let unit = |name: &str, x: f64| -> Result<(), String> {
            if x.is_finite() && (0.0..=1.0).contains(&x) {
                Ok(())
            } else {
                Err(format!("{name} must be in [0, 1] (got {x})"))
            }
        };
        let pos = |name: &str, x: f64, min: f64| -> Result<(), String> {
            if x.is_finite() && x >= min {
                Ok(())
            } else {
                Err(format!("{name} must be a finite number >= {min} (got {x})"))
            }
        };
        unit("zero_out", self.zero_out)?;
        if self.zero_out >= 1.0 {
            return Err("zero_out must be below 1 (some page needs links)".into());
        }
        unit("template", self.template)?;
        unit("copy", self.copy)?;
        unit("local", self.local)?;
        unit("copy_sibling", self.copy_sibling)?;
        unit("degree_corr", self.degree_corr)?;
        unit("up_link", self.up_link)?;
        unit("hidden", self.hidden)?;
        unit("mutual", self.mutual)?;
        unit("parent_back", self.parent_back)?;
        unit("clone", self.clone)?;
        unit("global_pages", self.global_pages)?;
        unit("zero_hidden", self.zero_hidden)?;
        if self.global_pages == 0.0 {
            return Err("global_pages must be above 0".into());
        }
        let shares = self.template + self.copy + self.mutual + self.local;
        if shares > 1.0 + 1e-9 {
            return Err(format!(
                "template + copy + mutual + local must be at most 1 (got {shares})"
            ));
        }
        pos("out_tail", self.out_tail, 0.05)?;
        pos("out_cap", self.out_cap, 1.0)?;
        pos("host_mean", self.host_mean, 1.0)?;
        pos("host_sigma", self.host_sigma, 0.0)?;
        pos("host_max", self.host_max, 1.0)?;
        pos("dir_mean", self.dir_mean, 1.0)?;
        pos("template_pages", self.template_pages, 0.0)?;
        pos("local_gap", self.local_gap, 0.0)?;
        pos("host_zipf", self.host_zipf, 0.0)?;
        pos("global_zipf", self.global_zipf, 0.0)?;
        pos("parent_zipf", self.parent_zipf, 0.0)?;
        if self.out_knots.is_empty() {
            return Err("out_knots must not be empty".into());
        }
        let mut prev = (f64::INFINITY, 0.0);
        for (i, &[s, d]) in self.out_knots.iter().enumerate() {
            if !(s.is_finite() && s > 0.0 && s <= 1.0 && s < prev.0) {
                return Err(format!(
                    "out_knots[{i}]: survival {s} must be in (0, 1] and decreasing"
                ));
            }
            if !(d.is_finite() && d > 0.0 && d >= prev.1) {
                return Err(format!(
                    "out_knots[{i}]: degree {d} must be positive and non-decreasing"
                ));
            }
            prev = (s, d);
        }
        Ok(())
    }

    /// Parses a parameter file (TOML, or JSON when it starts with `{`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let p: Self = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| e.to_string())?
        } else {
            toml::from_str(text).map_err(|e| e.to_string())?
        };
        p.validate()?;
        Ok(p)
    }

    /// The parameters as TOML (`json == false`) or pretty JSON.
    pub fn render(&self, json: bool) -> String {
        if json {
            serde_json::to_string_pretty(self).expect("params serialize") + "\n"
        } else {
            toml::to_string(self).expect("params serialize")
        }
    }
}

/// The parameters fitted to cnr-2000 (`generate webgraph --like
/// ../shared/data/cnr-2000/cnr-2000 --params-out`), the shape of the presets.
pub fn cnr2000_params() -> CopyingParams {
    CopyingParams::parse(include_str!("../cnr2000_params.toml")).expect("built-in params are valid")
}
