//! The column SPEC of `prepare clicks --format csv|tsv --columns SPEC` (parsed and
//! resolved against a header), its line parser ([`ColumnLayout`]) and the documented
//! hash of a text categorical.
//!
//! A SPEC is comma-separated entries, either all positional (`ROLE[:OPT...][*N]`, one
//! per column, `*N` repeating it) or all by name (`NAME=ROLE[:OPT...]`, which needs a
//! header row; `*=ROLE` gives every column not named its role). Roles: `label` (0 or
//! 1), `dense` (a number, stored as f32), `log` (a number, `ln(1 + max(x, 0))`,
//! Criteo's transform), `cat` or its synonym `text` (any text, hashed by
//! [`text_key`]), `hex` (1 to 16 hex
//! digits, the key itself), `weights:TABLE` (the per-id weights of the `cat`/`hex`
//! column TABLE, one per key, in its list separator) and `skip`. Options of `cat` and
//! `hex`: `list=C` (a multi-hot field, items separated by the one character C),
//! `weight=C` (each item `KEY<C>WEIGHT`). Avazu: `--header --columns
//! 'click=label,id=skip,*=cat'`.

use super::ingest::Block;
use crate::rng::mix64;

/// What a column holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Label,
    Dense,
    Log,
    Cat,
    Hex,
    /// The weights of the table column named here (or numbered, positionally 1-based).
    Weights(String),
    Skip,
}

/// One column of a resolved SPEC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub role: Role,
    /// `list=C`: the items' separator.
    pub list: Option<char>,
    /// `weight=C`: the separator of each item's key and weight.
    pub pair: Option<char>,
}

/// The key of a text categorical: FNV-1a 64 of its bytes (offset basis
/// `0xcbf29ce484222325`, prime `0x100000001b3`), then splitmix64's finalizer
/// ([`mix64`]).
pub fn text_key(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

/// One entry before resolution: optional name, role, options, repetition.
fn parse_entry(e: &str) -> Result<(Option<String>, Column, usize), String> {
    let (name, rest) = match e.split_once('=') {
        Some((n, r)) if !n.contains(':') => (Some(n.trim().to_string()), r),
        _ => (None, e),
    };
    let mut chars = rest.trim().chars().peekable();
    let mut word = String::new();
    while let Some(&c) = chars.peek() {
        if c == ':' || c == '*' {
            break;
        }
        word.push(c);
        chars.next();
    }
    let mut col = Column {
        name: name.clone().unwrap_or_default(),
        role: Role::Skip,
        list: None,
        pair: None,
    };
    let mut target = None;
    let mut times = 1usize;
    while let Some(c) = chars.next() {
        if c == '*' {
            let n: String = chars.by_ref().collect();
            times = n
                .trim()
                .parse()
                .ok()
                .filter(|&n| (1..=1_000_000).contains(&n))
                .ok_or_else(|| format!("{e:?}: the count after * must be in 1..=1000000"))?;
            break;
        }
        // ':' then KEY=C (one character) or, for weights, the table.
        let mut key = String::new();
        while let Some(&k) = chars.peek() {
            if k == '=' || k == ':' || k == '*' {
                break;
            }
            key.push(k);
            chars.next();
        }
        if word == "weights" && target.is_none() {
            target = Some(key);
            continue;
        }
        if chars.next() != Some('=') {
            return Err(format!("{e:?}: an option is list=C or weight=C"));
        }
        let v = chars
            .next()
            .ok_or_else(|| format!("{e:?}: {key}= needs one character"))?;
        let slot = match key.as_str() {
            "list" => &mut col.list,
            "weight" => &mut col.pair,
            _ => return Err(format!("{e:?}: unknown option {key:?} (list=C, weight=C)")),
        };
        if slot.replace(v).is_some() {
            return Err(format!("{e:?}: {key} given twice"));
        }
    }
    col.role = match word.as_str() {
        "label" => Role::Label,
        "dense" => Role::Dense,
        "log" => Role::Log,
        "cat" | "text" => Role::Cat,
        "hex" => Role::Hex,
        "skip" => Role::Skip,
        "weights" => Role::Weights(
            target
                .filter(|t| !t.is_empty())
                .ok_or_else(|| format!("{e:?}: weights:TABLE names its table column"))?,
        ),
        w => {
            return Err(format!(
                "{e:?}: unknown role {w:?} (label, dense, log, cat, hex, weights:TABLE, skip)"
            ))
        }
    };
    if (col.list.is_some() || col.pair.is_some()) && !matches!(col.role, Role::Cat | Role::Hex) {
        return Err(format!(
            "{e:?}: list= and weight= apply to cat and hex only"
        ));
    }
    Ok((name, col, times))
}

/// Split a SPEC into entries at commas, except a comma that is an option's value.
fn entries(spec: &str) -> Vec<&str> {
    let b = spec.as_bytes();
    let (mut out, mut start) = (Vec::new(), 0);
    for i in 0..b.len() {
        if b[i] == b','
            && !(i > 0 && b[i - 1] == b'=' && i > start + 1 && spec[start..i].contains(':'))
        {
            out.push(&spec[start..i]);
            start = i + 1;
        }
    }
    out.push(&spec[start..]);
    out
}

/// The SPEC resolved to one [`Column`] per field; `header`: the column names of the
/// header row, if any. Refuses an unknown name, a column named twice, a column
/// without a role, not exactly one label, no table, and a weights column whose table
/// is not a `cat`/`hex` column or that is weighted twice.
pub fn resolve(spec: &str, header: Option<&[String]>) -> Result<Vec<Column>, String> {
    let parsed: Vec<_> = entries(spec)
        .into_iter()
        .map(|e| parse_entry(e.trim()))
        .collect::<Result<_, _>>()?;
    let named = parsed.iter().filter(|p| p.0.is_some()).count();
    let mut cols: Vec<Column>;
    if named == 0 {
        cols = Vec::new();
        for (_, c, times) in parsed {
            cols.extend(std::iter::repeat_n(c, times));
        }
        for (i, c) in cols.iter_mut().enumerate() {
            c.name = match header {
                Some(h) => h.get(i).cloned().unwrap_or_default(),
                None => format!("{}", i + 1),
            };
        }
        if let Some(h) = header {
            if h.len() != cols.len() {
                return Err(format!(
                    "{} columns in the SPEC, {} in the header",
                    cols.len(),
                    h.len()
                ));
            }
        }
    } else {
        let h = header.ok_or("NAME=ROLE entries need --header")?;
        if named != parsed.len() {
            return Err("a SPEC is all positional or all NAME=ROLE".into());
        }
        let mut slot: Vec<Option<Column>> = vec![None; h.len()];
        let mut rest = None;
        for (name, c, times) in parsed {
            let name = name.unwrap_or_default();
            if times != 1 {
                return Err(format!("{name}=: *N is for positional entries"));
            }
            if name == "*" {
                if rest.replace(c).is_some() {
                    return Err("*= given twice".into());
                }
                continue;
            }
            let i = h
                .iter()
                .position(|x| *x == name)
                .ok_or_else(|| format!("unknown column name {name:?} (not in the header)"))?;
            if slot[i].replace(c).is_some() {
                return Err(format!("column {name:?} given two roles"));
            }
        }
        cols = Vec::with_capacity(h.len());
        for (i, s) in slot.into_iter().enumerate() {
            let mut c = s
                .or_else(|| rest.clone())
                .ok_or_else(|| format!("column {:?} has no role (add {0}=skip or *=ROLE)", h[i]))?;
            c.name = h[i].clone();
            cols.push(c);
        }
    }
    check(&cols)?;
    Ok(cols)
}

fn check(cols: &[Column]) -> Result<(), String> {
    let labels = cols.iter().filter(|c| c.role == Role::Label).count();
    if labels != 1 {
        return Err(format!("{labels} label columns, expected exactly 1"));
    }
    if !cols.iter().any(|c| matches!(c.role, Role::Cat | Role::Hex)) {
        return Err("no cat or hex column (a click log needs at least one table)".into());
    }
    let mut weighted: Vec<&str> = cols
        .iter()
        .filter(|c| c.pair.is_some())
        .map(|c| c.name.as_str())
        .collect();
    for c in cols {
        if let Role::Weights(t) = &c.role {
            let target = cols
                .iter()
                .find(|x| x.name == *t)
                .filter(|x| matches!(x.role, Role::Cat | Role::Hex))
                .ok_or_else(|| format!("weights:{t}: no cat or hex column named {t:?}"))?;
            if weighted.contains(&target.name.as_str()) {
                return Err(format!("column {t:?} is given weights twice"));
            }
            weighted.push(&target.name);
        }
    }
    Ok(())
}

/// The field separator and quoting of a `--format csv|tsv` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// Tab-separated, no quoting: a field is the bytes between tabs.
    Tsv,
    /// Comma-separated, RFC 4180's quoting without line breaks in fields: a field that
    /// starts with `"` is quoted, ends at the next lone `"` (which must end the field),
    /// and holds `""` as one `"`; a `"` inside an unquoted field is refused.
    Csv,
}

impl Dialect {
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Tsv => "tsv",
            Dialect::Csv => "csv",
        }
    }

    fn sep(self) -> u8 {
        match self {
            Dialect::Tsv => b'\t',
            Dialect::Csv => b',',
        }
    }
}

/// The resolved columns of a csv/tsv click file and the line parser over them.
///
/// Values, and empty fields: `label` is `0` or `1` (empty is a bad line); `dense` is a
/// finite decimal number (Rust's `f64` syntax, e.g. `-1.5e3`; `nan` and `inf` are
/// refused) rounded to f32, `log` the same number through `ln(1 + max(x, 0))` in f64
/// rounded once to f32; an empty `dense` or `log` field is 0. `cat` is any bytes,
/// hashed by [`text_key`]; `hex` is 1 to 16 hex digits (either case), the key itself;
/// an empty `cat`/`hex` field is an empty bag. With `list=C` each item between the
/// separators is one key (an empty field is an empty bag; an empty item within a
/// non-empty field, such as `a||b` or a trailing `|`, is a bad line).
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnLayout {
    cols: Vec<Column>,
    /// Index among its kind (dense value or table) of each column.
    index: Vec<usize>,
    n_dense: usize,
    n_cat: usize,
    dialect: Dialect,
    /// Each file's first line is a header (skipped).
    header: bool,
    spec: String,
    /// Per table: whether it carries per-id weights (`weight=C` or a `weights:` column).
    weighted: Vec<bool>,
    /// Per `weights:` column (by column index): the table column it weighs.
    weights_of: Vec<Option<usize>>,
}

impl ColumnLayout {
    /// `spec` resolved against `header` (the header row's names, when the files have
    /// one).
    pub fn new(
        spec: &str,
        header: Option<&[String]>,
        dialect: Dialect,
    ) -> Result<ColumnLayout, String> {
        let cols = resolve(spec, header)?;
        let (mut nd, mut nc) = (0usize, 0usize);
        let index: Vec<usize> = cols
            .iter()
            .map(|c| match c.role {
                Role::Dense | Role::Log => {
                    nd += 1;
                    nd - 1
                }
                Role::Cat | Role::Hex => {
                    nc += 1;
                    nc - 1
                }
                _ => 0,
            })
            .collect();
        let weights_of: Vec<Option<usize>> = cols
            .iter()
            .map(|c| match &c.role {
                Role::Weights(t) => cols.iter().position(|x| x.name == *t),
                _ => None,
            })
            .collect();
        let mut weighted = vec![false; nc];
        for (i, c) in cols.iter().enumerate() {
            if c.pair.is_some() {
                weighted[index[i]] = true;
            }
            if let Some(j) = weights_of[i] {
                weighted[index[j]] = true;
            }
        }
        Ok(ColumnLayout {
            cols,
            index,
            n_dense: nd,
            n_cat: nc,
            dialect,
            header: header.is_some(),
            spec: spec.to_string(),
            weighted,
            weights_of,
        })
    }

    /// Per table: whether it carries per-id weights.
    pub fn weighted(&self) -> &[bool] {
        &self.weighted
    }

    pub fn fields(&self) -> usize {
        self.cols.len()
    }

    pub fn n_dense(&self) -> usize {
        self.n_dense
    }

    pub fn n_cat(&self) -> usize {
        self.n_cat
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Each file's first line is a header.
    pub fn has_header(&self) -> bool {
        self.header
    }

    /// The SPEC as given.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// The tables' names: the header's names of the `cat`/`hex` columns, or `C1`,
    /// `C2`, ... without a header.
    pub fn table_names(&self) -> Vec<String> {
        let tables = self
            .cols
            .iter()
            .filter(|c| matches!(c.role, Role::Cat | Role::Hex));
        if self.header {
            tables.map(|c| c.name.clone()).collect()
        } else {
            (1..=self.n_cat).map(|i| format!("C{i}")).collect()
        }
    }

    /// How errors name column `i` (0-based): its header name and number, or its
    /// number.
    fn column_name(&self, i: usize) -> String {
        if self.header {
            format!("{} ({:?})", i + 1, self.cols[i].name)
        } else {
            format!("{}", i + 1)
        }
    }

    /// Whether the label field of `line` (a file's first line) is `0` or `1`: for
    /// `--header auto`, a first line whose label is not is a header.
    pub fn label_is_valid(spec: &str, line: &[u8], dialect: Dialect) -> bool {
        let Ok(cols) = resolve(spec, None) else {
            return true;
        };
        let mut sc = Scratch::default();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if split_fields(line, dialect, &mut sc).is_err() {
            return true;
        }
        match cols.iter().position(|c| c.role == Role::Label) {
            Some(i) if i < sc.spans.len() => matches!(sc.field(i), b"0" | b"1"),
            _ => true,
        }
    }

    /// Parse every line of `text` (whole lines, as `criteo::parse_lines`) into `out`.
    pub fn parse_lines(&self, text: &[u8], out: &mut Block) {
        let mut sc = Scratch::default();
        let mut start = 0usize;
        while start < text.len() {
            let end = memchr::memchr(b'\n', &text[start..]).map_or(text.len(), |k| start + k);
            let line = &text[start..end];
            if let Err(reason) = self.parse_line(line, out, &mut sc) {
                out.push_bad(out.lines, || reason);
            }
            out.lines += 1;
            start = end + 1;
        }
    }

    /// One line (a trailing `\r` dropped) appended to `out` as an example; on a bad
    /// line `out` is left as it was and the reason names the column.
    fn parse_line(&self, line: &[u8], out: &mut Block, sc: &mut Scratch) -> Result<(), String> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return Err(format!("empty line (expected {} fields)", self.fields()));
        }
        split_fields(line, self.dialect, sc)?;
        if sc.spans.len() != self.fields() {
            return Err(format!(
                "{} {}-separated fields, expected {}",
                sc.spans.len(),
                if self.dialect == Dialect::Tsv {
                    "tab"
                } else {
                    "comma"
                },
                self.fields()
            ));
        }
        let nd0 = out.dense.len();
        let r = self.parse_fields(out, sc);
        if r.is_err() {
            out.dense.truncate(nd0);
            for (t, k) in out.keys.iter_mut().enumerate() {
                let end = k.offsets.last().copied().unwrap_or(0) as usize;
                k.ids.truncate(end);
                if let Some(w) = out.weights.get_mut(t) {
                    w.truncate(end.min(w.len()));
                }
            }
            return r;
        }
        for k in &mut out.keys {
            let len = u32::try_from(k.ids.len()).expect("a block holds fewer than 2^32 keys");
            k.offsets.push(len);
        }
        out.n += 1;
        Ok(())
    }

    fn parse_fields(&self, out: &mut Block, sc: &Scratch) -> Result<(), String> {
        let mut label = 0.0f32;
        // Each table's id count before this line (for its weights column).
        let before: Vec<usize> = out.keys.iter().map(|k| k.ids.len()).collect();
        for (i, c) in self.cols.iter().enumerate() {
            let f = sc.field(i);
            let bad = |what: &str| self.bad_field(i, f, what);
            match c.role {
                Role::Label => {
                    label = match f {
                        b"0" => 0.0,
                        b"1" => 1.0,
                        _ => return Err(bad("is not a label (0 or 1)")),
                    }
                }
                Role::Dense | Role::Log => {
                    let x = if f.is_empty() {
                        0.0
                    } else {
                        std::str::from_utf8(f)
                            .ok()
                            .and_then(|s| s.parse::<f64>().ok())
                            .filter(|x| x.is_finite())
                            .ok_or_else(|| bad("is not a finite number or empty"))?
                    };
                    out.dense.push(if c.role == Role::Log {
                        x.max(0.0).ln_1p() as f32
                    } else {
                        x as f32
                    });
                }
                Role::Cat | Role::Hex => self.parse_table_field(i, f, out)?,
                Role::Skip | Role::Weights(_) => {}
            }
        }
        for (i, t) in self.weights_of.iter().enumerate() {
            if let Some(j) = *t {
                self.parse_weights_field(i, j, before[self.index[j]], sc.field(i), out)?;
            }
        }
        out.labels.push(label);
        Ok(())
    }

    /// The reason of a bad field `f` of column `i`.
    fn bad_field(&self, i: usize, f: &[u8], what: &str) -> String {
        format!(
            "column {}: {} {what}",
            self.column_name(i),
            crate::error::quote(&String::from_utf8_lossy(f))
        )
    }

    /// The items of field `f` of column `i` (split at its `list=` separator, if any).
    fn items<'a>(&self, i: usize, f: &'a [u8]) -> Box<dyn Iterator<Item = &'a [u8]> + 'a> {
        match self.cols[i].list {
            Some(sep) => {
                let mut b = [0u8; 4];
                let sep = sep.encode_utf8(&mut b).as_bytes().to_vec();
                Box::new(split_on(f, sep))
            }
            None => Box::new(std::iter::once(f)),
        }
    }

    /// A `cat`/`hex` field: its keys (and, with `weight=C`, their weights) into `out`.
    fn parse_table_field(&self, i: usize, f: &[u8], out: &mut Block) -> Result<(), String> {
        let c = &self.cols[i];
        let t = self.index[i];
        if f.is_empty() {
            return Ok(());
        }
        let bad = |what: &str| self.bad_field(i, f, what);
        for item in self.items(i, f) {
            if item.is_empty() {
                return Err(bad(
                    "has an empty item (list separator doubled or at an end)",
                ));
            }
            let key = match c.pair {
                Some(p) => {
                    let (k, w) = split_pair(item, p).ok_or_else(|| {
                        bad(&format!("has an item without its weight (KEY{p}WEIGHT)"))
                    })?;
                    out.weights[t].push(
                        parse_weight(w)
                            .ok_or_else(|| bad("has a weight that is not a finite number"))?,
                    );
                    k
                }
                None => item,
            };
            if key.is_empty() {
                return Err(bad("has an empty key"));
            }
            out.keys[t].ids.push(if c.role == Role::Hex {
                hex_key(key)
                    .ok_or_else(|| bad("is not 1 to 16 hex digits (or a list of them) or empty"))?
            } else {
                text_key(key)
            });
        }
        Ok(())
    }

    /// A `weights:` field (column `i`) of table column `j`, whose ids of this line
    /// start at `from`: one finite number per id, in `j`'s list separator.
    fn parse_weights_field(
        &self,
        i: usize,
        j: usize,
        from: usize,
        f: &[u8],
        out: &mut Block,
    ) -> Result<(), String> {
        let t = self.index[j];
        let ids = out.keys[t].ids.len() - from;
        let mut got = 0usize;
        if !f.is_empty() {
            for item in self.items(j, f) {
                let w = parse_weight(item).ok_or_else(|| {
                    self.bad_field(i, f, "has a weight that is not a finite number")
                })?;
                out.weights[t].push(w);
                got += 1;
            }
        }
        if got != ids {
            return Err(self.bad_field(
                i,
                f,
                &format!(
                    "holds {got} weights for the {ids} ids of column {}",
                    self.column_name(j)
                ),
            ));
        }
        Ok(())
    }
}

/// `item` split at the last `p`: key and weight.
fn split_pair(item: &[u8], p: char) -> Option<(&[u8], &[u8])> {
    let mut b = [0u8; 4];
    let sep = p.encode_utf8(&mut b).as_bytes();
    let k = item.windows(sep.len()).rposition(|w| w == sep)?;
    Some((&item[..k], &item[k + sep.len()..]))
}

/// A per-id weight: a number in Rust's `f64` syntax, finite once rounded to f32.
fn parse_weight(b: &[u8]) -> Option<f32> {
    let x = std::str::from_utf8(b).ok()?.parse::<f64>().ok()? as f32;
    x.is_finite().then_some(x)
}

/// The items of `f` between occurrences of `sep` (which may be several bytes).
fn split_on(f: &[u8], sep: Vec<u8>) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(f);
    std::iter::from_fn(move || {
        let r = rest?;
        match r.windows(sep.len()).position(|w| w == sep.as_slice()) {
            Some(k) => {
                rest = Some(&r[k + sep.len()..]);
                Some(&r[..k])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

/// 1 to 16 hex digits as their value.
fn hex_key(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 16 {
        return None;
    }
    let s = std::str::from_utf8(b).ok()?;
    if !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// The names of a header row (fields unquoted, as UTF-8 text).
pub fn header_names(line: &[u8], dialect: Dialect) -> Result<Vec<String>, String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut sc = Scratch::default();
    split_fields(line, dialect, &mut sc)?;
    (0..sc.spans.len())
        .map(|i| {
            String::from_utf8(sc.field(i).to_vec())
                .map_err(|_| format!("header field {} is not UTF-8", i + 1))
        })
        .collect()
}

/// A line's fields (unquoted), reused from line to line.
#[derive(Default)]
struct Scratch {
    buf: Vec<u8>,
    spans: Vec<(usize, usize)>,
}

impl Scratch {
    fn field(&self, i: usize) -> &[u8] {
        let (a, b) = self.spans[i];
        &self.buf[a..b]
    }
}

/// Split `line` (no `\n`, no trailing `\r`) into `sc`'s fields.
fn split_fields(line: &[u8], dialect: Dialect, sc: &mut Scratch) -> Result<(), String> {
    sc.buf.clear();
    sc.spans.clear();
    let sep = dialect.sep();
    if dialect == Dialect::Tsv {
        sc.buf.extend_from_slice(line);
        let mut start = 0;
        for k in memchr::memchr_iter(sep, line) {
            sc.spans.push((start, k));
            start = k + 1;
        }
        sc.spans.push((start, line.len()));
        return Ok(());
    }
    let mut at = 0usize;
    loop {
        let start = sc.buf.len();
        if line.get(at) == Some(&b'"') {
            at += 1;
            loop {
                match line.get(at) {
                    None => {
                        return Err(format!(
                            "field {}: a quoted field without its closing quote (a line break inside quotes is not supported)",
                            sc.spans.len() + 1
                        ))
                    }
                    Some(b'"') if line.get(at + 1) == Some(&b'"') => {
                        sc.buf.push(b'"');
                        at += 2;
                    }
                    Some(b'"') => {
                        at += 1;
                        break;
                    }
                    Some(&c) => {
                        sc.buf.push(c);
                        at += 1;
                    }
                }
            }
            if at < line.len() && line[at] != sep {
                return Err(format!(
                    "field {}: text after the closing quote",
                    sc.spans.len() + 1
                ));
            }
        } else {
            let end = memchr::memchr(sep, &line[at..]).map_or(line.len(), |k| at + k);
            if memchr::memchr(b'"', &line[at..end]).is_some() {
                return Err(format!(
                    "field {}: a quote inside an unquoted field (quote the whole field and double the quote)",
                    sc.spans.len() + 1
                ));
            }
            sc.buf.extend_from_slice(&line[at..end]);
            at = end;
        }
        sc.spans.push((start, sc.buf.len()));
        if at >= line.len() {
            return Ok(());
        }
        at += 1; // the separator
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &str) -> Vec<String> {
        s.split(',').map(String::from).collect()
    }

    #[test]
    fn text_key_is_fnv1a_then_mix64() {
        // FNV-1a 64 of "" is the offset basis, of "a" 0xaf63dc4c8601ec8c (published).
        assert_eq!(text_key(b""), mix64(0xcbf2_9ce4_8422_2325));
        assert_eq!(text_key(b"a"), mix64(0xaf63_dc4c_8601_ec8c));
        assert_ne!(text_key(b"ab"), text_key(b"ba"));
    }

    #[test]
    fn positional_specs_repeat_and_take_options() {
        let c = resolve("label,log*13,hex*26", None).unwrap();
        assert_eq!(c.len(), 40);
        assert_eq!(
            (c[1].role.clone(), c[39].role.clone()),
            (Role::Log, Role::Hex)
        );
        let c = resolve(
            "label,cat:list=|:weight=:,cat:list=,*2,weights:3,skip",
            None,
        )
        .unwrap();
        assert_eq!(c.len(), 6);
        assert_eq!((c[1].list, c[1].pair), (Some('|'), Some(':')));
        assert_eq!((c[2].list, c[3].list), (Some(','), Some(',')));
        assert_eq!(c[4].role, Role::Weights("3".into()));
    }

    #[test]
    fn avazu_by_name_in_one_line() {
        let mut h = names("id,click,hour,C1,banner_pos,site_id,site_domain,site_category");
        h.extend(names(
            "app_id,app_domain,app_category,device_id,device_ip,device_model",
        ));
        h.extend(names(
            "device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21",
        ));
        let c = resolve("click=label,id=skip,*=cat", Some(&h)).unwrap();
        assert_eq!(c.len(), 24);
        assert_eq!(c[1].role, Role::Label);
        assert_eq!(c[0].role, Role::Skip);
        assert!(c[2..].iter().all(|x| x.role == Role::Cat));
        assert_eq!(c[23].name, "C21");
    }

    #[test]
    fn bad_specs_are_refused_with_a_reason() {
        let h = names("y,a,b,w");
        for (spec, hdr, want) in [
            ("dense,cat", None, "0 label columns"),
            ("label,label,cat", None, "2 label columns"),
            ("label,dense", None, "no cat or hex"),
            ("label,cat,foo", None, "unknown role"),
            ("label,cat*0", None, "count after *"),
            ("label,dense:list=|", None, "apply to cat and hex"),
            ("label,cat:size=3", None, "unknown option"),
            ("y=label,a=cat", None, "need --header"),
            (
                "y=label,zz=cat,*=skip",
                Some(&h),
                "unknown column name \"zz\"",
            ),
            ("y=label,a=cat,a=skip,*=skip", Some(&h), "two roles"),
            ("y=label,a=cat", Some(&h), "\"b\" has no role"),
            (
                "y=label,a=cat,w=weights:b,*=skip",
                Some(&h),
                "no cat or hex column named \"b\"",
            ),
            (
                "y=label,a=cat:weight=:,w=weights:a,*=skip",
                Some(&h),
                "weights twice",
            ),
            (
                "label,cat",
                Some(&h),
                "2 columns in the SPEC, 4 in the header",
            ),
        ] {
            let e = resolve(spec, hdr.map(|v| &v[..])).unwrap_err();
            assert!(e.contains(want), "{spec}: {e}");
        }
    }

    fn parse(cols: &ColumnLayout, text: &str) -> Block {
        let mut b = Block::new(cols.n_dense(), cols.n_cat());
        cols.parse_lines(text.as_bytes(), &mut b);
        b
    }

    #[test]
    fn csv_quotes_lists_hex_and_numbers_parse_to_their_values() {
        let c = ColumnLayout::new(
            "label,dense,log,cat,cat:list=|,hex:list=;,skip",
            None,
            Dialect::Csv,
        )
        .unwrap();
        let b = parse(
            &c,
            "1,-1.5e1,3,\"a, \"\"b\"\"\",x|y|x,ff;10,whatever\r\n0,,,,,,\n",
        );
        assert_eq!((b.n, b.lines, b.bad), (2, 2, 0), "{:?}", b.first_bad);
        assert_eq!(b.labels, vec![1.0, 0.0]);
        assert_eq!(b.dense, vec![-15.0, (3.0f64).ln_1p() as f32, 0.0, 0.0]);
        assert_eq!(b.keys[0].ids, vec![text_key(b"a, \"b\"")]);
        assert_eq!(b.keys[0].offsets, vec![0, 1, 1]);
        let (x, y) = (text_key(b"x"), text_key(b"y"));
        assert_eq!(b.keys[1].ids, vec![x, y, x]);
        assert_eq!(b.keys[1].offsets, vec![0, 3, 3]);
        assert_eq!(b.keys[2].ids, vec![0xff, 0x10]);
        // log clamps negatives to 0.
        let b = parse(&c, "0,0,-5,a,b,1,\n");
        assert_eq!(b.dense, vec![0.0, 0.0]);
        // tsv: quotes and commas are text.
        let t = ColumnLayout::new("label,cat,cat", None, Dialect::Tsv).unwrap();
        let b = parse(&t, "1\t\"a,b\"\tc\n");
        assert_eq!(b.keys[0].ids, vec![text_key(b"\"a,b\"")]);
        assert_eq!(b.keys[1].ids, vec![text_key(b"c")]);
    }

    #[test]
    fn bad_lines_name_the_column_and_leave_the_block_as_it_was() {
        let h = names("y,price,site,tags");
        let c = ColumnLayout::new(
            "y=label,price=dense,site=cat,tags=hex:list=|",
            Some(&h),
            Dialect::Csv,
        )
        .unwrap();
        assert_eq!(c.table_names(), vec!["site", "tags"]);
        for (line, want) in [
            ("1,2,a", "3 comma-separated fields, expected 4"),
            ("1,2,a,b,c", "5 comma-separated fields, expected 4"),
            ("2,2,a,b", "column 1 (\"y\"): \"2\" is not a label"),
            (",2,a,b", "column 1 (\"y\"): \"\" is not a label"),
            (
                "1,x,a,b",
                "column 2 (\"price\"): \"x\" is not a finite number",
            ),
            ("1,nan,a,b", "\"nan\" is not a finite number"),
            (
                "1,2,a,b||c",
                "column 4 (\"tags\"): \"b||c\" has an empty item",
            ),
            ("1,2,a,b|", "has an empty item"),
            (
                "1,2,a,g",
                "column 4 (\"tags\"): \"g\" is not 1 to 16 hex digits",
            ),
            ("1,2,a,11111111111111111", "is not 1 to 16 hex digits"),
            ("1,2,\"a,b", "without its closing quote"),
            ("1,2,\"a\"x,b", "text after the closing quote"),
            ("1,2,a\"b,c", "a quote inside an unquoted field"),
            ("", "empty line"),
        ] {
            let text = format!("0,1,ok,f\n{line}\n1,2,ok,e\n");
            let b = parse(&c, &text);
            assert_eq!((b.n, b.lines, b.bad), (2, 3, 1), "{line}");
            assert_eq!(b.first_bad[0].0, 1);
            assert!(
                b.first_bad[0].1.contains(want),
                "{line}: {}",
                b.first_bad[0].1
            );
            assert_eq!(b.keys[1].ids, vec![0xf, 0xe], "{line}");
            assert_eq!(b.dense, vec![1.0, 2.0]);
        }
        // Without a header, columns are numbered.
        let c = ColumnLayout::new("label,dense,cat", None, Dialect::Tsv).unwrap();
        let b = parse(&c, "1\tz\ta\n");
        assert_eq!(
            b.first_bad[0].1,
            "column 2: \"z\" is not a finite number or empty"
        );
    }

    #[test]
    fn weights_parse_beside_their_ids_and_bad_ones_name_the_column() {
        let (a, b) = (text_key(b"a"), text_key(b"b"));
        let c = ColumnLayout::new(
            "label,cat:list=|:weight=:,cat:list=|,weights:3",
            None,
            Dialect::Csv,
        )
        .unwrap();
        assert_eq!(c.weighted(), &[true, true]);
        let blk = parse(&c, "1,a:2|b:0.5,a|b,1.5|-1\n0,,,\n");
        assert_eq!((blk.n, blk.bad), (2, 0), "{:?}", blk.first_bad);
        assert_eq!(blk.keys[0].ids, vec![a, b]);
        assert_eq!(blk.weights[0], vec![2.0, 0.5]);
        assert_eq!(blk.weights[1], vec![1.5, -1.0]);
        for (line, want) in [
            (
                "1,a:x,a,1",
                "column 2: \"a:x\" has a weight that is not a finite number",
            ),
            ("1,a:inf,a,1", "not a finite number"),
            ("1,a:1e39,a,1", "not a finite number"),
            ("1,a,a,1", "without its weight"),
            (
                "1,a:1,a|b,1",
                "column 4: \"1\" holds 1 weights for the 2 ids of column 3",
            ),
            ("1,a:1,a,nan", "not a finite number"),
            ("1,a:1,,1", "holds 1 weights for the 0 ids"),
        ] {
            let blk = parse(&c, &format!("0,b:1,b,3\n{line}\n"));
            assert_eq!((blk.n, blk.bad), (1, 1), "{line}");
            assert!(
                blk.first_bad[0].1.contains(want),
                "{line}: {}",
                blk.first_bad[0].1
            );
            assert_eq!(blk.weights[0].len(), blk.keys[0].ids.len(), "{line}");
            assert_eq!(blk.weights[1], vec![3.0], "{line}");
        }
        assert!(ColumnLayout::new("label,cat", None, Dialect::Csv)
            .unwrap()
            .weighted()
            .iter()
            .all(|w| !w));
        let spec = "skip,label,cat";
        assert!(ColumnLayout::label_is_valid(spec, b"x,1,a", Dialect::Csv));
        assert!(!ColumnLayout::label_is_valid(
            spec,
            b"id,click,a",
            Dialect::Csv
        ));
        assert!(!ColumnLayout::label_is_valid(
            spec,
            b"x,\"click\",a\r",
            Dialect::Csv
        ));
        assert_eq!(
            header_names(b"id,\"a,b\",c\r", Dialect::Csv).unwrap(),
            vec!["id".to_string(), "a,b".into(), "c".into()]
        );
    }
}
