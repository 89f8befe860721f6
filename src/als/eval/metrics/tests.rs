use super::super::{RecallSums, TopK};
use super::*;
use crate::comm::threads::run;
use crate::comm::Comm;
use crate::rng::SplitMix64;

fn ranking(cols: &[u32]) -> Vec<Cand> {
    cols.iter()
        .enumerate()
        .map(|(i, &col)| Cand {
            score: -(i as f32),
            col,
        })
        .collect()
}

fn sums_of(rankings: &[Vec<Cand>], holdouts: &[Vec<u32>]) -> Ranking {
    let mut s = RankingSums::new();
    for (r, h) in rankings.iter().zip(holdouts) {
        s.add(r, h);
    }
    s.local_metrics()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

fn assert_at(got: AtK, want: [f64; 4], what: &str) {
    let g = [got.precision, got.map, got.ndcg, got.recall];
    for (name, (x, y)) in ["precision", "map", "ndcg", "recall"]
        .iter()
        .zip(g.iter().zip(&want))
    {
        assert!(close(*x, *y), "{what} {name}@{}: {x} != {y}", got.k);
    }
}

/// Four rows: |rel| < K, |rel| > K, one hit at the K-th place, and an empty held-out
/// set (0 in the means, nothing in the pooled precision).
fn four_rows() -> (Vec<Vec<Cand>>, Vec<Vec<u32>>) {
    let rankings = vec![
        ranking(&[1, 2, 3, 4, 5]),
        ranking(&[7, 8, 9, 10, 11]),
        ranking(&[20, 21, 22, 23, 24]),
        ranking(&[30, 31, 32, 33, 34]),
    ];
    let holdouts = vec![vec![2, 4], vec![7, 8, 9, 10, 11, 12], vec![22], vec![]];
    (rankings, holdouts)
}

#[test]
fn hand_computed_metrics_at_3_and_5() {
    let (rankings, holdouts) = four_rows();
    let l3 = 1.0 / 3f64.log2();
    let l5 = 1.0 / 5f64.log2();
    // K = 3. Row 0: a hit at place 2 of m = 2: AP (1/2)/2, DCG l3 over 1 + l3, recall
    // 1/2. Row 1: 3 hits of m = 3: AP 1, NDCG 1, recall 1. Row 2: a hit at place 3 of
    // m = 1: AP (1/3)/1, DCG 1/log2(4) = 1/2 over 1, recall 1. Row 3: 0.
    let want3 = [
        5.0 / 6.0,
        (0.25 + 1.0 + 1.0 / 3.0) / 4.0,
        (l3 / (1.0 + l3) + 1.0 + 0.5) / 4.0,
        (0.5 + 1.0 + 1.0) / 4.0,
    ];
    // K = 5. Row 0: hits at places 2 and 4 of m = 2: AP (1/2 + 2/4)/2, DCG l3 + l5.
    // Row 1: 5 hits of m = 5. Row 2 as at K = 3.
    let want5 = [
        (2.0 + 5.0 + 1.0) / (2.0 + 5.0 + 1.0),
        (0.5 + 1.0 + 1.0 / 3.0) / 4.0,
        ((l3 + l5) / (1.0 + l3) + 1.0 + 0.5) / 4.0,
        3.0 / 4.0,
    ];
    let got = sums_of(&rankings, &holdouts);
    assert_eq!(got.rows, 4);
    assert_at(got.at(3).unwrap(), want3, "sums");
    assert_at(got.at(5).unwrap(), want5, "sums");
    let r: Vec<&[Cand]> = rankings.iter().map(|v| &v[..]).collect();
    let h: Vec<&[u32]> = holdouts.iter().map(|v| &v[..]).collect();
    assert_at(ranking_metrics_ref(&r, &h, 3), want3, "reference");
    assert_at(ranking_metrics_ref(&r, &h, 5), want5, "reference");
    // K = 1: only row 1's first place hits.
    assert_at(got.at(1).unwrap(), [1.0 / 3.0, 0.25, 0.25, 0.25], "sums");
    // Past the rankings' length nothing more hits; the denominators keep growing.
    let at50 = got.at(50).unwrap();
    assert!(close(at50.precision, 8.0 / (2.0 + 6.0 + 1.0)));
    assert!(close(at50.recall, (1.0 + 5.0 / 6.0 + 1.0) / 4.0));
    assert!(got.at(0).is_none() && got.at(MAX_K + 1).is_none());
}

#[test]
fn tied_scores_rank_the_lower_column_first() {
    // Columns 5 and 3 tie at 1.0: the top 3 is [9, 3, 5], so the held-out 5 is at
    // place 3 (AP 1/3, NDCG 1/2); broken the other way it would be at place 2.
    let mut top = TopK::new(3);
    for (col, score) in [(5, 1.0), (3, 1.0), (9, 2.0), (1, 0.5)] {
        top.push(Cand { score, col });
    }
    let r = top.into_padded();
    assert_eq!(r.iter().map(|c| c.col).collect::<Vec<_>>(), vec![9, 3, 5]);
    let got = sums_of(&[r], &[vec![5]]).at(3).unwrap();
    // Pooled precision divides by min(K, |R|) = 1.
    assert_at(got, [1.0, 1.0 / 3.0, 0.5, 1.0], "ties");
}

/// Random rankings of `MAX_K` distinct columns of 0..200 and held-out sets of 0..80
/// columns (some empty, some longer than `MAX_K`).
fn random_rows(n: usize, seed: u64) -> (Vec<Vec<Cand>>, Vec<Vec<u32>>) {
    let mut rankings = Vec::new();
    let mut holdouts = Vec::new();
    for u in 0..n {
        let mut g = SplitMix64::for_id(seed, 1, u as u64);
        let mut cols: Vec<u32> = (0..200).collect();
        for i in 0..MAX_K {
            let j = i + g.below((200 - i) as u64) as usize;
            cols.swap(i, j);
        }
        rankings.push(ranking(&cols[..MAX_K]));
        let len = g.below(80) as usize;
        let mut h: Vec<u32> = (0..len).map(|_| g.below(120) as u32).collect();
        h.sort_unstable();
        h.dedup();
        holdouts.push(h);
    }
    (rankings, holdouts)
}

#[test]
fn sums_equal_the_row_by_row_reference_and_recall_keeps_its_bits() {
    let (rankings, holdouts) = random_rows(300, 7);
    let got = sums_of(&rankings, &holdouts);
    let r: Vec<&[Cand]> = rankings.iter().map(|v| &v[..]).collect();
    let h: Vec<&[u32]> = holdouts.iter().map(|v| &v[..]).collect();
    for k in 1..=MAX_K {
        let want = ranking_metrics_ref(&r, &h, k);
        let g = got.at(k).unwrap();
        assert_at(
            g,
            [want.precision, want.map, want.ndcg, want.recall],
            "random",
        );
        assert!(g.map > 0.0 && g.ndcg > 0.0, "K = {k}: the rows hit");
    }
    let mut rs = RecallSums::new();
    for (x, y) in rankings.iter().zip(&holdouts) {
        rs.add(x, y);
    }
    let recall = rs.local_finish();
    assert_eq!(got.at(20).unwrap().recall.to_bits(), recall.at20.to_bits());
    assert_eq!(got.at(50).unwrap().recall.to_bits(), recall.at50.to_bits());
    assert_eq!(got.rows, recall.test_rows);
}

#[test]
fn all_reduced_sums_have_the_same_bits_at_every_rank_count() {
    let (rankings, holdouts) = random_rows(97, 11);
    let one = sums_of(&rankings, &holdouts);
    for p in 2..=4 {
        let parts = run(p, |c| {
            let mut s = RankingSums::new();
            for u in (c.rank()..rankings.len()).step_by(p) {
                s.add(&rankings[u], &holdouts[u]);
            }
            c.all_reduce_sum(s.as_mut_slice());
            s.local_metrics()
        });
        for got in parts {
            assert_eq!(got.rows, one.rows);
            for k in 1..=MAX_K {
                let (a, b) = (got.at(k).unwrap(), one.at(k).unwrap());
                let bits = |x: AtK| [x.precision, x.map, x.ndcg, x.recall].map(f64::to_bits);
                assert_eq!(bits(a), bits(b), "P = {p}, K = {k}");
            }
        }
    }
}

#[test]
fn k_list_parses_sorts_and_refuses_out_of_range() {
    assert_eq!("10,20,50".parse::<KList>(), Ok(KList(vec![10, 20, 50])));
    assert_eq!("50, 5,5".parse::<KList>(), Ok(KList(vec![5, 50])));
    assert_eq!(KList::default(), KList(vec![20, 50]));
    assert_eq!(KList(vec![5, 10]).to_string(), "5,10");
    for bad in ["0", "51", "10,100", "a", "", "10,", "-1"] {
        let e = bad.parse::<KList>().unwrap_err();
        assert!(e.contains("1..=50"), "{bad:?}: {e}");
    }
}
