use super::*;

fn params() -> CopyingParams {
    cnr2000_params()
}

#[test]
fn exact_arcs_and_clean_rows() {
    let p = params();
    let m = CopyModel::new(&p, 5_000, 51_234, 7).unwrap();
    let (indptr, targets) = m.generate_rows(0, 5_000);
    assert_eq!(targets.len(), 51_234);
    for (u, w) in indptr.windows(2).enumerate() {
        let row = &targets[w[0] as usize..w[1] as usize];
        assert!(
            row.windows(2).all(|x| x[0] < x[1]),
            "row {u} not sorted/distinct"
        );
        assert!(row.iter().all(|&v| v as usize != u && v < 5_000), "row {u}");
    }
}

#[test]
fn any_split_and_thread_count_gives_the_same_rows() {
    let p = params();
    let m = CopyModel::new(&p, 3_001, 30_000, 3).unwrap();
    let (ip, t) = m.generate_rows(0, 3_001);
    for cut in [1u64, 977, 1500, 3000] {
        let (ia, ta) = m.generate_rows(0, cut);
        let (ib, tb) = m.generate_rows(cut, 3_001);
        let mut joined = ta.clone();
        joined.extend_from_slice(&tb);
        assert_eq!(joined, t, "cut {cut}");
        assert_eq!(ia.len() + ib.len() - 1, ip.len());
    }
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let (_, t1) = one.install(|| m.generate_rows(0, 3_001));
    assert_eq!(t1, t);
    let other = CopyModel::new(&p, 3_001, 30_000, 4).unwrap();
    assert_ne!(other.generate_rows(0, 3_001).1, t);
}

#[test]
fn params_round_trip_and_refuse_bad_fields() {
    let p = params();
    assert_eq!(CopyingParams::parse(&p.render(false)).unwrap(), p);
    assert_eq!(CopyingParams::parse(&p.render(true)).unwrap(), p);
    let mut bad = p.clone();
    bad.copy = 0.9;
    bad.template = 0.5;
    assert!(bad.validate().unwrap_err().contains("at most 1"));
    let text = p
        .render(false)
        .replace("version = 4", "version = 4\nbogus = 3");
    assert!(CopyingParams::parse(&text).is_err());
    assert!(CopyModel::new(&p, 10, 2, 1).is_err());
    // A file of the previous version is refused, naming the versions.
    let old = p.render(false).replace("version = 4", "version = 3");
    assert!(CopyingParams::parse(&old)
        .unwrap_err()
        .contains("version 3"));
}

#[test]
fn parents_link_their_children_and_clones_copy_their_source() {
    let mut p = params();
    p.clone = 0.5;
    let m = CopyModel::new(&p, 6_000, 60_000, 5).unwrap();
    let (indptr, targets) = m.generate_rows(0, 6_000);
    let row = |u: usize| &targets[indptr[u] as usize..indptr[u + 1] as usize];
    let is_index = |u: u64| m.index[m.dir_index(u)] == u;
    let (mut with_parent, mut clones) = (0, 0);
    for v in 0..6_000u64 {
        let x = m.parents[v as usize];
        if x != u32::MAX {
            with_parent += 1;
            // A parent with room for its children (every parent but an index,
            // whose listing comes first) links to each of them.
            assert!(m.degrees[x as usize] > 0 && x as u64 != v);
            if !is_index(x as u64) {
                assert!(
                    row(x as usize).binary_search(&(v as u32)).is_ok(),
                    "{x} -> {v}"
                );
            }
        }
        if let Some(c) = m.clone_source(v) {
            clones += 1;
            // Same directory, before it, with links, not a clone itself.
            assert!(c < v && m.dir_index(c) == m.dir_index(v));
            assert!(m.clone_source(c).is_none() && m.degrees[c as usize] > 0);
            // Two clones of one source with one degree have one list, up to
            // the two pages themselves.
            if v > 0
                && m.clone_source(v - 1) == Some(c)
                && m.degrees[v as usize - 1] == m.degrees[v as usize]
            {
                let strip = |r: &[u32]| -> Vec<u32> {
                    r.iter()
                        .copied()
                        .filter(|&t| t as u64 != v && t as u64 != v - 1 && t as u64 != c)
                        .collect()
                };
                assert_eq!(
                    strip(row(v as usize - 1)),
                    strip(row(v as usize)),
                    "clones {} {v}",
                    v - 1
                );
            }
        }
    }
    assert!(
        with_parent > 1_000 && clones > 500,
        "{with_parent} parents, {clones} clones"
    );
    // Every page but a few has an in-link (the crawl found it).
    let mut indeg = vec![0u32; 6_000];
    for &t in &targets {
        indeg[t as usize] += 1;
    }
    let orphans = indeg.iter().filter(|&&d| d == 0).count();
    assert!(orphans < 6_000 / 20, "{orphans} pages without in-links");
}
