//! `torusrec plot`: charts of real `als --metrics` and `embed --metrics` files and of a
//! small table, as SVG that parses, names its series and axes and stays small; one
//! rasterized to PNG (resvg) at the size asked for; bad inputs exit 2 naming the file
//! (and line), and an existing output is kept without --force.

use crate::util;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use util::{tempdir, Output, TestCommand};

fn plot(args: &[&str]) -> Output {
    TestCommand::direct().arg("plot").args(args).run()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// Real metrics files, made once: two als runs (f32 and bf16 tables) and one embed run.
struct Runs {
    _dir: tempfile::TempDir,
    f32: PathBuf,
    bf16: PathBuf,
    embed: PathBuf,
}

fn runs() -> &'static Runs {
    static RUNS: OnceLock<Runs> = OnceLock::new();
    RUNS.get_or_init(|| {
        let dir = tempdir();
        let data = dir.path().join("g.h5");
        TestCommand::direct()
            .args([
                "generate",
                "webgraph",
                "--model",
                "independent",
                "--preset",
                "in-dense",
                "--scale",
                "0.001",
            ])
            .args(["--out", s(&data)])
            .run()
            .expect_code(0);
        let als = |name: &str, dtype: &str| {
            let m = dir.path().join(name);
            TestCommand::direct()
                .args(["als", "--data", s(&data), "--dim", "8", "--epochs", "3"])
                .args([
                    "--eval-every",
                    "1",
                    "--threads",
                    "1",
                    "--table-dtype",
                    dtype,
                ])
                .args(["--metrics", s(&m)])
                .run()
                .expect_code(0);
            m
        };
        let f32 = als("f32.jsonl", "f32");
        let bf16 = als("bf16.jsonl", "bf16");
        let embed = dir.path().join("tiny.jsonl");
        TestCommand::direct()
            .args([
                "embed",
                "--preset",
                "tiny",
                "--steps",
                "20",
                "--log-every",
                "5",
            ])
            .args([
                "--eval-every",
                "10",
                "--eval-examples",
                "1024",
                "--threads",
                "1",
            ])
            .args(["--metrics", s(&embed)])
            .run()
            .expect_code(0);
        Runs {
            _dir: dir,
            f32,
            bf16,
            embed,
        }
    })
}

/// The trimmed contents of the SVG's `<text>` elements.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..];
            Some(body[..body.find("</text>")?].trim().to_string())
        })
        .collect()
}

/// Lines (and legend marks) drawn in the `i`-th series colour.
fn series_lines(svg: &str, rgb: &str) -> usize {
    svg.matches(&format!(
        "<polyline fill=\"none\" opacity=\"1\" stroke=\"{rgb}\" stroke-width=\"2\""
    ))
    .count()
}

/// The SVG parses (usvg), has the size asked for, has a text element equal to each
/// needle, is under 200 KB.
fn check_svg(path: &Path, size: (f32, f32), needles: &[&str]) -> String {
    let svg = std::fs::read_to_string(path).expect("svg written");
    assert!(svg.len() < 200_000, "{} bytes", svg.len());
    let tree = resvg::usvg::Tree::from_str(&svg, &resvg::usvg::Options::default())
        .unwrap_or_else(|e| panic!("not SVG: {e}\n{}", &svg[..svg.len().min(2000)]));
    assert_eq!((tree.size().width(), tree.size().height()), size);
    let texts = texts(&svg);
    for n in needles {
        assert!(texts.iter().any(|t| t == n), "no text {n:?} in {texts:?}");
    }
    // No fonts embedded.
    assert!(!svg.contains("@font-face") && !svg.contains("base64"));
    svg
}

/// Files in `dir` whose names start with `.` (temporaries of the atomic write).
fn hidden_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with('.'))
        .collect()
}

#[test]
fn als_runs_overlaid_with_a_legend() {
    let r = runs();
    let dir = tempdir();
    let out = dir.path().join("als.svg");
    plot(&[s(&r.f32), s(&r.bf16), "--out", s(&out)])
        .expect_code(0)
        .stdout_has(&["wrote"]);
    // Three panels of 300 px: loss, Recall@20 (every epoch evaluated), edges/s.
    let svg = check_svg(
        &out,
        (800.0, 900.0),
        &[
            "f32",
            "bf16",
            "loss by epoch",
            "Recall@20 by epoch",
            "edges/s by epoch",
            "epoch",
            "loss",
            "Recall@20",
            "edges/s",
        ],
    );
    // Per series, a line and a legend mark in each of the three panels.
    assert_eq!(series_lines(&svg, "#1F77B4"), 6);
    assert_eq!(series_lines(&svg, "#FF7F0E"), 6);
    assert!(hidden_files(dir.path()).is_empty());

    // Labels and title from the command line.
    let out2 = dir.path().join("labelled.svg");
    plot(&[
        s(&r.f32),
        s(&r.bf16),
        "--label",
        "tables f32",
        "--label",
        "tables bf16",
    ])
    .expect_code(2)
    .stderr_has(&["--out"]);
    plot(&[
        s(&r.f32),
        s(&r.bf16),
        "--label",
        "tables f32",
        "--label",
        "tables bf16",
        "--title",
        "f32 & bf16",
        "--out",
        s(&out2),
    ])
    .expect_code(0);
    check_svg(
        &out2,
        (800.0, 930.0),
        &["tables f32", "tables bf16", "f32 &amp; bf16"],
    );
    plot(&[
        s(&r.f32),
        s(&r.bf16),
        "--label",
        "one",
        "--out",
        s(&dir.path().join("x.svg")),
    ])
    .expect_code(2)
    .stderr_has(&["--label given 1 times for 2 run files"]);
}

#[test]
fn embed_run_has_auc_and_examples_per_second() {
    let r = runs();
    let dir = tempdir();
    let out = dir.path().join("embed.svg");
    plot(&[s(&r.embed), "--label", "tiny", "--out", s(&out)]).expect_code(0);
    let svg = check_svg(
        &out,
        (800.0, 900.0),
        &[
            "tiny",
            "loss by step",
            "eval AUC by step",
            "examples/s by step",
            "step",
            "eval AUC",
        ],
    );
    assert_eq!(series_lines(&svg, "#1F77B4"), 6);
    assert_eq!(series_lines(&svg, "#FF7F0E"), 0);

    // als and embed files do not mix: the second file and its first record are named.
    let mixed = dir.path().join("mixed.svg");
    plot(&[s(&r.f32), s(&r.embed), "--out", s(&mixed)])
        .expect_code(2)
        .stderr_has(&[
            &format!("{}:1:", r.embed.display()),
            "plot one kind at a time",
        ]);
    assert!(!mixed.exists());
}

#[test]
fn png_rendering_has_the_chart_size() {
    let r = runs();
    let dir = tempdir();
    let out = dir.path().join("small.svg");
    plot(&[s(&r.f32), s(&r.bf16), "--width", "640", "--height", "200"]).expect_code(2);
    plot(&[
        s(&r.f32),
        s(&r.bf16),
        "--width",
        "640",
        "--height",
        "200",
        "--out",
        s(&out),
    ])
    .expect_code(0);
    let svg = std::fs::read_to_string(&out).unwrap();
    let tree = resvg::usvg::Tree::from_str(&svg, &resvg::usvg::Options::default()).unwrap();
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    let png = pixmap.encode_png().unwrap();
    std::fs::write(dir.path().join("small.png"), &png).unwrap();

    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&png[12..16], b"IHDR");
    let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((w, h), (640, 600));
    // Not blank: the first series' colour (and the second's) is drawn.
    let px = pixmap.pixels();
    let has = |rgb: (u8, u8, u8)| {
        px.iter()
            .any(|p| (p.red(), p.green(), p.blue(), p.alpha()) == (rgb.0, rgb.1, rgb.2, 255))
    };
    assert!(has((31, 119, 180)), "first series colour missing");
    assert!(has((255, 127, 14)), "second series colour missing");
    let white = px
        .iter()
        .filter(|p| (p.red(), p.green(), p.blue()) == (255, 255, 255))
        .count();
    assert!(
        white > px.len() / 2 && white < px.len(),
        "{white} of {}",
        px.len()
    );

    // PNG output is not built into the binary: refused before any work.
    let png_out = dir.path().join("run.png");
    plot(&[s(&r.f32), "--out", s(&png_out)])
        .expect_code(2)
        .stderr_has(&["PNG is not built in"]);
    assert!(!png_out.exists());
}

#[test]
fn bad_run_files_exit_2_naming_file_and_line() {
    let r = runs();
    let dir = tempdir();
    let out = dir.path().join("o.svg");
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let missing = dir.path().join("missing.jsonl");
    plot(&[s(&missing), "--out", s(&out)])
        .expect_code(2)
        .stderr_has(&[&format!("{}: no such file", missing.display())]);
    let empty = write("empty.jsonl", "\n\n");
    plot(&[s(&empty), "--out", s(&out)])
        .expect_code(2)
        .stderr_has(&[&format!("{}: empty", empty.display())]);
    let bad = write("bad.jsonl", "{\"epoch\":1,\"loss\":2.0}\nnot json\n");
    plot(&[s(&r.f32), s(&bad), "--out", s(&out)])
        .expect_code(2)
        .stderr_has(&[&format!("{}:2: not JSON", bad.display())]);
    let neither = write(
        "neither.jsonl",
        "{\"epoch\":1,\"loss\":2.0}\n{\"loss\":1.0}\n",
    );
    plot(&[s(&neither), "--out", s(&out)])
        .expect_code(2)
        .stderr_has(&[&format!("{}:2:", neither.display()), "\"epoch\""]);
    let mixed = write(
        "mixed.jsonl",
        "{\"epoch\":1,\"loss\":2.0}\n{\"step\":5,\"loss\":1.0}\n",
    );
    plot(&[s(&mixed), "--out", s(&out)])
        .expect_code(2)
        .stderr_has(&[&format!(
            "{}:2: embed metrics (\"step\") after als metrics (\"epoch\" on line 1)",
            mixed.display()
        )]);
    let nothing = write(
        "nothing.jsonl",
        "{\"epoch\":1}\n{\"epoch\":2,\"loss\":null}\n",
    );
    plot(&[s(&nothing), "--out", s(&out)])
        .expect_code(2)
        .stderr_has(&[&format!("{}:1: no plottable values", nothing.display())]);
    let only_final = write("final.jsonl", "{\"final\":true,\"loss\":1.0}\n");
    plot(&[s(&only_final), "--out", s(&out)])
        .expect_code(2)
        .stderr_has(&[&format!("{}:1: only a final line", only_final.display())]);
    plot(&["--out", s(&out)])
        .expect_code(2)
        .stderr_has(&["--table"]);
    // --log-y with no value above 0: nothing to draw, no empty chart written.
    let negative = write(
        "negative.jsonl",
        "{\"epoch\":1,\"loss\":-2.0}\n{\"epoch\":2,\"loss\":-1.0}\n",
    );
    plot(&[s(&negative), "--log-y", "--out", s(&out)])
        .expect_code(2)
        .stderr_has(&["nothing to plot", "no value above 0"]);
    assert!(!out.exists());

    // An existing output is kept unless --force.
    std::fs::write(&out, "keep").unwrap();
    plot(&[s(&r.f32), "--out", s(&out)])
        .expect_code(2)
        .stderr_has(&["output exists (pass --force to overwrite)"]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep");
    plot(&[s(&r.f32), "--out", s(&out), "--force"]).expect_code(0);
    assert!(std::fs::read_to_string(&out).unwrap().starts_with("<svg"));
    assert!(hidden_files(dir.path()).is_empty());
}

const TABLE: &str = "\
# a benchmark's table; the comment is skipped
dataset\tvariant\tP\tseconds\tbytes
cnr-k1\tdedup\t1\t2.0\t0
cnr-k1\tdedup\t2\t1.2\t1000
cnr-k1\tallgather\t2\t1.5\t4000
in-dense\tdedup\t1\t8.0\t0
in-dense\tdedup\t2\t4.5\t20000
in-dense\tallgather\t2\t5.0\t90000
in-dense\timplicit\t1\t3.0\t-
";

#[test]
fn table_bars_and_lines() {
    let dir = tempdir();
    let t = dir.path().join("t.tsv");
    std::fs::write(&t, TABLE).unwrap();
    // Categorical x: grouped bars, one colour per variant.
    let bars = dir.path().join("bars.svg");
    plot(&[
        "--table",
        s(&t),
        "--x",
        "dataset",
        "--y",
        "seconds",
        "--series",
        "variant",
        "--where",
        "P=2",
        "--ylabel",
        "s/epoch",
        "--out",
        s(&bars),
    ])
    .expect_code(0);
    let svg = check_svg(
        &bars,
        (800.0, 300.0),
        &[
            "cnr-k1",
            "in-dense",
            "dedup",
            "allgather",
            "s/epoch",
            "s/epoch by dataset",
        ],
    );
    assert!(
        !texts(&svg).contains(&"implicit".to_string()),
        "--where P=2 keeps no implicit row"
    );
    // Two groups x two variants, each bar a filled rect in its series' colour.
    assert_eq!(svg.matches("fill=\"#1F77B4\"").count() - 1, 2, "{svg}"); // + legend
    assert_eq!(svg.matches("fill=\"#FF7F0E\"").count() - 1, 2, "{svg}");

    // Numeric x: lines; "-" cells are left out; a log axis.
    let lines = dir.path().join("lines.svg");
    plot(&[
        "--table",
        s(&t),
        "--x",
        "P",
        "--y",
        "bytes",
        "--series",
        "variant",
        "--where",
        "dataset=in-dense",
        "--log-y",
        "--out",
        s(&lines),
    ])
    .expect_code(0);
    let svg = check_svg(
        &lines,
        (800.0, 300.0),
        &["dedup", "allgather", "bytes by P"],
    );
    assert!(
        !texts(&svg).contains(&"implicit".to_string()),
        "its bytes are \"-\""
    );
    assert_eq!(series_lines(&svg, "#1F77B4"), 2, "dedup: line and legend");
    assert_eq!(
        series_lines(&svg, "#FF7F0E"),
        2,
        "allgather (one point): line and legend"
    );

    // Errors name the column or the file and line.
    let out = dir.path().join("e.svg");
    plot(&[
        "--table",
        s(&t),
        "--x",
        "dataset",
        "--y",
        "nope",
        "--out",
        s(&out),
    ])
    .expect_code(2)
    .stderr_has(&[
        "--y \"nope\": no such column",
        "dataset, variant, P, seconds, bytes",
    ]);
    plot(&[
        "--table",
        s(&t),
        "--x",
        "dataset",
        "--y",
        "variant",
        "--out",
        s(&out),
    ])
    .expect_code(2)
    .stderr_has(&[&format!(
        "{}:3: column variant: \"dedup\" is not a number",
        t.display()
    )]);
    plot(&[
        "--table",
        s(&t),
        "--x",
        "dataset",
        "--y",
        "seconds",
        "--kind",
        "line",
    ])
    .expect_code(2);
    plot(&[
        "--table",
        s(&t),
        "--x",
        "dataset",
        "--y",
        "seconds",
        "--kind",
        "line",
        "--out",
        s(&out),
    ])
    .expect_code(2)
    .stderr_has(&["--kind line needs numbers in column dataset"]);
    plot(&[
        "--table",
        s(&t),
        "--x",
        "P",
        "--y",
        "seconds",
        "--where",
        "P=9",
        "--out",
        s(&out),
    ])
    .expect_code(2)
    .stderr_has(&["no rows to plot"]);
    let ragged = dir.path().join("ragged.csv");
    std::fs::write(&ragged, "a,b\n1,2\n3\n").unwrap();
    plot(&[
        "--table",
        s(&ragged),
        "--x",
        "a",
        "--y",
        "b",
        "--out",
        s(&out),
    ])
    .expect_code(2)
    .stderr_has(&[&format!(
        "{}:3: 1 cells, the header has 2",
        ragged.display()
    )]);
    assert!(!out.exists());
}

#[test]
fn under_mpirun_one_rank_draws() {
    let r = runs();
    let dir = tempdir();
    let out = dir.path().join("mpi.svg");
    TestCommand::mpirun(2)
        .args(["plot", s(&r.f32), "--out", s(&out)])
        .run()
        .expect_code(0)
        .occurs("wrote", 1);
    check_svg(&out, (800.0, 900.0), &["f32", "loss by epoch"]);
}
