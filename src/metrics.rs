//! Process measurements for people and benchmarks.

/// Peak resident set size of this process in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// This process's reads so far: `(bytes read by system calls, bytes fetched from
/// storage)` (`rchar` and `read_bytes` of `/proc/self/io`; the difference came from
/// the page cache).
pub fn io_read_bytes() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/self/io").ok()?;
    let field = |k: &str| -> Option<u64> {
        s.lines()
            .find(|l| l.starts_with(k))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("rchar:")?, field("read_bytes:")?))
}

/// `12.3 MB` style sizes (decimal units, as network figures are usually quoted).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `8G`, `512M`, `64k` or plain bytes.
pub fn parse_bytes(s: &str) -> crate::Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => {
                    return Err(crate::Error::Config(format!(
                        "bad size {} (e.g. 8G, 512M)",
                        crate::error::quote(s)
                    )))
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num.parse().map_err(|_| {
        crate::Error::Config(format!(
            "bad size {} (e.g. 8G, 512M)",
            crate::error::quote(s)
        ))
    })?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(crate::Error::Config(format!(
            "bad size {}",
            crate::error::quote(s)
        )));
    }
    Ok((v * mult as f64) as u64)
}

/// `1,234,567` style integers for people.
pub fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn human_bytes_units() {
        assert_eq!(super::human_bytes(999), "999 B");
        assert_eq!(super::human_bytes(1500), "1.5 kB");
        assert_eq!(super::human_bytes(2_500_000_000), "2.5 GB");
    }
}
