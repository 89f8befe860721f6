//! The Criteo text format and its line parser: bytes in, columns out, no allocation
//! per line.
//!
//! A Criteo file has one example per line, fields separated by tabs:
//!
//! | column | count | content | parsed as |
//! |---|---|---|---|
//! | label | 1 | `0` or `1` | `0.0` / `1.0` (anything else is a bad line) |
//! | `I1`..`I13` | 13 | an integer (optional `-`, then 1 to 18 decimal digits), or empty (missing) | `ln(1 + max(x, 0))` as f32; missing is `0.0` |
//! | `C1`..`C26` | 26 | 1 to 16 hex digits (either case), or empty (missing) | the u64 value of the digits, one key in that table's bag; missing is an empty bag |
//!
//! The dense transform is DLRM's (`np.log(x + 1)` after clamping negatives and filling
//! missing values with 0): [`dense_value`] computes `ln_1p` in f64 and rounds once to
//! f32, so the stored value is the f32 nearest to the exact `ln(1 + x)` (up to the
//! last bit of the libm `log1p`), whatever the platform's f32 arithmetic.
//!
//! A line ends at `\n`; one `\r` before it is dropped (`\r\n` files), as is nothing
//! else: spaces are part of a field (and make it bad). A file's last line may lack its
//! `\n`. An empty line is a bad line.
//!
//! [`Layout`] generalizes the column order (`--format tsv --columns
//! label,dense*13,cat*26,skip`): any order of exactly one `label`, `dense`, `cat` and
//! `skip` (ignored) columns, `KIND*N` repeating a kind. Dense columns are named `I1`,
//! `I2`, ... and categorical ones `C1`, `C2`, ... in their order, whatever the layout.
//!
//! A refused line is described by [`BadField`] (which field, what is wrong) and
//! turned into text only then ([`describe`]): the caller adds the file and line.

use super::ingest::Block;

/// Fields of a Criteo line.
pub const CRITEO_FIELDS: usize = 40;
pub const CRITEO_DENSE: usize = 13;
pub const CRITEO_CAT: usize = 26;
/// Most decimal digits of a dense value (`10^18 - 1` fits an i64 and a u64).
pub const MAX_DENSE_DIGITS: usize = 18;
/// Most hex digits of a categorical value (64 bits).
pub const MAX_HEX_DIGITS: usize = 16;

/// What a column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Col {
    Label,
    Dense,
    Cat,
    Skip,
}

/// The columns of a line, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    cols: Vec<Col>,
    /// Index among its kind (dense or categorical) of each column.
    index: Vec<usize>,
    n_dense: usize,
    n_cat: usize,
}

impl Layout {
    fn from_cols(cols: Vec<Col>) -> Result<Layout, String> {
        let mut index = Vec::with_capacity(cols.len());
        let (mut nd, mut nc, mut nl) = (0, 0, 0);
        for c in &cols {
            index.push(match c {
                Col::Dense => {
                    nd += 1;
                    nd - 1
                }
                Col::Cat => {
                    nc += 1;
                    nc - 1
                }
                Col::Label => {
                    nl += 1;
                    0
                }
                Col::Skip => 0,
            });
        }
        if nl != 1 {
            return Err(format!("{nl} label columns, expected exactly 1"));
        }
        if nc == 0 {
            return Err("no cat column (a click log needs at least one table)".into());
        }
        Ok(Layout {
            cols,
            index,
            n_dense: nd,
            n_cat: nc,
        })
    }

    /// Criteo's: `label,dense*13,cat*26`.
    pub fn criteo() -> Layout {
        let mut cols = vec![Col::Label];
        cols.extend([Col::Dense; CRITEO_DENSE]);
        cols.extend([Col::Cat; CRITEO_CAT]);
        Layout::from_cols(cols).expect("the Criteo layout is valid")
    }

    /// A layout from its spec: comma-separated `label`, `dense`, `cat` or `skip`, each
    /// optionally `*N` (N >= 1 times); e.g. `label,dense*13,cat*26`.
    pub fn parse(spec: &str) -> Result<Layout, String> {
        let mut cols = Vec::new();
        for part in spec.split(',') {
            let part = part.trim();
            let (kind, times) = match part.split_once('*') {
                Some((k, n)) => {
                    let n: usize = n
                        .trim()
                        .parse()
                        .ok()
                        .filter(|&n| (1..=1_000_000).contains(&n))
                        .ok_or_else(|| {
                            format!("{part:?}: the count after * must be in 1..=1000000")
                        })?;
                    (k.trim(), n)
                }
                None => (part, 1),
            };
            let col = match kind {
                "label" => Col::Label,
                "dense" => Col::Dense,
                "cat" => Col::Cat,
                "skip" => Col::Skip,
                _ => {
                    return Err(format!(
                        "{part:?}: a column is label, dense, cat or skip (optionally KIND*N)"
                    ))
                }
            };
            if cols.len() + times > 1_000_000 {
                return Err("more than 1000000 columns".into());
            }
            cols.extend(std::iter::repeat_n(col, times));
        }
        Layout::from_cols(cols)
    }

    /// Fields of a line.
    pub fn fields(&self) -> usize {
        self.cols.len()
    }

    pub fn n_dense(&self) -> usize {
        self.n_dense
    }

    /// Categorical columns (tables).
    pub fn n_cat(&self) -> usize {
        self.n_cat
    }

    /// The name of field `i` (0-based): `label`, `I3`, `C17`, or `field 41` for a
    /// skipped one.
    pub fn column_name(&self, i: usize) -> String {
        match self.cols.get(i) {
            Some(Col::Label) => "label".into(),
            Some(Col::Dense) => format!("I{}", self.index[i] + 1),
            Some(Col::Cat) => format!("C{}", self.index[i] + 1),
            Some(Col::Skip) | None => format!("field {}", i + 1),
        }
    }

    /// The spec that [`Layout::parse`] reads back into this layout (runs collapsed).
    pub fn spec(&self) -> String {
        let name = |c: Col| match c {
            Col::Label => "label",
            Col::Dense => "dense",
            Col::Cat => "cat",
            Col::Skip => "skip",
        };
        let mut parts: Vec<String> = Vec::new();
        let mut i = 0;
        while i < self.cols.len() {
            let c = self.cols[i];
            let mut j = i + 1;
            while j < self.cols.len() && self.cols[j] == c {
                j += 1;
            }
            parts.push(if j - i == 1 {
                name(c).to_string()
            } else {
                format!("{}*{}", name(c), j - i)
            });
            i = j;
        }
        parts.join(",")
    }

    /// Names of the tables (`C1`, `C2`, ...).
    pub fn table_names(&self) -> Vec<String> {
        (1..=self.n_cat).map(|i| format!("C{i}")).collect()
    }
}

/// Why a line was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadField {
    /// The line has this many fields, not the layout's.
    Fields(usize),
    /// Nothing at all (after a `\r`).
    Empty,
    /// The label (at field `i`) is not `0` or `1`.
    Label(usize),
    /// Dense field `i` is not an integer of at most [`MAX_DENSE_DIGITS`] digits.
    Dense(usize),
    /// Categorical field `i` is not 1 to 16 hex digits.
    Cat(usize),
    /// No line end within the reader's block (see `ingest`).
    TooLong(usize),
}

/// The message of a refused line (without file and line), quoting the bad field.
pub fn describe(layout: &Layout, line: &[u8], bad: BadField) -> String {
    let field = |i: usize| -> String {
        let f = line.split(|&b| b == b'\t').nth(i).unwrap_or(&[]);
        crate::error::quote(&String::from_utf8_lossy(f))
    };
    let expected = layout.fields();
    match bad {
        BadField::Fields(n) => format!(
            "{n} tab-separated field{}, expected {expected}",
            if n == 1 { "" } else { "s" }
        ),
        BadField::Empty => format!("empty line (expected {expected} tab-separated fields)"),
        BadField::Label(i) => format!("label {}: expected 0 or 1", field(i)),
        BadField::Dense(i) => format!(
            "column {}: {} is not an integer (optional -, 1 to {MAX_DENSE_DIGITS} digits) or empty",
            layout.column_name(i),
            field(i)
        ),
        BadField::Cat(i) => format!(
            "column {}: {} is not 1 to {MAX_HEX_DIGITS} hex digits or empty",
            layout.column_name(i),
            field(i)
        ),
        BadField::TooLong(limit) => format!(
            "no line end within {} (not a file of text lines?)",
            crate::metrics::human_bytes(limit as u64)
        ),
    }
}

/// DLRM's dense transform: `ln(1 + max(x, 0))`, computed in f64 (`ln_1p`) and
/// rounded once to f32. Values below [`SMALL_VALUES`] (most of Criteo's) come from a
/// table of the same function.
#[inline]
pub fn dense_value(x: i64) -> f32 {
    if x <= 0 {
        0.0
    } else if x < SMALL_VALUES as i64 {
        SMALL_LN_1P[x as usize]
    } else {
        dense_value_ref(x)
    }
}

/// [`dense_value`] without the table.
fn dense_value_ref(x: i64) -> f32 {
    if x <= 0 {
        0.0
    } else {
        (x as f64).ln_1p() as f32
    }
}

/// Dense values with a precomputed transform.
pub const SMALL_VALUES: usize = 1 << 12;
static SMALL_LN_1P: std::sync::LazyLock<Vec<f32>> =
    std::sync::LazyLock::new(|| (0..SMALL_VALUES as i64).map(dense_value_ref).collect());

/// Hex digit values; 0xff for any other byte.
const HEX: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// Parse a dense field starting at `at`; returns the value (missing: 0) and the index
/// of the byte after the field (a tab or the end of the line).
#[inline]
fn dense_field(line: &[u8], mut at: usize) -> Option<(i64, usize)> {
    let start = at;
    let neg = line.get(at) == Some(&b'-');
    if neg {
        at += 1;
    }
    let digits = at;
    let mut v: i64 = 0;
    while at < line.len() {
        let c = line[at];
        if c == b'\t' {
            break;
        }
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.wrapping_mul(10).wrapping_add(d as i64);
        at += 1;
    }
    let n = at - digits;
    if n == 0 {
        // Missing (empty field) is 0; a lone "-" is bad.
        return (at == start).then_some((0, at));
    }
    if n > MAX_DENSE_DIGITS {
        return None;
    }
    Some((if neg { -v } else { v }, at))
}

/// Parse a categorical field at `at`: `Some((None, end))` when missing.
#[inline]
fn cat_field(line: &[u8], mut at: usize) -> Option<(Option<u64>, usize)> {
    let start = at;
    let mut v: u64 = 0;
    while at < line.len() {
        let c = line[at];
        if c == b'\t' {
            break;
        }
        let h = HEX[c as usize];
        if h == 0xff {
            return None;
        }
        v = (v << 4) | h as u64;
        at += 1;
    }
    match at - start {
        0 => Some((None, at)),
        n if n <= MAX_HEX_DIGITS => Some((Some(v), at)),
        _ => None,
    }
}

/// Parse one line (without its `\n`; a trailing `\r` is dropped) and append the
/// example to `out`. On a bad line `out` is left as it was.
pub fn parse_line(layout: &Layout, line: &[u8], out: &mut Block) -> Result<(), BadField> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return Err(BadField::Empty);
    }
    let nd0 = out.dense.len();
    let r = parse_fields(layout, line, out);
    if let Err(bad) = r {
        out.dense.truncate(nd0);
        for k in &mut out.keys {
            let end = k.offsets.last().copied().unwrap_or(0) as usize;
            k.ids.truncate(end);
        }
        // A field that fails, or a count that differs: the count is the clearer error.
        let n = memchr::memchr_iter(b'\t', line).count() + 1;
        return Err(if n != layout.fields() {
            BadField::Fields(n)
        } else {
            bad
        });
    }
    for k in &mut out.keys {
        let len = u32::try_from(k.ids.len()).expect("a block holds fewer than 2^32 keys");
        k.offsets.push(len);
    }
    out.n += 1;
    Ok(())
}

/// The fields of a non-empty line into `out` (dense values, keys and label; offsets
/// and `n` are the caller's).
#[inline]
fn parse_fields(layout: &Layout, line: &[u8], out: &mut Block) -> Result<(), BadField> {
    let last = layout.cols.len() - 1;
    let mut at = 0usize;
    let mut label = 0.0f32;
    for (i, &col) in layout.cols.iter().enumerate() {
        let end = match col {
            Col::Dense => {
                let (v, end) = dense_field(line, at).ok_or(BadField::Dense(i))?;
                out.dense.push(dense_value(v));
                end
            }
            Col::Cat => {
                let (v, end) = cat_field(line, at).ok_or(BadField::Cat(i))?;
                if let Some(v) = v {
                    out.keys[layout.index[i]].ids.push(v);
                }
                end
            }
            Col::Label => {
                let end = at + 1;
                label = match line.get(at) {
                    Some(b'0') => 0.0,
                    Some(b'1') => 1.0,
                    _ => return Err(BadField::Label(i)),
                };
                if end < line.len() && line[end] != b'\t' {
                    return Err(BadField::Label(i));
                }
                end
            }
            Col::Skip => memchr::memchr(b'\t', &line[at..]).map_or(line.len(), |k| at + k),
        };
        // `end` is a tab or the end of the line.
        if i < last {
            if end >= line.len() {
                return Err(BadField::Fields(i + 1));
            }
            at = end + 1;
        } else if end != line.len() {
            return Err(BadField::Fields(layout.fields() + 1));
        }
    }
    out.labels.push(label);
    Ok(())
}

/// Parse every line of `text` (complete lines: each ends with `\n`, except perhaps
/// the last) into `out`: good lines become examples, bad ones are counted and the
/// first few recorded (see [`Block::push_bad`]). `out.lines` counts both.
pub fn parse_lines(layout: &Layout, text: &[u8], out: &mut Block) {
    let mut start = 0usize;
    while start < text.len() {
        let end = memchr::memchr(b'\n', &text[start..]).map_or(text.len(), |k| start + k);
        let line = &text[start..end];
        if let Err(bad) = parse_line(layout, line, out) {
            out.push_bad(out.lines, || describe(layout, line, bad));
        }
        out.lines += 1;
        start = end + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(layout: &Layout) -> Block {
        Block::new(layout.n_dense(), layout.n_cat())
    }

    /// A Criteo line from its label, dense and categorical fields.
    fn line(label: &str, dense: &[&str], cat: &[&str]) -> String {
        let mut f = vec![label.to_string()];
        f.extend(dense.iter().map(|s| s.to_string()));
        f.extend(cat.iter().map(|s| s.to_string()));
        f.join("\t")
    }

    fn full(label: &str) -> (Vec<String>, Vec<String>, String) {
        let dense: Vec<String> = (0..13).map(|j| j.to_string()).collect();
        let cat: Vec<String> = (0..26).map(|c| format!("{:08x}", c * 0x1111)).collect();
        let d: Vec<&str> = dense.iter().map(|s| s.as_str()).collect();
        let c: Vec<&str> = cat.iter().map(|s| s.as_str()).collect();
        let l = line(label, &d, &c);
        (dense, cat, l)
    }

    fn one(l: &str) -> Result<Block, (BadField, String)> {
        let lay = Layout::criteo();
        let mut b = block(&lay);
        match parse_line(&lay, l.as_bytes(), &mut b) {
            Ok(()) => Ok(b),
            Err(e) => {
                // The block is untouched by a bad line.
                assert_eq!(b, block(&lay), "{l:?}");
                Err((e, describe(&lay, l.as_bytes(), e)))
            }
        }
    }

    #[test]
    fn a_full_line_parses_to_its_values() {
        let (_, _, l) = full("1");
        let b = one(&l).unwrap();
        assert_eq!(b.n, 1);
        assert_eq!(b.labels, vec![1.0]);
        let want: Vec<f32> = (0..13).map(|j| (j as f64).ln_1p() as f32).collect();
        assert_eq!(b.dense, want);
        for (c, k) in b.keys.iter().enumerate() {
            assert_eq!(k.offsets, vec![0, 1]);
            assert_eq!(k.ids, vec![(c * 0x1111) as u64]);
        }
    }

    #[test]
    fn dense_transform_is_ln_1p_in_f64_rounded_once() {
        for (x, want) in [
            (0i64, 0.0f32),
            (1, std::f64::consts::LN_2 as f32),
            (2, 3f64.ln() as f32),
            (9, 10f64.ln() as f32),
            (1_000_000, 1_000_001f64.ln() as f32),
            (999_999_999_999_999_999, 1e18f64.ln() as f32),
            (-1, 0.0),
            (-3, 0.0),
            (i64::MIN + 1, 0.0),
        ] {
            assert_eq!(dense_value(x).to_bits(), want.to_bits(), "x = {x}");
        }
        // An f32 computation would differ in the last bit for some values; the f64
        // path is the reference, and the table holds its values.
        for x in (-5..SMALL_VALUES as i64 + 100).chain([1 << 20, 1 << 40]) {
            let want = if x > 0 {
                (x as f64).ln_1p() as f32
            } else {
                0.0
            };
            assert_eq!(dense_value(x).to_bits(), want.to_bits(), "x = {x}");
        }
    }

    #[test]
    fn missing_fields_negative_values_and_either_case_hex() {
        let mut dense = vec![""; 13];
        dense[1] = "-2";
        dense[4] = "-0";
        dense[5] = "007";
        dense[12] = "123456789012345678";
        let mut cat = vec![""; 26];
        cat[0] = "68fd1e64";
        cat[3] = "ABCDEF01";
        cat[7] = "f";
        cat[25] = "FFFFFFFFffffffff";
        let b = one(&line("0", &dense, &cat)).unwrap();
        assert_eq!(b.labels, vec![0.0]);
        let mut want = vec![0.0f32; 13];
        want[5] = 8f64.ln() as f32;
        want[12] = (123456789012345678f64).ln_1p() as f32;
        assert_eq!(b.dense, want);
        for (c, k) in b.keys.iter().enumerate() {
            let expect: Vec<u64> = match c {
                0 => vec![0x68fd1e64],
                3 => vec![0xabcdef01],
                7 => vec![0xf],
                25 => vec![u64::MAX],
                _ => vec![],
            };
            assert_eq!(k.ids, expect, "C{}", c + 1);
            assert_eq!(k.offsets, vec![0, expect.len() as u32]);
        }
        // Every field missing but the label.
        let b = one(&line("1", &[""; 13], &[""; 26])).unwrap();
        assert_eq!(b.dense, vec![0.0; 13]);
        assert!(b
            .keys
            .iter()
            .all(|k| k.ids.is_empty() && k.offsets == [0, 0]));
    }

    #[test]
    fn crlf_and_the_last_line_without_newline() {
        let (_, _, l) = full("1");
        let lay = Layout::criteo();
        let text = format!("{l}\r\n{l}\n{l}");
        let mut b = block(&lay);
        parse_lines(&lay, text.as_bytes(), &mut b);
        assert_eq!((b.n, b.lines, b.bad), (3, 3, 0));
        assert_eq!(b.keys[0].offsets, vec![0, 1, 2, 3]);
        // One \r only: a second one belongs to the last field.
        let e = one(&format!("{l}\r\r")).unwrap_err();
        assert_eq!(e.0, BadField::Cat(39));
    }

    #[test]
    fn bad_lines_are_precise() {
        let (_, cat, l) = full("0");
        let lay = Layout::criteo();
        let cases: Vec<(String, BadField, &str)> = vec![
            (
                l.replacen('0', "2", 1),
                BadField::Label(0),
                "label \"2\": expected 0 or 1",
            ),
            (format!("01{}", &l[1..]), BadField::Label(0), "label \"01\""),
            (
                l[1..].to_string(),
                BadField::Label(0),
                "label \"\": expected 0 or 1",
            ),
            (
                l.replacen("\t3\t", "\t3x\t", 1),
                BadField::Dense(4),
                "column I4: \"3x\"",
            ),
            (
                l.replacen("\t3\t", "\t-\t", 1),
                BadField::Dense(4),
                "column I4: \"-\"",
            ),
            (
                l.replacen("\t3\t", "\t+3\t", 1),
                BadField::Dense(4),
                "column I4",
            ),
            (
                l.replacen("\t3\t", "\t1234567890123456789\t", 1),
                BadField::Dense(4),
                "not an integer",
            ),
            (
                l.replacen("\t3\t", "\t 3\t", 1),
                BadField::Dense(4),
                "column I4: \" 3\"",
            ),
            (
                l.replacen(&cat[16], "zz123456", 1),
                BadField::Cat(30),
                "column C17: \"zz123456\" is not 1 to 16 hex digits",
            ),
            (
                l.replacen(&cat[16], "0123456789abcdef0", 1),
                BadField::Cat(30),
                "column C17",
            ),
            (
                format!("{l}\t"),
                BadField::Fields(41),
                "41 tab-separated fields, expected 40",
            ),
            (
                format!("{l}\tdeadbeef"),
                BadField::Fields(41),
                "41 tab-separated fields",
            ),
            (
                l.rsplit_once('\t').unwrap().0.to_string(),
                BadField::Fields(39),
                "39 tab-separated fields, expected 40",
            ),
            (
                "1".into(),
                BadField::Fields(1),
                "1 tab-separated field, expected 40",
            ),
            (
                "1 2 3".into(),
                BadField::Fields(1),
                "1 tab-separated field,",
            ),
            (String::new(), BadField::Empty, "empty line"),
            ("\r".into(), BadField::Empty, "empty line"),
        ];
        for (text, want, msg) in cases {
            let (got, m) = one(&text).unwrap_err();
            assert_eq!(got, want, "{text:?}");
            assert!(m.contains(msg), "{m} does not contain {msg}");
        }
        // A missing field with a bad one: the count wins.
        let short = l.replacen("\t3\t", "\tx\t", 1);
        let short = short.rsplit_once('\t').unwrap().0;
        assert_eq!(one(short).unwrap_err().0, BadField::Fields(39));
        let _ = lay;
    }

    #[test]
    fn parse_lines_counts_and_records_bad_lines_in_order() {
        let (_, _, l) = full("1");
        let lay = Layout::criteo();
        let text = format!("{l}\n\n{l}\n2{}\n{l}\n", &l[1..]);
        let mut b = block(&lay);
        parse_lines(&lay, text.as_bytes(), &mut b);
        assert_eq!((b.n, b.lines, b.bad), (3, 5, 2));
        assert_eq!(b.first_bad.len(), 2);
        assert_eq!(b.first_bad[0].0, 1);
        assert!(b.first_bad[0].1.contains("empty line"));
        assert_eq!(b.first_bad[1].0, 3);
        assert!(b.first_bad[1].1.contains("label"));
        assert_eq!(b.labels, vec![1.0; 3]);
        assert_eq!(b.dense.len(), 39);
    }

    #[test]
    fn layouts_parse_and_name_their_columns() {
        let c = Layout::criteo();
        assert_eq!(Layout::parse("label,dense*13,cat*26").unwrap(), c);
        assert_eq!(c.spec(), "label,dense*13,cat*26");
        assert_eq!(c.column_name(0), "label");
        assert_eq!(c.column_name(3), "I3");
        assert_eq!(c.column_name(30), "C17");
        let l = Layout::parse("skip, cat*2 ,label,dense,skip").unwrap();
        assert_eq!((l.fields(), l.n_dense(), l.n_cat()), (6, 1, 2));
        assert_eq!(l.column_name(0), "field 1");
        assert_eq!(l.column_name(2), "C2");
        assert_eq!(l.column_name(4), "I1");
        assert_eq!(l.table_names(), vec!["C1", "C2"]);
        assert_eq!(Layout::parse(&l.spec()).unwrap(), l);
        for bad in [
            "",
            "dense,cat",
            "label,label,cat",
            "label,dense",
            "label,cat*0",
            "label,cat,foo",
            "label,cat*x",
        ] {
            assert!(Layout::parse(bad).is_err(), "{bad:?}");
        }

        let mut b = Block::new(1, 2);
        parse_line(&l, b"xyz\tab\t\t1\t-5\tanything at all", &mut b).unwrap();
        assert_eq!(b.labels, vec![1.0]);
        assert_eq!(b.dense, vec![0.0]);
        assert_eq!(b.keys[0].ids, vec![0xab]);
        assert!(b.keys[1].ids.is_empty());
    }
}
