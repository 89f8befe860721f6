//! The streaming prepare (`data::stream`) writes the same dataset as the in-memory
//! reference (`global_prepare` + `global_write_dataset`), at 1-3 thread ranks, with
//! small chunks so that every pass runs over many chunks and the transpose over
//! several column blocks: on cnr-2000 (BV decoded on every pass, and held in
//! memory; K = 1 and 10, docs/design.md's reference counts) and on a small synthetic web graph; and through the `prepare` /
//! `generate webgraph` entry point.

use std::path::{Path, PathBuf};
use torusrec::app::prepare::{global_run_with, PrepareConfig, Source};
use torusrec::comm::threads::run;
use torusrec::comm::Comm;
use torusrec::data::graph::dataset::{global_write_dataset, Dataset};
use torusrec::data::graph::prepare::global_prepare;
use torusrec::data::graph::readers::{bv_info, read_bv, SourceInfo};
use torusrec::data::graph::rows::LocalRows;
use torusrec::data::graph::stream::budget::StreamOpts;
use torusrec::data::graph::stream::global_prepare_stream;
use torusrec::data::graph::stream::sources::{BvRows, MemoryRows, RowSource, SyntheticRows};
use torusrec::data::graph::webgraph_gen::{generate_rows, HostLayout, WebGraphSpec};
use torusrec::io::outfile::temp_path;

fn cnr() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cnr-2000/cnr-2000")
}

/// Small buffers: chunks of a few hundred arcs, transpose blocks of a few thousand.
const SMALL: StreamOpts = StreamOpts {
    chunk_arcs: 700,
    transpose_arcs: 5000,
};

/// The in-memory reference at `p` ranks, written to `out`.
fn reference_file(
    p: usize,
    out: &Path,
    k: u64,
    seed: u64,
    rows_of: &(dyn Fn(usize, usize) -> (SourceInfo, LocalRows) + Sync),
) {
    run(p, |c| {
        let (info, rows) = rows_of(c.rank(), c.size());
        let (meta, part) = global_prepare(&c, &info, rows, k, seed).unwrap();
        global_write_dataset(&c, out, &meta, &part).unwrap();
    });
}

fn bv_rows(rank: usize, size: usize) -> (SourceInfo, LocalRows) {
    read_bv(&cnr(), rank, size).unwrap()
}

#[test]
fn stream_equals_reference_on_cnr2000_at_1_2_3_ranks() {
    let d = tempfile::tempdir().unwrap();
    for (k, nodes, arcs) in [(1u64, 238_598u64, 2_892_560u64), (10, 22_988, 477_754)] {
        let ref_path = d.path().join(format!("ref-{k}.h5"));
        reference_file(1, &ref_path, k, 42, &bv_rows);
        let reference = Dataset::read(&ref_path).unwrap();
        assert_eq!(reference.meta.num_rows, nodes);
        assert_eq!(reference.num_arcs(), arcs);
        for p in 1..=3 {
            let out = d.path().join(format!("stream-{k}-{p}.h5"));
            let reports = run(p, |c| {
                // Chunks of ~20k arcs: cnr-2000 has 3.2M arcs, so ~80 chunks per rank.
                let opts = StreamOpts {
                    chunk_arcs: 20_000,
                    transpose_arcs: 100_000,
                };
                // Rows decoded from the file on every pass, and rows held in memory.
                if p != 2 {
                    let info = bv_info(&cnr()).unwrap();
                    let src = BvRows::new(&cnr(), &info, c.rank(), c.size());
                    global_prepare_stream(&c, &src, &info, k, 42, &out, &opts).unwrap()
                } else {
                    let (info, rows) = bv_rows(c.rank(), c.size());
                    global_prepare_stream(&c, &MemoryRows(rows), &info, k, 42, &out, &opts).unwrap()
                }
            });
            assert!(!temp_path(&out).exists());
            let got = Dataset::read(&out).unwrap();
            assert_eq!(got, reference, "K = {k}, P = {p}");
            let r = &reports[0];
            assert!(reports.iter().all(|x| x.meta == r.meta));
            assert_eq!(r.train_arcs + r.fold_arcs + r.holdout_arcs, arcs);
            assert_eq!(r.test_rows, reference.test_rows.len() as u64);
        }
    }
}

fn spec() -> WebGraphSpec {
    WebGraphSpec::from_preset("in-dense", 0.002).unwrap()
}

fn synthetic_rows(rank: usize, size: usize, seed: u64) -> (SourceInfo, LocalRows) {
    let spec = spec();
    let layout = HostLayout::new(&spec, seed);
    let (lo, hi) = torusrec::blocks::block_range(spec.nodes, size, rank);
    let (indptr, targets) = generate_rows(&spec, &layout, seed, lo, hi);
    let rows = LocalRows {
        lo,
        indptr,
        targets,
    };
    let info = SourceInfo {
        name: format!("synthetic:webgraph:in-dense:scale=0.002:seed={seed}"),
        nodes: spec.nodes,
        arcs: 0,
    };
    (info, rows)
}

#[test]
fn stream_equals_reference_on_a_synthetic_graph_at_1_2_3_ranks() {
    let d = tempfile::tempdir().unwrap();
    let seed = 7;
    for k in [0u64, 5] {
        // The reference, with the arc count the app reports (all generated arcs).
        let ref_path = d.path().join(format!("ref-{k}.h5"));
        let total = synthetic_rows(0, 1, seed).1.num_arcs();
        reference_file(2, &ref_path, k, seed, &|r, s| {
            let (mut info, rows) = synthetic_rows(r, s, seed);
            info.arcs = total;
            (info, rows)
        });
        let reference = Dataset::read(&ref_path).unwrap();
        assert!(reference.meta.num_rows > 100 && reference.num_arcs() > 10_000);
        for p in 1..=3 {
            let out = d.path().join(format!("stream-{k}-{p}.h5"));
            run(p, |c| {
                let (info, _) = synthetic_rows(c.rank(), c.size(), seed);
                let src = SyntheticRows::new(&spec(), seed, c.rank(), c.size());
                global_prepare_stream(&c, &src, &info, k, seed, &out, &SMALL).unwrap()
            });
            assert_eq!(Dataset::read(&out).unwrap(), reference, "K = {k}, P = {p}");
        }
        // The `generate webgraph` entry point writes the same file.
        let out = d.path().join(format!("app-{k}.h5"));
        let cfg = PrepareConfig {
            source: Source::Synthetic {
                preset: "in-dense".into(),
                scale: 0.002,
                spec: spec(),
            },
            min_links: k,
            seed,
            out: out.clone(),
            force: false,
        };
        let reports = run(2, |c| global_run_with(&c, &cfg, &SMALL).unwrap());
        assert_eq!(Dataset::read(&out).unwrap(), reference, "app, K = {k}");
        assert_eq!(reports[0].meta, reference.meta);
        assert!(reports[0].peak_rss_bytes > 0);
    }
}

#[test]
fn chunks_cover_the_block_in_order() {
    let spec = spec();
    for chunk in [1usize, 50, 1000, 1 << 30] {
        let src = SyntheticRows::new(&spec, 3, 1, 3);
        let (lo, hi) = src.block();
        let mut next = lo;
        let mut arcs = Vec::new();
        src.for_each_chunk(chunk, &mut |c| {
            assert_eq!(c.lo, next);
            next += c.num_rows() as u64;
            arcs.extend_from_slice(&c.targets);
            Ok(())
        })
        .unwrap();
        assert_eq!(next, hi);
        let whole = synthetic_rows(1, 3, 3).1;
        assert_eq!(arcs, whole.targets, "chunk {chunk}");

        let mem = MemoryRows(whole.clone());
        let mut rows = Vec::new();
        mem.for_each_chunk(chunk, &mut |c| {
            assert!(c.num_rows() >= 1);
            assert!(c.num_rows() == 1 || c.num_arcs() as usize <= chunk);
            rows.extend((0..c.num_rows()).map(|i| c.row(i).to_vec()));
            Ok(())
        })
        .unwrap();
        let want: Vec<Vec<u32>> = (0..whole.num_rows())
            .map(|i| whole.row(i).to_vec())
            .collect();
        assert_eq!(rows, want, "chunk {chunk}");
    }
}

#[test]
fn a_filter_that_empties_the_graph_fails_everywhere_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("none.h5");
    let res = run(2, |c| {
        let (info, rows) = bv_rows(c.rank(), c.size());
        global_prepare_stream(&c, &MemoryRows(rows), &info, 1_000_000, 1, &out, &SMALL).map(|_| ())
    });
    for r in &res {
        assert_eq!(r.as_ref().unwrap_err().exit_code(), 2);
    }
    assert!(res[0]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("empty graph"));
    assert!(!out.exists() && !temp_path(&out).exists());
}
