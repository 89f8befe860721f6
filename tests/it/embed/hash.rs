//! Hash-table embeddings under the thread communicator: key resolution on hand-made
//! batches at P = 1..4, determinism, exact resume (LFU and TTL, with eviction),
//! re-sharding P = 4 -> 2 -> 3, warm start on another rank count, admission, counts
//! equal to the occurrences trained, evaluation leaving the tables alone, a key's
//! admission the same on every sending rank, and pipelining refused.

use crate::util;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use torusrec::comm::threads::{run, ThreadComm};
use torusrec::comm::Comm;
use torusrec::data::clicks::batch::{Bags, Batch, KeyBags};
use torusrec::data::clicks::gen::ClickGen;
use torusrec::data::clicks::source::Source;
use torusrec::embed::io::checkpoint;
use torusrec::embed::tables::hashtab::{owner, Entry};
use torusrec::embed::tables::keys::{
    global_resolve, init_key_row, IdMap, Resolve, ResolveBufs, ResolveCounts, NO_ROW,
};
use torusrec::embed::tables::placement::Plan;
use torusrec::embed::tables::store::{Store, TableOpt};
use torusrec::embed::train::trainer::{EmbedConfig, EmbedTrainer, StepStatus};
use torusrec::spec::{preset, Evict, ModelSpec, Pooling, TableSpec, ValencyDist, VocabKind};

// ---------------------------------------------------------------------------------
// Helpers

const SEED: u64 = 5;
/// The tables of the `tiny` preset made hash tables: a (vocab 1000, sum), b (50,
/// mean) and d (300, mean); c and e stay fixed.
const HASHED: [usize; 3] = [0, 1, 3];
/// Capacities larger than the id space of every table on every rank at P <= 4:
/// nothing is ever evicted, refused or dropped by re-sharding.
const ROOMY: [u64; 3] = [4000, 200, 1200];
/// Capacities small enough that the tables fill and evict within a few steps.
const TIGHT: [u64; 3] = [48, 12, 24];

/// The data (the `tiny` preset: its vocabularies are the generated id space) and the
/// model (the same with `HASHED` tables hash tables of capacities `cap`).
fn hash_model(cap: [u64; 3], admit_after: u32, evict: Evict) -> (ModelSpec, ModelSpec) {
    let data = preset("tiny", 1.0).unwrap();
    let mut model = data.clone();
    for (&t, &c) in HASHED.iter().zip(&cap) {
        let ts = &mut model.tables[t];
        ts.vocab_kind = VocabKind::Hash;
        ts.vocab = c;
        ts.admit_after = admit_after;
        ts.evict = evict;
    }
    model.validate("test model").unwrap();
    (data, model)
}

fn config(data: &ModelSpec, model: &ModelSpec, steps: u64) -> EmbedConfig {
    let opt = TableOpt::RowWiseAdagrad {
        lr: 0.1,
        eps: 1e-8,
        wd: 0.0,
    };
    EmbedConfig {
        seed: SEED,
        ids: IdMap::new(data, model, false).unwrap(),
        ..util::embed_config(model, opt, 24, 2, steps)
    }
}

/// A fresh trainer on this rank: every table row-cyclic over every rank.
fn trainer(c: &ThreadComm, data: &ModelSpec, cfg: &EmbedConfig) -> EmbedTrainer {
    let plan = Plan::uniform(&cfg.spec, c.size(), "row_cyclic").unwrap();
    let src = Source::Generated(ClickGen::new(data, cfg.seed));
    EmbedTrainer::new(cfg.clone(), src, &plan, c.rank()).unwrap()
}

/// Train up to step `to`; the mean training loss over those steps.
fn train_to(c: &ThreadComm, tr: &mut EmbedTrainer, to: u64) -> f64 {
    while tr.step < to {
        assert_eq!(tr.global_step(c, false).unwrap(), StepStatus::Done);
    }
    tr.global_interval(c).unwrap().loss
}

/// One held entry of this rank with its row and optimizer state (as bits).
type Held = (usize, Entry, Vec<u32>, Vec<u32>);

/// Every hash shard's entries on this rank in (table, slot) order, with their rows
/// and optimizer state.
fn held(tr: &EmbedTrainer) -> Vec<Held> {
    let mut out = Vec::new();
    for (t, h) in tr.store.hash.iter().enumerate() {
        let Some(h) = h else { continue };
        let sp = tr.store.state_per_row(t);
        let ls = tr.store.local.iter().find(|l| l.shard.table == t).unwrap();
        let w = ls.shard.width();
        for e in h.entries() {
            let s = e.slot as usize;
            let row = ls.data[s * w..(s + 1) * w].iter().map(|v| v.to_bits());
            let st = ls.state[s * sp..(s + 1) * sp].iter().map(|v| v.to_bits());
            out.push((t, e, row.collect(), st.collect()));
        }
    }
    out
}

/// By (table, key): (count, last seen, row bits, state bits).
type KeyMap = BTreeMap<(usize, u64), (u32, u64, Vec<u32>, Vec<u32>)>;

/// The entries of every rank by key, checking that each key is held once, by its
/// owner among `p` ranks.
fn by_key(ranks: &[Vec<Held>]) -> KeyMap {
    let p = ranks.len();
    let mut m = KeyMap::new();
    for (r, held) in ranks.iter().enumerate() {
        for (t, e, row, st) in held {
            assert_eq!(
                owner(e.key, *t, p),
                r,
                "table {t} key {} on rank {r}",
                e.key
            );
            let v = (e.count, e.last_seen, row.clone(), st.clone());
            assert!(m.insert((*t, e.key), v).is_none(), "key {} twice", e.key);
        }
    }
    m
}

/// What a rank reports at the end of a run.
#[derive(Debug, Clone, PartialEq)]
struct RankState {
    held: Vec<Held>,
    mlp: Vec<u32>,
    checksum: u64,
    step: u64,
}

fn state(c: &ThreadComm, tr: &EmbedTrainer) -> RankState {
    RankState {
        held: held(tr),
        mlp: tr.mlp.flat().iter().map(|v| v.to_bits()).collect(),
        checksum: tr.global_checksum(c).unwrap(),
        step: tr.step,
    }
}

/// Every hash shard's counters on this rank, summed: (inserted, evicted, expired,
/// refused), and the entries held and admitted.
fn counters(tr: &EmbedTrainer) -> [u64; 6] {
    let mut v = [0u64; 6];
    for h in tr.store.hash.iter().flatten() {
        let s = h.stats();
        v[0] += s.inserted;
        v[1] += s.evicted;
        v[2] += s.expired;
        v[3] += s.refused;
        v[4] += h.len() as u64;
        v[5] += h.admitted() as u64;
    }
    v
}

fn summed(c: &ThreadComm, mut v: [u64; 6]) -> [u64; 6] {
    c.all_reduce_sum(&mut v);
    v
}

fn ckpt_path(dir: &Path, step: u64) -> PathBuf {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "h5"))
        .collect();
    v.sort();
    assert_eq!(v.len(), 1, "one checkpoint in {}: {v:?}", dir.display());
    let m = checkpoint::local_read_manifest(&v[0]).unwrap();
    assert_eq!(m.step, step);
    v.pop().unwrap()
}

// ---------------------------------------------------------------------------------
// Training with hash tables

#[test]
fn two_runs_at_p2_give_the_same_bits() {
    let (data, model) = hash_model(TIGHT, 2, Evict::Lfu);
    let cfg = config(&data, &model, 5);
    let go = || {
        run(2, |c| {
            let mut tr = trainer(&c, &data, &cfg);
            let loss = train_to(&c, &mut tr, cfg.steps);
            (state(&c, &tr), summed(&c, counters(&tr)), loss)
        })
    };
    let (a, b) = (go(), go());
    assert_eq!(a, b);
    let (st, cnt, loss) = &a[0];
    assert!(loss.is_finite());
    // The hash tables hold and train keys: the comparison is not between empty tables.
    assert!(cnt[5] > 0, "no key admitted: {cnt:?}");
    assert!(!st.held.is_empty());
    // Fewer steps: another checksum (the checksum sees the training).
    let short = run(2, |c| {
        let mut tr = trainer(&c, &data, &cfg);
        train_to(&c, &mut tr, 4);
        tr.global_checksum(&c).unwrap()
    });
    assert_ne!(short[0], st.checksum);
}

#[test]
fn a_resumed_run_continues_bit_for_bit_with_eviction() {
    for evict in [Evict::Lfu, Evict::Ttl(2)] {
        let (data, model) = hash_model(TIGHT, 2, evict);
        let cfg = config(&data, &model, 6);
        for p in [2, 3] {
            let dir = util::tempdir();
            let res = run(p, |c| {
                // Uninterrupted.
                let mut tr = trainer(&c, &data, &cfg);
                train_to(&c, &mut tr, 6);
                let whole = state(&c, &tr);
                let cnt = summed(&c, counters(&tr));
                // Three steps, a checkpoint, a fresh trainer restored from it.
                let mut tr = trainer(&c, &data, &cfg);
                train_to(&c, &mut tr, 3);
                let at3 = held(&tr);
                let path = checkpoint::global_write_checkpoint(&c, &tr, dir.path(), 2).unwrap();
                drop(tr);
                let mut tr = trainer(&c, &data, &cfg);
                let m = checkpoint::global_restore(&c, &mut tr, &path).unwrap();
                assert_eq!((m.step, tr.step, m.world_size), (3, 3, p));
                // Exact: every entry back in its slot with its row and state.
                assert_eq!(held(&tr), at3, "rank {} after the restore", c.rank());
                train_to(&c, &mut tr, 6);
                (whole, state(&c, &tr), cnt)
            });
            let what = format!("{evict} P={p}");
            let cnt = res[0].2;
            assert!(cnt[1] > 0, "{what}: nothing evicted: {cnt:?}");
            assert!(cnt[5] > 0, "{what}: nothing admitted: {cnt:?}");
            for (r, (whole, resumed, _)) in res.iter().enumerate() {
                assert_eq!(resumed, whole, "{what}: rank {r}");
            }
        }
    }
}

#[test]
fn resharding_4_to_2_to_3_keeps_every_entry() {
    let (data, model) = hash_model(ROOMY, 2, Evict::Lfu);
    let cfg = config(&data, &model, 4);
    let (d4, d2) = (util::tempdir(), util::tempdir());
    let at4 = run(4, |c| {
        let mut tr = trainer(&c, &data, &cfg);
        train_to(&c, &mut tr, 4);
        checkpoint::global_write_checkpoint(&c, &tr, d4.path(), 2).unwrap();
        (held(&tr), tr.global_checksum(&c).unwrap(), counters(&tr))
    });
    let restore = |p: usize, from: &Path, to: Option<&Path>| {
        let path = ckpt_path(from, 4);
        run(p, |c| {
            let mut tr = trainer(&c, &data, &cfg);
            let m = checkpoint::global_restore(&c, &mut tr, &path).unwrap();
            assert_eq!(m.step, 4);
            if let Some(dir) = to {
                checkpoint::global_write_checkpoint(&c, &tr, dir, 2).unwrap();
            }
            (held(&tr), tr.global_checksum(&c).unwrap(), counters(&tr))
        })
    };
    let at2 = restore(2, d4.path(), Some(d2.path()));
    let at3 = restore(3, d2.path(), None);
    // Nothing was evicted or refused while training: every key seen is held.
    assert!(at4.iter().all(|x| x.2[1] == 0 && x.2[3] == 0));
    let [m4, m2, m3] = [&at4, &at2, &at3].map(|v| {
        let held: Vec<Vec<Held>> = v.iter().map(|x| x.0.clone()).collect();
        by_key(&held)
    });
    assert!(m4.len() > 100, "{} keys", m4.len());
    for t in HASHED {
        assert!(m4.keys().any(|k| k.0 == t), "table {t} holds nothing");
    }
    assert!(m4.values().any(|v| v.0 < 2) && m4.values().any(|v| v.0 >= 2));
    assert_eq!(m2, m4, "P=4 -> 2");
    assert_eq!(m3, m4, "P=2 -> 3");
    let sums: BTreeSet<u64> = [&at4, &at2, &at3]
        .iter()
        .flat_map(|v| v.iter().map(|x| x.1))
        .collect();
    assert_eq!(sums.len(), 1, "checksums {sums:?}");
    // Re-sharded shards count their admitted entries again.
    let admitted = |v: &[(Vec<Held>, u64, [u64; 6])]| v.iter().map(|x| x.2[5]).sum::<u64>();
    assert_eq!(admitted(&at2), admitted(&at4));
    assert_eq!(admitted(&at3), admitted(&at4));
}

#[test]
fn a_warm_start_on_another_rank_count_keeps_counts_and_resets_steps() {
    let (data, model) = hash_model(ROOMY, 2, Evict::Ttl(3));
    let cfg = config(&data, &model, 4);
    let dir = util::tempdir();
    let before = run(2, |c| {
        let mut tr = trainer(&c, &data, &cfg);
        train_to(&c, &mut tr, 4);
        checkpoint::global_write_checkpoint(&c, &tr, dir.path(), 2).unwrap();
        held(&tr)
    });
    let before = by_key(&before);
    assert!(before.len() > 100, "{} keys", before.len());
    assert!(before.values().any(|v| v.1 > 0));
    let path = ckpt_path(dir.path(), 4);
    let after = run(3, |c| {
        let mut tr = trainer(&c, &data, &cfg);
        let w = checkpoint::global_init_from(&c, &mut tr, &path).unwrap();
        assert_eq!(tr.step, 0);
        assert_eq!(w.manifest.step, 4);
        assert_eq!(w.dropped, 0);
        let h = held(&tr);
        let loss = train_to(&c, &mut tr, 3);
        (w.entries, h, loss, tr.step)
    });
    let held3: Vec<Vec<Held>> = after.iter().map(|x| x.1.clone()).collect();
    let warm = by_key(&held3);
    assert_eq!(after[0].0, before.len() as u64);
    assert_eq!(warm.len(), before.len());
    for (k, (count, _, row, st)) in &before {
        let w = &warm[k];
        assert_eq!(
            (w.0, w.1),
            (*count, 0),
            "{k:?}: count kept, last seen reset"
        );
        assert_eq!((&w.2, &w.3), (row, st), "{k:?}: row and state kept");
    }
    for (_, _, loss, step) in &after {
        assert!(loss.is_finite() && *loss > 0.0, "loss {loss}");
        assert_eq!(*step, 3);
    }
}

#[test]
fn keys_below_the_admission_threshold_get_no_row_and_the_model_still_trains() {
    let (data, model) = hash_model(ROOMY, 1_000_000, Evict::Lfu);
    let cfg = config(&data, &model, 4);
    let res = run(2, |c| {
        let mut tr = trainer(&c, &data, &cfg);
        let mlp0 = tr.mlp.flat();
        let loss = train_to(&c, &mut tr, 4);
        assert!(loss.is_finite() && loss > 0.0, "loss {loss}");
        assert_ne!(tr.mlp.flat(), mlp0, "the MLP did not train");
        for &t in &HASHED {
            let h = tr.store.hash[t].as_ref().unwrap();
            assert_eq!(h.admitted(), 0, "table {t}");
            assert!(!h.is_empty(), "table {t}: keys are counted");
        }
        // Rows of counted keys are their initial rows: nothing trained them.
        let cap = |t: usize| model.tables[t].vocab;
        for (t, e, row, st) in held(&tr) {
            let mut want = vec![0f32; row.len()];
            init_key_row(SEED, t, cap(t), e.key, &mut want);
            let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            assert_eq!(row, want, "table {t} key {}", e.key);
            assert!(st.iter().all(|&s| s == 0), "table {t} key {}", e.key);
        }
        // The next step's keys resolve to no row: empty bags, one per example.
        let n = 24;
        let mut b = tr.source.batch(1000 + (n * c.rank()) as u64, n).unwrap();
        cfg.ids.apply(&mut b, &|| "test".into()).unwrap();
        let fixed = b.bags[2].clone();
        let mut bufs = ResolveBufs::default();
        let how = Resolve::Train { step: tr.step };
        let r = global_resolve(&c, &mut tr.store, &mut b, how, &mut bufs).unwrap();
        assert!(r.occurrences > 0 && r.sent > 0);
        assert_eq!(r.no_row, r.sent);
        for &t in &HASHED {
            assert_eq!(b.bags[t].offsets, vec![0; n + 1], "table {t}");
            assert!(b.bags[t].ids.is_empty());
            assert!(b.keys[t].ids.len() >= n, "table {t} has keys");
        }
        assert_eq!(b.bags[2], fixed, "a fixed table's rows changed");
        tr.store.hash[0].as_ref().unwrap().admitted()
    });
    assert_eq!(res, vec![0, 0]);
}

#[test]
fn evaluation_counts_nothing_and_changes_nothing() {
    let (data, model) = hash_model(TIGHT, 2, Evict::Ttl(1));
    let mut cfg = config(&data, &model, 4);
    cfg.eval_examples = 200;
    let res = run(2, |c| {
        let mut tr = trainer(&c, &data, &cfg);
        train_to(&c, &mut tr, 4);
        let before = (held(&tr), counters(&tr), tr.global_checksum(&c).unwrap());
        let (auc, ll) = tr.global_evaluate(&c).unwrap();
        let after = (held(&tr), counters(&tr), tr.global_checksum(&c).unwrap());
        // Evaluate twice: the same answer (nothing it did changed the tables).
        let again = tr.global_evaluate(&c).unwrap();
        assert_eq!((auc, ll), again);
        assert!(auc.is_some_and(|a| a.is_finite()));
        assert!(ll.is_some_and(|l| l.is_finite()));
        (before, after)
    });
    for (r, (before, after)) in res.iter().enumerate() {
        assert!(!before.0.is_empty());
        assert_eq!(before, after, "rank {r}");
    }
}

// ---------------------------------------------------------------------------------
// global_resolve on hand-made batches

fn table(name: &str, kind: VocabKind, vocab: u64, admit_after: u32) -> TableSpec {
    TableSpec {
        name: name.into(),
        vocab,
        dim: 3,
        pooling: Pooling::Sum,
        valency: 2.0,
        valency_dist: ValencyDist::Poisson,
        vocab_kind: kind,
        admit_after,
        evict: Evict::Lfu,
    }
}

/// Four tables: `h` (hash, roomy), `f` (fixed), `none` (hash, no keys in any
/// batch), `tight` (hash, one row per rank: most keys find no row).
fn resolve_spec(p: usize) -> ModelSpec {
    let spec = ModelSpec {
        table_dtype: Default::default(),
        arch: Default::default(),
        n_dense: 1,
        hidden: vec![4],
        zipf: 1.05,
        tables: vec![
            table("h", VocabKind::Hash, 64, 1),
            table("f", VocabKind::Fixed, 10, 1),
            table("none", VocabKind::Hash, 8, 1),
            table("tight", VocabKind::Hash, p as u64, 1),
        ],
    };
    spec.validate("resolve spec").unwrap();
    spec
}

fn key_bags(bags: &[&[u64]]) -> KeyBags {
    let mut b = KeyBags::default();
    b.offsets.push(0);
    for bag in bags {
        b.ids.extend_from_slice(bag);
        b.offsets.push(b.ids.len() as u32);
    }
    b
}

/// Rank `r`'s batch of call `call`: keys 0 and u64::MAX, duplicates within and
/// across examples and ranks, keys of this rank only; the last rank of several has
/// no examples. With `default_none`, table `none` carries no offsets at all.
fn resolve_batch(p: usize, r: usize, call: u64, default_none: bool) -> Batch {
    let mine = 0x8000_0000_0000_0000 + r as u64 + 100 * call;
    let (h, tight): (Vec<Vec<u64>>, Vec<Vec<u64>>) = if p > 1 && r == p - 1 {
        (vec![], vec![])
    } else {
        (
            vec![
                vec![0, u64::MAX, 5 + call],
                vec![5 + call, 5 + call],
                vec![],
                vec![u64::MAX, mine, 7, 0, mine],
            ],
            vec![
                vec![1 + 10 * call, 2, 3 + call],
                vec![3 + call, mine],
                vec![],
                vec![9],
            ],
        )
    };
    let n = h.len();
    let refs = |v: &[Vec<u64>]| -> KeyBags {
        let r: Vec<&[u64]> = v.iter().map(|b| &b[..]).collect();
        key_bags(&r)
    };
    let fixed = Bags {
        offsets: (0..=n as u32).collect(),
        ids: (0..n as u32).map(|i| i % 10).collect(),
    };
    let none = if default_none {
        KeyBags::default()
    } else {
        KeyBags {
            offsets: vec![0; n + 1],
            ids: vec![],
        }
    };
    let stale = Bags {
        offsets: vec![0, 42],
        ids: vec![7; 42],
    };
    Batch {
        n,
        n_dense: 1,
        dense: vec![0.5; n],
        labels: vec![1.0; n],
        // Rows of hash tables before resolution are garbage the resolution replaces.
        bags: vec![stale.clone(), fixed, stale.clone(), stale],
        keys: vec![refs(&h), KeyBags::default(), none, refs(&tight)],
    }
}

/// Every rank's held entries of hash table `t` as key -> row (`slot * P + rank`),
/// over all ranks, admitted ones only.
fn global_rows(c: &ThreadComm, store: &Store, t: usize) -> BTreeMap<u64, u32> {
    let (p, me) = (c.size() as u64, c.rank() as u64);
    let h = store.hash[t].as_ref().unwrap();
    let mine: Vec<u64> = h
        .entries()
        .iter()
        .filter(|e| e.count >= h.admit_after())
        .flat_map(|e| [e.key, e.slot as u64 * p + me])
        .collect();
    let all = c.all_gather_v(&mine).unwrap().data;
    let mut m = BTreeMap::new();
    for kv in all.chunks_exact(2) {
        assert!(
            m.insert(kv[0], kv[1] as u32).is_none(),
            "key {} twice",
            kv[0]
        );
    }
    m
}

/// Checks `b` (resolved) against the keys it had and the owners' entries.
fn check_resolved(c: &ThreadComm, store: &Store, before: &Batch, b: &Batch, r: ResolveCounts) {
    let spec = &store.spec;
    let p = c.size();
    let mut occurrences = 0;
    let mut sent = 0;
    let mut no_row = 0;
    for t in [0, 2, 3] {
        let rows = global_rows(c, store, t);
        // Distinct keys never share a row; rows are the owner's.
        let distinct: BTreeSet<u32> = rows.values().copied().collect();
        assert_eq!(distinct.len(), rows.len(), "table {t}: keys share a row");
        for (&k, &row) in &rows {
            assert!((row as u64) < spec.tables[t].vocab, "table {t} row {row}");
            assert_eq!(row as usize % p, owner(k, t, p), "table {t} key {k}");
        }
        let keys = &before.keys[t];
        let bags = &b.bags[t];
        assert_eq!(bags.offsets.len(), b.n + 1, "table {t}: offsets");
        assert_eq!(bags.offsets[0], 0);
        let mut want = Vec::new();
        for e in 0..keys.len() {
            want.extend(keys.bag(e).iter().filter_map(|k| rows.get(k).copied()));
            assert_eq!(bags.offsets[e + 1] as usize, want.len(), "table {t} ex {e}");
        }
        if keys.offsets.is_empty() {
            assert!(bags.offsets.iter().all(|&o| o == 0), "table {t}");
        }
        assert_eq!(bags.ids, want, "table {t}: rows of the keys with a row");
        assert!(!bags.ids.contains(&NO_ROW));
        occurrences += keys.ids.len() as u64;
        let d: BTreeSet<u64> = keys.ids.iter().copied().collect();
        sent += d.len() as u64;
        no_row += d.iter().filter(|k| !rows.contains_key(k)).count() as u64;
    }
    assert_eq!(
        r,
        ResolveCounts {
            occurrences,
            sent,
            no_row
        }
    );
    // The fixed table is left alone.
    assert_eq!(b.bags[1], before.bags[1]);
    assert_eq!(b.keys, before.keys);
}

#[test]
fn global_resolve_gives_every_occurrence_of_a_key_its_row_at_p_1_to_4() {
    for p in 1..=4 {
        let spec = resolve_spec(p);
        let stats = run(p, |c| {
            let plan = Plan::uniform(&spec, p, "row_cyclic").unwrap();
            let opt = TableOpt::RowWiseAdagrad {
                lr: 0.1,
                eps: 1e-8,
                wd: 0.0,
            };
            let mut store = Store::new(&spec, &plan, c.rank(), opt, SEED, None).unwrap();
            let mut bufs = ResolveBufs::default();
            // Calls 0 and 1 train (the second evicts in `tight`), call 2 only looks up:
            // one set of buffers for all of them.
            for call in 0..3u64 {
                let before = resolve_batch(p, c.rank(), call.min(1), call == 1);
                let mut b = before.clone();
                let how = if call < 2 {
                    Resolve::Train { step: call }
                } else {
                    Resolve::Lookup { step: 1 }
                };
                let entries0: Vec<_> = store.hash.iter().flatten().map(|h| h.entries()).collect();
                let r = global_resolve(&c, &mut store, &mut b, how, &mut bufs).unwrap();
                check_resolved(&c, &store, &before, &b, r);
                if call == 2 {
                    let entries: Vec<_> =
                        store.hash.iter().flatten().map(|h| h.entries()).collect();
                    assert_eq!(entries, entries0, "a lookup changed the entries");
                }
            }
            // Every key of `h` was admitted: 0 and u64::MAX included.
            let rows = global_rows(&c, &store, 0);
            assert!(rows.contains_key(&0) && rows.contains_key(&u64::MAX));
            assert!(store.hash[2].as_ref().unwrap().is_empty());
            let st = store.hash[3].as_ref().unwrap().stats();
            (st.refused, st.evicted)
        });
        let refused: u64 = stats.iter().map(|x| x.0).sum();
        let evicted: u64 = stats.iter().map(|x| x.1).sum();
        // `tight` (one row per rank) could not take every key of a step, and made
        // room for the second call's keys.
        assert!(refused > 0, "P={p}: nothing refused");
        assert!(evicted > 0, "P={p}: nothing evicted");
    }
}

#[test]
fn a_key_admitted_in_a_step_has_its_row_in_every_example_of_the_step() {
    // One hash table admitting a key at its second occurrence; the step's two
    // examples both hold key 42. At P = 1 one rank has both, at P = 2 one each: the
    // key reaches its second occurrence in this step either way.
    let spec = ModelSpec {
        table_dtype: Default::default(),
        arch: Default::default(),
        n_dense: 1,
        hidden: vec![4],
        zipf: 1.05,
        tables: vec![table("h", VocabKind::Hash, 16, 2)],
    };
    for p in [1, 2] {
        let got = run(p, |c| {
            let plan = Plan::uniform(&spec, p, "row_cyclic").unwrap();
            let opt = TableOpt::Sgd { lr: 0.1, wd: 0.0 };
            let mut store = Store::new(&spec, &plan, c.rank(), opt, SEED, None).unwrap();
            let n = 2 / p;
            let keys: Vec<Vec<u64>> = vec![vec![42]; n];
            let r: Vec<&[u64]> = keys.iter().map(|b| &b[..]).collect();
            let mut b = Batch {
                n,
                n_dense: 1,
                dense: vec![0.0; n],
                labels: vec![0.0; n],
                bags: vec![Bags::default()],
                keys: vec![key_bags(&r)],
            };
            let how = Resolve::Train { step: 0 };
            global_resolve(&c, &mut store, &mut b, how, &mut ResolveBufs::default()).unwrap();
            b.bags[0].clone()
        });
        for (r, bags) in got.iter().enumerate() {
            assert_eq!(
                bags.ids.len(),
                bags.len(),
                "P={p} rank {r}: an example of the step in which key 42 was admitted \
                 looks up no row: {bags:?}"
            );
        }
    }
}

/// Occurrences of every (hash table, key) in the global examples of steps `steps`.
fn occurrences(
    tr: &EmbedTrainer,
    cfg: &EmbedConfig,
    steps: std::ops::Range<u64>,
) -> BTreeMap<(usize, u64), u32> {
    let mut m = BTreeMap::new();
    for s in steps {
        let (first, count) = tr.schedule.window(s);
        let mut b = tr.source.batch(first, count as usize).unwrap();
        cfg.ids.apply(&mut b, &|| "test".into()).unwrap();
        for t in HASHED {
            for &k in &b.keys[t].ids {
                *m.entry((t, k)).or_insert(0) += 1;
            }
        }
    }
    m
}

#[test]
fn counts_are_the_occurrences_of_the_steps_trained() {
    let (data, model) = hash_model(ROOMY, 1, Evict::Lfu);
    {
        let cfg = config(&data, &model, 5);
        for p in [1, 3] {
            let res = run(p, |c| {
                let mut tr = trainer(&c, &data, &cfg);
                train_to(&c, &mut tr, 5);
                (held(&tr), occurrences(&tr, &cfg, 0..5))
            });
            let want = &res[0].1;
            let held: Vec<Vec<Held>> = res.iter().map(|x| x.0.clone()).collect();
            let got: BTreeMap<(usize, u64), u32> =
                by_key(&held).into_iter().map(|(k, v)| (k, v.0)).collect();
            assert_eq!(&got, want, "P={p}");
        }
    }
}

#[test]
fn pipelining_is_refused_with_hash_tables() {
    // The next step's keys would be admitted, evicted and counted before this step's
    // gradients are applied (and before a checkpoint): the trainer refuses it.
    let (data, model) = hash_model(TIGHT, 1, Evict::Lfu);
    let mut cfg = config(&data, &model, 8);
    cfg.pipeline = true;
    let plan = Plan::uniform(&model, 1, "row_cyclic").unwrap();
    let src = Source::Generated(ClickGen::new(&data, SEED));
    let e = EmbedTrainer::new(cfg, src, &plan, 0)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("pipelining with hash tables"), "{e}");
}

#[test]
fn global_resolve_takes_a_batch_without_keys() {
    // `Batch::empty` carries no keys (`keys` is empty): a rank with no examples.
    for p in [1, 2] {
        let spec = resolve_spec(p);
        run(p, |c| {
            let plan = Plan::uniform(&spec, p, "row_cyclic").unwrap();
            let opt = TableOpt::Sgd { lr: 0.1, wd: 0.0 };
            let mut store = Store::new(&spec, &plan, c.rank(), opt, SEED, None).unwrap();
            let mut b = if c.rank() == 0 {
                Batch::empty(&spec)
            } else {
                resolve_batch(p, 0, 0, false)
            };
            let how = Resolve::Train { step: 0 };
            global_resolve(&c, &mut store, &mut b, how, &mut ResolveBufs::default()).unwrap();
            for t in [0, 2, 3] {
                assert_eq!(b.bags[t].offsets.len(), b.n + 1);
            }
        });
    }
}

#[test]
fn a_hash_table_over_the_whole_id_space_trains_as_the_fixed_table() {
    // Capacity = the id space, admission at once, one rank (nothing evicted): a key's
    // initial row is the fixed table's row of that id, so training is the same
    // function of the data: the same loss, step for step, bit for bit. (Evaluation
    // differs where a held-out id was never trained: the fixed table has its
    // initial row, the hash table looks up nothing.)
    let data = preset("tiny", 1.0).unwrap();
    let mut model = data.clone();
    for &t in &HASHED {
        model.tables[t].vocab_kind = VocabKind::Hash;
    }
    let go = |m: &ModelSpec| {
        let cfg = config(&data, m, 6);
        run(1, |c| {
            let mut tr = trainer(&c, &data, &cfg);
            (1..=6)
                .map(|s| train_to(&c, &mut tr, s).to_bits())
                .collect::<Vec<u64>>()
        })
        .remove(0)
    };
    let (fixed, hashed) = (go(&data), go(&model));
    assert!(fixed.iter().all(|&l| f64::from_bits(l).is_finite()));
    assert_eq!(fixed, hashed);
}
