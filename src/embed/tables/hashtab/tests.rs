//! Tests of the hash-table shard against an obviously-correct reference model.

use super::*;
use std::collections::{BTreeMap, BTreeSet};

/// A tiny SplitMix64 stream for test inputs.
struct Sm(u64);

impl Sm {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }
    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Obviously-correct reference: ordered maps, full sorts.
struct Model {
    cap: usize,
    admit: u32,
    evict: Evict,
    /// key -> (count, last_seen, slot)
    map: BTreeMap<u64, (u32, u64, u32)>,
    free: BTreeSet<u32>,
    stats: Stats,
}

fn model_expired(evict: Evict, last: u64, step: u64) -> bool {
    matches!(evict, Evict::Ttl(t) if step - last > t)
}

impl Model {
    fn new(cap: usize, admit: u32, evict: Evict) -> Model {
        Model {
            cap,
            admit,
            evict,
            map: BTreeMap::new(),
            free: (0..cap as u32).collect(),
            stats: Stats::default(),
        }
    }

    fn resolve(&mut self, key: u64, c: u32, step: u64, fresh: &mut Vec<(u32, u64)>) -> Option<u32> {
        if let Some(e) = self.map.get_mut(&key) {
            if model_expired(self.evict, e.1, step) {
                *e = (c, step, e.2);
                fresh.push((e.2, key));
                self.stats.expired += 1;
            } else {
                e.0 = e.0.saturating_add(c);
                e.1 = step;
            }
            return (e.0 >= self.admit).then_some(e.2);
        }
        if self.free.is_empty() {
            let cands: Vec<(u64, u32, u64, u32)> = self
                .map
                .iter()
                .filter(|(_, e)| e.1 < step)
                .map(|(&k, &(cnt, last, slot))| (k, cnt, last, slot))
                .collect();
            if cands.is_empty() {
                self.stats.refused += 1;
                return None;
            }
            let expired: Vec<(u64, u32, u64, u32)> = cands
                .iter()
                .copied()
                .filter(|c| model_expired(self.evict, c.2, step))
                .collect();
            let victims = if !expired.is_empty() {
                expired
            } else {
                let mut sorted = cands;
                match self.evict {
                    Evict::Lfu => sorted.sort_by_key(|c| (c.1, c.2, c.0)),
                    Evict::Ttl(_) => sorted.sort_by_key(|c| (c.2, c.1, c.0)),
                }
                sorted.truncate((self.cap / 16).max(1));
                sorted
            };
            for v in victims {
                self.map.remove(&v.0);
                self.free.insert(v.3);
                self.stats.evicted += 1;
            }
        }
        let slot = *self.free.iter().next().unwrap();
        self.free.remove(&slot);
        self.map.insert(key, (c, step, slot));
        self.stats.inserted += 1;
        fresh.push((slot, key));
        (c >= self.admit).then_some(slot)
    }

    fn get(&self, key: u64, step: u64) -> Option<u32> {
        let &(c, last, slot) = self.map.get(&key)?;
        let expired = matches!(self.evict, Evict::Ttl(t) if step.saturating_sub(last) > t);
        (c >= self.admit && !expired).then_some(slot)
    }

    fn entries(&self) -> Vec<Entry> {
        let mut v: Vec<Entry> = self
            .map
            .iter()
            .map(|(&key, &(count, last_seen, slot))| Entry {
                slot,
                key,
                count,
                last_seen,
            })
            .collect();
        v.sort_by_key(|e| e.slot);
        v
    }

    fn admitted(&self) -> usize {
        self.map.values().filter(|e| e.0 >= self.admit).count()
    }
}

/// Internal consistency: every used slot is reachable through the index, the index
/// holds exactly the used slots, and the counters match.
fn check_invariants(t: &HashShard) {
    let entries = t.entries();
    assert_eq!(entries.len(), t.len());
    let occupied = t.index.iter().filter(|&&s| s != EMPTY).count();
    assert_eq!(occupied, t.len());
    for e in &entries {
        assert!(matches!(t.probe(e.key), Probe::Found(s) if s == e.slot));
    }
    let adm = entries
        .iter()
        .filter(|e| e.count >= t.admit_after())
        .count();
    assert_eq!(adm, t.admitted());
    for w in 0..t.used.len() {
        if w < t.free_hint {
            assert_eq!(t.used[w], !0u64, "free_hint past a free slot");
        }
    }
}

type Stream = Vec<(u64, Vec<(u64, u32)>)>;

/// What `resolve` returned and pushed, call by call.
type Outputs = Vec<(Option<u32>, Vec<(u32, u64)>)>;

/// A random train stream: Zipf-like keys (log-uniform rank over `universe`, with
/// keys 0 and u64::MAX among the most frequent, some one-off random keys), 1..=6
/// draws per step aggregated per distinct key, steps advancing by 1 or jumping.
fn gen_stream(seed: u64, steps: usize, universe: u64) -> Stream {
    let mut rng = Sm(seed);
    let mut step = 0u64;
    let mut out = Vec::with_capacity(steps);
    for _ in 0..steps {
        let n = 1 + rng.below(6);
        let mut keys: Vec<(u64, u32)> = Vec::new();
        for _ in 0..n {
            let key = if rng.below(10) == 0 {
                rng.next()
            } else {
                let r = ((universe as f64 + 1.0).powf(rng.unit()) as u64).saturating_sub(1);
                match r {
                    0 => 0,
                    1 => u64::MAX,
                    r if r % 2 == 0 => r,
                    r => mix64(r) & 0xffff_ffff,
                }
            };
            let c = if rng.below(500) == 0 { u32::MAX / 2 } else { 1 };
            match keys.iter_mut().find(|(k, _)| *k == key) {
                Some(e) => e.1 = e.1.saturating_add(c),
                None => keys.push((key, c)),
            }
        }
        out.push((step, keys));
        step += if rng.below(20) == 0 {
            2 + rng.below(12)
        } else {
            1
        };
    }
    out
}

fn compare_with_model(
    cap: usize,
    admit: u32,
    evict: Evict,
    steps: usize,
    seed: u64,
    total: &mut Stats,
) {
    let universe = 4 * cap as u64 + 20;
    let stream = gen_stream(seed, steps, universe);
    let mut t = HashShard::new(cap, admit, evict).unwrap();
    let mut m = Model::new(cap, admit, evict);
    let mut rng = Sm(seed ^ 0xabcd);
    let (mut f1, mut f2) = (Vec::new(), Vec::new());
    let every = if cap <= 16 { 1 } else { 37 };
    for (i, (step, keys)) in stream.iter().enumerate() {
        for &(key, c) in keys {
            f1.clear();
            f2.clear();
            let a = t.resolve(key, c, *step, &mut f1);
            let b = m.resolve(key, c, *step, &mut f2);
            let ctx = format!("cap {cap} admit {admit} {evict} step {step} key {key}");
            assert_eq!(a, b, "{ctx}");
            assert_eq!(f1, f2, "{ctx}");
        }
        for _ in 0..3 {
            let key = match rng.below(4) {
                0 => rng.next(),
                _ => keys[rng.below(keys.len() as u64) as usize].0,
            };
            let at = step + rng.below(8);
            assert_eq!(t.get(key, at), m.get(key, at), "get {key} at {at}");
        }
        if i % every == 0 || i + 1 == stream.len() {
            assert_eq!(t.entries(), m.entries(), "cap {cap} {evict} step {step}");
            assert_eq!(t.stats(), m.stats);
            assert_eq!(t.admitted(), m.admitted());
            check_invariants(&t);
        }
    }
    let s = t.stats();
    assert!(s.inserted > 0);
    total.inserted += s.inserted;
    total.evicted += s.evicted;
    total.expired += s.expired;
    total.refused += s.refused;
    if cap <= 16 {
        assert!(s.evicted > 0, "cap {cap} {evict}: no eviction exercised");
    }
}

#[test]
fn matches_reference_model() {
    let mut seed = 1;
    let mut total = Stats::default();
    for &cap in &[1usize, 2, 3, 7, 16, 40, 100, 1000] {
        for &admit in &[1u32, 3] {
            for &evict in &[Evict::Lfu, Evict::Ttl(1), Evict::Ttl(5)] {
                let steps = if cap >= 1000 { 8000 } else { 4000 };
                compare_with_model(cap, admit, evict, steps, seed, &mut total);
                seed += 1;
            }
        }
    }
    // Every rule was exercised.
    assert!(total.evicted > 1000 && total.expired > 100, "{total:?}");
    assert!(total.refused > 100, "{total:?}");
}

#[test]
fn new_refuses_bad_parameters() {
    assert!(HashShard::new(0, 1, Evict::Lfu)
        .unwrap_err()
        .contains("capacity"));
    assert!(HashShard::new(u32::MAX as usize, 1, Evict::Lfu).is_err());
    assert!(HashShard::new(4, 0, Evict::Lfu)
        .unwrap_err()
        .contains("admit_after"));
    assert!(HashShard::new(4, 1, Evict::Ttl(0))
        .unwrap_err()
        .contains("ttl"));
    let t = HashShard::new(5, 2, Evict::Ttl(3)).unwrap();
    assert_eq!(
        (t.capacity(), t.admit_after(), t.evict()),
        (5, 2, Evict::Ttl(3))
    );
    assert!(t.is_empty());
    assert_eq!(t.index.len(), 16);
}

#[test]
fn admission_at_nth_occurrence() {
    let mut t = HashShard::new(4, 3, Evict::Lfu).unwrap();
    let mut f = Vec::new();
    assert_eq!(t.resolve(7, 1, 0, &mut f), None);
    assert_eq!(f, vec![(0, 7)]);
    f.clear();
    assert_eq!(t.resolve(7, 1, 1, &mut f), None);
    assert_eq!(t.get(7, 1), None);
    assert_eq!((t.len(), t.admitted()), (1, 0));
    assert_eq!(t.resolve(7, 1, 2, &mut f), Some(0));
    assert!(f.is_empty(), "no re-initialization on admission");
    assert_eq!((t.len(), t.admitted()), (1, 1));
    assert_eq!(t.get(7, 2), Some(0));
    // Three occurrences in one step admit at once.
    assert_eq!(t.resolve(u64::MAX, 3, 2, &mut f), Some(1));
    assert_eq!(t.resolve(0, 2, 2, &mut f), None);
    assert_eq!(f, vec![(1, u64::MAX), (2, 0)]);
    assert_eq!(t.get(0, 2), None);
    assert_eq!(t.get(12345, 2), None);
    assert_eq!(
        t.stats(),
        Stats {
            inserted: 3,
            ..Stats::default()
        }
    );
}

#[test]
fn ttl_expiry_restarts_in_place() {
    let mut t = HashShard::new(4, 2, Evict::Ttl(5)).unwrap();
    let mut f = Vec::new();
    assert_eq!(t.resolve(8, 1, 0, &mut f), None);
    assert_eq!(t.resolve(9, 2, 10, &mut f), Some(1));
    assert_eq!(f, vec![(0, 8), (1, 9)]);
    f.clear();
    // 15 - 10 = 5 is not > 5: still alive.
    assert_eq!(t.resolve(9, 1, 15, &mut f), Some(1));
    assert!(f.is_empty());
    assert_eq!(t.get(9, 20), Some(1));
    assert_eq!(t.get(9, 21), None);
    // 21 - 15 = 6 > 5: restarts with count 1, not admitted.
    assert_eq!(t.resolve(9, 1, 21, &mut f), None);
    assert_eq!(f, vec![(1, 9)]);
    assert_eq!(t.stats().expired, 1);
    assert_eq!(t.admitted(), 0);
    let e = t.entries();
    assert_eq!(
        e[1],
        Entry {
            slot: 1,
            key: 9,
            count: 1,
            last_seen: 21
        }
    );
    f.clear();
    assert_eq!(t.resolve(9, 1, 21, &mut f), Some(1));
    assert!(f.is_empty());
    assert_eq!(t.admitted(), 1);
    // An expired restart that is admitted at once.
    assert_eq!(t.resolve(9, 4, 40, &mut f), Some(1));
    assert_eq!(f, vec![(1, 9)]);
    assert_eq!(t.entries()[1].count, 4);
    assert_eq!(
        t.stats(),
        Stats {
            inserted: 2,
            evicted: 0,
            expired: 2,
            refused: 0
        }
    );
}

#[test]
fn current_step_entries_are_never_evicted() {
    for evict in [Evict::Lfu, Evict::Ttl(1)] {
        let mut t = HashShard::new(2, 1, evict).unwrap();
        let mut f = Vec::new();
        assert_eq!(t.resolve(1, 1, 5, &mut f), Some(0));
        assert_eq!(t.resolve(2, 1, 5, &mut f), Some(1));
        assert_eq!(t.resolve(3, 1, 5, &mut f), None);
        assert_eq!(f.len(), 2);
        assert_eq!(
            t.stats(),
            Stats {
                inserted: 2,
                evicted: 0,
                expired: 0,
                refused: 1
            }
        );
        assert_eq!(t.get(3, 5), None);
        assert_eq!(t.len(), 2);
        // Next step both are candidates; the tie (1, 5, key) goes to key 1.
        assert_eq!(t.resolve(3, 1, 6, &mut f), Some(0));
        assert_eq!(f[2], (0, 3));
        assert_eq!(t.get(1, 6), None);
        assert_eq!(t.get(2, 6), Some(1));
        check_invariants(&t);
    }
    // The only candidate goes even with the highest count.
    let mut t = HashShard::new(2, 1, Evict::Lfu).unwrap();
    let mut f = Vec::new();
    t.resolve(1, 10, 1, &mut f);
    t.resolve(2, 1, 1, &mut f);
    t.resolve(2, 1, 2, &mut f);
    assert_eq!(t.resolve(3, 1, 2, &mut f), Some(0));
    assert_eq!(t.get(1, 2), None);
    assert_eq!(t.stats().evicted, 1);
}

#[test]
fn lfu_order_count_then_last_seen_then_key() {
    let mut t = HashShard::new(4, 1, Evict::Lfu).unwrap();
    let mut f = Vec::new();
    t.resolve(10, 5, 1, &mut f); // slot 0
    t.resolve(40, 2, 1, &mut f); // slot 1
    t.resolve(30, 2, 1, &mut f); // slot 2
    t.resolve(20, 2, 2, &mut f); // slot 3
                                 // (2,1,30) < (2,1,40) < (2,2,20) < (5,1,10): key 30 goes.
    assert_eq!(t.resolve(50, 1, 5, &mut f), Some(2));
    // Now (1,5,50) is the smallest.
    assert_eq!(t.resolve(60, 1, 6, &mut f), Some(2));
    // Then (1,6,60) again; at step 6 it is protected, so (2,1,40) goes.
    assert_eq!(t.resolve(70, 1, 6, &mut f), Some(1));
    let keys: Vec<u64> = t.entries().iter().map(|e| e.key).collect();
    assert_eq!(keys, vec![10, 70, 60, 20]);
    assert_eq!(t.stats().evicted, 3);

    // capacity 32: each pass removes 32 / 16 = 2 entries.
    let mut t = HashShard::new(32, 1, Evict::Lfu).unwrap();
    for k in 0..32u64 {
        assert_eq!(
            t.resolve(100 + k, (k % 5) as u32 + 1, 1, &mut f),
            Some(k as u32)
        );
    }
    // Count-1 keys are 100, 105, 110, ...; 100 and 105 go (slots 0 and 5).
    assert_eq!(t.resolve(999, 1, 2, &mut f), Some(0));
    assert_eq!(t.resolve(998, 1, 2, &mut f), Some(5));
    assert_eq!(t.stats().evicted, 2);
    // 999 and 998 are protected at step 2: 110 and 115 go.
    assert_eq!(t.resolve(997, 1, 2, &mut f), Some(10));
    assert_eq!(t.get(115, 2), None);
    assert_eq!(t.get(120, 2), Some(20));
    assert_eq!(t.stats().evicted, 4);
    assert_eq!(t.len(), 31);
    check_invariants(&t);
}

#[test]
fn ttl_removes_all_expired_else_lru() {
    let mut t = HashShard::new(3, 1, Evict::Ttl(100)).unwrap();
    let mut f = Vec::new();
    t.resolve(1, 50, 1, &mut f);
    t.resolve(2, 1, 2, &mut f);
    t.resolve(3, 1, 3, &mut f);
    // Nothing expired: least recently used goes, whatever its count.
    assert_eq!(t.resolve(4, 1, 4, &mut f), Some(0));
    assert_eq!(t.get(1, 4), None);

    let mut t = HashShard::new(4, 1, Evict::Ttl(2)).unwrap();
    t.resolve(1, 1, 1, &mut f);
    t.resolve(2, 9, 1, &mut f);
    t.resolve(3, 1, 3, &mut f);
    t.resolve(4, 1, 4, &mut f);
    // 4 - 1 = 3 > 2: keys 1 and 2 both expire in one pass.
    assert_eq!(t.resolve(5, 1, 4, &mut f), Some(0));
    assert_eq!(t.stats().evicted, 2);
    assert_eq!(t.resolve(6, 1, 4, &mut f), Some(1));
    assert_eq!(
        t.stats(),
        Stats {
            inserted: 6,
            evicted: 2,
            expired: 0,
            refused: 0
        }
    );
    check_invariants(&t);
}

#[test]
fn count_saturates() {
    let mut t = HashShard::new(2, 1, Evict::Lfu).unwrap();
    let mut f = Vec::new();
    t.resolve(1, u32::MAX - 1, 0, &mut f);
    t.resolve(1, 5, 1, &mut f);
    assert_eq!(t.entries()[0].count, u32::MAX);
    t.resolve(1, u32::MAX, 2, &mut f);
    assert_eq!(t.entries()[0].count, u32::MAX);
    assert_eq!(t.entries()[0].last_seen, 2);
}

#[test]
fn colliding_keys_survive_deletions() {
    // Many keys, tiny-probe clusters broken by repeated eviction: every held key
    // must stay reachable.
    let mut t = HashShard::new(64, 1, Evict::Lfu).unwrap();
    let mut f = Vec::new();
    let mut rng = Sm(77);
    for step in 0..20_000u64 {
        let key = rng.below(300);
        t.resolve(key, 1, step, &mut f);
        if step % 97 == 0 {
            check_invariants(&t);
        }
    }
    check_invariants(&t);
    // A pass removes 64 / 16 = 4 entries, then refills one slot at a time.
    assert!((61..=64).contains(&t.len()));
    assert!(t.stats().evicted > 1000);
}

fn run(t: &mut HashShard, stream: &[(u64, Vec<(u64, u32)>)]) -> Outputs {
    let mut out = Vec::new();
    for (step, keys) in stream {
        for &(k, c) in keys {
            let mut f = Vec::new();
            let r = t.resolve(k, c, *step, &mut f);
            out.push((r, f));
        }
    }
    out
}

#[test]
fn restore_continues_identically() {
    for (i, &(cap, admit, evict)) in [
        (1usize, 1u32, Evict::Lfu),
        (7, 3, Evict::Ttl(5)),
        (50, 1, Evict::Ttl(1)),
        (200, 3, Evict::Lfu),
    ]
    .iter()
    .enumerate()
    {
        let stream = gen_stream(100 + i as u64, 4000, 4 * cap as u64 + 20);
        let (head, tail) = stream.split_at(2000);
        let mut a = HashShard::new(cap, admit, evict).unwrap();
        run(&mut a, head);
        let snap = a.stats();
        let mut entries = a.entries();
        entries.reverse(); // any order is accepted
        let mut b = HashShard::restore(cap, admit, evict, &entries).unwrap();
        assert_eq!(b.entries(), a.entries());
        assert_eq!(b.stats(), Stats::default());
        assert_eq!((b.len(), b.admitted()), (a.len(), a.admitted()));
        check_invariants(&b);
        assert_eq!(run(&mut a, tail), run(&mut b, tail));
        assert_eq!(a.entries(), b.entries());
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!(sb.inserted, sa.inserted - snap.inserted);
        assert_eq!(sb.evicted, sa.evicted - snap.evicted);
        assert_eq!(sb.expired, sa.expired - snap.expired);
        assert_eq!(sb.refused, sa.refused - snap.refused);
    }
}

/// `take_renewed` lists exactly the slots that took a new entry (an insert, an
/// expired entry restarting) since the last call, ascending, and forgets them; a
/// touch of a held entry and a restore renew nothing.
#[test]
fn renewed_slots_are_the_new_entries() {
    let mut fresh = Vec::new();
    let mut a = HashShard::new(4, 1, Evict::Ttl(2)).unwrap();
    for key in [10, 11, 12] {
        a.resolve(key, 1, 0, &mut fresh);
    }
    assert_eq!(a.take_renewed(), vec![0, 1, 2]);
    assert!(a.take_renewed().is_empty());
    a.resolve(11, 1, 1, &mut fresh); // a touch
    assert!(a.take_renewed().is_empty());
    a.resolve(10, 1, 9, &mut fresh); // expired: restarts in slot 0
    a.resolve(13, 1, 9, &mut fresh); // inserted into slot 3
    assert_eq!(a.take_renewed(), vec![0, 3]);
    let mut b = HashShard::restore(4, 1, Evict::Ttl(2), &a.entries()).unwrap();
    assert!(b.take_renewed().is_empty());
    let want: Vec<u32> = fresh.iter().map(|f| f.0).collect();
    assert_eq!(want, vec![0, 1, 2, 0, 3]);
}

#[test]
fn restore_refuses_bad_input() {
    let e = |slot, key| Entry {
        slot,
        key,
        count: 1,
        last_seen: 0,
    };
    let err = HashShard::restore(4, 1, Evict::Lfu, &[e(0, 1), e(4, 2)]).unwrap_err();
    assert!(
        err.contains("slot 4") && err.contains("out of range"),
        "{err}"
    );
    let err = HashShard::restore(4, 1, Evict::Lfu, &[e(2, 1), e(2, 2)]).unwrap_err();
    assert!(err.contains("duplicate slot 2"), "{err}");
    let err = HashShard::restore(4, 1, Evict::Lfu, &[e(0, 9), e(3, 9)]).unwrap_err();
    assert!(err.contains("duplicate key 9"), "{err}");
    assert!(HashShard::restore(0, 1, Evict::Lfu, &[]).is_err());
    let t = HashShard::restore(4, 1, Evict::Lfu, &[e(3, u64::MAX), e(1, 0)]).unwrap();
    assert_eq!(t.get(0, 0), Some(1));
    assert_eq!(t.get(u64::MAX, 0), Some(3));
}

#[test]
fn insert_entry_takes_smallest_free_slot() {
    let e = |slot, key| Entry {
        slot,
        key,
        count: 1,
        last_seen: 0,
    };
    let mut t = HashShard::restore(4, 2, Evict::Lfu, &[e(1, 10), e(3, 30)]).unwrap();
    assert_eq!(t.insert_entry(5, 7, 9), Ok(0));
    assert!(t.insert_entry(10, 1, 1).unwrap_err().contains("already"));
    assert_eq!(t.insert_entry(6, 1, 9), Ok(2));
    assert!(t.insert_entry(7, 1, 1).unwrap_err().contains("full"));
    assert_eq!(
        t.entries()[0],
        Entry {
            slot: 0,
            key: 5,
            count: 7,
            last_seen: 9
        }
    );
    assert_eq!(t.admitted(), 1);
    assert_eq!(t.stats(), Stats::default());
    check_invariants(&t);
}

#[test]
fn resharding_preserves_entries() {
    let cap = 300;
    let stream = gen_stream(5, 5000, 2000);
    let mut a = HashShard::new(cap, 3, Evict::Ttl(5)).unwrap();
    run(&mut a, &stream);
    let mut entries = a.entries();
    assert!(entries.len() > 100);
    let last_step = stream.last().unwrap().0;
    let want: BTreeSet<(u64, u32, u64)> = entries
        .iter()
        .map(|e| (e.key, e.count, e.last_seen))
        .collect();
    entries.sort_by_key(|e| e.key);
    let table = 3;
    for q in 1..=4usize {
        let mut parts: Vec<HashShard> = (0..q)
            .map(|_| HashShard::new(cap, 3, Evict::Ttl(5)).unwrap())
            .collect();
        for e in &entries {
            let r = owner(e.key, table, q);
            parts[r].insert_entry(e.key, e.count, e.last_seen).unwrap();
        }
        let mut got = BTreeSet::new();
        for (r, p) in parts.iter().enumerate() {
            for (i, e) in p.entries().iter().enumerate() {
                assert_eq!(e.slot as usize, i, "slots fill from 0");
                assert_eq!(owner(e.key, table, q), r);
                assert!(got.insert((e.key, e.count, e.last_seen)));
            }
            check_invariants(p);
        }
        assert_eq!(got, want, "q = {q}");
        for e in &entries {
            let p = &parts[owner(e.key, table, q)];
            let old = a.get(e.key, last_step).is_some();
            assert_eq!(p.get(e.key, last_step).is_some(), old);
        }
    }
}

#[test]
fn owner_in_range_and_balanced() {
    for p in 2..=4usize {
        for table in [0usize, 1, 25] {
            for criteo in [false, true] {
                let mut n = vec![0usize; p];
                for i in 0..100_000u64 {
                    let key = if criteo { mix64(i) & 0xffff_ffff } else { i };
                    let r = owner(key, table, p);
                    assert!(r < p);
                    n[r] += 1;
                }
                let mean = 100_000.0 / p as f64;
                for &c in &n {
                    assert!((c as f64 - mean).abs() < 0.1 * mean, "p {p}: {n:?}");
                }
            }
        }
    }
    let mut rng = Sm(3);
    for _ in 0..10_000 {
        let p = 1 + rng.below(1000) as usize;
        let (key, table) = (rng.next(), rng.below(40) as usize);
        let r = owner(key, table, p);
        assert!(r < p);
        assert_eq!(r, owner(key, table, p));
    }
    assert_eq!(owner(u64::MAX, 0, 1), 0);
    assert_eq!(owner(0, 7, 1), 0);
    // The table salt decorrelates tables: about 1/4 agreement at p = 4.
    let same = (0..10_000u64)
        .filter(|&k| owner(k, 0, 4) == owner(k, 1, 4))
        .count();
    assert!((2000..3000).contains(&same), "{same}");
}

#[test]
fn evict_parse_display() {
    for e in [
        Evict::Lfu,
        Evict::Ttl(1),
        Evict::Ttl(5),
        Evict::Ttl(u64::MAX),
    ] {
        let s = e.to_string();
        assert_eq!(Evict::parse(&s), Ok(e));
    }
    assert_eq!(Evict::Ttl(5).to_string(), "ttl:5");
    assert_eq!(Evict::Lfu.to_string(), "lfu");
    assert_eq!(Evict::default(), Evict::Lfu);
    for bad in [
        "",
        "LFU",
        "lru",
        "ttl",
        "ttl:",
        "ttl:0",
        "ttl:-1",
        "ttl:+5",
        "ttl:5x",
        "ttl: 5",
        " lfu",
        "ttl:99999999999999999999",
    ] {
        let err = Evict::parse(bad).unwrap_err();
        assert!(err.contains(&format!("{bad:?}")), "{err}");
    }
}
