//! The bad-input corpus (issue 11, part A): malformed files for every reader and
//! subcommand (BV, TSV, `.tsv.gz`, MTX, prepared HDF5 datasets, embed specs, plans,
//! click logs, checkpoints) and out-of-range numbers on the command line. Every case
//! asserts its exit code and a fragment of its message: a user error is exit 2 with a
//! message naming what is wrong, never a panic (101), an abort (134), a signal, a hang,
//! an allocation sized by the input, or a silent run on garbage.
//!
//! The cases run one after another (each is a short run of the binary); all failures
//! are reported together. A few run at 2 ranks to show that every rank exits alike.

use crate::util;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use util::{cnr2000, h5_read, rank_codes, tempdir, TestCommand};

/// One malformed input and what the binary must answer.
struct Case {
    name: &'static str,
    /// 1: run directly; more: under mpirun, every rank must exit `code`.
    ranks: usize,
    args: Vec<String>,
    code: i32,
    /// Fragments that stderr (or, for exit 0, stdout) must contain.
    needles: Vec<String>,
    /// Fragments that must not appear in stdout (e.g. "epoch": it trained).
    not_stdout: Vec<&'static str>,
}

fn case(name: &'static str, args: &[&str], code: i32, needles: &[&str]) -> Case {
    Case {
        name,
        ranks: 1,
        args: args.iter().map(|s| s.to_string()).collect(),
        code,
        needles: needles.iter().map(|s| s.to_string()).collect(),
        not_stdout: Vec::new(),
    }
}

impl Case {
    fn ranks(mut self, n: usize) -> Self {
        self.ranks = n;
        self
    }

    fn not_stdout(mut self, s: &'static str) -> Self {
        self.not_stdout.push(s);
        self
    }

    /// Run it; `Err` describes how it failed.
    fn check(&self, scratch: &Path) -> Result<(), String> {
        let codes = scratch.join(format!("codes-{}", self.name));
        let cmd = if self.ranks == 1 {
            TestCommand::direct()
        } else {
            std::fs::create_dir_all(&codes).unwrap();
            TestCommand::mpirun(self.ranks).record_rank_codes(&codes)
        };
        let cmd = cmd
            .args(&self.args)
            .current_dir(scratch)
            .timeout(Duration::from_secs(60));
        let run = std::panic::catch_unwind(|| cmd.run())
            .map_err(|_| format!("{}: timed out (see the panic above)", self.name))?;
        let codes_seen = if self.ranks == 1 {
            vec![Some(run.code)]
        } else {
            rank_codes(&codes, self.ranks)
        };
        if codes_seen != vec![Some(self.code); self.ranks] {
            return Err(format!(
                "{}: exit codes {codes_seen:?}, want {} on every rank\n{}",
                self.name,
                self.code,
                run.dump()
            ));
        }
        let text = if self.code == 0 {
            &run.stdout
        } else {
            &run.stderr
        };
        for n in &self.needles {
            if !text.contains(n.as_str()) {
                return Err(format!("{}: lacks {n:?}\n{}", self.name, run.dump()));
            }
        }
        for n in &self.not_stdout {
            if run.stdout.contains(n) {
                return Err(format!(
                    "{}: stdout has {n:?} (it ran on bad input)\n{}",
                    self.name,
                    run.dump()
                ));
            }
        }
        // No error line may quote more than ~100 characters of one token.
        if let Some(l) = run
            .stderr
            .lines()
            .find(|l| l.split_whitespace().any(|w| w.chars().count() > 240))
        {
            return Err(format!(
                "{}: an error line quotes a huge token: {}...",
                self.name,
                &l[..l.len().min(300)]
            ));
        }
        Ok(())
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p.to_string_lossy().into_owned()
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    w.write_all(bytes).unwrap();
    w.finish().unwrap()
}

/// An edge list big enough that its gzip stream spans several deflate blocks.
fn edge_list(n: u32) -> String {
    let mut s = String::from("# a ring with chords\n");
    for u in 0..n {
        s.push_str(&format!("{u}\t{}\n{u}\t{}\n", (u + 1) % n, (u * 7 + 3) % n));
        s.push_str(&format!("{}\t{u}\n", (u * 13 + 5) % n));
    }
    s
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A copy of the BV graph cnr-2000 under `dir/name` with `.graph` bytes `graph` and
/// `.properties` text `props` (None: the originals).
fn bv_copy(dir: &Path, name: &str, graph: Option<Vec<u8>>, props: Option<Vec<u8>>) -> String {
    let base = dir.join(name);
    let src = cnr2000();
    let with = |p: &Path, ext: &str| {
        let mut o = p.as_os_str().to_owned();
        o.push(ext);
        PathBuf::from(o)
    };
    let g = graph.unwrap_or_else(|| std::fs::read(with(&src, ".graph")).unwrap());
    std::fs::write(with(&base, ".graph"), g).unwrap();
    let p = props.unwrap_or_else(|| std::fs::read(with(&src, ".properties")).unwrap());
    std::fs::write(with(&base, ".properties"), p).unwrap();
    s(&base)
}

fn props_with(key: &str, value: &str) -> Vec<u8> {
    let mut o = cnr2000().into_os_string();
    o.push(".properties");
    let text = std::fs::read_to_string(PathBuf::from(o)).unwrap();
    text.lines()
        .map(|l| match l.split_once('=') {
            Some((k, _)) if k.trim() == key => format!("{key}={value}"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        .into_bytes()
}

/// A copy of `src` with dataset `name` overwritten by `v` (same length).
fn h5_with<T: hdf5::H5Type>(dir: &Path, tag: &str, src: &Path, name: &str, v: &[T]) -> String {
    let p = dir.join(format!("{tag}.h5"));
    std::fs::copy(src, &p).unwrap();
    util::h5_write(&p, name, v);
    s(&p)
}

const SPEC_OK: &str = "n_dense = 4\nhidden = [8]\n[[table]]\nname = \"a\"\nvocab = 100\ndim = 8\n[[table]]\nname = \"b\"\nvocab = 50\ndim = 8\n";

/// `cmd` with the `defaults` (flag, value) pairs whose flag `extra` does not give,
/// then `extra`.
fn with_defaults<'a>(
    cmd: &[&'a str],
    defaults: &[(&'a str, &'a str)],
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut v = cmd.to_vec();
    for &(flag, value) in defaults {
        if !extra.contains(&flag) {
            v.push(flag);
            v.push(value);
        }
    }
    v.extend_from_slice(extra);
    v
}

/// Embed flags for a short run on the tiny spec.
fn embed_args<'a>(spec: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    with_defaults(
        &["embed", "--tables", spec],
        &[
            ("--steps", "2"),
            ("--batch", "16"),
            ("--eval-examples", "64"),
            ("--threads", "1"),
            ("--plan", "table"),
        ],
        extra,
    )
}

fn als_args<'a>(data: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    with_defaults(
        &["als", "--data", data],
        &[("--dim", "4"), ("--epochs", "1"), ("--threads", "1")],
        extra,
    )
}

#[test]
fn every_bad_input_exits_2_with_a_message() {
    let dir = tempdir();
    let d = dir.path();
    let out = |name: &str| s(&d.join(name));
    let mut cases: Vec<Case> = Vec::new();

    // ---- A prepared dataset (cnr-2000, K = 10) and a click log to corrupt.
    let good = d.join("good.h5");
    util::prepare_cnr2000(TestCommand::direct(), 10, &good)
        .run()
        .expect_code(0);
    let spec = write(d, "spec.toml", SPEC_OK.as_bytes());
    let clicks = d.join("clicks.h5");
    TestCommand::direct()
        .args(["generate", "clicks", "--tables", &spec, "--examples", "512"])
        .arg("--out")
        .arg(&clicks)
        .run()
        .expect_code(0);

    // ---- BV graphs.
    let graph_bytes = {
        let mut o = cnr2000().into_os_string();
        o.push(".graph");
        std::fs::read(PathBuf::from(o)).unwrap()
    };
    let prep_bv = |base: String, extra: &[&str], name: &str| -> Vec<String> {
        let mut v: Vec<String> = ["prepare", "--format", "bv", "--input", &base, "--out"]
            .iter()
            .map(|x| x.to_string())
            .collect();
        v.push(out(name));
        v.extend(extra.iter().map(|x| x.to_string()));
        v
    };
    let mut bv_case = |name: &'static str, base: String, code: i32, needles: &[&str]| {
        let mut c = case(name, &[], code, needles);
        c.args = prep_bv(base, &[], &format!("{name}.h5"));
        cases.push(c);
    };
    bv_case(
        "bv-missing-graph",
        s(&d.join("nothing-here")),
        2,
        &["missing: a BV graph needs"],
    );
    bv_case(
        "bv-properties-not-utf8",
        bv_copy(d, "bv1", None, Some(b"nodes=\xff\xfe\narcs=3\n".to_vec())),
        2,
        &["bv1.properties", "UTF-8"],
    );
    bv_case(
        "bv-properties-no-nodes",
        bv_copy(d, "bv2", None, Some(b"arcs=3\n".to_vec())),
        2,
        &["missing or invalid property 'nodes'"],
    );
    bv_case(
        "bv-properties-nodes-not-a-number",
        bv_copy(d, "bv3", None, Some(props_with("nodes", "many"))),
        2,
        &["property 'nodes'"],
    );
    bv_case(
        "bv-properties-nodes-beyond-u32",
        bv_copy(d, "bv4", None, Some(props_with("nodes", "1099511627776"))),
        2,
        &["1099511627776 nodes"],
    );
    bv_case(
        "bv-properties-nodes-near-u32-max",
        bv_copy(d, "bv5", None, Some(props_with("nodes", "4294967290"))),
        2,
        &["estimate"],
    );
    bv_case(
        "bv-properties-arcs-wrong",
        bv_copy(d, "bv6", None, Some(props_with("arcs", "12345"))),
        2,
        &["properties say 12345"],
    );
    bv_case(
        "bv-graph-truncated",
        bv_copy(
            d,
            "bv7",
            Some(graph_bytes[..graph_bytes.len() / 2].to_vec()),
            None,
        ),
        2,
        &["bv7.graph"],
    );
    bv_case(
        "bv-graph-empty",
        bv_copy(d, "bv8", Some(Vec::new()), None),
        2,
        &["bv8.graph"],
    );
    bv_case(
        "bv-graph-random-bytes",
        bv_copy(
            d,
            "bv9",
            Some(
                (0..100_000u32)
                    .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
                    .collect(),
            ),
            None,
        ),
        2,
        &["bv9.graph"],
    );
    bv_case(
        "bv-properties-is-a-directory",
        {
            let b = bv_copy(d, "bv10", None, None);
            std::fs::remove_file(format!("{b}.properties")).unwrap();
            std::fs::create_dir(format!("{b}.properties")).unwrap();
            b
        },
        2,
        &["bv10.properties"],
    );
    // `.offsets` is not needed for a sequential scan: garbage there is ignored.
    {
        let b = bv_copy(d, "bv11", None, None);
        write(d, "bv11.offsets", b"garbage");
        let mut c = case("bv-garbage-offsets-is-ignored", &[], 0, &["wrote"]);
        c.args = prep_bv(b, &["--min-links", "10"], "bv11.h5");
        cases.push(c);
    }

    // ---- TSV edge lists.
    let prep = |fmt: &str, input: &str, name: &str, extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["prepare", "--format", fmt, "--input", input, "--out"]
            .iter()
            .map(|x| x.to_string())
            .collect();
        v.push(out(name));
        v.extend(extra.iter().map(|x| x.to_string()));
        v
    };
    let text_case =
        |name: &'static str, fmt: &str, file: &str, bytes: &[u8], code: i32, needles: &[&str]| {
            let p = write(d, file, bytes);
            let mut c = case(name, &[], code, needles);
            c.args = prep(fmt, &p, &format!("{name}.h5"), &[]);
            c
        };
    let long = "7".repeat(5000);
    cases.push(text_case(
        "tsv-negative-id",
        "tsv",
        "neg.tsv",
        b"0 1\n-1 2\n",
        2,
        &["neg.tsv:2:", "source \"-1\" is not a non-negative integer"],
    ));
    cases.push(text_case(
        "tsv-id-beyond-u32",
        "tsv",
        "big.tsv",
        b"0 1\n1 4294967294\n",
        2,
        &["big.tsv:2:", "does not fit"],
    ));
    cases.push(text_case(
        "tsv-third-field",
        "tsv",
        "three.tsv",
        b"0 1 2\n",
        2,
        &["three.tsv:1:", "third field"],
    ));
    cases.push(text_case(
        "tsv-missing-target",
        "tsv",
        "one.tsv",
        b"0 1\n5\n",
        2,
        &["one.tsv:2:", "missing the target"],
    ));
    cases.push(text_case(
        "tsv-huge-token-is-cut",
        "tsv",
        "long.tsv",
        format!("0 {long}x\n").as_bytes(),
        2,
        &["long.tsv:1:", "more bytes)"],
    ));
    cases.push(text_case(
        "tsv-not-utf8",
        "tsv",
        "bin.tsv",
        b"0 1\n\xff\xfe 2\n",
        2,
        &["bin.tsv:2:", "UTF-8"],
    ));
    cases.push(text_case(
        "tsv-only-comments",
        "tsv",
        "comments.tsv",
        b"# nothing\n% here\n",
        2,
        &["no arcs"],
    ));
    text_case("tsv-empty", "tsv", "empty.tsv", b"", 2, &["no arcs"]);
    cases.push(text_case(
        "tsv-only-self-loops",
        "tsv",
        "loops.tsv",
        b"0 0\n1 1\n2 2\n",
        2,
        &["empty graph"],
    ));
    cases.push(text_case(
        "tsv-float-id",
        "tsv",
        "float.tsv",
        b"0 1.5\n",
        2,
        &["float.tsv:1:", "\"1.5\""],
    ));
    // The documented largest id: renumbered densely, not one row per possible id.
    cases.push(text_case(
        "tsv-largest-id-is-renumbered",
        "tsv",
        "sparse.tsv",
        b"0 4294967293\n4294967293 0\n0 7\n7 0\n7 4294967293\n4294967293 7\n",
        0,
        &["3 nodes"],
    ));
    {
        let p = write(d, "sparse0.tsv", b"0 4294967293\n4294967293 0\n");
        let mut c = case(
            "tsv-largest-id-with-k0-needs-every-row",
            &[],
            2,
            &["estimate", "4,294,967,294 nodes"],
        );
        c.args = prep("tsv", &p, "sparse0.h5", &["--min-links", "0"]);
        cases.push(c);
    }
    {
        let mut c = case("tsv-missing-file", &[], 2, &["no such file"]);
        c.args = prep("tsv", &out("absent.tsv"), "absent.h5", &[]);
        cases.push(c);
        let mut c = case("tsv-input-is-a-directory", &[], 2, &["no such file"]);
        c.args = prep("tsv", &s(d), "isdir.h5", &[]);
        cases.push(c);
    }

    // ---- Gzip-compressed edge lists.
    let ring = edge_list(20_000);
    let full = gz(ring.as_bytes());
    cases.push(text_case(
        "gz-valid",
        "tsv",
        "ok.tsv.gz",
        &full,
        0,
        &["wrote"],
    ));
    cases.push(text_case(
        "gz-truncated-in-the-middle",
        "tsv",
        "half.tsv.gz",
        &full[..full.len() / 2],
        2,
        &["half.tsv.gz", "truncated or corrupt"],
    ));
    cases.push(text_case(
        "gz-truncated-before-the-trailer",
        "tsv",
        "notrailer.tsv.gz",
        &full[..full.len() - 8],
        2,
        &["notrailer.tsv.gz", "truncated or corrupt"],
    ));
    cases.push(text_case(
        "gz-truncated-by-one-byte",
        "tsv",
        "minus1.tsv.gz",
        &full[..full.len() - 1],
        2,
        &["minus1.tsv.gz", "truncated or corrupt"],
    ));
    cases.push(text_case(
        "gz-not-gzip",
        "tsv",
        "plain.tsv.gz",
        b"0 1\n1 0\n",
        2,
        &["plain.tsv.gz", "truncated or corrupt"],
    ));
    {
        let mut bad = full.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0x55;
        cases.push(text_case(
            "gz-corrupt-byte",
            "tsv",
            "flip.tsv.gz",
            &bad,
            2,
            &["flip.tsv.gz"],
        ));
        let mut crc = full.clone();
        let n = crc.len();
        crc[n - 6] ^= 1;
        cases.push(text_case(
            "gz-crc-mismatch",
            "tsv",
            "crc.tsv.gz",
            &crc,
            2,
            &["crc.tsv.gz", "truncated or corrupt"],
        ));
        let mut tail = full.clone();
        tail.extend_from_slice(b"trailing garbage");
        cases.push(text_case(
            "gz-trailing-garbage",
            "tsv",
            "tail.tsv.gz",
            &tail,
            2,
            &["tail.tsv.gz", "truncated or corrupt"],
        ));
    }
    text_case(
        "gz-empty-file",
        "tsv",
        "zero.tsv.gz",
        b"",
        2,
        &["zero.tsv.gz"],
    );
    {
        let p = write(d, "half2.tsv.gz", &full[..full.len() / 3]);
        let mut c = case(
            "gz-truncated-at-2-ranks",
            &[],
            2,
            &["half2.tsv.gz", "truncated or corrupt"],
        )
        .ranks(2);
        c.args = prep("tsv", &p, "half2.h5", &[]);
        cases.push(c);
    }

    // ---- Matrix Market.
    let mm = "%%MatrixMarket matrix coordinate pattern general\n";
    cases.push(text_case(
        "mtx-no-banner",
        "mtx",
        "nobanner.mtx",
        b"3 3 1\n1 2\n",
        2,
        &["nobanner.mtx:1:", "not a Matrix Market file"],
    ));
    cases.push(text_case(
        "mtx-array-format",
        "mtx",
        "array.mtx",
        b"%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n",
        2,
        &["'array' format"],
    ));
    cases.push(text_case(
        "mtx-complex-field",
        "mtx",
        "complex.mtx",
        b"%%MatrixMarket matrix coordinate complex general\n2 2 1\n1 2 1 0\n",
        2,
        &["field 'complex'"],
    ));
    cases.push(text_case(
        "mtx-hermitian",
        "mtx",
        "herm.mtx",
        b"%%MatrixMarket matrix coordinate real hermitian\n2 2 1\n1 2 1\n",
        2,
        &["symmetry 'hermitian'"],
    ));
    cases.push(text_case(
        "mtx-huge-size-line",
        "mtx",
        "hugesize.mtx",
        format!("{mm}4294967294 4294967294 3\n1 2\n2 1\n4294967294 1\n").as_bytes(),
        0,
        &["wrote"],
    ));
    cases.push(text_case(
        "mtx-size-beyond-u32",
        "mtx",
        "toobig.mtx",
        format!("{mm}99999999999 3 1\n1 2\n").as_bytes(),
        2,
        &["99999999999 nodes"],
    ));
    cases.push(text_case(
        "mtx-entry-outside",
        "mtx",
        "outside.mtx",
        format!("{mm}3 3 2\n1 2\n4 1\n").as_bytes(),
        2,
        &["outside.mtx:4:", "outside the declared 3 x 3"],
    ));
    cases.push(text_case(
        "mtx-zero-index",
        "mtx",
        "zero.mtx",
        format!("{mm}3 3 1\n0 2\n").as_bytes(),
        2,
        &["zero.mtx:3:", "1-based"],
    ));
    cases.push(text_case(
        "mtx-truncated",
        "mtx",
        "short.mtx",
        format!("{mm}3 3 3\n1 2\n2 3\n").as_bytes(),
        2,
        &["short.mtx:4:", "truncated"],
    ));
    cases.push(text_case(
        "mtx-too-many-entries",
        "mtx",
        "long.mtx",
        format!("{mm}3 3 1\n1 2\n2 3\n").as_bytes(),
        2,
        &["long.mtx:4:", "more entries"],
    ));
    cases.push(text_case(
        "mtx-no-size-line",
        "mtx",
        "nosize.mtx",
        mm.as_bytes(),
        2,
        &["no size line"],
    ));
    cases.push(text_case(
        "mtx-size-line-not-numbers",
        "mtx",
        "words.mtx",
        format!("{mm}three by three\n").as_bytes(),
        2,
        &["words.mtx:2:", "row count"],
    ));
    cases.push(text_case(
        "mtx-huge-entry-count-short-file",
        "mtx",
        "hugennz.mtx",
        format!("{mm}3 3 18446744073709551615\n1 2\n").as_bytes(),
        2,
        &["hugennz.mtx:3:", "truncated"],
    ));

    // ---- Prepared datasets (als and inspect) with corrupt CSR arrays.
    let ip: Vec<u64> = h5_read(&good, "train/indptr");
    let idx: Vec<u32> = h5_read(&good, "train/indices");
    let row = (ip.len() / 2..ip.len() - 1)
        .find(|&r| ip[r + 1] - ip[r] >= 2)
        .unwrap();
    let decreasing = {
        let mut v = ip.clone();
        v[row + 1] = v[row] - 1;
        h5_with(d, "decreasing", &good, "train/indptr", &v)
    };
    let shifted = {
        let v: Vec<u64> = ip.iter().map(|x| x + 1).collect();
        h5_with(d, "shifted", &good, "train/indptr", &v)
    };
    let out_of_range = {
        let mut v = idx.clone();
        v[3] = u32::MAX - 5;
        h5_with(d, "range", &good, "train/indices", &v)
    };
    let duplicate = {
        let mut v = idx.clone();
        let a = ip[row] as usize;
        v[a + 1] = v[a];
        h5_with(d, "dup", &good, "train/indices", &v)
    };
    let not_transpose = {
        let mut v: Vec<u32> = h5_read(&good, "train_t/indices");
        let ipt: Vec<u64> = h5_read(&good, "train_t/indptr");
        // Move one arc of a column to another row id that keeps the row sorted.
        let c = (0..ipt.len() - 1)
            .find(|&c| ipt[c + 1] - ipt[c] >= 2 && v[ipt[c] as usize] > 0)
            .unwrap();
        let a = ipt[c] as usize;
        if a == 0 || v[a] - 1 != v[a - 1] {
            v[a] -= 1;
        }
        h5_with(d, "notT", &good, "train_t/indices", &v)
    };
    let huge_rows = {
        let p = d.join("hugerows.h5");
        std::fs::copy(&good, &p).unwrap();
        let f = torusrec::io::h5::open_rw(&p).unwrap();
        f.attr("num_rows").unwrap().write_scalar(&u64::MAX).unwrap();
        s(&p)
    };
    let truncated_h5 = {
        let bytes = std::fs::read(&good).unwrap();
        write(d, "trunc.h5", &bytes[..bytes.len() / 2])
    };
    let text_h5 = write(d, "text.h5", b"this is not HDF5\n");
    let mut als_case = |name: &'static str, data: &str, needles: &[&str], ranks: usize| {
        let mut c = case(name, &als_args(data, &[]), 2, needles)
            .not_stdout("final:")
            .ranks(ranks);
        c.not_stdout.push("edges/s");
        cases.push(c);
    };
    als_case(
        "h5-decreasing-indptr",
        &decreasing,
        &["train/indptr", &format!("decreases at entry {}", row + 1)],
        1,
    );
    als_case(
        "h5-decreasing-indptr-at-2-ranks",
        &decreasing,
        &["train/indptr", "decreases"],
        2,
    );
    als_case(
        "h5-indptr-not-from-0",
        &shifted,
        &["train/indptr", "starts at 1"],
        1,
    );
    als_case(
        "h5-index-out-of-range",
        &out_of_range,
        &["train/indices"],
        1,
    );
    als_case(
        "h5-duplicate-column",
        &duplicate,
        &["train/indices", "sorted and distinct"],
        1,
    );
    als_case(
        "h5-train-t-not-the-transpose",
        &not_transpose,
        &["train_t"],
        1,
    );
    als_case("h5-num-rows-u64-max", &huge_rows, &["num_rows"], 1);
    als_case("h5-truncated-file", &truncated_h5, &["trunc.h5"], 1);
    als_case("h5-not-hdf5", &text_h5, &["text.h5"], 1);
    als_case("h5-missing", &out("absent.h5"), &["absent.h5"], 1);
    cases.push(case(
        "inspect-decreasing-indptr",
        &["inspect", &decreasing],
        2,
        &["train/indptr"],
    ));
    cases.push(case(
        "inspect-not-hdf5",
        &["inspect", &text_h5],
        2,
        &["text.h5"],
    ));

    // ---- Embed specs (TOML), for plan, embed and generate clicks.
    let spec_case = |name: &'static str, file: &str, bytes: &[u8], needles: &[&str]| -> Case {
        let p = write(d, file, bytes);
        let mut c = case(name, &[], 2, needles);
        c.args = embed_args(&p, &[]).iter().map(|x| x.to_string()).collect();
        c.not_stdout("ex/s")
    };
    cases.push(spec_case(
        "spec-not-utf8",
        "bin.toml",
        b"n_dense = 4\n# \xff\xfe\n",
        &["bin.toml", "UTF-8"],
    ));
    cases.push(spec_case(
        "spec-syntax-error",
        "syntax.toml",
        b"n_dense = 4\nhidden = [8\n",
        &["syntax.toml:"],
    ));
    cases.push(spec_case(
        "spec-unknown-field",
        "unknown.toml",
        format!("{SPEC_OK}colour = \"red\"\n").as_bytes(),
        &["unknown.toml", "colour"],
    ));
    cases.push(spec_case(
        "spec-vocab-0",
        "vocab0.toml",
        b"[[table]]\nname = \"a\"\nvocab = 0\ndim = 8\n",
        &["vocab must be in 1..="],
    ));
    cases.push(spec_case(
        "spec-negative-zipf",
        "zipf.toml",
        format!("zipf = -1.0\n{SPEC_OK}").as_bytes(),
        &["zipf exponent"],
    ));
    cases.push(spec_case(
        "spec-no-tables",
        "notables.toml",
        b"n_dense = 4\ntable = []\n",
        &["no tables"],
    ));
    let huge_vocab = write(
        d,
        "hugevocab.toml",
        b"n_dense = 4\nhidden = [8]\n[[table]]\nname = \"a\"\nvocab = 4294967295\ndim = 4096\n",
    );
    cases.push(
        case(
            "spec-vocab-2^32-1-dim-4096",
            &embed_args(&huge_vocab, &[]),
            2,
            &["estimate"],
        )
        .not_stdout("ex/s"),
    );
    cases.push(
        case(
            "spec-vocab-2^32-1-dim-4096-at-2-ranks",
            &embed_args(&huge_vocab, &[]),
            2,
            &["estimate"],
        )
        .ranks(2),
    );
    // A click log holds ids, not tables: the huge table costs nothing there.
    cases.push(case(
        "generate-clicks-vocab-2^32-1-dim-4096-is-fine",
        &[
            "generate",
            "clicks",
            "--tables",
            &huge_vocab,
            "--examples",
            "10",
            "--out",
            &out("hv.h5"),
        ],
        0,
        &["clicks: 10 examples"],
    ));
    let huge_hidden = write(
        d,
        "hidden.toml",
        b"n_dense = 4\nhidden = [100000000]\n[[table]]\nname = \"a\"\nvocab = 100\ndim = 8\n",
    );
    cases.push(
        case(
            "spec-hidden-100000000",
            &embed_args(&huge_hidden, &[]),
            2,
            &["estimate"],
        )
        .not_stdout("ex/s"),
    );
    cases.push(case(
        "tables-file-missing",
        &embed_args(&out("absent.toml"), &[]),
        2,
        &["absent.toml"],
    ));

    // ---- plan.
    cases.push(case(
        "plan-ranks-100000000",
        &["plan", "--tables", &spec, "--ranks", "100000000"],
        2,
        &["--ranks 100000000"],
    ));
    cases.push(case(
        "plan-ranks-0",
        &["plan", "--tables", &spec, "--ranks", "0"],
        2,
        &["--ranks"],
    ));
    cases.push(case(
        "plan-tasks-huge",
        &[
            "plan",
            "--tables",
            &spec,
            "--ranks",
            "2",
            "--tasks",
            "1000000000000",
        ],
        2,
        &["--tasks"],
    ));
    // `plan` of the spec at 2 ranks on estimated statistics, before its flags.
    let plan_2 = ["plan", "--tables", &spec, "--ranks", "2", "--estimate"];
    let dir_arg = s(d);
    cases.push(case(
        "plan-out-is-a-directory",
        &[&plan_2[..], &["--force", "--out", &dir_arg]].concat(),
        2,
        &["directory"],
    ));

    // ---- Cost model files for the planner (plan, embed --plan auto).
    let cost_neg = write(d, "cost-neg.json", b"{\"mem_bw\": 1e10, \"net_bw\": -1}");
    let cost_typo = write(d, "cost-typo.json", b"{\"netbw\": 1e7}");
    let cost_junk = write(d, "cost-junk.json", b"nope");
    let cost_secs = write(d, "cost-secs.json", b"{\"lookup_s\": -1e-9}");
    let cost_missing = out("absent-cost.json");
    let cost_good = write(d, "cost-good.json", b"{\"net_bw\": 1e9}");
    for (name, file, needles) in [
        (
            "plan-cost-model-negative",
            &cost_neg,
            &["cost-neg.json", "net_bw -1"][..],
        ),
        (
            "plan-cost-model-unknown-field",
            &cost_typo,
            &["cost-typo.json", "unknown field `netbw`"],
        ),
        (
            "plan-cost-model-not-json",
            &cost_junk,
            &["cost-junk.json", "not a cost model"],
        ),
        (
            "plan-cost-model-negative-seconds",
            &cost_secs,
            &["cost-secs.json", "lookup_s"],
        ),
        (
            "plan-cost-model-missing",
            &cost_missing,
            &["absent-cost.json"],
        ),
    ] {
        let args = [&plan_2[..], &["--cost-model", file.as_str()]].concat();
        cases.push(case(name, &args, 2, needles).not_stdout("plan:"));
    }
    cases.push(
        case(
            "embed-cost-model-negative",
            &embed_args(&spec, &["--plan", "auto", "--cost-model", &cost_neg]),
            2,
            &["cost-neg.json", "net_bw -1"],
        )
        .not_stdout("ex/s"),
    );
    cases.push(
        case(
            "embed-cost-model-with-a-placement-kind",
            &embed_args(&spec, &["--plan", "table", "--cost-model", &cost_good]),
            2,
            &["--cost-model", "--plan auto", "--plan table"],
        )
        .not_stdout("ex/s"),
    );

    // ---- Plan files for embed --plan.
    let plan_case = |name: &'static str, plan: &str, needles: &[&str]| -> Case {
        case(name, &embed_args(&spec, &["--plan", plan]), 2, needles).not_stdout("ex/s")
    };
    cases.push(plan_case(
        "plan-file-missing",
        &out("absent.json"),
        &["absent.json"],
    ));
    let plan_bin = write(d, "bin.json", b"{\"world\": \xff}");
    cases.push(plan_case(
        "plan-file-not-utf8",
        &plan_bin,
        &["bin.json", "UTF-8"],
    ));
    let plan_junk = write(d, "junk.json", b"[1, 2, 3]");
    cases.push(plan_case(
        "plan-file-not-a-plan",
        &plan_junk,
        &["junk.json", "not a plan"],
    ));
    let long_plan = format!("{}.json", "p".repeat(3000));
    cases.push(plan_case(
        "plan-huge-name-is-cut",
        &long_plan,
        &["characters)...ppp"],
    ));
    {
        let p = d.join("plan4.json");
        TestCommand::direct()
            .args([
                "plan",
                "--tables",
                &spec,
                "--ranks",
                "4",
                "--estimate",
                "--out",
            ])
            .arg(&p)
            .run()
            .expect_code(0);
        cases.push(plan_case("plan-file-for-4-ranks", &s(&p), &["4"]));
    }

    // ---- Click logs.
    let offsets: Vec<u64> = h5_read(&clicks, "tables/0/offsets");
    let bad_offsets = {
        let mut v = offsets.clone();
        v[10] = v[9] + 1_000_000;
        h5_with(d, "badoffsets", &clicks, "tables/0/offsets", &v)
    };
    let ids: Vec<u32> = h5_read(&clicks, "tables/0/ids");
    let bad_ids = {
        let mut v = ids.clone();
        v[5] = 4_000_000_000;
        h5_with(d, "badids", &clicks, "tables/0/ids", &v)
    };
    let click_case = |name: &'static str, data: &str, needles: &[&str]| -> Case {
        case(
            name,
            &[
                "embed",
                "--data",
                data,
                "--steps",
                "2",
                "--batch",
                "16",
                "--eval-examples",
                "64",
                "--threads",
                "1",
                "--plan",
                "table",
            ],
            2,
            needles,
        )
        .not_stdout("ex/s")
    };
    cases.push(click_case(
        "clicks-offsets-jump",
        &bad_offsets,
        &["tables/0/offsets"],
    ));
    cases.push(click_case(
        "clicks-id-beyond-vocab",
        &bad_ids,
        &["tables/0/ids"],
    ));
    cases.push(click_case("clicks-not-hdf5", &text_h5, &["text.h5"]));
    cases.push(click_case(
        "clicks-missing",
        &out("absent-clicks.h5"),
        &["absent-clicks.h5"],
    ));
    cases.push(case(
        "generate-clicks-out-is-a-directory",
        &[
            "generate",
            "clicks",
            "--tables",
            &spec,
            "--examples",
            "10",
            "--force",
            "--out",
            &s(d),
        ],
        2,
        &["directory"],
    ));
    cases.push(case(
        "generate-clicks-out-unwritable",
        &[
            "generate",
            "clicks",
            "--tables",
            &spec,
            "--examples",
            "10",
            "--out",
            "/proc/x.h5",
        ],
        2,
        &["/proc/x.h5"],
    ));

    // ---- Checkpoints and output paths.
    let good_s = s(&good);
    let not_ckpt = write(d, "ckpt-0000000001.h5", b"not a checkpoint");
    let ck = out("ck");
    cases.push(case(
        "als-resume-corrupt-file",
        &als_args(&good_s, &["--checkpoint-dir", &ck, "--resume", &not_ckpt]),
        76,
        &["training hold", "not an HDF5 file"],
    ));
    cases.push(case(
        "als-resume-missing-file",
        &als_args(
            &good_s,
            &["--checkpoint-dir", &ck, "--resume", &out("nope.h5")],
        ),
        2,
        &["no such checkpoint file"],
    ));
    cases.push(
        case(
            "als-checkpoint-dir-uncreatable",
            &als_args(&good_s, &["--checkpoint-dir", "/proc/torusrec-ck"]),
            2,
            &["/proc/torusrec-ck"],
        )
        .not_stdout("edges/s"),
    );
    cases.push(
        case(
            "als-metrics-uncreatable",
            &als_args(&good_s, &["--metrics", "/proc/torusrec/m.jsonl"]),
            2,
            &["/proc/torusrec/m.jsonl"],
        )
        .not_stdout("edges/s"),
    );
    cases.push(
        case(
            "embed-metrics-uncreatable",
            &embed_args(&spec, &["--metrics", "/proc/torusrec/m.jsonl"]),
            2,
            &["/proc/torusrec/m.jsonl"],
        )
        .not_stdout("ex/s"),
    );
    cases.push(
        case(
            "embed-checkpoint-dir-uncreatable",
            &embed_args(&spec, &["--checkpoint-dir", "/proc/torusrec-ck"]),
            2,
            &["/proc/torusrec-ck"],
        )
        .not_stdout("ex/s"),
    );
    cases.push(
        case(
            "als-out-unwritable",
            &als_args(&good_s, &["--out", "/proc/x.h5"]),
            2,
            &["/proc/x.h5"],
        )
        .not_stdout("edges/s"),
    );
    cases.push(
        case(
            "als-out-is-a-directory",
            &als_args(&good_s, &["--out", &s(d), "--force"]),
            2,
            &["directory"],
        )
        .not_stdout("edges/s"),
    );
    cases.push(case(
        "prepare-out-is-a-directory",
        &[
            "prepare",
            "--format",
            "tsv",
            "--input",
            &write(d, "ok.tsv", b"0 1\n1 0\n"),
            "--force",
            "--out",
            &s(d),
        ],
        2,
        &["directory"],
    ));

    // ---- Numbers on the command line.
    cases.push(case(
        "embed-batch-1000000000",
        &embed_args(&spec, &["--batch", "1000000000"]),
        2,
        &["--batch"],
    ));
    cases.push(case(
        "embed-table-lr-inf",
        &embed_args(&spec, &["--table-lr", "inf"]),
        2,
        &["--table-lr"],
    ));
    cases.push(case(
        "embed-dense-lr-nan",
        &embed_args(&spec, &["--dense-lr", "NaN"]),
        2,
        &["--dense-lr"],
    ));
    cases.push(case(
        "embed-mem-per-rank-garbage",
        &embed_args(&spec, &["--mem-per-rank", "lots"]),
        2,
        &["bad size"],
    ));
    cases.push(case(
        "torus-product-overflows",
        &["--torus", "4294967296x4294967296x4294967296", "selftest"],
        2,
        &["--torus"],
    ));
    cases.push(case(
        "torus-product-wraps-to-1",
        &["--torus", "3x12297829382473034411", "selftest"],
        2,
        &["multiply to more than"],
    ));
    cases.push(
        case(
            "torus-product-overflows-at-2-ranks",
            &["--torus", "4294967296x4294967296x4294967296", "selftest"],
            2,
            &["--torus"],
        )
        .ranks(2),
    );
    cases.push(case(
        "threads-100000",
        &als_args(&good_s, &["--threads", "100000"]),
        2,
        &["100000 threads"],
    ));
    cases.push(case(
        "wait-for-data-nan",
        &als_args(&good_s, &["--wait-for-data", "nan"]),
        2,
        &["--wait-for-data"],
    ));
    cases.push(case(
        "als-dim-0",
        &als_args(&good_s, &["--dim", "0"]),
        2,
        &["--dim 0"],
    ));
    cases.push(case(
        "als-mem-per-rank-too-small",
        &als_args(&good_s, &["--mem-per-rank", "1K"]),
        2,
        &["estimate", "--mem-per-rank"],
    ));
    cases.push(case(
        "generate-webgraph-scale-1000",
        &[
            "generate",
            "webgraph",
            "--preset",
            "in-dense",
            "--scale",
            "1000",
            "--out",
            &out("wg.h5"),
        ],
        2,
        &["estimate"],
    ));
    cases.push(case(
        "generate-webgraph-beyond-u32-nodes",
        &[
            "generate",
            "webgraph",
            "--preset",
            "sparse",
            "--scale",
            "1000",
            "--out",
            &out("wg.h5"),
        ],
        2,
        &["at most 4294967295"],
    ));
    cases.push(case(
        "generate-webgraph-scale-negative",
        &[
            "generate",
            "webgraph",
            "--preset",
            "in-dense",
            "--scale=-1",
            "--out",
            &out("wg.h5"),
        ],
        2,
        &["--scale"],
    ));
    cases.push(case(
        "generate-webgraph-unknown-preset",
        &[
            "generate",
            "webgraph",
            "--preset",
            "nope",
            "--out",
            &out("wg.h5"),
        ],
        2,
        &["nope"],
    ));
    let huge_arg = "9".repeat(10_000);
    cases.push(case(
        "cli-huge-number-is-cut",
        &als_args(&good_s, &["--epochs", &huge_arg]),
        2,
        &["more bytes)"],
    ));

    let n = cases.len();
    assert!(n >= 60, "the corpus has only {n} cases");
    let failures: Vec<String> = cases.iter().filter_map(|c| c.check(d).err()).collect();
    println!("bad-input corpus: {n} cases, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "{} of {n} cases failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// A TSV whose ids are spread over the u32 range prepares to the same dataset as the
/// same graph with compact ids (renumbered densely, not one row per possible id),
/// except `/node_ids`, which keeps the original ids, and the `source_nodes` attribute.
#[test]
fn sparse_tsv_ids_are_renumbered_and_keep_their_original_ids() {
    let dir = tempdir();
    let d = dir.path();
    let n = 2000u64;
    let text = edge_list(n as u32);
    // Spread: id u -> u * 2,000,000 + 7 (the largest near 4e9); order is kept.
    let spread = |u: u64| u * 2_000_000 + 7;
    let sparse: String = text
        .lines()
        .map(|l| match l.split_once('\t') {
            Some((a, b)) => format!(
                "{}\t{}\n",
                spread(a.parse().unwrap()),
                spread(b.parse().unwrap())
            ),
            None => format!("{l}\n"),
        })
        .collect();
    let dense_in = write(d, "dense.tsv", text.as_bytes());
    let sparse_in = write(d, "sparse.tsv", sparse.as_bytes());
    let prepare = |input: &str, out: &Path| {
        TestCommand::direct()
            .args(["prepare", "--format", "tsv", "--input", input, "--out"])
            .arg(out)
            .run()
            .expect_code(0);
    };
    let (a, b) = (d.join("dense.h5"), d.join("sparse.h5"));
    prepare(&dense_in, &a);
    prepare(&sparse_in, &b);
    for name in [
        "train/indptr",
        "train_t/indptr",
        "test/fold/indptr",
        "test/holdout/indptr",
    ] {
        assert_eq!(h5_read::<u64>(&a, name), h5_read::<u64>(&b, name), "{name}");
    }
    for name in [
        "train/indices",
        "train_t/indices",
        "test/rows",
        "test/fold/indices",
        "test/holdout/indices",
    ] {
        assert_eq!(h5_read::<u32>(&a, name), h5_read::<u32>(&b, name), "{name}");
    }
    let ids_a: Vec<u64> = h5_read(&a, "node_ids");
    let ids_b: Vec<u64> = h5_read(&b, "node_ids");
    assert_eq!(ids_a.len(), n as usize);
    assert_eq!(ids_b, ids_a.iter().map(|&u| spread(u)).collect::<Vec<_>>());
    let source_nodes = |p: &Path| -> u64 {
        torusrec::io::h5::open(p)
            .unwrap()
            .attr("source_nodes")
            .unwrap()
            .read_scalar()
            .unwrap()
    };
    assert_eq!(source_nodes(&a), n);
    assert_eq!(source_nodes(&b), spread(n - 1) + 1);
    // And both validate.
    for p in [&a, &b] {
        TestCommand::direct()
            .arg("inspect")
            .arg(p)
            .run()
            .expect_code(0);
    }
}
