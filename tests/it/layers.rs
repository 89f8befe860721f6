//! The module layers point down (issues 13 and 16): a source scan builds the crate's
//! module graph file by file and fails, naming the file and line, on an arrow that
//! points up or sideways between layers or rooms ([`LAYERS`], [`ROOMS`]), on an import
//! circle between files, and on communication or I/O in the numeric modules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn rust_files(p: &Path) -> Vec<PathBuf> {
    if p.is_file() {
        return vec![p.to_path_buf()];
    }
    let mut out = Vec::new();
    for e in std::fs::read_dir(p).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The crate's module graph, file by file: each file of `src/` and the modules its
/// non-test code names through `crate::`, `super::` or `self::` paths (`use` lines and
/// paths in code alike), each resolved to the longest module that is a file. A file's
/// names of its own ancestors (a child using its parent's items) are not arrows: the
/// parent declares the child.
struct ModuleGraph {
    /// Module paths (`embed::tables::keys`); lib.rs is `""`.
    modules: Vec<String>,
    files: Vec<PathBuf>,
    /// For each module, the modules it names, with the first line naming each.
    arrows: Vec<BTreeMap<usize, (usize, String)>>,
}

/// `embed/tables/keys.rs` -> `embed::tables::keys`; `embed/mod.rs` -> `embed`.
fn module_path(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// Parses one path tree at the start of `s` (`a::b::{c, d::{e, f}}`), pushing every
/// path it names, after `prefix`, into `out`; returns the bytes consumed.
fn parse_path_tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let ident_len = |s: &str| {
        s.find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(s.len())
    };
    let mut path = prefix.to_vec();
    let mut i = 0;
    loop {
        if s[i..].starts_with('{') {
            i += 1;
            loop {
                let r = &s[i..];
                let t = r.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
                i += r.len() - t.len();
                if t.is_empty() {
                    return i;
                }
                if t.starts_with('}') {
                    return i + 1;
                }
                let used = parse_path_tree(t, &path, out);
                i += if used == 0 {
                    t.chars().next().map_or(1, char::len_utf8)
                } else {
                    used
                };
            }
        }
        let n = ident_len(&s[i..]);
        if n == 0 {
            if !path.is_empty() {
                out.push(path);
            }
            return i;
        }
        path.push(s[i..i + n].to_string());
        i += n;
        if s[i..].starts_with("::") {
            i += 2;
        } else {
            out.push(path);
            return i;
        }
    }
}

/// A file's code without comments and without its `#[cfg(test)] mod tests`, newlines kept.
fn code_of(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    for line in text.lines() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            // The test module is last by this crate's habit; its imports are not the
            // module's.
            break;
        }
        code.push_str(line.split("//").next().unwrap_or(""));
        code.push('\n');
    }
    code
}

impl ModuleGraph {
    fn of_crate() -> ModuleGraph {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let files: Vec<PathBuf> = rust_files(&src)
            .into_iter()
            .filter(|f| f != &src.join("main.rs"))
            .collect();
        let modules: Vec<String> = files
            .iter()
            .map(|f| module_path(f.strip_prefix(&src).unwrap()))
            .collect();
        let index: BTreeMap<&str, usize> = modules
            .iter()
            .enumerate()
            .map(|(i, m)| (m.as_str(), i))
            .collect();
        let resolve = |path: &[String]| -> Option<usize> {
            (1..=path.len())
                .rev()
                .find_map(|n| index.get(path[..n].join("::").as_str()).copied())
        };
        let mut arrows = vec![BTreeMap::new(); files.len()];
        for (m, file) in files.iter().enumerate() {
            let me: Vec<String> = modules[m]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            let code = code_of(&std::fs::read_to_string(file).unwrap());
            let bytes = code.as_bytes();
            let mut at = 0;
            while at < code.len() {
                let rest = &code[at..];
                let boundary = at == 0 || {
                    let c = bytes[at - 1];
                    !(c.is_ascii_alphanumeric() || c == b'_' || c == b':')
                };
                let (base, skip): (Vec<String>, usize) = if !boundary {
                    (Vec::new(), 0)
                } else if rest.starts_with("crate::") {
                    (Vec::new(), "crate::".len())
                } else if rest.starts_with("self::") {
                    (me.clone(), "self::".len())
                } else if rest.starts_with("super::") {
                    let mut r = rest;
                    let mut n = 0;
                    while let Some(after) = r.strip_prefix("super::") {
                        r = after;
                        n += 1;
                    }
                    (
                        me[..me.len().saturating_sub(n)].to_vec(),
                        rest.len() - r.len(),
                    )
                } else {
                    (Vec::new(), 0)
                };
                if skip == 0 {
                    at += rest.chars().next().map_or(1, char::len_utf8);
                    continue;
                }
                let mut paths = Vec::new();
                let used = parse_path_tree(&code[at + skip..], &base, &mut paths);
                let line = code[..at].matches('\n').count();
                for p in paths {
                    let Some(t) = resolve(&p) else { continue };
                    let target = &modules[t];
                    let ancestor = target.is_empty()
                        || modules[m] == *target
                        || modules[m].starts_with(&format!("{target}::"));
                    if !ancestor {
                        let text = code.lines().nth(line).unwrap_or("").trim().to_string();
                        arrows[m].entry(t).or_insert((line + 1, text));
                    }
                }
                at += skip + used.max(1);
            }
        }
        ModuleGraph {
            modules,
            files,
            arrows,
        }
    }

    /// The sets of more than one module that reach each other (the strongly connected
    /// components, by Tarjan's algorithm).
    fn circles(&self) -> Vec<Vec<usize>> {
        struct Walk<'g> {
            g: &'g ModuleGraph,
            index: Vec<Option<usize>>,
            low: Vec<usize>,
            stack: Vec<usize>,
            on_stack: Vec<bool>,
            next: usize,
            out: Vec<Vec<usize>>,
        }
        fn visit(w: &mut Walk, v: usize) {
            w.index[v] = Some(w.next);
            w.low[v] = w.next;
            w.next += 1;
            w.stack.push(v);
            w.on_stack[v] = true;
            for t in w.g.arrows[v].keys().copied().collect::<Vec<_>>() {
                match w.index[t] {
                    None => {
                        visit(w, t);
                        w.low[v] = w.low[v].min(w.low[t]);
                    }
                    Some(it) if w.on_stack[t] => w.low[v] = w.low[v].min(it),
                    Some(_) => {}
                }
            }
            if Some(w.low[v]) == w.index[v] {
                let mut comp = Vec::new();
                loop {
                    let t = w.stack.pop().unwrap();
                    w.on_stack[t] = false;
                    comp.push(t);
                    if t == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    w.out.push(comp);
                }
            }
        }
        let n = self.modules.len();
        let mut w = Walk {
            g: self,
            index: vec![None; n],
            low: vec![0; n],
            stack: Vec::new(),
            on_stack: vec![false; n],
            next: 0,
            out: Vec::new(),
        };
        for v in 0..n {
            if w.index[v].is_none() {
                visit(&mut w, v);
            }
        }
        w.out
    }

    /// One line per arrow inside `circle`: `a -> b (file:line: text)`.
    fn describe(&self, circle: &[usize]) -> String {
        let mut lines = Vec::new();
        for &a in circle {
            for (&b, (line, text)) in &self.arrows[a] {
                if circle.contains(&b) {
                    lines.push(format!(
                        "  {} -> {} ({}:{}: {})",
                        self.modules[a],
                        self.modules[b],
                        self.files[a].display(),
                        line,
                        text
                    ));
                }
            }
        }
        lines.join("\n")
    }
}

#[test]
fn no_import_circles_between_files() {
    let g = ModuleGraph::of_crate();
    // The scan would pass vacuously if it found no arrows.
    let keys = g.modules.iter().position(|m| m == "embed::tables::keys");
    assert!(
        keys.is_some_and(|k| !g.arrows[k].is_empty()),
        "the scan found no arrows"
    );
    let circles = g.circles();
    let text: Vec<String> = circles.iter().map(|c| g.describe(c)).collect();
    assert!(circles.is_empty(), "import circles:\n{}", text.join("\n\n"));
}

/// The crate's layers, lowest first. A module may name modules of lower layers only:
/// modules of one layer are peers and name nothing of each other (iALS and the
/// embedding model share what lies below them, never each other's code). Every
/// top-level module is placed here; a new one fails [`layers_point_down`] until it is.
const LAYERS: &[&[&str]] = &[
    &["error"],
    &[
        "allocs",
        "bf16",
        "blocks",
        "cpu",
        "faults",
        "hugepages",
        "lsq",
        "metrics",
        "node",
        "panic_guard",
        "plot",
        "rng",
    ],
    &["io", "mem_estimate"],
    &["comm"],
    &["ckpt"],
    &["spec"],
    &["data"],
    &["als", "embed"],
    &["projection"],
    &["cli"],
    &["app"],
];

/// The rooms inside a top-level module, lowest first, in the same sense as [`LAYERS`]:
/// a room names only rooms below it (the files of one room name each other freely).
/// Every room of these modules is placed here.
const ROOMS: &[(&str, &[&[&str]])] = &[
    ("data", &[&["graph", "clicks"], &["useritem"]]),
    (
        "als",
        &[
            &["solve"],
            &["shard", "model"],
            &["eval", "checkpoint"],
            &["train"],
            &["recommend", "tune"],
        ],
    ),
    (
        "embed",
        &[
            &["dense", "tables"],
            &["sharding"],
            &["train"],
            &["planner", "io"],
            &["calibrate", "driver", "predict"],
        ],
    ),
    (
        "projection",
        &[&["chip", "traffic"], &["als", "embed"], &["measure"]],
    ),
];

fn layer_of(layers: &[&[&str]], name: &str) -> Option<usize> {
    layers.iter().position(|l| l.contains(&name))
}

/// Every arrow points down: between top-level modules by [`LAYERS`] (so `data` names
/// neither `als` nor `embed`, `als` and `embed` name nothing of each other, and `ckpt`,
/// `io` and the leaves name no workload), and between the rooms of `data`, `als`,
/// `embed` and `projection` by [`ROOMS`].
#[test]
fn layers_point_down() {
    let g = ModuleGraph::of_crate();
    let mut bad = Vec::new();
    for (a, arrows) in g.arrows.iter().enumerate() {
        let pa: Vec<&str> = g.modules[a].split("::").collect();
        if g.modules[a].is_empty() {
            continue;
        }
        let Some(la) = layer_of(LAYERS, pa[0]) else {
            bad.push(format!("{}: not placed in LAYERS", g.files[a].display()));
            continue;
        };
        let rooms = ROOMS.iter().find(|(m, _)| *m == pa[0]).map(|(_, r)| *r);
        if let (Some(rooms), Some(room)) = (rooms, pa.get(1)) {
            if layer_of(rooms, room).is_none() {
                bad.push(format!(
                    "{}: room {room} not placed in ROOMS",
                    g.files[a].display()
                ));
            }
        }
        for (&b, (line, text)) in arrows {
            let pb: Vec<&str> = g.modules[b].split("::").collect();
            let ok = if pa[0] != pb[0] {
                layer_of(LAYERS, pb[0]).is_some_and(|lb| lb < la)
            } else if let (Some(rooms), Some(ra), Some(rb)) = (rooms, pa.get(1), pb.get(1)) {
                ra == rb
                    || matches!(
                        (layer_of(rooms, ra), layer_of(rooms, rb)),
                        (Some(x), Some(y)) if y < x
                    )
            } else {
                true
            };
            if !ok {
                bad.push(format!(
                    "{}:{line}: {} -> {}: {text}",
                    g.files[a].display(),
                    g.modules[a],
                    g.modules[b]
                ));
            }
        }
    }
    // The scan would pass vacuously if it read no arrows at all.
    let arrows: usize = g.arrows.iter().map(|a| a.len()).sum();
    assert!(
        arrows > 500,
        "only {arrows} arrows found: the scan is broken"
    );
    assert!(
        bad.is_empty(),
        "arrows that point up or sideways:\n{}",
        bad.join("\n")
    );
}

/// The scan itself: an upward `use` in a multi-line group, a `super::` path and a path
/// in code are all arrows; a comment and the test module are not.
#[test]
fn the_module_scan_reads_groups_super_paths_and_code() {
    let mut paths = Vec::new();
    parse_path_tree("a::{b, c::{d, e}, f as g}", &[], &mut paths);
    let names: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        names,
        ["a::b", "a::c::d", "a::c::e", "a::f", "a::as", "a::g"]
    );
    let code =
        code_of("use x; // crate::y::z\nfn f() {}\n#[cfg(test)]\nmod tests { use crate::w; }\n");
    assert!(
        !code.contains("crate::y") && !code.contains("crate::w"),
        "{code}"
    );
    let g = ModuleGraph::of_crate();
    let arrow = |a: &str, b: &str| {
        let (ia, ib) = (
            g.modules.iter().position(|m| m == a).unwrap(),
            g.modules.iter().position(|m| m == b).unwrap(),
        );
        g.arrows[ia].contains_key(&ib)
    };
    // `use crate::{Error, Result}` names lib.rs, which is no arrow; a group over lines:
    assert!(arrow("embed::train::trainer", "embed::tables::store"));
    // A `super::` path:
    assert!(arrow("data::graph::readers", "data::graph::rows"));
}

/// Numerics never communicate or do I/O (issue 16): the iALS solvers, the embedding
/// row kernels, the MLP and its GEMM name no communicator, MPI, file, HDF5, checkpoint
/// or printing.
#[test]
fn numeric_modules_neither_communicate_nor_do_io() {
    let numeric = [
        "als/solve",
        "embed/dense",
        "embed/tables/row_kernels.rs",
        "embed/tables/table_opt.rs",
        "embed/train/schedule.rs",
    ];
    let needles = [
        "crate::comm",
        "Comm",
        "mpi::",
        "hdf5",
        "std::fs",
        "std::io",
        "std::net",
        "crate::io",
        "crate::ckpt",
        "println!",
        "print!",
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    let mut files = 0;
    for dir in numeric {
        for f in rust_files(&src.join(dir)) {
            files += 1;
            let code = code_of(&std::fs::read_to_string(&f).unwrap());
            for (i, line) in code.lines().enumerate() {
                for n in needles {
                    let hit = line.match_indices(n).any(|(at, _)| {
                        let before = line[..at].chars().next_back();
                        let after = line[at + n.len()..].chars().next();
                        let word =
                            |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                        !word(before) && (n.ends_with(['!', ':']) || !word(after))
                    });
                    if hit {
                        found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(files >= 8, "only {files} numeric files found: a path moved");
    assert!(
        found.is_empty(),
        "numerics that communicate or do I/O:\n{}",
        found.join("\n")
    );
}

/// Every line of the files under `dir` (relative to `src/`) that contains `needle`,
/// comments included.
fn mentions(dir: &str, needle: &str) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for f in rust_files(&src.join(dir)) {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.contains(needle) {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    found
}

/// The command line is below the subcommands (issue 32): `app` turns `cli`'s flags
/// into configs and runs them; `cli` names nothing of `app`.
#[test]
fn cli_does_not_mention_app() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert!(src.join("cli/mod.rs").is_file(), "src/cli/ is a directory");
    assert!(!rust_files(&src.join("cli")).is_empty());
    let found = mentions("cli", "crate::app");
    assert!(found.is_empty(), "cli mentions app:\n{}", found.join("\n"));
}

/// The launcher's environment and the node's description (issue 32): only src/node.rs
/// reads the ranks on the node, the launcher's rank, the core count, the node's memory
/// and its cgroup limit; every other module asks `node`.
#[test]
fn only_node_reads_the_launcher_and_the_node() {
    let needles = [
        "OMPI_COMM_WORLD",
        "MPI_LOCALNRANKS",
        "PMI_RANK",
        "PMIX_RANK",
        "SLURM_",
        "available_parallelism",
        "/proc/meminfo",
        "/proc/cpuinfo",
        "MemTotal",
        "cgroup",
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let node = src.join("node.rs");
    // The scan would pass vacuously if node.rs stopped reading them.
    let node_text = std::fs::read_to_string(&node).unwrap();
    for n in needles {
        assert!(node_text.contains(n), "src/node.rs does not read {n}");
    }
    let mut found = Vec::new();
    for f in rust_files(&src) {
        if f == node {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for n in needles {
                if code.contains(n) {
                    found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "read outside src/node.rs:\n{}",
        found.join("\n")
    );
}

/// The HDF5 and output-file helpers have one home each (issue 32): `data::dataset`
/// no longer re-exports them for old callers.
#[test]
fn dataset_does_not_re_export_the_file_helpers() {
    let found: Vec<String> = ["pub use crate::io::h5", "pub use crate::io::outfile"]
        .iter()
        .flat_map(|n| mentions("data", n))
        .collect();
    assert!(found.is_empty(), "re-exports:\n{}", found.join("\n"));
}
