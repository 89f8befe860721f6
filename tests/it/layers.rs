//! The module layers point down (issue 13): the checkpoint machinery, the file helpers,
//! `data`, the click data (`clicks`) and the model spec do not import the modules above
//! them. A source scan: a `use` or path of a higher module in a lower one fails here,
//! naming the file and line.

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

/// Every line of the files under `lower` (relative to `src/`) that names one of the
/// `higher` modules (`crate::<m>`).
fn upward_imports(lower: &str, higher: &[&str]) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for f in rust_files(&src.join(lower)) {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for m in higher {
                if code.contains(&format!("crate::{m}::"))
                    || code.contains(&format!("crate::{m}}}"))
                {
                    found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn lower_layers_do_not_import_higher_ones() {
    let cases: [(&str, &[&str]); 10] = [
        (
            "ckpt",
            &["data", "app", "als", "embed", "cli", "project", "clicks"],
        ),
        (
            "h5.rs",
            &["data", "app", "als", "embed", "cli", "project", "ckpt"],
        ),
        (
            "outfile.rs",
            &["data", "app", "als", "embed", "cli", "project", "ckpt"],
        ),
        (
            "faults.rs",
            &["data", "app", "als", "embed", "cli", "project", "ckpt"],
        ),
        (
            "metrics.rs",
            &["data", "app", "als", "embed", "cli", "project", "ckpt"],
        ),
        (
            "error.rs",
            &["data", "app", "als", "embed", "cli", "project", "ckpt"],
        ),
        ("data", &["app", "cli", "project", "embed", "clicks"]),
        // The click data is below the embedding model (issue 16).
        ("clicks", &["app", "cli", "als", "embed", "project", "plot"]),
        (
            "spec.rs",
            &[
                "app", "cli", "als", "embed", "project", "plot", "clicks", "data",
            ],
        ),
        ("plot", &["app", "cli", "als", "embed", "project"]),
    ];
    let mut all = Vec::new();
    for (lower, higher) in cases {
        all.extend(upward_imports(lower, higher));
    }
    assert!(all.is_empty(), "imports that point up:\n{}", all.join("\n"));
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
