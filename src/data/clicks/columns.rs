//! The column SPEC of `prepare clicks --format csv|tsv --columns SPEC` (parsed and
//! resolved against a header; the line parser that uses it is not written yet) and
//! the documented hash of a text categorical.
//!
//! A SPEC is comma-separated entries, either all positional (`ROLE[:OPT...][*N]`, one
//! per column, `*N` repeating it) or all by name (`NAME=ROLE[:OPT...]`, which needs a
//! header row; `*=ROLE` gives every column not named its role). Roles: `label` (0 or
//! 1), `dense` (a number, stored as f32), `log` (a number, `ln(1 + max(x, 0))`,
//! Criteo's transform), `cat` (any text, hashed by [`text_key`]), `hex` (1 to 16 hex
//! digits, the key itself), `weights:TABLE` (the per-id weights of the `cat`/`hex`
//! column TABLE, one per key, in its list separator) and `skip`. Options of `cat` and
//! `hex`: `list=C` (a multi-hot field, items separated by the one character C),
//! `weight=C` (each item `KEY<C>WEIGHT`). Avazu: `--header --columns
//! 'click=label,id=skip,*=cat'`.

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
        "cat" => Role::Cat,
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
}
