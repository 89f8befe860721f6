#!/usr/bin/env python3
"""Synthetic users x items interactions for the user-item benchmark (bench/useritem.md).

    scripts/gen_useritem.py --users 1000000 --items 200000 --interactions 20000000 \
        --seed 42 --out out/bench-useritem/syn-20m.tsv

Writes `user<TAB>item` lines (0-based integer ids, each (user, item) at most once,
users in increasing order) that `torusrec prepare --matrix user-item --format tsv`
reads. The model (planted clusters, so Recall measures more than popularity):

- item i has global popularity weight (i + 1)^-alpha (`--alpha`, 1.0: Zipf), and
  belongs to cluster i mod C (`--clusters` C, 64); within a cluster the popularity is
  the same power law restricted to its items;
- user u belongs to cluster hash(u) mod C, and draws n_u items, n_u = clamp(round(mean *
  x_u), `--min-per-user`, items / 2), x_u Pareto with shape `--user-shape` (2.0, mean 1),
  mean = interactions / users: a power-law activity;
- each draw is, with probability `--affinity` (0.8), an item of the user's cluster by
  the cluster's popularity, otherwise an item by the global popularity; repeats are
  dropped and the deficit drawn again (at most 8 rounds), so the line count is n_u
  summed or a little under (printed at the end).

Determinism: users are generated in blocks of 4096; block b's draws come from numpy's
PCG64 seeded with (seed, b), so the output is a pure function of (seed, the options)
and of nothing else (not the machine, not the write buffering). Memory: O(items +
block), streaming.
"""

import argparse
import sys
import time

import numpy as np

BLOCK = 4096


def die(msg):
    print(f"gen_useritem: error: {msg}", file=sys.stderr)
    sys.exit(2)


def cluster_tables(items, clusters, alpha):
    """Global and per-cluster cumulative popularity (float64) and the clusters' items."""
    w = (np.arange(items, dtype=np.float64) + 1.0) ** -alpha
    glob = np.cumsum(w)
    glob /= glob[-1]
    members, cums = [], []
    for c in range(clusters):
        idx = np.arange(c, items, clusters, dtype=np.int64)
        cw = np.cumsum(w[idx])
        members.append(idx)
        cums.append(cw / cw[-1])
    return glob, members, cums


def user_block(b, a, tables):
    """Lines of users [b * BLOCK, min(users, (b + 1) * BLOCK)): (users, items) int64 arrays."""
    glob, members, cums = tables
    rng = np.random.default_rng([a.seed, b])
    u0, u1 = b * BLOCK, min(a.users, (b + 1) * BLOCK)
    nu = u1 - u0
    mean = a.interactions / a.users
    # Pareto (Lomax + 1) with shape k has mean k / (k - 1): scale to mean 1
    x = (rng.pareto(a.user_shape, nu) + 1.0) * (a.user_shape - 1.0) / a.user_shape
    n = np.clip(np.rint(mean * x), a.min_per_user, max(a.min_per_user, a.items // 2)).astype(np.int64)
    cl = rng.integers(0, a.clusters, nu)
    us, its = [], []
    for j in range(nu):
        want, c = int(n[j]), int(cl[j])
        picks = np.zeros(0, dtype=np.int64)
        for _ in range(8):  # repeats are dropped: draw the deficit again, at most 8 rounds
            k = 2 * (want - len(picks)) if len(picks) else want
            local = rng.random(k) < a.affinity
            r = rng.random(k)
            new = np.empty(k, dtype=np.int64)
            new[local] = members[c][np.minimum(np.searchsorted(cums[c], r[local]), len(members[c]) - 1)]
            new[~local] = np.minimum(np.searchsorted(glob, r[~local]), a.items - 1)
            # keep the first `want` distinct items in draw order
            allp = np.concatenate([picks, new])
            _, first = np.unique(allp, return_index=True)
            picks = allp[np.sort(first)][:want]
            if len(picks) >= want:
                break
        picks = np.sort(picks)
        us.append(np.full(len(picks), u0 + j, dtype=np.int64))
        its.append(picks)
    return np.concatenate(us), np.concatenate(its)


def self_test():
    """Determinism, ranges, no repeats, and the planted structure."""
    a = argparse.Namespace(users=5000, items=3000, interactions=100000, seed=7, alpha=1.0,
                           clusters=8, affinity=0.8, user_shape=2.0, min_per_user=5)
    t = cluster_tables(a.items, a.clusters, a.alpha)
    u1, i1 = user_block(1, a, t)
    u2, i2 = user_block(1, a, t)
    assert np.array_equal(u1, u2) and np.array_equal(i1, i2), "not deterministic"
    a2 = argparse.Namespace(**{**vars(a), "seed": 8})
    assert not np.array_equal(user_block(1, a2, t)[1][:100], i1[:100]), "seed ignored"
    assert u1.min() == BLOCK and u1.max() == a.users - 1 and i1.min() >= 0 and i1.max() < a.items
    pairs = u1 * a.items + i1
    assert len(np.unique(pairs)) == len(pairs), "repeated (user, item)"
    counts = np.bincount(u1 - BLOCK)
    assert counts.min() >= a.min_per_user
    # each user's most common item cluster holds far more than 1/C of its items
    share = []
    for u in range(BLOCK, a.users):
        it = i1[u1 == u]
        share.append(np.bincount(it % a.clusters, minlength=a.clusters).max() / len(it))
    assert np.mean(share) > 0.6, np.mean(share)
    # popularity: item 0 is drawn more than item 1000
    allu, alli = user_block(0, a, t)
    pop = np.bincount(alli, minlength=a.items)
    assert pop[:10].sum() > 5 * pop[1000:1010].sum()
    print("gen_useritem self-test: 5 passed, 0 failed")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=1000000)
    p.add_argument("--items", type=int, default=200000)
    p.add_argument("--interactions", type=int, default=20000000, help="target total (before repeats are dropped)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--alpha", type=float, default=1.0, help="item popularity exponent")
    p.add_argument("--clusters", type=int, default=64)
    p.add_argument("--affinity", type=float, default=0.8, help="probability a draw is from the user's cluster")
    p.add_argument("--user-shape", type=float, default=2.0, help="Pareto shape of user activity (> 1)")
    p.add_argument("--min-per-user", type=int, default=5)
    p.add_argument("--out", help="output TSV (required unless --self-test)")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args()
    if a.self_test:
        self_test()
        return 0
    if not a.out:
        p.error("--out is required")
    if a.users < 1 or a.items < 2 or a.interactions < a.users:
        die("need --users >= 1, --items >= 2, --interactions >= --users")
    if not (a.user_shape > 1.0) or not (0.0 <= a.affinity <= 1.0) or a.clusters < 1 or a.clusters > a.items:
        die("need --user-shape > 1, 0 <= --affinity <= 1, 1 <= --clusters <= --items")
    t0 = time.perf_counter()
    tables = cluster_tables(a.items, a.clusters, a.alpha)
    total = 0
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        for b in range((a.users + BLOCK - 1) // BLOCK):
            us, its = user_block(b, a, tables)
            total += len(us)
            f.write("\n".join(f"{u}\t{i}" for u, i in zip(us.tolist(), its.tolist())))
            f.write("\n")
    import os
    os.replace(tmp, a.out)
    print(f"gen_useritem: wrote {a.out}: {a.users} users x {a.items} items, {total} interactions "
          f"(seed {a.seed}) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
