//! Hand cases for the reader, the filter and the splits.

use super::filter::{build_matrix, min_count_filter, Ids, Matrix};
use super::parse::{parse_columns, parse_text, Column, Header, Interactions, TextFormat};
use super::split::{split, SplitKind};
use crate::rng::{hash3, stream};
use std::path::Path;

fn parse(text: &str, format: TextFormat, header: Header) -> crate::error::Result<Interactions> {
    parse_text(text.as_bytes(), Path::new("in.txt"), format, None, header)
}

#[test]
fn csv_header_is_skipped_and_weights_times_read() {
    let x = parse(
        "userId,movieId,rating,timestamp\n1,31,2.5,100\n2,31,4,50\n",
        TextFormat::Csv,
        Header::Auto,
    )
    .unwrap();
    assert_eq!(x.pairs.len(), 2);
    assert_eq!(x.weights, vec![2.5, 4.0]);
    assert_eq!(x.times, Some(vec![100.0, 50.0]));
    assert!(x.weighted);
    // Without a header the same first line is an error naming line 1.
    let e = parse(
        "userId,movieId,rating,timestamp\n1,31,2.5,100\n",
        TextFormat::Csv,
        Header::No,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("line 1") && e.contains("weight"), "{e}");
}

#[test]
fn tsv_without_header_strings_unweighted() {
    let x = parse("# c\nbob\tx\nal ice y\n", TextFormat::Tsv, Header::Auto);
    // "al ice y" has 3 fields: a wrong column count on line 3.
    let e = x.unwrap_err().to_string();
    assert!(
        e.contains("line 3") && e.contains("3 fields, expected 2"),
        "{e}"
    );
    let x = parse("bob\tx\nalice\ty\nbob y\n", TextFormat::Tsv, Header::Auto).unwrap();
    assert!(!x.weighted);
    assert_eq!(x.weights, vec![1.0; 3]);
    let m = build_matrix(&x);
    assert_eq!(m.user_ids, Ids::Strings(vec!["alice".into(), "bob".into()]));
    assert_eq!(m.item_ids, Ids::Strings(vec!["x".into(), "y".into()]));
    // alice: y; bob: x, y.
    assert_eq!(m.indptr, vec![0, 1, 3]);
    assert_eq!(m.items, vec![1, 0, 1]);
}

#[test]
fn integer_ids_numeric_order_and_duplicates_summed() {
    let x = parse(
        "10 7 2 5\n9 7 1 1\n10 7 3 7\n100 3 1 2\n",
        TextFormat::Tsv,
        Header::Auto,
    )
    .unwrap();
    let m = build_matrix(&x);
    assert_eq!(m.user_ids, Ids::Ints(vec![9, 10, 100]));
    assert_eq!(m.item_ids, Ids::Ints(vec![3, 7]));
    // 9: {7: 1}; 10: {7: 2 + 3, latest time 7}; 100: {3: 1}.
    assert_eq!(m.indptr, vec![0, 1, 2, 3]);
    assert_eq!(m.items, vec![1, 1, 0]);
    assert_eq!(m.weights, vec![1.0, 5.0, 1.0]);
    assert_eq!(m.times, Some(vec![1.0, 7.0, 2.0]));
    // A mixed side (an id that is not an integer) sorts as strings.
    let m = build_matrix(&parse("10 a\n9 b\nz a\n", TextFormat::Tsv, Header::No).unwrap());
    assert_eq!(
        m.user_ids,
        Ids::Strings(vec!["10".into(), "9".into(), "z".into()])
    );
}

#[test]
fn bad_values_name_the_line() {
    for (text, needle) in [
        ("1 2 3\n1 2 -1\n", "line 2: negative weight"),
        ("1 2 3 4\n1 2 3 x\n", "line 2: time \"x\" is not a number"),
        ("1 2 nan\n", "line 1: weight \"nan\""),
        ("1\n", "line 1: 1 fields"),
        ("# only a comment\n", "empty file"),
        ("", "empty file"),
    ] {
        let e = parse(text, TextFormat::Tsv, Header::No).unwrap_err();
        assert!(e.to_string().contains(needle), "{text:?}: {e}");
        assert_eq!(e.exit_code(), 2, "{text:?}");
    }
    let e = parse(
        "%%MatrixMarket matrix coordinate real general\n2 2 1\n0 1 1\n",
        TextFormat::Mtx,
        Header::No,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("line 3: id \"0\" is not a 1-based integer"),
        "{e}"
    );
}

#[test]
fn columns_spec() {
    use Column::*;
    assert_eq!(
        parse_columns("skip,item,user,time").unwrap(),
        vec![Skip, Item, User, Time]
    );
    assert!(parse_columns("user,user,item").is_err());
    assert!(parse_columns("user,weight").is_err());
    assert!(parse_columns("user,item,rating").is_err());
    let x = parse_text(
        "a,5,1.5,u1\n".as_bytes(),
        Path::new("f"),
        TextFormat::Csv,
        Some(&[Item, Time, Weight, User]),
        Header::No,
    )
    .unwrap();
    assert_eq!(
        (x.users.names.clone(), x.items.names.clone()),
        (vec!["u1".into()], vec!["a".into()])
    );
    assert_eq!((x.weights[0], x.times.as_ref().unwrap()[0]), (1.5, 5.0));
}

fn hand_matrix() -> Matrix {
    // Users A B C D, items w x y z (ids in that order):
    // A {x, y}, B {x}, C {x, y, z}, D {y, w}.
    let text = "A x\nB x\nC x\nC y\nC z\nA y\nD y\nD w\n";
    build_matrix(&parse(text, TextFormat::Tsv, Header::No).unwrap())
}

#[test]
fn min_count_reaches_its_fixed_point() {
    let m = hand_matrix();
    // Round 1 drops B (1 item), z and w (1 user each); round 2 drops D (only y is
    // left); round 3 changes nothing.
    let (f, r) = min_count_filter(&m, 2, 2);
    assert_eq!(r.rounds, 3);
    assert_eq!(
        (r.removed_users, r.removed_items, r.removed_interactions),
        (2, 2, 4)
    );
    assert_eq!(f.user_ids, Ids::Strings(vec!["A".into(), "C".into()]));
    assert_eq!(f.item_ids, Ids::Strings(vec!["x".into(), "y".into()]));
    assert_eq!(
        (f.indptr.clone(), f.items.clone()),
        (vec![0, 2, 4], vec![0, 1, 0, 1])
    );
    // The defaults (1, 1) change nothing in one round.
    let (g, r) = min_count_filter(&m, 1, 1);
    assert_eq!((r.rounds, g), (1, m));
}

/// 40 users, user u has items 0..(u % 7 + 1) with weight u + item, time 100 - item.
fn grid_matrix() -> Matrix {
    let mut text = String::new();
    for u in 0..40 {
        for i in 0..(u % 7 + 1) {
            text.push_str(&format!("{u} {i} {} {}\n", u + i, 100 - i));
        }
    }
    build_matrix(&parse(&text, TextFormat::Tsv, Header::No).unwrap())
}

/// The parts of a split agree with the matrix: fold + holdout = the user's row, with
/// their weights, and training holds the fold (or nothing, for `strong`).
fn check_parts(m: &Matrix, kind: SplitKind, seed: u64) -> super::split::Split {
    let s = split(m, kind, seed).unwrap();
    for (k, &u) in s.test_rows.iter().enumerate() {
        let (fi, fw) = s.fold.row(k);
        let (hi, hw) = s.holdout.row(k);
        assert!(!hi.is_empty());
        let mut all: Vec<(u32, f32)> = fi.iter().copied().zip(fw.iter().copied()).collect();
        all.extend(hi.iter().copied().zip(hw.iter().copied()));
        all.sort_by_key(|p| p.0);
        let r = m.row(u as usize);
        let want: Vec<(u32, f32)> = m.items[r.clone()]
            .iter()
            .copied()
            .zip(m.weights[r].iter().copied())
            .collect();
        assert_eq!(all, want, "user {u}");
        let (ti, _) = s.train.row(u as usize);
        if kind == SplitKind::Strong {
            assert!(ti.is_empty());
        } else {
            assert_eq!(ti, fi);
        }
    }
    s
}

#[test]
fn strong_split_takes_a_tenth_by_hash() {
    let m = grid_matrix();
    let s = check_parts(&m, SplitKind::Strong, 7);
    let mut by_hash: Vec<(u64, u32)> = (0..40u32)
        .map(|u| (hash3(7, stream::TEST_ROWS, u as u64), u))
        .collect();
    by_hash.sort_unstable();
    let mut want: Vec<u32> = by_hash[..4].iter().map(|p| p.1).collect();
    want.sort_unstable();
    assert_eq!(s.test_rows, want);
    for (k, &u) in s.test_rows.iter().enumerate() {
        let n = m.row(u as usize).len();
        assert_eq!(s.holdout.row(k).0.len(), (n / 4).max(1));
    }
}

#[test]
fn last_split_holds_out_the_latest() {
    let text = "0 5 1 10\n0 6 1 30\n0 7 1 30\n0 8 1 20\n1 5 1 3\n2 5 1 9\n2 6 1 8\n";
    let m = build_matrix(&parse(text, TextFormat::Tsv, Header::No).unwrap());
    let s = check_parts(&m, SplitKind::Last, 1);
    // User 1 has one interaction: not a test user. User 0: items 6 and 7 share the
    // latest time, the larger item (7, index 2) is held out; user 2: item 5 (index 0).
    assert_eq!(s.test_rows, vec![0, 2]);
    assert_eq!(s.holdout.row(0).0, &[2]);
    assert_eq!(s.holdout.row(1).0, &[0]);
    assert_eq!(s.train.row(1).0, &[0]);
}

#[test]
fn random_split_follows_the_hash() {
    let m = grid_matrix();
    let s = check_parts(&m, SplitKind::Random, 3);
    for (k, &u) in s.test_rows.iter().enumerate() {
        let r = m.row(u as usize);
        let drawn: Vec<u32> = m.items[r]
            .iter()
            .copied()
            .filter(|&i| {
                hash3(3, stream::USERITEM_RANDOM, ((u as u64) << 32) | i as u64) < u64::MAX / 4
            })
            .collect();
        let held = s.holdout.row(k).0;
        // Every drawn item is held out, unless all were drawn (one stays in training).
        if drawn.len() == m.row(u as usize).len() {
            assert_eq!(held.len(), drawn.len() - 1);
        } else {
            assert_eq!(held, &drawn[..]);
        }
        assert!(!s.train.row(u as usize).0.is_empty());
    }
    // Users with a single interaction are never test users.
    assert!(s.test_rows.iter().all(|&u| u % 7 != 0));
    // Another seed gives another split.
    assert_ne!(split(&m, SplitKind::Random, 4).unwrap(), s);
}
