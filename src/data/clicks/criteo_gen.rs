//! Synthetic click logs in Criteo's format (`generate clicks --format criteo`): for
//! tests and benchmarks of ingestion where no real Criteo day exists.
//!
//! Example `e` of day `d` is a deterministic function of `(seed, d, e)` (one
//! [`SplitMix64`] seeded from them), never of the rank or thread count. Columns, with
//! the preset's tables `V_t` (table `c mod T` for column `C(c+1)`, cycling when the
//! preset has fewer than 26) and Zipf exponent `s`:
//!
//! - **`I1`..`I13`** (integers, heavy-tailed, non-negative but for a few): column `j`
//!   is missing (empty) with probability [`DENSE_MISSING`]`[j]` (0 to 77 %, as in
//!   Criteo); otherwise `I2` is negative (`-1`, `-2` or `-3`, uniformly) with
//!   probability 10 %, and every value is a Pareto draw
//!   `floor(scale_j ((1 - u)^(-1 / alpha_j) - 1))`, `u` uniform, capped at 10^12
//!   ([`DENSE_SCALE`], [`DENSE_ALPHA`]).
//! - **`C1`..`C26`** (8 lowercase hex digits): column `c` is missing with probability
//!   [`CAT_MISSING`]`[c]` (0 to 40 %); otherwise a popularity rank
//!   `r ~ Zipf(V_c(d), s)` ([`Zipf`], rank 0 most frequent) over a vocabulary that grows
//!   by a tenth of day 0's every day, `V_c(d) = V_c + d max(1, round(V_c / 10))`. The
//!   rank becomes an item: on day `d >= 1` a rank is *fresh* with probability 10 % (a
//!   hash of `(seed, c, d, r)`), and a fresh rank's item is one of the items new on
//!   day `d`, `V_c(d-1) + h mod (V_c(d) - V_c(d-1))`; every other rank is its own item.
//!   So most frequent keys persist from day to day, while new keys keep appearing
//!   among the frequent ones. The key is the top 32 bits of a hash of
//!   `(seed, c, item)`.
//! - **label**: `1` with probability `logistic(b + sum_j w_j ln(1 + max(I_j, 0)) + sum_c
//!   k_c(key))` over the present columns, with `w_j ~ N(0, 0.25^2)` drawn from
//!   `(seed, j)` and a per-key weight `k_c(key)` uniform with standard deviation
//!   [`KEY_WEIGHT_SD`], derived by hashing `(seed, c, key)` (no per-key memory). The
//!   bias `b` is set at construction so that examples `0..4096` of day 0 have a mean
//!   click probability of [`BASE_RATE`] (Criteo's ~25 %; bisection, deterministic).
//!
//! The draw order within an example: for each dense column its missing draw, then
//! (if present) the sign draw for `I2` and the value; for each categorical column
//! its missing draw, then the rank; then the label's uniform.

use std::io::Write;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::batch::KeyBags;
use super::criteo::{dense_value, CRITEO_CAT, CRITEO_DENSE};
use super::ingest::{Block, ExampleSource};
use super::sample::{logistic, Zipf};
use crate::blocks::block_range;
use crate::error::{Error, Result};
use crate::rng::{hash3, SplitMix64};
use crate::spec::ModelSpec;

/// Streams of this module (large constants: no collision with `crate::rng::stream`).
const STREAM_EXAMPLE: u64 = 0x4352_5445_4f00_0001;
const STREAM_DENSE_W: u64 = 0x4352_5445_4f00_0002;
const STREAM_KEY: u64 = 0x4352_5445_4f00_0003;
const STREAM_KEY_W: u64 = 0x4352_5445_4f00_0004;
const STREAM_FRESH: u64 = 0x4352_5445_4f00_0005;

/// Missing probability of `I1`..`I13`.
pub const DENSE_MISSING: [f64; CRITEO_DENSE] = [
    0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22,
];
/// Pareto scale of `I1`..`I13`.
pub const DENSE_SCALE: [f64; CRITEO_DENSE] = [
    2.0, 60.0, 12.0, 5.0, 8000.0, 60.0, 8.0, 12.0, 60.0, 0.5, 2.0, 1.0, 6.0,
];
/// Pareto tail exponent of `I1`..`I13` (smaller: heavier tail).
pub const DENSE_ALPHA: [f64; CRITEO_DENSE] = [
    1.5, 1.1, 1.3, 2.0, 1.2, 1.2, 1.3, 2.5, 1.2, 3.0, 1.8, 1.5, 1.6,
];
/// Probability that a present `I2` is negative.
pub const I2_NEGATIVE: f64 = 0.1;
/// Largest dense value drawn.
pub const DENSE_CAP: f64 = 1e12;
/// Missing probability of `C1`..`C26`.
pub const CAT_MISSING: [f64; CRITEO_CAT] = [
    0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0,
    0.4, 0.4, 0.03, 0.38, 0.0, 0.03, 0.4, 0.4,
];
/// Fraction of a day's ranks mapped to the day's new items (days >= 1).
pub const FRESH: f64 = 0.1;
/// Standard deviation of the dense weights and of the per-key weights.
pub const DENSE_WEIGHT_SD: f64 = 0.25;
pub const KEY_WEIGHT_SD: f64 = 0.3;
/// Mean click probability the bias is set to.
pub const BASE_RATE: f64 = 0.25;
/// Examples of day 0 the bias is calibrated on.
const CALIBRATION: u64 = 4096;
/// Examples per rayon task.
const CHUNK: usize = 4096;
/// Most days, and examples per day.
pub const MAX_DAYS: u64 = 10_000;
pub const MAX_PER_DAY: u64 = 1 << 40;

/// One example as raw Criteo values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawExample {
    pub label: bool,
    pub dense: [Option<i64>; CRITEO_DENSE],
    pub cat: [Option<u32>; CRITEO_CAT],
}

/// The generator of one `(preset tables, seed)`.
#[derive(Clone, Debug)]
pub struct CriteoGen {
    seed: u64,
    zipf_s: f64,
    /// Day-0 vocabulary of each column.
    vocab: [u64; CRITEO_CAT],
    w: [f64; CRITEO_DENSE],
    bias: f64,
}

/// A day's Zipf laws, one per column.
#[derive(Clone, Debug)]
pub struct Day {
    d: u64,
    zipf: Vec<Zipf>,
}

/// Uniform in [0, 1) from the top 53 bits of `h`.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

impl CriteoGen {
    /// `spec` must be valid; its tables (cycled) give the vocabularies, its `zipf`
    /// the exponent.
    pub fn new(spec: &ModelSpec, seed: u64) -> CriteoGen {
        let t = spec.tables.len();
        let mut g = CriteoGen {
            seed,
            zipf_s: spec.zipf,
            vocab: std::array::from_fn(|c| spec.tables[c % t].vocab),
            w: std::array::from_fn(|j| {
                DENSE_WEIGHT_SD * SplitMix64::for_id(seed, STREAM_DENSE_W, j as u64).next_normal()
            }),
            bias: 0.0,
        };
        g.bias = g.calibrate();
        g
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn bias(&self) -> f64 {
        self.bias
    }

    /// `V_c(d)`: column `c`'s vocabulary on day `d`.
    pub fn vocab(&self, c: usize, d: u64) -> u64 {
        let v = self.vocab[c];
        v + d * ((v as f64 / 10.0).round() as u64).max(1)
    }

    /// The Zipf laws of day `d`.
    pub fn day(&self, d: u64) -> Day {
        Day {
            d,
            zipf: (0..CRITEO_CAT)
                .map(|c| Zipf::new(self.vocab(c, d), self.zipf_s))
                .collect(),
        }
    }

    /// The item of popularity rank `r` of column `c` on day `d` (module doc).
    fn item(&self, c: usize, d: u64, r: u64) -> u64 {
        if d == 0 {
            return r;
        }
        let h = hash3(self.seed ^ ((c as u64) << 48) ^ d, STREAM_FRESH, r);
        if unit(h) < FRESH {
            let lo = self.vocab(c, d - 1);
            lo + crate::rng::mix64(h) % (self.vocab(c, d) - lo)
        } else {
            r
        }
    }

    /// The key of an item of column `c`.
    pub fn key(&self, c: usize, item: u64) -> u32 {
        (hash3(self.seed, STREAM_KEY, ((c as u64) << 48) ^ item) >> 32) as u32
    }

    /// The planted weight of a key of column `c`.
    pub fn key_weight(&self, c: usize, key: u32) -> f64 {
        let u = unit(hash3(
            self.seed,
            STREAM_KEY_W,
            ((c as u64) << 32) | key as u64,
        ));
        (u - 0.5) * 2.0 * 3f64.sqrt() * KEY_WEIGHT_SD
    }

    /// Draw example `e` of `day` into `out`; returns the planted logit without the
    /// bias and the label's uniform.
    fn draw(&self, day: &Day, e: u64, out: &mut RawExample) -> (f64, f64) {
        let mut rng = SplitMix64::for_id(self.seed, STREAM_EXAMPLE, (day.d << 40) | e);
        let mut z = 0.0f64;
        for j in 0..CRITEO_DENSE {
            out.dense[j] = if rng.next_f64() < DENSE_MISSING[j] {
                None
            } else if j == 1 && rng.next_f64() < I2_NEGATIVE {
                Some(-1 - rng.below(3) as i64)
            } else {
                let u = rng.next_f64();
                let x = DENSE_SCALE[j] * ((1.0 - u).powf(-1.0 / DENSE_ALPHA[j]) - 1.0);
                Some(x.min(DENSE_CAP).floor() as i64)
            };
            z += self.w[j] * dense_value(out.dense[j].unwrap_or(0)) as f64;
        }
        for (c, (slot, zipf)) in out.cat.iter_mut().zip(&day.zipf).enumerate() {
            *slot = if rng.next_f64() < CAT_MISSING[c] {
                None
            } else {
                let r = zipf.sample(&mut rng);
                let key = self.key(c, self.item(c, day.d, r));
                z += self.key_weight(c, key);
                Some(key)
            };
        }
        (z, rng.next_f64())
    }

    /// Example `e` of `day` into `out`.
    pub fn example(&self, day: &Day, e: u64, out: &mut RawExample) {
        let (z, u) = self.draw(day, e, out);
        out.label = u < logistic(self.bias + z);
    }

    /// The bias giving a mean click probability of [`BASE_RATE`] on the calibration
    /// examples (bisection).
    fn calibrate(&self) -> f64 {
        let day = self.day(0);
        let mut ex = RawExample::default();
        let z: Vec<f64> = (0..CALIBRATION)
            .map(|e| self.draw(&day, e, &mut ex).0)
            .collect();
        let rate = |b: f64| z.iter().map(|&z| logistic(b + z)).sum::<f64>() / z.len() as f64;
        let (mut lo, mut hi) = (-50.0f64, 50.0f64);
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if rate(mid) < BASE_RATE {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        0.5 * (lo + hi)
    }

    /// Examples `lo..lo + n` of `day` as parsed columns (what `prepare clicks` makes
    /// of their text), in parallel.
    pub fn block(&self, day: &Day, lo: u64, n: usize) -> Block {
        let parts: Vec<Block> = (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .map(|k| {
                let a = k * CHUNK;
                let m = CHUNK.min(n - a);
                let mut b = Block::new(CRITEO_DENSE, CRITEO_CAT);
                let mut ex = RawExample::default();
                for e in lo + a as u64..lo + (a + m) as u64 {
                    self.example(day, e, &mut ex);
                    push_example(&ex, &mut b);
                }
                b
            })
            .collect();
        let mut out = Block::new(CRITEO_DENSE, CRITEO_CAT);
        for p in &parts {
            append(&mut out, p);
        }
        out
    }

    /// Examples `lo..lo + n` of `day` as Criteo text (one line each), in parallel.
    pub fn text(&self, day: &Day, lo: u64, n: usize) -> Vec<u8> {
        self.text_chunks(day, lo, n, &|t| t).concat()
    }

    /// The text of examples `lo..lo + n` in chunks of [`CHUNK`] examples, each mapped
    /// by `finish` (e.g. compressed), in parallel, in order.
    fn text_chunks(
        &self,
        day: &Day,
        lo: u64,
        n: usize,
        finish: &(dyn Fn(Vec<u8>) -> Vec<u8> + Sync),
    ) -> Vec<Vec<u8>> {
        (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .map(|k| {
                let a = k * CHUNK;
                let m = CHUNK.min(n - a);
                let mut out = Vec::with_capacity(m * 300);
                let mut ex = RawExample::default();
                for e in lo + a as u64..lo + (a + m) as u64 {
                    self.example(day, e, &mut ex);
                    write_line(&ex, &mut out);
                }
                finish(out)
            })
            .collect()
    }

    /// Write day `d`'s `n` examples to `path` as Criteo text, gzip-compressed when
    /// `gzip` (one gzip member per chunk of examples, compressed in parallel: a
    /// multi-member file every gzip reader accepts). Written under `<path>.partial`,
    /// made durable and renamed. Returns the bytes written.
    pub fn write_day(&self, d: u64, n: u64, path: &Path, gzip: bool) -> Result<u64> {
        let tmp = crate::io::outfile::temp_path(path);
        let r = self.write_day_into(d, n, &tmp, gzip).and_then(|bytes| {
            crate::io::outfile::commit(&tmp, path)?;
            Ok(bytes)
        });
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r
    }

    fn write_day_into(&self, d: u64, n: u64, tmp: &Path, gzip: bool) -> Result<u64> {
        let day = self.day(d);
        let file = std::fs::File::create(tmp).map_err(|e| Error::io(tmp, e))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
        let compress = |t: Vec<u8>| -> Vec<u8> {
            let mut enc = flate2::write::GzEncoder::new(
                Vec::with_capacity(t.len() / 3),
                flate2::Compression::fast(),
            );
            // Writing to a Vec cannot fail.
            let _ = enc.write_all(&t);
            enc.finish().unwrap_or_default()
        };
        let finish: &(dyn Fn(Vec<u8>) -> Vec<u8> + Sync) = if gzip { &compress } else { &|t| t };
        // Windows of a few chunks per thread bound the memory.
        let window = (CHUNK * 4 * rayon::current_num_threads()) as u64;
        let mut bytes = 0u64;
        let mut lo = 0u64;
        while lo < n {
            let m = window.min(n - lo) as usize;
            for part in self.text_chunks(&day, lo, m, finish) {
                w.write_all(&part).map_err(|e| Error::io(tmp, e))?;
                bytes += part.len() as u64;
            }
            lo += m as u64;
        }
        if n == 0 && gzip {
            let empty = compress(Vec::new());
            w.write_all(&empty).map_err(|e| Error::io(tmp, e))?;
            bytes += empty.len() as u64;
        }
        w.flush().map_err(|e| Error::io(tmp, e))?;
        Ok(bytes)
    }
}

/// Append `p`'s examples to `out` (both start their offsets at 0).
fn append(out: &mut Block, p: &Block) {
    out.n += p.n;
    out.labels.extend_from_slice(&p.labels);
    out.dense.extend_from_slice(&p.dense);
    for (o, k) in out.keys.iter_mut().zip(&p.keys) {
        let base = o.ids.len() as u32;
        o.offsets.extend(k.offsets[1..].iter().map(|&x| base + x));
        o.ids.extend_from_slice(&k.ids);
    }
    out.lines += p.lines;
}

/// Append one example as `prepare clicks` parses it: `dense_value` of each dense
/// value (missing: 0), each present key in its table's bag.
pub fn push_example(ex: &RawExample, b: &mut Block) {
    b.labels.push(if ex.label { 1.0 } else { 0.0 });
    b.dense
        .extend(ex.dense.iter().map(|x| dense_value(x.unwrap_or(0))));
    for (k, bag) in ex.cat.iter().zip(b.keys.iter_mut()) {
        push_key(bag, *k);
    }
    b.n += 1;
    b.lines += 1;
}

fn push_key(bag: &mut KeyBags, k: Option<u32>) {
    if let Some(k) = k {
        bag.ids.push(k as u64);
    }
    bag.offsets.push(bag.ids.len() as u32);
}

/// Append `x` in decimal.
fn put_int(out: &mut Vec<u8>, x: i64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut v = x.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if x < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[i..]);
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Append one example as a Criteo line (with its `\n`).
pub fn write_line(ex: &RawExample, out: &mut Vec<u8>) {
    out.push(if ex.label { b'1' } else { b'0' });
    for x in &ex.dense {
        out.push(b'\t');
        if let Some(x) = x {
            put_int(out, *x);
        }
    }
    for k in &ex.cat {
        out.push(b'\t');
        if let Some(k) = k {
            for s in (0..8).rev() {
                out.push(HEX_DIGITS[((k >> (4 * s)) & 0xf) as usize]);
            }
        }
    }
    out.push(b'\n');
}

/// The generator as an [`ExampleSource`]: `per_day` examples on each of `days` days,
/// day `d`'s examples cut into `P` blocks of indices, rank `r` generating block `r`.
pub struct GenSource {
    gen: CriteoGen,
    days: Vec<PathBuf>,
    per_day: u64,
    rank: usize,
    size: usize,
}

/// Examples generated at once (per rank).
const GEN_BLOCK: usize = 1 << 16;

impl GenSource {
    /// `names[d]` names day `d` (in errors; e.g. the text file it stands for).
    pub fn new(
        gen: CriteoGen,
        names: Vec<PathBuf>,
        per_day: u64,
        rank: usize,
        size: usize,
    ) -> Self {
        GenSource {
            gen,
            days: names,
            per_day,
            rank,
            size,
        }
    }
}

impl ExampleSource for GenSource {
    fn days(&self) -> usize {
        self.days.len()
    }

    fn day_path(&self, d: usize) -> &Path {
        &self.days[d]
    }

    fn n_dense(&self) -> usize {
        CRITEO_DENSE
    }

    fn tables(&self) -> usize {
        CRITEO_CAT
    }

    fn for_each_block(&self, d: usize, f: &mut dyn FnMut(&Block) -> Result<()>) -> Result<()> {
        let (lo, hi) = block_range(self.per_day, self.size, self.rank);
        let day = self.gen.day(d as u64);
        let mut e = lo;
        while e < hi {
            let m = (hi - e).min(GEN_BLOCK as u64) as usize;
            f(&self.gen.block(&day, e, m))?;
            e += m as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::clicks::criteo::{parse_lines, Layout};
    use crate::spec::preset;

    fn gen(seed: u64) -> CriteoGen {
        CriteoGen::new(&preset("small", 0.01).unwrap(), seed)
    }

    #[test]
    fn text_parses_back_to_the_generated_block() {
        let g = gen(3);
        for d in [0u64, 2] {
            let day = g.day(d);
            let text = g.text(&day, 100, 5000);
            let mut parsed = Block::new(CRITEO_DENSE, CRITEO_CAT);
            parse_lines(&Layout::criteo(), &text, &mut parsed);
            assert_eq!(parsed.bad, 0);
            parsed.bytes = 0;
            let block = g.block(&day, 100, 5000);
            assert_eq!(parsed, block);
            // Deterministic whatever the cut.
            let mut two = g.block(&day, 100, 1234);
            append(&mut two, &g.block(&day, 1334, 3766));
            assert_eq!(two, block);
        }
    }

    #[test]
    fn lines_look_like_criteo() {
        let g = gen(1);
        let day = g.day(1);
        let text = String::from_utf8(g.text(&day, 0, 20_000)).unwrap();
        let (mut neg, mut missing_i1, mut missing_c19, mut pos) = (0, 0, 0, 0);
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            assert_eq!(f.len(), 40);
            assert!(f[0] == "0" || f[0] == "1");
            pos += usize::from(f[0] == "1");
            neg += usize::from(f[2].starts_with('-'));
            missing_i1 += usize::from(f[1].is_empty());
            missing_c19 += usize::from(f[14 + 18].is_empty());
            for c in &f[14..] {
                assert!(
                    c.is_empty()
                        || (c.len() == 8
                            && c.chars()
                                .all(|x| x.is_ascii_hexdigit() && !x.is_ascii_uppercase()))
                );
            }
        }
        let rate = |k: usize| k as f64 / 20_000.0;
        assert!((rate(neg) - 0.1).abs() < 0.02, "{neg}");
        assert!((rate(missing_i1) - 0.45).abs() < 0.02, "{missing_i1}");
        assert!((rate(missing_c19) - 0.4).abs() < 0.02, "{missing_c19}");
        assert!((rate(pos) - BASE_RATE).abs() < 0.03, "positives {pos}");
    }

    /// The planted logit ranks clicks well above chance (the Bayes AUC), so a model
    /// that learns it can reach a meaningful AUC.
    #[test]
    fn labels_follow_the_planted_model() {
        let g = gen(7);
        let day = g.day(0);
        let mut ex = RawExample::default();
        let mut scored: Vec<(f64, bool)> = (0..20_000)
            .map(|e| {
                let (z, _) = g.draw(&day, e, &mut ex);
                g.example(&day, e, &mut ex);
                (z, ex.label)
            })
            .collect();
        scored.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut rank_sum, mut pos) = (0.0f64, 0u64);
        for (i, &(_, l)) in scored.iter().enumerate() {
            if l {
                rank_sum += (i + 1) as f64;
                pos += 1;
            }
        }
        let neg = scored.len() as u64 - pos;
        let auc = (rank_sum - (pos * (pos + 1)) as f64 / 2.0) / (pos * neg) as f64;
        assert!(auc > 0.75, "Bayes AUC {auc}");
    }

    #[test]
    fn vocabularies_grow_and_new_keys_appear_among_the_frequent() {
        let g = gen(5);
        assert_eq!(g.vocab(0, 0), 343);
        assert_eq!(g.vocab(0, 3), 343 + 3 * 34);
        // Keys of the 50 most frequent ranks of C1 on day 0 and day 2.
        let top = |d: u64| -> std::collections::HashSet<u32> {
            (0..50).map(|r| g.key(0, g.item(0, d, r))).collect()
        };
        let (k0, k2) = (top(0), top(2));
        let new = k2.difference(&k0).count();
        assert!((1..=15).contains(&new), "{new} new keys among the top 50");
    }

    #[test]
    fn written_days_read_back_plain_and_gzipped() {
        let g = gen(2);
        let dir = tempfile::tempdir().unwrap();
        let day = g.day(1);
        let want = g.text(&day, 0, 10_000);
        let p = dir.path().join("day_1.tsv");
        assert_eq!(
            g.write_day(1, 10_000, &p, false).unwrap(),
            want.len() as u64
        );
        assert_eq!(std::fs::read(&p).unwrap(), want);
        let q = dir.path().join("day_1.tsv.gz");
        g.write_day(1, 10_000, &q, true).unwrap();
        let mut back = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(&q).unwrap()),
            &mut back,
        )
        .unwrap();
        assert_eq!(back, want);
        assert!(!crate::io::outfile::temp_path(&q).exists());
    }

    #[test]
    fn integers_print_like_printf() {
        for x in [0i64, 7, -3, 10, 1234567890123, i64::MIN + 1, i64::MAX] {
            let mut v = Vec::new();
            put_int(&mut v, x);
            assert_eq!(String::from_utf8(v).unwrap(), x.to_string());
        }
    }
}
