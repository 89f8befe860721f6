//! Text click-log files (Criteo or another tab-separated [`Layout`]) as an
//! [`ExampleSource`]: one day per file, each rank reading its share.
//!
//! - A plain file of `S` bytes is cut into `P` byte ranges (`crate::data::graph::rows::
//!   block_range` of `S` over the ranks); a line belongs to the range that holds its
//!   first byte, so a rank starts after the first `\n` at or after its range's first
//!   byte minus one, and reads its last line to its end even past the range.
//! - A `.gz` file cannot be cut: the `g`-th `.gz` of the inputs is read whole by rank
//!   `g mod P` (multi-member gzip; a truncated or corrupt stream is an input error
//!   naming the file). An empty (0-byte) `.gz` is an empty day.
//!
//! Each rank reads its share in blocks of at most [`BLOCK_BYTES`] of whole lines, and
//! parses a block in up to as many pieces as rayon has threads, each piece into its
//! own [`Block`]; the pieces are handed on in order. A line longer than a block is a
//! bad line (skipped to its end). Memory per rank: the block, its parsed columns
//! (about 2.5 times the text for Criteo), and gzip's state.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::columns::ColumnLayout;
use super::criteo::{describe, parse_lines, BadField, Layout};
use super::ingest::{Block, ExampleSource};
use crate::blocks::block_range;
use crate::error::{Error, Result};
use crate::io::compress::is_gz;

/// Most text read and parsed at once per rank (8 MiB).
pub const BLOCK_BYTES: usize = 8 << 20;
/// Smallest piece of a block parsed by one thread.
const MIN_PIECE: usize = 256 << 10;

/// How the lines of the files are parsed.
#[derive(Clone, Debug, PartialEq)]
pub enum LineFormat {
    /// Criteo's parser over a tab-separated [`Layout`] (the fast path).
    Fixed(Layout),
    /// A csv/tsv [`ColumnLayout`]; with a header, each file's first line is skipped
    /// (and counted as a line, so errors still name the file's line numbers).
    Columns(ColumnLayout),
}

impl From<Layout> for LineFormat {
    fn from(l: Layout) -> Self {
        LineFormat::Fixed(l)
    }
}

impl LineFormat {
    pub fn n_dense(&self) -> usize {
        match self {
            LineFormat::Fixed(l) => l.n_dense(),
            LineFormat::Columns(c) => c.n_dense(),
        }
    }

    pub fn n_cat(&self) -> usize {
        match self {
            LineFormat::Fixed(l) => l.n_cat(),
            LineFormat::Columns(c) => c.n_cat(),
        }
    }

    fn header(&self) -> bool {
        matches!(self, LineFormat::Columns(c) if c.has_header())
    }

    /// Per table: whether it carries per-id weights.
    pub fn weighted(&self) -> Vec<bool> {
        match self {
            LineFormat::Fixed(l) => vec![false; l.n_cat()],
            LineFormat::Columns(c) => c.weighted().to_vec(),
        }
    }

    fn parse_lines(&self, text: &[u8], out: &mut Block) {
        match self {
            LineFormat::Fixed(l) => parse_lines(l, text, out),
            LineFormat::Columns(c) => c.parse_lines(text, out),
        }
    }

    fn describe_long(&self, limit: usize) -> String {
        match self {
            LineFormat::Fixed(l) => describe(l, b"", BadField::TooLong(limit)),
            LineFormat::Columns(_) => format!(
                "no line end within {} (not a file of text lines?)",
                crate::metrics::human_bytes(limit as u64)
            ),
        }
    }
}

/// The first line of `path` (plain or .gz) without its `\n` and `\r`, at most 1 MiB;
/// `None` for an empty file. Rank-local.
pub fn first_line(path: &Path) -> Result<Option<Vec<u8>>> {
    const MAX: usize = 1 << 20;
    let file = File::open(path).map_err(|e| Error::input(path, format!("cannot open: {e}")))?;
    let mut r: Box<dyn Read> = if is_gz(path) {
        Box::new(flate2::read::MultiGzDecoder::new(std::io::BufReader::new(
            file,
        )))
    } else {
        Box::new(file)
    };
    let mut out = Vec::new();
    let mut buf = [0u8; 64 << 10];
    loop {
        let k = match r.read(&mut buf) {
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::input(path, format!("cannot read: {e}"))),
        };
        if k == 0 {
            break;
        }
        if let Some(q) = memchr::memchr(b'\n', &buf[..k]) {
            out.extend_from_slice(&buf[..q]);
            break;
        }
        out.extend_from_slice(&buf[..k]);
        if out.len() > MAX {
            return Err(Error::input(path, "the first line is longer than 1 MiB"));
        }
    }
    if out.last() == Some(&b'\r') {
        out.pop();
    }
    Ok((!out.is_empty()).then_some(out))
}

/// One input file.
#[derive(Clone, Debug)]
struct Input {
    path: PathBuf,
    len: u64,
    gz: bool,
    /// `.gz` inputs: the rank that reads it.
    owner: usize,
}

/// This rank's part of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Share {
    /// Lines starting in bytes `lo..hi` of a plain file.
    Range(u64, u64),
    /// The whole (compressed) file.
    Whole,
    Nothing,
}

/// The text files of a click log, one per day, and this rank's share of each.
#[derive(Clone, Debug)]
pub struct TextFiles {
    layout: LineFormat,
    inputs: Vec<Input>,
    rank: usize,
    size: usize,
    block_bytes: usize,
}

impl TextFiles {
    /// Rank-local, identical on every rank: every input must be a readable file.
    pub fn new(
        paths: &[PathBuf],
        layout: impl Into<LineFormat>,
        rank: usize,
        size: usize,
    ) -> Result<Self> {
        let layout = layout.into();
        if paths.is_empty() {
            return Err(Error::Config("no input files".into()));
        }
        let mut inputs = Vec::with_capacity(paths.len());
        let mut gz_seen = 0usize;
        for p in paths {
            let meta = std::fs::metadata(p).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::input(p, "no such file"),
                _ => Error::input(p, format!("cannot read: {e}")),
            })?;
            if !meta.is_file() {
                return Err(Error::input(p, "not a file"));
            }
            File::open(p).map_err(|e| Error::input(p, format!("cannot open: {e}")))?;
            let gz = is_gz(p);
            inputs.push(Input {
                path: p.clone(),
                len: meta.len(),
                gz,
                owner: gz_seen % size.max(1),
            });
            gz_seen += usize::from(gz);
        }
        Ok(TextFiles {
            layout,
            inputs,
            rank,
            size,
            block_bytes: BLOCK_BYTES,
        })
    }

    /// Read in blocks of `bytes` instead of [`BLOCK_BYTES`] (tests; at least 64).
    pub fn with_block_bytes(mut self, bytes: usize) -> Self {
        self.block_bytes = bytes.max(64);
        self
    }

    /// Bytes of the input files (compressed size for `.gz`).
    pub fn file_bytes(&self) -> u64 {
        self.inputs.iter().map(|i| i.len).sum()
    }

    pub fn layout(&self) -> &LineFormat {
        &self.layout
    }

    fn share(&self, d: usize) -> Share {
        let i = &self.inputs[d];
        if i.gz {
            if i.owner == self.rank && i.len > 0 {
                Share::Whole
            } else {
                Share::Nothing
            }
        } else {
            let (lo, hi) = block_range(i.len, self.size, self.rank);
            if lo < hi {
                Share::Range(lo, hi)
            } else {
                Share::Nothing
            }
        }
    }

    /// Parse `text` (whole lines) in pieces into `blocks` and hand them to `f`;
    /// `header`: the first line is a header (counted as a line, not parsed).
    fn parse_and_hand_on(
        &self,
        text: &[u8],
        header: bool,
        blocks: &mut Vec<Block>,
        f: &mut dyn FnMut(&Block) -> Result<()>,
    ) -> Result<()> {
        let text = if header {
            memchr::memchr(b'\n', text).map_or(&text[text.len()..], |q| &text[q + 1..])
        } else {
            text
        };
        let mut pieces = split_lines(text, rayon::current_num_threads(), MIN_PIECE);
        if header && pieces.is_empty() {
            pieces.push(&text[..0]);
        }
        while blocks.len() < pieces.len() {
            blocks.push(Block::new(self.layout.n_dense(), self.layout.n_cat()));
        }
        let layout = &self.layout;
        blocks[..pieces.len()]
            .par_iter_mut()
            .zip(pieces.par_iter())
            .enumerate()
            .for_each(|(k, (b, piece))| {
                b.clear();
                b.bytes = piece.len() as u64;
                if header && k == 0 {
                    b.lines = 1;
                }
                layout.parse_lines(piece, b);
            });
        blocks[..pieces.len()].iter().try_for_each(f)
    }
}

/// `text` cut into at most `k` pieces of whole lines, each (but the last) at least
/// `min` bytes.
fn split_lines(text: &[u8], k: usize, min: usize) -> Vec<&[u8]> {
    let k = k.clamp(1, (text.len() / min.max(1)).max(1));
    let mut out = Vec::with_capacity(k);
    let mut start = 0;
    for i in 1..k {
        let target = (text.len() * i / k).max(start);
        if target >= text.len() {
            break;
        }
        let end = memchr::memchr(b'\n', &text[target..]).map_or(text.len(), |q| target + q + 1);
        out.push(&text[start..end]);
        start = end;
        if start >= text.len() {
            break;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// What the reader hands on.
enum Text<'a> {
    /// Whole lines (each ends with `\n` but perhaps the last line of the file).
    Lines(&'a [u8]),
    /// A line with no end within a block (skipped).
    LongLine,
}

/// Stream the lines of `r` (from its current position) that start before byte
/// `limit` (relative), in blocks of at most `buf.len()` bytes.
fn for_each_text(
    r: &mut dyn Read,
    limit: u64,
    buf: &mut [u8],
    read_err: &dyn Fn(std::io::Error) -> Error,
    f: &mut dyn FnMut(Text) -> Result<()>,
) -> Result<()> {
    const TAIL: u64 = 64 << 10;
    let cap_len = buf.len();
    let mut filled = 0usize;
    let mut consumed = 0u64; // bytes before buf[0]
    let mut eof = false;
    let mut skipping = false;
    loop {
        // Fill: up to the limit plus a little (to finish the last line), or the block.
        let in_range = limit.saturating_sub(consumed);
        let cap = in_range.saturating_add(TAIL).min(cap_len as u64) as usize;
        let cap = cap.max((filled as u64 + TAIL).min(cap_len as u64) as usize);
        while filled < cap && !eof {
            match r.read(&mut buf[filled..cap]) {
                Ok(0) => eof = true,
                Ok(k) => filled += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(read_err(e)),
            }
        }
        if skipping {
            match memchr::memchr(b'\n', &buf[..filled]) {
                Some(q) => {
                    buf.copy_within(q + 1..filled, 0);
                    filled -= q + 1;
                    consumed += (q + 1) as u64;
                    skipping = false;
                }
                None if eof => return Ok(()),
                None => {
                    consumed += filled as u64;
                    filled = 0;
                    continue;
                }
            }
        }
        if consumed >= limit || (eof && filled == 0) {
            return Ok(());
        }
        let p = limit - consumed; // lines starting before buf[p] are ours (p >= 1)
        let (cut, done) = if p <= filled as u64 {
            let from = p as usize - 1;
            match memchr::memchr(b'\n', &buf[from..filled]) {
                Some(q) => (from + q + 1, true),
                None if eof => (filled, true),
                // The last line is not complete yet: hand on the lines before it.
                None => (
                    memchr::memrchr(b'\n', &buf[..filled]).map_or(0, |q| q + 1),
                    false,
                ),
            }
        } else {
            match memchr::memrchr(b'\n', &buf[..filled]) {
                Some(q) => (q + 1, false),
                None if eof => (filled, true),
                None => (0, false),
            }
        };
        if cut == 0 {
            if eof {
                return Ok(());
            }
            if filled == cap_len {
                // No line end within a block: one bad line, skipped to its end.
                f(Text::LongLine)?;
                consumed += filled as u64;
                filled = 0;
                skipping = true;
            }
            continue;
        }
        f(Text::Lines(&buf[..cut]))?;
        if done {
            return Ok(());
        }
        buf.copy_within(cut..filled, 0);
        filled -= cut;
        consumed += cut as u64;
    }
}

/// The first line start at or after byte `lo` (> 0) of `file` (`len` if none).
fn align_start(file: &File, lo: u64, len: u64) -> std::io::Result<u64> {
    let mut b = [0u8; 1];
    file.read_exact_at(&mut b, lo - 1)?;
    if b[0] == b'\n' {
        return Ok(lo);
    }
    let mut buf = vec![0u8; 64 << 10];
    let mut pos = lo;
    while pos < len {
        let k = file.read_at(&mut buf, pos)?;
        if k == 0 {
            break;
        }
        if let Some(q) = memchr::memchr(b'\n', &buf[..k]) {
            return Ok(pos + q as u64 + 1);
        }
        pos += k as u64;
    }
    Ok(len.max(pos))
}

impl ExampleSource for TextFiles {
    fn days(&self) -> usize {
        self.inputs.len()
    }

    fn day_path(&self, d: usize) -> &Path {
        &self.inputs[d].path
    }

    fn n_dense(&self) -> usize {
        self.layout.n_dense()
    }

    fn tables(&self) -> usize {
        self.layout.n_cat()
    }

    fn weighted(&self) -> Vec<bool> {
        self.layout.weighted()
    }

    fn for_each_block(&self, d: usize, f: &mut dyn FnMut(&Block) -> Result<()>) -> Result<()> {
        let input = &self.inputs[d];
        let path = input.path.as_path();
        let share = self.share(d);
        if share == Share::Nothing {
            return Ok(());
        }
        let mut file =
            File::open(path).map_err(|e| Error::input(path, format!("cannot open: {e}")))?;
        let gz = input.gz;
        let read_err = |e: std::io::Error| {
            if gz {
                Error::input(
                    path,
                    format!("the compressed stream is truncated or corrupt: {e}"),
                )
            } else {
                Error::io(path, e)
            }
        };
        let mut buf = vec![0u8; self.block_bytes];
        let mut blocks: Vec<Block> = Vec::new();
        let mut long = Block::new(self.layout.n_dense(), self.layout.n_cat());
        let block_bytes = self.block_bytes;
        let layout = &self.layout;
        // The header: the first line of a share that starts the file.
        let mut header = layout.header() && matches!(share, Share::Whole | Share::Range(0, _));
        let mut on_text = |text: Text| -> Result<()> {
            let h = std::mem::take(&mut header);
            match text {
                Text::Lines(t) => self.parse_and_hand_on(t, h, &mut blocks, f),
                Text::LongLine => {
                    long.clear();
                    long.lines = 1;
                    long.push_bad(0, || layout.describe_long(block_bytes));
                    f(&long)
                }
            }
        };
        match share {
            Share::Whole => {
                let mut dec = flate2::read::MultiGzDecoder::new(std::io::BufReader::with_capacity(
                    1 << 20,
                    file,
                ));
                for_each_text(&mut dec, u64::MAX, &mut buf, &read_err, &mut on_text)
            }
            Share::Range(lo, hi) => {
                let start = if lo == 0 {
                    0
                } else {
                    align_start(&file, lo, input.len).map_err(read_err)?
                };
                if start >= hi {
                    return Ok(());
                }
                file.seek(SeekFrom::Start(start)).map_err(read_err)?;
                for_each_text(&mut file, hi - start, &mut buf, &read_err, &mut on_text)
            }
            Share::Nothing => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines "k\n" for k in 0..n, some long, as one text.
    fn numbered(n: usize) -> Vec<u8> {
        let mut t = Vec::new();
        for k in 0..n {
            t.extend_from_slice(format!("{k}").as_bytes());
            t.extend(std::iter::repeat_n(b'x', (k * 7) % 23));
            t.push(b'\n');
        }
        t
    }

    /// Every line's text read by `for_each_text` from `start` with `limit`.
    fn lines_of(text: &[u8], start: usize, limit: u64, block: usize) -> (Vec<String>, usize) {
        let mut r = std::io::Cursor::new(&text[start..]);
        let mut buf = vec![0u8; block];
        let mut out = Vec::new();
        let mut long = 0;
        for_each_text(&mut r, limit, &mut buf, &|e| Error::io("x", e), &mut |t| {
            match t {
                Text::Lines(b) => {
                    assert!(!b.is_empty());
                    for l in b.strip_suffix(b"\n").unwrap_or(b).split(|&c| c == b'\n') {
                        out.push(String::from_utf8(l.to_vec()).unwrap());
                    }
                }
                Text::LongLine => long += 1,
            }
            Ok(())
        })
        .unwrap();
        (out, long)
    }

    #[test]
    fn ranges_cover_every_line_once_whatever_the_block_and_rank_count() {
        let text = numbered(500);
        let want: Vec<String> = String::from_utf8(text.clone())
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.txt");
        std::fs::write(&p, &text).unwrap();
        let file = File::open(&p).unwrap();
        for block in [64usize, 100, 4096, 1 << 20] {
            for ranks in 1..=7 {
                let mut all = Vec::new();
                for r in 0..ranks {
                    let (lo, hi) = block_range(text.len() as u64, ranks, r);
                    let start = if lo == 0 {
                        0
                    } else {
                        align_start(&file, lo, text.len() as u64).unwrap()
                    };
                    if start >= hi {
                        continue;
                    }
                    let (l, long) = lines_of(&text, start as usize, hi - start, block);
                    assert_eq!(long, 0);
                    all.extend(l);
                }
                assert_eq!(all, want, "block {block}, {ranks} ranks");
            }
        }
        // Without a final newline.
        let (l, _) = lines_of(b"a\nbb\nccc", 0, u64::MAX, 64);
        assert_eq!(l, vec!["a", "bb", "ccc"]);
        let (l, _) = lines_of(b"", 0, u64::MAX, 64);
        assert!(l.is_empty());
    }

    #[test]
    fn a_line_longer_than_a_block_is_one_long_line() {
        let mut text = b"a\n".to_vec();
        text.extend(std::iter::repeat_n(b'y', 300));
        text.extend_from_slice(b"\nb\n");
        let (l, long) = lines_of(&text, 0, u64::MAX, 64);
        assert_eq!((l, long), (vec!["a".to_string(), "b".to_string()], 1));
        // At the end of the file, without a newline.
        let mut text = b"a\n".to_vec();
        text.extend(std::iter::repeat_n(b'y', 300));
        let (l, long) = lines_of(&text, 0, u64::MAX, 64);
        assert_eq!((l, long), (vec!["a".to_string()], 1));
    }

    #[test]
    fn pieces_are_whole_lines_in_order() {
        let text = numbered(1000);
        for k in [1, 2, 3, 8] {
            for min in [1, 100, 1 << 20] {
                let p = split_lines(&text, k, min);
                assert!(p.len() <= k);
                assert_eq!(p.concat(), text);
                for piece in &p {
                    assert!(piece.ends_with(b"\n"));
                }
            }
        }
        assert!(split_lines(b"", 4, 1).is_empty());
        assert_eq!(split_lines(b"abc", 4, 1), vec![b"abc".as_slice()]);
    }
}
