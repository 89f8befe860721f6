//! Input graph readers. Each returns the whole graph's size and the out-arcs of the
//! contiguous block of source nodes that this rank owns.
//!
//! - `bv`: a WebGraph BV graph (`BASE.graph` + `BASE.properties`; `.offsets` is not
//!   needed for a sequential scan). Every rank decodes the stream and keeps its block.
//! - `tsv`: SNAP-style edge lists, `src dst` per line separated by tabs or spaces,
//!   `#` or `%` comment lines, gzip-compressed when the name ends in `.gz` (a
//!   truncated or corrupt stream is an input error). Ids are non-negative integers
//!   below 2^32 - 2; the graph has `max id + 1` nodes. With a variant filter K >= 1,
//!   `prepare` renumbers the ids that occur densely (`EdgeList::renumber_dense`) and
//!   keeps the original ids in `/node_ids`, so a sparse id space costs memory by arcs.
//! - `mtx`: Matrix Market `coordinate` files (pattern, integer or real; values are
//!   ignored; `symmetric` adds both directions). Ids are 1-based; the graph has
//!   `max(rows, cols)` nodes.

use super::rows::LocalRows;
use crate::blocks::block_range;
use crate::error::{Error, Result};
use crate::io::compress::is_gz;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// What every rank learns about the input graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    /// Human-readable origin, stored as the `source` attribute.
    pub name: String,
    pub nodes: u64,
    /// Arcs as given in the input (before removing self-loops and duplicates).
    pub arcs: u64,
}

/// The largest node id accepted (ids are stored as u32; `u32::MAX` marks "none").
pub const MAX_ID: u64 = u32::MAX as u64 - 2;

fn check_nodes(path: &Path, nodes: u64) -> Result<()> {
    if nodes > MAX_ID + 1 {
        return Err(Error::input(
            path,
            format!("{nodes} nodes: torusrec stores node ids as u32 and supports fewer than 2^32 - 1 nodes"),
        ));
    }
    Ok(())
}

fn bv_file(basename: &Path, ext: &str) -> PathBuf {
    let mut s = basename.as_os_str().to_owned();
    s.push(ext);
    PathBuf::from(s)
}

/// A BV graph's size from `BASENAME.properties` (checking that `.graph` exists).
pub fn bv_info(basename: &Path) -> Result<SourceInfo> {
    let with_ext = |ext: &str| bv_file(basename, ext);
    for ext in [".graph", ".properties"] {
        let p = with_ext(ext);
        if !p.is_file() {
            return Err(Error::input(
                &p,
                "missing: a BV graph needs BASENAME.graph and BASENAME.properties",
            ));
        }
    }
    let props = crate::error::read_text(&with_ext(".properties"))?;
    let prop = |key: &str| -> Result<u64> {
        props
            .lines()
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| k.trim() == key)
            .and_then(|(_, v)| v.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                Error::input(
                    with_ext(".properties"),
                    format!("missing or invalid property '{key}'"),
                )
            })
    };
    let nodes = prop("nodes")?;
    let arcs = prop("arcs")?;
    check_nodes(basename, nodes)?;
    Ok(SourceInfo {
        name: format!("bv:{}", basename.display()),
        nodes,
        arcs,
    })
}

/// One sequential pass over a BV graph (`info` from [`bv_info`]): `f` gets the rows
/// of `lo..hi` in order, in chunks of whole rows of about `chunk_arcs` arcs. With
/// `validate`, the stream is decoded to its end and its arc count checked against
/// the properties; otherwise decoding stops at `hi`. A corrupt or truncated stream is
/// an input error naming `BASENAME.graph`.
pub fn bv_for_each_chunk(
    basename: &Path,
    info: &SourceInfo,
    (lo, hi): (u64, u64),
    validate: bool,
    chunk_arcs: usize,
    f: &mut dyn FnMut(LocalRows) -> Result<()>,
) -> Result<()> {
    use webgraph::prelude::*;

    let nodes = info.nodes;
    let arcs = info.arcs;
    let graph_path = bv_file(basename, ".graph");
    let graph = BvGraphSeq::with_basename(basename)
        .load()
        .map_err(|e| Error::input(&graph_path, format!("cannot open BV graph: {e:#}")))?;
    let mut it = graph.iter();
    let end = if validate { nodes } else { hi };
    let mut node = 0u64;
    let mut seen = 0u64;
    let mut chunk = LocalRows::empty(lo);
    while node < end {
        // Decode up to the end of a chunk. A truncated or corrupt bit stream can make
        // the decoder panic; turn that into an input error instead of killing the rank.
        let decoded = crate::panic_guard::catch(|| -> Result<()> {
            while node < end {
                let succ = it.next_successors().map_err(|e| {
                    Error::input(
                        &graph_path,
                        format!("corrupt bit stream at node {node}: {e:#}"),
                    )
                })?;
                seen += succ.len() as u64;
                if node >= lo && node < hi {
                    for &t in succ {
                        if t as u64 >= nodes {
                            return Err(Error::input(
                                &graph_path,
                                format!("node {node} has successor {t} >= {nodes} nodes: the file is corrupt or truncated"),
                            ));
                        }
                        chunk.targets.push(t as u32);
                    }
                    chunk.indptr.push(chunk.targets.len() as u64);
                }
                node += 1;
                if node == hi || (node > lo && node < hi && chunk.targets.len() >= chunk_arcs) {
                    return Ok(());
                }
            }
            Ok(())
        });
        match decoded {
            Some(r) => r?,
            None => {
                return Err(Error::input(
                    &graph_path,
                    "the BV decoder failed: the file is truncated or corrupt",
                ))
            }
        }
        if chunk.num_rows() > 0 {
            let next = LocalRows::empty(chunk.lo + chunk.num_rows() as u64);
            f(std::mem::replace(&mut chunk, next))?;
        }
    }
    if validate && seen != arcs {
        return Err(Error::input(
            &graph_path,
            format!("decoded {seen} arcs but the properties say {arcs}: the file is truncated or corrupt"),
        ));
    }
    Ok(())
}

/// Read a BV graph by basename, keeping the rows of block `rank` of `size`.
pub fn read_bv(basename: &Path, rank: usize, size: usize) -> Result<(SourceInfo, LocalRows)> {
    let info = bv_info(basename)?;
    let (lo, hi) = block_range(info.nodes, size, rank);
    let mut rows = LocalRows::empty(lo);
    bv_for_each_chunk(basename, &info, (lo, hi), true, usize::MAX, &mut |c| {
        rows = c;
        Ok(())
    })?;
    Ok((info, rows))
}

fn open_text(path: &Path) -> Result<Box<dyn BufRead>> {
    if !path.is_file() {
        return Err(Error::input(path, "no such file"));
    }
    let f =
        std::fs::File::open(path).map_err(|e| Error::input(path, format!("cannot open: {e}")))?;
    let r: Box<dyn Read> = if is_gz(path) {
        // Multi-member gzip; flate2 checks every member's CRC and length and reports
        // a stream cut anywhere (in a header, a deflate block or a trailer), a bad
        // header or trailing garbage as a read error, which becomes an input error.
        Box::new(flate2::read::MultiGzDecoder::new(f))
    } else {
        Box::new(f)
    };
    Ok(Box::new(BufReader::with_capacity(1 << 20, r)))
}

/// Iterate over the lines of a text file with 1-based numbers, as byte strings.
fn for_each_line(path: &Path, mut f: impl FnMut(u64, &str) -> Result<()>) -> Result<()> {
    let mut r = open_text(path)?;
    let mut buf = Vec::new();
    let mut line_no = 0u64;
    loop {
        buf.clear();
        let n = r.read_until(b'\n', &mut buf).map_err(|e| {
            if is_gz(path) {
                Error::input(
                    path,
                    format!("the compressed stream is truncated or corrupt: {e}"),
                )
            } else {
                Error::io(path, e)
            }
        })?;
        if n == 0 {
            return Ok(());
        }
        line_no += 1;
        let line = std::str::from_utf8(&buf).map_err(|_| Error::Parse {
            path: path.into(),
            line: line_no,
            msg: "not valid UTF-8 text".into(),
        })?;
        f(line_no, line.trim_end_matches(['\n', '\r']))?;
    }
}

fn parse_id(path: &Path, line: u64, tok: Option<&str>, what: &str) -> Result<u64> {
    let tok = tok.ok_or_else(|| Error::Parse {
        path: path.into(),
        line,
        msg: format!("expected two node ids, missing the {what}"),
    })?;
    tok.parse::<u64>().map_err(|_| Error::Parse {
        path: path.into(),
        line,
        msg: format!(
            "{what} {} is not a non-negative integer",
            crate::error::quote(tok)
        ),
    })
}

/// Append an arc, growing the list fallibly: an edge list too large for this
/// machine's memory is an input error, not an abort.
fn push_pair(pairs: &mut Vec<(u32, u32)>, p: (u32, u32), path: &Path) -> Result<()> {
    if pairs.len() == pairs.capacity() {
        pairs.try_reserve(pairs.len().max(1 << 16)).map_err(|_| {
            Error::input(
                path,
                format!(
                    "out of memory after {} arcs: the edge list is too large to read on this node",
                    pairs.len()
                ),
            )
        })?;
    }
    pairs.push(p);
    Ok(())
}

/// An edge list read whole: its size and every arc as (source, target) ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeList {
    pub info: SourceInfo,
    pub pairs: Vec<(u32, u32)>,
}

impl EdgeList {
    /// The rows of block `rank` of `size` of the graph's `info.nodes` nodes.
    pub fn into_block(self, rank: usize, size: usize) -> (SourceInfo, LocalRows) {
        let Self { info, mut pairs } = self;
        let (lo, hi) = block_range(info.nodes, size, rank);
        pairs.retain(|&(s, _)| (s as u64) >= lo && (s as u64) < hi);
        let rows = LocalRows::from_pairs(lo, hi, &pairs);
        (info, rows)
    }

    /// Renumber the ids that occur densely, keeping their order: the graph then has
    /// as many nodes as distinct ids instead of `max id + 1`. Returns the original id
    /// of each new one (increasing), or `None` when the ids already are `0..nodes`.
    /// A node that occurs in no arc has no links, so a variant filter with K >= 1
    /// removes it anyway: with K >= 1 the prepared dataset is the same either way,
    /// and a sparse id space (ids up to 2^32 - 3) costs memory by arcs, not by ids.
    pub fn renumber_dense(&mut self) -> Option<Vec<u32>> {
        let mut ids: Vec<u32> = Vec::with_capacity(2 * self.pairs.len());
        for &(s, t) in &self.pairs {
            ids.push(s);
            ids.push(t);
        }
        ids.sort_unstable();
        ids.dedup();
        if ids.len() as u64 == self.info.nodes {
            return None;
        }
        let new = |x: u32| ids.partition_point(|&v| v < x) as u32;
        for p in self.pairs.iter_mut() {
            *p = (new(p.0), new(p.1));
        }
        self.info.nodes = ids.len() as u64;
        ids.shrink_to_fit();
        Some(ids)
    }
}

/// Read a SNAP-style edge list, keeping the rows of block `rank` of `size`.
pub fn read_tsv(path: &Path, rank: usize, size: usize) -> Result<(SourceInfo, LocalRows)> {
    Ok(read_tsv_pairs(path)?.into_block(rank, size))
}

/// Read a SNAP-style edge list whole.
pub fn read_tsv_pairs(path: &Path) -> Result<EdgeList> {
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    let mut max_id: Option<u64> = None;
    for_each_line(path, |line_no, line| {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with('%') {
            return Ok(());
        }
        let mut it = t.split_ascii_whitespace();
        let s = parse_id(path, line_no, it.next(), "source")?;
        let d = parse_id(path, line_no, it.next(), "target")?;
        if let Some(extra) = it.next() {
            return Err(Error::Parse {
                path: path.into(),
                line: line_no,
                msg: format!(
                    "expected two node ids, found a third field {}",
                    crate::error::quote(extra)
                ),
            });
        }
        for id in [s, d] {
            if id > MAX_ID {
                return Err(Error::Parse {
                    path: path.into(),
                    line: line_no,
                    msg: format!("node id {id} does not fit: ids must be at most {MAX_ID}"),
                });
            }
        }
        max_id = Some(max_id.map_or(s.max(d), |m| m.max(s).max(d)));
        push_pair(&mut pairs, (s as u32, d as u32), path)
    })?;
    let nodes = max_id.map_or(0, |m| m + 1);
    if pairs.is_empty() {
        return Err(Error::input(path, "the graph has no arcs"));
    }
    check_nodes(path, nodes)?;
    let arcs = pairs.len() as u64;
    Ok(EdgeList {
        info: SourceInfo {
            name: format!("tsv:{}", path.display()),
            nodes,
            arcs,
        },
        pairs,
    })
}

/// Read a Matrix Market coordinate file, keeping the rows of block `rank` of `size`.
pub fn read_mtx(path: &Path, rank: usize, size: usize) -> Result<(SourceInfo, LocalRows)> {
    Ok(read_mtx_pairs(path)?.into_block(rank, size))
}

/// Read a Matrix Market coordinate file whole: the banner (`mtx_banner`), the
/// size line (`mtx_size`), then the entries (`mtx_entry`), each checked.
pub fn read_mtx_pairs(path: &Path) -> Result<EdgeList> {
    let perr = |line: u64, msg: String| mtx_error(path, line, msg);
    let mut symmetric = false;
    let mut field = String::new();
    let mut header: Option<(u64, u64, u64)> = None;
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    let mut entries = 0u64;
    let mut last_line = 0u64;
    for_each_line(path, |line_no, line| {
        last_line = line_no;
        if line_no == 1 {
            (field, symmetric) = mtx_banner(path, line_no, line)?;
            return Ok(());
        }
        let t = line.trim();
        if t.is_empty() || t.starts_with('%') {
            return Ok(());
        }
        match header {
            None => header = Some(mtx_size(path, line_no, t)?),
            Some((rows, cols, nnz)) => {
                if entries == nnz {
                    return Err(perr(
                        line_no,
                        format!("more entries than the {nnz} the size line declares"),
                    ));
                }
                let (s, d) = mtx_entry(path, line_no, t, &field, (rows, cols))?;
                entries += 1;
                push_pair(&mut pairs, (s, d), path)?;
                if symmetric && s != d {
                    push_pair(&mut pairs, (d, s), path)?;
                }
            }
        }
        Ok(())
    })?;
    let (rows, cols, nnz) =
        header.ok_or_else(|| Error::input(path, "no size line: the file is empty or truncated"))?;
    if entries != nnz {
        return Err(perr(
            last_line,
            format!("the size line declares {nnz} entries but the file has {entries}: truncated"),
        ));
    }
    let nodes = rows.max(cols);
    if pairs.is_empty() {
        return Err(Error::input(path, "the graph has no arcs"));
    }
    check_nodes(path, nodes)?;
    let arcs = pairs.len() as u64;
    Ok(EdgeList {
        info: SourceInfo {
            name: format!("mtx:{}", path.display()),
            nodes,
            arcs,
        },
        pairs,
    })
}

/// A parse error at line `line` of the Matrix Market file `path`.
fn mtx_error(path: &Path, line: u64, msg: String) -> Error {
    Error::Parse {
        path: path.into(),
        line,
        msg,
    }
}

/// The banner (the first line): a coordinate matrix; returns its field (`pattern`,
/// `integer` or `real`) and whether it is symmetric.
fn mtx_banner(path: &Path, line_no: u64, line: &str) -> Result<(String, bool)> {
    let perr = |line: u64, msg: String| mtx_error(path, line, msg);
    let l = line.to_ascii_lowercase();
    let f: Vec<&str> = l.split_ascii_whitespace().collect();
    if f.len() < 5 || f[0] != "%%matrixmarket" || f[1] != "matrix" {
        return Err(perr(line_no, "not a Matrix Market file: the first line must be '%%MatrixMarket matrix coordinate ...'".into()));
    }
    if f[2] != "coordinate" {
        return Err(perr(
            line_no,
            format!(
                "'{}' format: only 'coordinate' (sparse) matrices are graphs",
                f[2]
            ),
        ));
    }
    if !matches!(f[3], "pattern" | "integer" | "real") {
        return Err(perr(
            line_no,
            format!("field '{}': expected pattern, integer or real", f[3]),
        ));
    }
    let symmetric = match f[4] {
        "general" => false,
        "symmetric" => true,
        other => {
            return Err(perr(
                line_no,
                format!("symmetry '{other}': expected general or symmetric"),
            ))
        }
    };
    Ok((f[3].to_string(), symmetric))
}

/// The size line `t`: rows, columns, entries.
fn mtx_size(path: &Path, line_no: u64, t: &str) -> Result<(u64, u64, u64)> {
    let mut it = t.split_ascii_whitespace();
    let mut num = |what: &str| parse_id(path, line_no, it.next(), what);
    let (r, c, nnz) = (num("row count")?, num("column count")?, num("entry count")?);
    if let Some(x) = it.next() {
        return Err(mtx_error(
            path,
            line_no,
            format!(
                "size line: a fourth field {} (expected 'rows columns entries')",
                crate::error::quote(x)
            ),
        ));
    }
    Ok((r, c, nnz))
}

/// An entry line `t` of a `field` matrix of `rows x cols`: the arc (0-based). The
/// value is ignored, but it must be there, of the declared field.
fn mtx_entry(
    path: &Path,
    line_no: u64,
    t: &str,
    field: &str,
    (rows, cols): (u64, u64),
) -> Result<(u32, u32)> {
    let mut it = t.split_ascii_whitespace();
    let i = parse_id(path, line_no, it.next(), "row index")?;
    let j = parse_id(path, line_no, it.next(), "column index")?;
    let value = it.next();
    let ok = match (field, value) {
        ("pattern", None) => true,
        ("integer", Some(v)) => v.parse::<i64>().is_ok(),
        ("real", Some(v)) => v.parse::<f64>().is_ok_and(f64::is_finite),
        _ => false,
    };
    if !ok || it.next().is_some() {
        let want = if field == "pattern" {
            "two ids"
        } else {
            "two ids and a value"
        };
        return Err(mtx_error(
            path,
            line_no,
            format!(
                "a '{field}' entry is {want}: got {}",
                crate::error::quote(t)
            ),
        ));
    }
    if i == 0 || i > rows || j == 0 || j > cols {
        return Err(mtx_error(path, line_no, format!("entry ({i}, {j}) outside the declared {rows} x {cols} matrix (indices are 1-based)")));
    }
    Ok(((i - 1) as u32, (j - 1) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::File::create(&p)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        p
    }

    #[test]
    fn tsv_reads_comments_tabs_and_blocks() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "g.txt", "# c\n0\t1\n1 2\n\n% x\n3  0\n");
        let (info, all) = read_tsv(&p, 0, 1).unwrap();
        assert_eq!((info.nodes, info.arcs), (4, 3));
        assert_eq!(all.row(0), &[1]);
        assert_eq!(all.row(3), &[0]);
        let (_, second) = read_tsv(&p, 1, 2).unwrap();
        assert_eq!(second.lo, 2);
        assert_eq!(second.num_arcs(), 1);
    }

    #[test]
    fn tsv_errors_name_the_line() {
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "g.txt", "0 1\n1 x\n");
        let e = read_tsv(&p, 0, 1).unwrap_err().to_string();
        assert!(
            e.ends_with("g.txt:2: target \"x\" is not a non-negative integer"),
            "{e}"
        );
        let p = write(d.path(), "h.txt", "0 1\n5000000000 1\n");
        let e = read_tsv(&p, 0, 1).unwrap_err().to_string();
        assert!(e.contains("h.txt:2:") && e.contains("does not fit"), "{e}");
        let p = write(d.path(), "e.txt", "# nothing\n");
        assert!(read_tsv(&p, 0, 1)
            .unwrap_err()
            .to_string()
            .contains("no arcs"));
    }

    #[test]
    fn tsv_gzip() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("g.txt.gz");
        let mut w = flate2::write::GzEncoder::new(
            std::fs::File::create(&p).unwrap(),
            flate2::Compression::default(),
        );
        w.write_all(b"0 1\n1 0\n").unwrap();
        w.finish().unwrap();
        let (info, rows) = read_tsv(&p, 0, 1).unwrap();
        assert_eq!((info.nodes, rows.num_arcs()), (2, 2));
    }

    #[test]
    fn mtx_pattern_symmetric_and_truncated() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "g.mtx",
            "%%MatrixMarket matrix coordinate pattern symmetric\n% c\n3 3 2\n2 1\n3 3\n",
        );
        let (info, rows) = read_mtx(&p, 0, 1).unwrap();
        assert_eq!(info.nodes, 3);
        assert_eq!(rows.row(0), &[1]);
        assert_eq!(rows.row(1), &[0]);
        assert_eq!(rows.row(2), &[2]);
        let p = write(
            d.path(),
            "t.mtx",
            "%%MatrixMarket matrix coordinate real general\n3 3 3\n1 2 0.5\n2 3 1.0\n",
        );
        let e = read_mtx(&p, 0, 1).unwrap_err().to_string();
        assert!(e.contains("t.mtx:4:") && e.contains("truncated"), "{e}");
        let p = write(
            d.path(),
            "o.mtx",
            "%%MatrixMarket matrix coordinate pattern general\n2 2 1\n3 1\n",
        );
        let e = read_mtx(&p, 0, 1).unwrap_err().to_string();
        assert!(e.contains("o.mtx:3:") && e.contains("outside"), "{e}");
        // Entries must match the declared field; the size line has three numbers.
        for (name, text, says) in [
            (
                "p3",
                "pattern general\n3 3 1\n1 2 7\n",
                "a 'pattern' entry is two ids",
            ),
            (
                "r2",
                "real general\n3 3 1\n1 2\n",
                "a 'real' entry is two ids and a value",
            ),
            (
                "rn",
                "real general\n3 3 1\n1 2 nan\n",
                "two ids and a value",
            ),
            (
                "i15",
                "integer general\n3 3 1\n1 2 1.5\n",
                "a 'integer' entry",
            ),
            (
                "i4",
                "integer general\n3 3 1\n1 2 3 4\n",
                "a 'integer' entry",
            ),
            ("s4", "pattern general\n3 3 1 9\n1 2\n", "a fourth field"),
        ] {
            let head = "%%MatrixMarket matrix coordinate ";
            let p = write(d.path(), &format!("{name}.mtx"), &format!("{head}{text}"));
            let e = read_mtx(&p, 0, 1).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{name}.mtx:")) && e.contains(says),
                "{e}"
            );
        }
        let p = write(
            d.path(),
            "ok.mtx",
            "%%MatrixMarket matrix coordinate integer general\n3 3 2\n1 2 -4\n2 3 7\n",
        );
        assert_eq!(read_mtx(&p, 0, 1).unwrap().0.arcs, 2);
    }
}
