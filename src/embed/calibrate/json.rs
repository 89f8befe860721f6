//! A JSON object read field by field: every field checked (type, range, known
//! names), the error naming it by its path (e.g. `gather[3].seconds`).

use serde_json::{Map, Value};

/// A result whose error is the message naming the field.
pub(super) type R<T> = std::result::Result<T, String>;

/// A JSON object at a path, for messages that name the field.
pub(super) struct Obj<'a> {
    pub(super) map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    pub(super) fn of(v: &'a Value, path: &str) -> R<Obj<'a>> {
        match v {
            Value::Object(map) => Ok(Obj {
                map,
                path: path.to_string(),
            }),
            _ => Err(format!("{}: must be an object", name(path))),
        }
    }

    pub(super) fn at(&self, k: &str) -> String {
        if self.path.is_empty() {
            k.to_string()
        } else {
            format!("{}.{k}", self.path)
        }
    }

    pub(super) fn only(&self, known: &[&str]) -> R<()> {
        for k in self.map.keys() {
            if !known.contains(&k.as_str()) {
                return Err(format!(
                    "{}: unknown field (known: {})",
                    self.at(k),
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }

    pub(super) fn get(&self, k: &str) -> R<&'a Value> {
        self.map
            .get(k)
            .ok_or_else(|| format!("{}: missing", self.at(k)))
    }

    pub(super) fn f64(&self, k: &str) -> R<f64> {
        self.get(k)?
            .as_f64()
            .ok_or_else(|| format!("{}: must be a number", self.at(k)))
    }

    /// A finite number > 0 (`positive`) or >= 0.
    pub(super) fn num(&self, k: &str, positive: bool) -> R<f64> {
        let v = self.f64(k)?;
        let ok = v.is_finite() && if positive { v > 0.0 } else { v >= 0.0 };
        if ok {
            Ok(v)
        } else {
            Err(format!(
                "{} {v}: must be a finite number {}",
                self.at(k),
                if positive { "> 0" } else { ">= 0" }
            ))
        }
    }

    /// An integer >= `min`.
    pub(super) fn int(&self, k: &str, min: u64) -> R<u64> {
        let v = self.get(k)?;
        let n = v
            .as_u64()
            .ok_or_else(|| format!("{} {v}: must be an integer >= {min}", self.at(k)))?;
        if n < min {
            return Err(format!("{} {n}: must be at least {min}", self.at(k)));
        }
        Ok(n)
    }

    pub(super) fn usize(&self, k: &str, min: u64) -> R<usize> {
        let n = self.int(k, min)?;
        usize::try_from(n).map_err(|_| format!("{} {n}: too large", self.at(k)))
    }

    pub(super) fn string(&self, k: &str) -> R<String> {
        match self.get(k)? {
            Value::String(s) if !s.is_empty() => Ok(s.clone()),
            v => Err(format!("{} {v}: must be a non-empty string", self.at(k))),
        }
    }

    pub(super) fn bool(&self, k: &str) -> R<bool> {
        self.get(k)?
            .as_bool()
            .ok_or_else(|| format!("{}: must be true or false", self.at(k)))
    }

    /// A non-empty array of objects.
    pub(super) fn objs(&self, k: &str) -> R<Vec<Obj<'a>>> {
        let v = self.get(k)?;
        let a = v
            .as_array()
            .ok_or_else(|| format!("{}: must be an array", self.at(k)))?;
        if a.is_empty() {
            return Err(format!("{}: must not be empty", self.at(k)));
        }
        a.iter()
            .enumerate()
            .map(|(i, x)| Obj::of(x, &format!("{}[{i}]", self.at(k))))
            .collect()
    }
}

fn name(path: &str) -> &str {
    if path.is_empty() {
        "the file"
    } else {
        path
    }
}
