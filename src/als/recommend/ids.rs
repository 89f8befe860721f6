//! Original ids in and out of `recommend`: the ids of a graph's nodes (`/node_ids`,
//! u64) and of a user x item dataset's users and items (`/user_ids`, `/item_ids`: u64,
//! or UTF-8 strings when a side's ids are not all integers; docs/design.md), and the
//! id lists read from the command line and from files.

use crate::error::{quote, Error, Result};
use crate::io::h5::{open_h5, read_range};
use hdf5::types::{TypeDescriptor, VarLenUnicode};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Original node ids of the internal ids `0..n` (`/node_ids`; the identity when the
/// dataset has none).
#[derive(Debug, Clone)]
pub struct NodeIds {
    ids: Option<Vec<u64>>,
    /// `(original, internal)` sorted, when `ids` is not increasing.
    by_original: Option<Vec<(u64, u32)>>,
    n: u64,
}

impl NodeIds {
    /// Rank-local: read `/node_ids` of a dataset with `n` rows.
    pub fn local_read(path: &Path, n: u64) -> Result<Self> {
        Self::local_read_named(path, "node_ids", n, true)
    }

    /// Rank-local: read the u64 dataset `name` of `n` entries (the identity when it is
    /// absent and `optional`).
    fn local_read_named(path: &Path, name: &str, n: u64, optional: bool) -> Result<Self> {
        let f = open_h5(path)?;
        if f.dataset(name).is_err() {
            if !optional {
                return Err(Error::layout(path, name, "missing"));
            }
            return Ok(Self {
                ids: None,
                by_original: None,
                n,
            });
        }
        let len = crate::io::h5::dataset_len(&f, path, name)?;
        if len != n {
            return Err(Error::layout(
                path,
                name,
                format!("{len} entries, expected {n}"),
            ));
        }
        let ids = read_range::<u64>(&f, path, name, 0, n)?;
        Self::from_ids(ids)
            .map_err(|dup| Error::layout(path, name, format!("original id {dup} appears twice")))
    }

    /// The map of `ids` (the original id of each internal id); a repeated original
    /// id is returned as the error.
    pub fn from_ids(ids: Vec<u64>) -> std::result::Result<Self, u64> {
        let by_original = if ids.windows(2).all(|w| w[0] < w[1]) {
            None
        } else {
            let mut v: Vec<(u64, u32)> = ids
                .iter()
                .enumerate()
                .map(|(i, &o)| (o, i as u32))
                .collect();
            v.sort_unstable();
            if let Some(w) = v.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(w[0].0);
            }
            Some(v)
        };
        Ok(Self {
            n: ids.len() as u64,
            ids: Some(ids),
            by_original,
        })
    }

    /// The original id of internal id `i`.
    pub fn original(&self, i: u32) -> u64 {
        match &self.ids {
            Some(ids) => ids[i as usize],
            None => i as u64,
        }
    }

    /// The internal id of an original id, if it is a node.
    pub fn internal(&self, orig: u64) -> Option<u32> {
        match (&self.ids, &self.by_original) {
            (None, _) => (orig < self.n).then_some(orig as u32),
            (Some(_), Some(v)) => v.binary_search_by_key(&orig, |p| p.0).ok().map(|i| v[i].1),
            (Some(ids), None) => ids.binary_search(&orig).ok().map(|i| i as u32),
        }
    }
}

/// The original ids of one side (rows or columns): integers or strings.
#[derive(Debug, Clone)]
pub enum IdMap {
    Ints(NodeIds),
    Strings {
        names: Vec<String>,
        index: HashMap<String, u32>,
    },
}

impl IdMap {
    /// Rank-local: read the ids `name` (`user_ids` or `item_ids`) of `n` entries, u64
    /// or UTF-8 strings.
    pub fn local_read(path: &Path, name: &str, n: u64) -> Result<Self> {
        let f = open_h5(path)?;
        let ds = f
            .dataset(name)
            .map_err(|_| Error::layout(path, name, "missing"))?;
        let ty = ds
            .dtype()
            .and_then(|t| t.to_descriptor())
            .map_err(|e| Error::layout(path, name, format!("unreadable type: {e}")))?;
        if ty != TypeDescriptor::VarLenUnicode {
            return NodeIds::local_read_named(path, name, n, false).map(IdMap::Ints);
        }
        let raw: Vec<VarLenUnicode> = ds
            .read_raw()
            .map_err(|e| Error::layout(path, name, format!("unreadable: {e}")))?;
        if raw.len() as u64 != n {
            return Err(Error::layout(
                path,
                name,
                format!("{} entries, expected {n}", raw.len()),
            ));
        }
        let names: Vec<String> = raw.iter().map(|s| s.as_str().to_string()).collect();
        Self::from_names(names)
            .map_err(|dup| Error::layout(path, name, format!("original id {dup:?} appears twice")))
    }

    /// The map of string ids; a repeated id is returned as the error.
    pub fn from_names(names: Vec<String>) -> std::result::Result<Self, String> {
        let mut index = HashMap::with_capacity(names.len());
        for (i, s) in names.iter().enumerate() {
            if index.insert(s.clone(), i as u32).is_some() {
                return Err(s.clone());
            }
        }
        Ok(IdMap::Strings { names, index })
    }

    /// The internal id of an original id written as `tok`, if there is one.
    pub fn internal(&self, tok: &str) -> Option<u32> {
        match self {
            IdMap::Ints(m) => tok.parse::<u64>().ok().and_then(|v| m.internal(v)),
            IdMap::Strings { index, .. } => index.get(tok).copied(),
        }
    }

    /// The original id of internal id `i`, as text.
    pub fn label(&self, i: u32) -> String {
        self.display(i).to_string()
    }

    /// The original id of internal id `i`, to format without a copy.
    pub fn display(&self, i: u32) -> Label<'_> {
        match self {
            IdMap::Ints(m) => Label::Int(m.original(i)),
            IdMap::Strings { names, .. } => Label::Str(&names[i as usize]),
        }
    }

    /// The original id of internal id `i` as an integer (`None` for string ids).
    pub fn as_u64(&self, i: u32) -> Option<u64> {
        match self {
            IdMap::Ints(m) => Some(m.original(i)),
            IdMap::Strings { .. } => None,
        }
    }

    pub fn is_strings(&self) -> bool {
        matches!(self, IdMap::Strings { .. })
    }
}

/// An original id to format ([`IdMap::display`]).
#[derive(Debug, Clone, Copy)]
pub enum Label<'a> {
    Int(u64),
    Str(&'a str),
}

impl std::fmt::Display for Label<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Label::Int(v) => write!(f, "{v}"),
            Label::Str(s) => f.write_str(s),
        }
    }
}

/// One original id as given, and where: a line of a file, or the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdTok {
    pub id: String,
    /// The file and 1-based line it was read from.
    pub at: Option<(PathBuf, u64)>,
}

impl IdTok {
    pub fn arg(id: &str) -> Self {
        Self {
            id: id.to_string(),
            at: None,
        }
    }
}

/// Ids from a comma- (or blank-) separated list.
pub fn parse_id_list(list: &str) -> Vec<IdTok> {
    list.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(IdTok::arg)
        .collect()
}

/// Ids from a file: one per line, `#` starts a comment, blank lines skipped; a line
/// of two or more fields is refused naming the file and line.
pub fn read_id_file(path: &Path) -> Result<Vec<IdTok>> {
    let text = crate::error::read_text(path)?;
    let mut ids = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let tok = line.split('#').next().unwrap_or("").trim();
        if tok.is_empty() {
            continue;
        }
        if tok.split_whitespace().nth(1).is_some() {
            return Err(Error::Parse {
                path: path.into(),
                line: i as u64 + 1,
                msg: format!("one id per line, not {}", quote(tok)),
            });
        }
        ids.push(IdTok {
            id: tok.to_string(),
            at: Some((path.into(), i as u64 + 1)),
        });
    }
    Ok(ids)
}

/// The internal ids of `toks` through `map`, in order (duplicates kept). An unknown
/// id from a file fails naming the file and line of the first; unknown ids from the
/// command line fail listing them (`what`: "node", "user", "item").
pub fn resolve_ids(map: &IdMap, toks: &[IdTok], what: &str) -> Result<Vec<u32>> {
    let article = if what.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    let mut out = Vec::with_capacity(toks.len());
    let mut unknown = Vec::new();
    for t in toks {
        match map.internal(&t.id) {
            Some(i) => out.push(i),
            None => {
                if let Some((path, line)) = &t.at {
                    return Err(Error::Parse {
                        path: path.clone(),
                        line: *line,
                        msg: format!("{} is not {article} {what} of the dataset", quote(&t.id)),
                    });
                }
                unknown.push(t.id.clone());
            }
        }
    }
    if !unknown.is_empty() {
        return Err(Error::Config(format!(
            "{} {what} id(s) are not {what}s of the dataset: {}",
            unknown.len(),
            super::list_ids(&unknown)
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_map_both_ways_sorted_or_not() {
        for ids in [vec![7u64, 1007, 2007, 9000], vec![2007, 7, 9000, 1007]] {
            let m = NodeIds::from_ids(ids.clone()).unwrap();
            for (i, &o) in ids.iter().enumerate() {
                assert_eq!(m.original(i as u32), o);
                assert_eq!(m.internal(o), Some(i as u32));
            }
            assert_eq!(m.internal(8), None);
            assert_eq!(m.internal(u64::MAX), None);
        }
        assert_eq!(NodeIds::from_ids(vec![5, 3, 5]).err(), Some(5));
        let identity = NodeIds {
            ids: None,
            by_original: None,
            n: 4,
        };
        assert_eq!(identity.internal(3), Some(3));
        assert_eq!(identity.internal(4), None);
        assert_eq!(identity.original(2), 2);
    }

    #[test]
    fn id_maps_translate_ints_and_strings() {
        let ints = IdMap::Ints(NodeIds::from_ids(vec![10, 3]).unwrap());
        assert_eq!(ints.internal("3"), Some(1));
        assert_eq!(ints.internal("x"), None);
        assert_eq!((ints.label(0), ints.as_u64(0)), ("10".into(), Some(10)));
        let s = IdMap::from_names(vec!["b".into(), "a".into()]).unwrap();
        assert_eq!((s.internal("a"), s.internal("c")), (Some(1), None));
        assert_eq!((s.label(0), s.as_u64(0)), ("b".into(), None));
        assert_eq!(
            IdMap::from_names(vec!["a".into(), "a".into()]).err(),
            Some("a".into())
        );
    }

    #[test]
    fn unknown_ids_name_the_file_and_line_or_are_listed() {
        let s = IdMap::from_names(vec!["a".into(), "b".into()]).unwrap();
        let from_file = IdTok {
            id: "zz".into(),
            at: Some(("f.txt".into(), 4)),
        };
        match resolve_ids(&s, &[IdTok::arg("b"), from_file], "item") {
            Err(Error::Parse { line: 4, msg, .. }) => assert!(msg.contains("\"zz\""), "{msg}"),
            other => panic!("{other:?}"),
        }
        let e = resolve_ids(&s, &parse_id_list("a,q, r"), "item").unwrap_err();
        assert!(e.to_string().contains("2 item id(s)"), "{e}");
        assert_eq!(
            resolve_ids(&s, &parse_id_list("b a b"), "item").unwrap(),
            vec![1, 0, 1]
        );
    }
}
