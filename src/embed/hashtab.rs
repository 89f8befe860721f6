//! Placeholder until the hash table lands: the eviction policy type only.

/// What a full hash table does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Evict {
    #[default]
    Lfu,
    Ttl(u64),
}

impl Evict {
    pub fn parse(s: &str) -> Result<Evict, String> {
        match s {
            "lfu" => Ok(Evict::Lfu),
            _ => match s.strip_prefix("ttl:").and_then(|n| n.parse::<u64>().ok()) {
                Some(n) if n >= 1 => Ok(Evict::Ttl(n)),
                _ => Err(format!("bad eviction policy {s:?} (lfu or ttl:STEPS)")),
            },
        }
    }
}

impl std::fmt::Display for Evict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Evict::Lfu => write!(f, "lfu"),
            Evict::Ttl(n) => write!(f, "ttl:{n}"),
        }
    }
}
