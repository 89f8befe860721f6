#!/usr/bin/env python3
"""The user-item benchmark's scorer (bench/useritem.md): one Python scoring function for
the factors of either system, on the same prepared split.

    # train implicit (one point or a REGS:ALPHAS grid), score it, check fold-in/similar
    scripts/bench_useritem.py implicit out/ml.h5 --dim 64 --epochs 16 --reg 0.1 --alpha 10 \
        --threads 2 --json out/imp.json
    # score torusrec's model (`als --out model.h5`) with its own fold-in objective
    scripts/bench_useritem.py torusrec out/ml.h5 --model out/model.h5 --reg 0.01 \
        --unobserved-weight 0.1 --metrics out/run.jsonl --json out/ours.json
    scripts/bench_useritem.py --self-test

Fold-in (strong generalization: test users have no training row; each is solved from
its visible items `/test/fold` against the item table H, in float64, exactly). One
solver, `fold_in`, with per-system coefficients:

    A_u = g G + c H_u^T H_u + r_u I,    b_u = s H_u^T 1,    G = H^T H

- implicit 0.7 (`recalculate_user`): g = 1, c = alpha - 1, r_u = reg, s = alpha;
- torusrec (docs/als.md, binary confidence): g = alpha0, c = 1,
  r_u = lambda (|I_u| + alpha0 n_items), s = 1.

Dividing torusrec's by alpha0 shows the map: it is implicit's recalculate_user with
alpha' = 1 + 1/alpha0, a per-user reg' = lambda (|I_u| + alpha0 n_items) / alpha0, and
the preference 1/(1 + alpha0) instead of 1 (which scales x_u and leaves the ranking).
So the two agree exactly only when reg' is the same for every user; on implicit's
factors the `mapped` overlap below uses alpha0 = 1/(alpha - 1) and the lambda that
gives reg' = reg at the median |I_u|, and says how far the frequency scaling moves it.

Scoring (the same for both): score every item, drop the user's visible items, rank
(higher first, ties to the lower item id), top K = 20 (compare_implicit.topk_rows);
with H_u the held-out items:
    Recall@K = |top_K & H_u| / min(K, |H_u|)
    NDCG@K   = sum_{r <= K, top[r] in H_u} 1/log2(r + 1) / sum_{r <= min(K, |H_u|)} 1/log2(r + 1)
both averaged over ALL test users (a user with no held-out item counts 0).

Checks against implicit itself (implicit mode, on implicit's factors):
- fold-in overlap: mean |ours & theirs| / 20 of the top 20 of our implicit-coefficient
  fold-in and of `model.recommend(users, fold, N=20, filter_already_liked_items=True,
  recalculate_user=True)`, over all test users; plus the `mapped` torusrec objective;
- similar overlap: mean |ours & theirs| / N of `model.similar_items(items, N=21)` and
  our cosine top 21 (H rows normalized, the item itself included, as implicit) over a
  seeded sample of items with at least one training interaction; `ties` also counts
  an item of theirs whose cosine ties our 21st within 1e-5 (cold items rated by one
  and the same user have parallel factors; the two top-k codes break such ties apart).

The real CLI (torusrec mode, docs/recommend.md): `--compare-topk FILE` reads the TSV of
`torusrec recommend --test` (or `--user` with test users; `--history` of a test user's
visible items gives the same bits) and reports the top-20 overlap
- `cli_topk_overlap_at_20`: with this script's f64 fold-in of the same model;
- `cli_vs_implicit_foldin_at_20`: with implicit's own `recommend(..., N=20,
  filter_already_liked_items=True, recalculate_user=True)` on the same factors (H as
  implicit's item_factors), one user at a time with the exact map above (alpha =
  1 + 1/alpha0, regularization = lambda (|I_u| + alpha0 n_items) / alpha0, use_cg off).
`--compare-similar FILE` reads the TSV of `torusrec recommend --similar ITEMS -k 20` and
reports the top-20 overlap with implicit's `similar_items(items, N=21)` on the same H,
the item itself dropped from implicit's list (`cli_vs_implicit_similar_at_20`; `_ties`
also counts a tie with our 20th within 1e-5, as above). `--sample-items N` prints a seeded
sample of N items with a training interaction (original ids, comma-separated) for it.
Ids in those files are original ids, mapped through `/user_ids` and `/item_ids`.
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare_implicit as ci  # noqa: E402  (sets one BLAS thread, installs the pins)

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import threadpoolctl  # noqa: E402
from implicit.cpu.als import AlternatingLeastSquares  # noqa: E402

K = 20


def die(msg, code=2):
    print(f"bench_useritem: error: {msg}", file=sys.stderr)
    sys.exit(code)


# ---------------------------------------------------------------------------------------
# fold-in and scoring


def implicit_coefs(reg, alpha):
    return {"g": 1.0, "c": alpha - 1.0, "s": alpha, "reg": reg, "per_count": 0.0}


def torusrec_coefs(lam, alpha0, n_items):
    # r_u = lam * |I_u| + lam * alpha0 * n_items
    return {"g": alpha0, "c": 1.0, "s": 1.0, "reg": lam * alpha0 * n_items, "per_count": lam}


def fold_in(Y, ds, co, batch=512):
    """x_u for every test user: A_u = g G + c Y_u^T Y_u + r_u I, b_u = s Y_u^T 1 (f64)."""
    d = Y.shape[1]
    t = ds.num_test
    Y64 = Y.astype(np.float64)
    G = Y64.T @ Y64
    X = np.zeros((t, d), dtype=np.float32)
    eye = np.eye(d)
    for b0 in range(0, t, batch):
        b1 = min(t, b0 + batch)
        A = np.repeat((co["g"] * G)[None, :, :], b1 - b0, axis=0)
        B = np.zeros((b1 - b0, d))
        for i in range(b0, b1):
            idx = ds.fold(i)
            A[i - b0] += (co["reg"] + co["per_count"] * len(idx)) * eye
            if len(idx) == 0:
                continue
            Yu = Y64[idx]
            A[i - b0] += co["c"] * (Yu.T @ Yu)
            B[i - b0] = co["s"] * Yu.sum(axis=0)
        X[b0:b1] = np.linalg.solve(A, B[:, :, None])[:, :, 0]
    return X


def ndcg_at(top, holdout, k):
    if len(holdout) == 0:
        return 0.0
    hit = np.isin(top[:k], holdout, assume_unique=True)
    disc = 1.0 / np.log2(np.arange(2, k + 2))
    ideal = disc[:min(k, len(holdout))].sum()
    return float(disc[:len(hit)][hit].sum() / ideal)


def top_lists(X, Y, ds, threads, k=K, block_bytes=128 << 20):
    """Top k of every test user (visible items excluded), in rank order."""
    n = Y.shape[0]
    t = ds.num_test
    YT = np.ascontiguousarray(Y.T, dtype=np.float32)
    block = max(1, min(t, block_bytes // (4 * max(n, 1))))

    def one(b0):
        b1 = min(t, b0 + block)
        S = X[b0:b1] @ YT
        lo, hi = ds.fold_indptr[b0], ds.fold_indptr[b1]
        lens = np.diff(ds.fold_indptr[b0:b1 + 1])
        S[np.repeat(np.arange(b1 - b0), lens), ds.fold_indices[lo:hi]] = -np.inf
        return ci.topk_rows(S, k)

    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"), \
            concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
        parts = list(pool.map(one, range(0, t, block)))
    return [x for p in parts for x in p]


def score(Y, ds, co, threads, k=K):
    """THE scoring function: fold in with coefficients `co`, then Recall@k and NDCG@k."""
    t0 = time.perf_counter()
    X = fold_in(Y, ds, co)
    tops = top_lists(X, Y, ds, threads, k)
    t = max(ds.num_test, 1)
    rec = sum(ci.recall_at(tp, ds.holdout(i), k) for i, tp in enumerate(tops)) / t
    ndcg = sum(ndcg_at(tp, ds.holdout(i), k) for i, tp in enumerate(tops)) / t
    return {f"recall_at_{k}": rec, f"ndcg_at_{k}": ndcg, "score_seconds": time.perf_counter() - t0}, X, tops


def overlap(a_lists, b_lists, k):
    return float(np.mean([len(np.intersect1d(a[:k], b[:k])) / k for a, b in zip(a_lists, b_lists)]))


def fold_csr(ds):
    t = ds.num_test
    return sp.csr_matrix((np.ones(len(ds.fold_indices), dtype=np.float32),
                          ds.fold_indices.astype(np.int32), ds.fold_indptr.astype(np.int32)),
                         shape=(t, ds.num_cols))


def similar_cosine(Y, items, n):
    """Cosine top n of each item (itself included) and the cosine matrix."""
    norms = np.linalg.norm(Y, axis=1)
    norms[norms == 0] = 1.0
    Yn = (Y / norms[:, None]).astype(np.float32)
    S = Yn[items] @ Yn.T
    return ci.topk_rows(S, n), S


def tie_overlap(ours, theirs, S, n, tol=1e-5):
    """Like `overlap`, but an item of theirs outside our top n also counts when its
    cosine ties our n-th (within tol): cold items rated by the same single user have
    parallel factors, and such ties are broken differently by the two top-k codes."""
    got = []
    for q, (a, b) in enumerate(zip(ours, theirs)):
        thr = S[q, a[n - 1]] - tol
        got.append(sum(1 for x in b[:n] if x in set(a[:n]) or S[q, x] >= thr) / n)
    return float(np.mean(got))


def implicit_checks(model, Y, ds, reg, alpha, tops, threads, n_similar=1000, seed=42):
    """Fold-in and similar-items overlap with implicit's own methods on its factors."""
    t = ds.num_test
    ids, _ = model.recommend(np.arange(t), fold_csr(ds), N=K, filter_already_liked_items=True,
                             recalculate_user=True)
    theirs = [np.asarray(r, dtype=np.int64) for r in ids]
    out = {"foldin_overlap_at_20": overlap(tops, theirs, K)}
    # torusrec's objective mapped onto implicit's (alpha0 = 1/(alpha - 1), lambda such
    # that reg' = reg at the median |I_u|)
    if alpha > 1:
        a0 = 1.0 / (alpha - 1.0)
        med = float(np.median(np.diff(ds.fold_indptr))) if t else 0.0
        lam = reg * a0 / (med + a0 * ds.num_cols)
        Xm = fold_in(Y, ds, torusrec_coefs(lam, a0, ds.num_cols))
        out.update(foldin_overlap_mapped_at_20=overlap(top_lists(Xm, Y, ds, threads), theirs, K),
                   mapped_alpha0=a0, mapped_lambda=lam)
    counts = np.diff(ds.train.tocsc().indptr)
    cand = np.flatnonzero(counts > 0)
    rng = np.random.default_rng(seed)
    items = np.sort(rng.choice(cand, size=min(n_similar, len(cand)), replace=False))
    sid, _ = model.similar_items(items, N=K + 1)
    ours, S = similar_cosine(Y, items, K + 1)
    theirs_s = [np.asarray(r, dtype=np.int64) for r in sid]
    out["similar_overlap_at_21"] = overlap(ours, theirs_s, K + 1)
    out["similar_overlap_ties_at_21"] = tie_overlap(ours, theirs_s, S, K + 1)
    out["similar_items_checked"] = len(items)
    return out


def id_index(ds, name):
    """Original id (as the CLI prints it) -> internal id, from /user_ids or /item_ids."""
    with h5py.File(ds.path, "r") as f:
        if name not in f:
            die(f"{ds.path}: no /{name} (not a `prepare --matrix user-item` dataset)")
        ids = f[name][:]
    return {(x.decode() if isinstance(x, bytes) else str(x)): i for i, x in enumerate(ids)}


def read_cli_tsv(path, header, rows, cols):
    """The lists of a `torusrec recommend` TSV: {query internal id: [column internal ids]}
    in rank order; `rows` and `cols` map the original ids."""
    lists = {}
    with open(path) as f:
        first = f.readline().rstrip("\n")
        if first != header:
            die(f"{path}:1: want the header {header!r} of `torusrec recommend`, not {first!r}")
        for ln, line in enumerate(f, 2):
            p = line.rstrip("\n").split("\t")
            if len(p) != 4 or p[0] not in rows or p[2] not in cols:
                die(f"{path}:{ln}: want `query rank column score` with ids of the dataset")
            lists.setdefault(rows[p[0]], []).append(cols[p[2]])
    if not lists:
        die(f"{path}: no recommendations")
    return lists


def compare_cli_topk(path, ds, tops):
    """Top-20 overlap of `torusrec recommend --test` (TSV) with this script's fold-in; and
    the CLI's lists by test position."""
    users = id_index(ds, "user_ids")
    lists = read_cli_tsv(path, "user\trank\titem\tscore", users, id_index(ds, "item_ids"))
    row_pos = {int(r): i for i, r in enumerate(ds.test_rows)}
    if any(r not in row_pos for r in lists):
        die(f"{path}: a user that is not a test user of {ds.path}")
    by_pos = {row_pos[r]: np.array(v) for r, v in lists.items()}
    pos = sorted(by_pos)
    return overlap([tops[i] for i in pos], [by_pos[i] for i in pos], K), by_pos


def implicit_on(Y, alpha, reg):
    """implicit's CPU model with torusrec's item factors (no training)."""
    m = AlternatingLeastSquares(factors=Y.shape[1], regularization=reg, alpha=alpha, use_cg=False,
                                num_threads=1, dtype=np.float32)
    m.item_factors = np.ascontiguousarray(Y, dtype=np.float32)
    m.user_factors = np.zeros((1, Y.shape[1]), dtype=np.float32)
    return m


def cli_vs_implicit_foldin(Y, ds, lam, alpha0, by_pos):
    """implicit's recommend(recalculate_user=True) on the same factors, user by user with
    the exact map of torusrec's fold-in objective, against the CLI's top 20."""
    m = implicit_on(Y, 1.0 + 1.0 / alpha0, 1.0)
    fold = fold_csr(ds)
    ours, theirs = [], []
    for i in sorted(by_pos):
        row = fold[i]
        m.regularization = lam * (row.nnz + alpha0 * ds.num_cols) / alpha0
        ids, _ = m.recommend(0, row, N=K, filter_already_liked_items=True, recalculate_user=True)
        ours.append(by_pos[i])
        theirs.append(np.asarray(ids, dtype=np.int64))
    return overlap(ours, theirs, K)


def cli_vs_implicit_similar(Y, ds, path):
    """The CLI's `--similar` top 20 against implicit's similar_items (itself dropped)."""
    items = id_index(ds, "item_ids")
    lists = read_cli_tsv(path, "item\trank\tsimilar\tscore", items, items)
    q = np.array(sorted(lists))
    sid, _ = implicit_on(Y, 1.0, 1.0).similar_items(q, N=K + 1)
    theirs = [np.array([x for x in r if x != i][:K], dtype=np.int64) for i, r in zip(q, sid)]
    ours = [np.array(lists[i]) for i in q]
    _, S = similar_cosine(Y, q, K + 1)
    for j, i in enumerate(q):
        S[j, i] = -np.inf
    return overlap(ours, theirs, K), tie_overlap(ours, theirs, S, K), len(q)


def sample_items(ds, n, seed=42):
    """A seeded sample of n items with a training interaction, as original ids."""
    counts = np.diff(ds.train.tocsc().indptr)
    cand = np.flatnonzero(counts > 0)
    items = np.sort(np.random.default_rng(seed).choice(cand, size=min(n, len(cand)), replace=False))
    names = {v: k for k, v in id_index(ds, "item_ids").items()}
    return ",".join(names[int(i)] for i in items)


# ---------------------------------------------------------------------------------------
# the two systems


def run_implicit(ds, a, reg, alpha):
    model = AlternatingLeastSquares(factors=a.dim, regularization=reg, alpha=alpha, iterations=a.epochs,
                                    use_cg=True, calculate_training_loss=False, num_threads=a.threads,
                                    random_state=a.seed, dtype=np.float32)
    model.cg_steps = a.cg_steps
    secs = []
    t0 = time.perf_counter()
    model.fit(ds.train, show_progress=False, callback=lambda it, el, _l: secs.append(float(el)))
    fit = time.perf_counter() - t0
    Y = np.asarray(model.item_factors, dtype=np.float32)
    res, _X, tops = score(Y, ds, implicit_coefs(reg, alpha), a.threads)
    steady = secs[1:] or secs
    r = {"system": "implicit", "data": ds.path, "dim": a.dim, "epochs": a.epochs, "reg": reg, "alpha": alpha,
         "cg_steps": a.cg_steps, "threads": a.threads, "fit_seconds": fit, "epoch_seconds": secs,
         "seconds_per_epoch_after_first": float(np.mean(steady)), "test_rows": ds.num_test,
         "versions": ci.versions(), **res}
    if a.checks:
        r.update(implicit_checks(model, Y, ds, reg, alpha, tops, a.threads))
    return r


def run_torusrec(ds, a):
    with h5py.File(a.model, "r") as f:
        if f["/H"].attrs.get("dtype") in ("bf16", b"bf16"):
            die(f"{a.model}: bf16 tables are not read by this script")
        Y = np.asarray(f["/H"][:], dtype=np.float32)
    if Y.shape[0] != ds.num_cols:
        die(f"{a.model}: /H has {Y.shape[0]} rows, {ds.path} has {ds.num_cols} items")
    res, _X, tops = score(Y, ds, torusrec_coefs(a.reg, a.unobserved_weight, ds.num_cols), a.threads)
    r = {"system": "torusrec", "data": ds.path, "model": a.model, "dim": int(Y.shape[1]), "reg": a.reg,
         "unobserved_weight": a.unobserved_weight, "test_rows": ds.num_test, **res}
    if a.metrics:
        from bench_metrics import load_jsonl, train_seconds
        epochs, final = load_jsonl(a.metrics)
        steady = epochs[1:] or epochs
        if steady:
            r["seconds_per_epoch_after_first"] = float(np.mean([train_seconds(e) for e in steady]))
            r["epochs"] = len(epochs)
        if final:
            r["torusrec_recall_at_20"] = final.get("recall_at_20")
            if final.get("ndcg_at_20") is not None:
                r["torusrec_ndcg_at_20"] = final["ndcg_at_20"]
    if a.compare_topk:
        r["cli_topk_overlap_at_20"], by_pos = compare_cli_topk(a.compare_topk, ds, tops)
        r["cli_topk_rows"] = len(by_pos)
        r["cli_vs_implicit_foldin_at_20"] = cli_vs_implicit_foldin(Y, ds, a.reg, a.unobserved_weight, by_pos)
    if a.compare_similar:
        (r["cli_vs_implicit_similar_at_20"], r["cli_vs_implicit_similar_ties_at_20"],
         r["cli_similar_items"]) = cli_vs_implicit_similar(Y, ds, a.compare_similar)
    return r


def line(r):
    s = (f"{r['system']} d={r['dim']} " + (f"reg={r['reg']:g} alpha={r['alpha']:g}" if r["system"] == "implicit"
         else f"reg={r['reg']:g} alpha0={r['unobserved_weight']:g}")
         + f"  Recall@20 {r['recall_at_20']:.4f}  NDCG@20 {r['ndcg_at_20']:.4f}")
    if r.get("seconds_per_epoch_after_first") is not None:
        s += f"  {r['seconds_per_epoch_after_first']:.3f} s/epoch"
    for key in ("foldin_overlap_at_20", "foldin_overlap_mapped_at_20", "similar_overlap_at_21",
                "similar_overlap_ties_at_21",
                "cli_topk_overlap_at_20", "cli_vs_implicit_foldin_at_20", "cli_vs_implicit_similar_at_20",
                "cli_vs_implicit_similar_ties_at_20"):
        if key in r:
            s += f"  {key} {r[key]:.4f}"
    return s


def self_test():
    top = np.array([5, 1, 7])
    assert ndcg_at(top, np.array([5]), 3) == 1.0
    assert abs(ndcg_at(top, np.array([1]), 3) - 1 / np.log2(3)) < 1e-12
    assert abs(ndcg_at(top, np.array([7, 9]), 3) - (1 / 2) / (1 + 1 / np.log2(3))) < 1e-12
    assert ndcg_at(top, np.array([], dtype=np.int64), 3) == 0.0
    # the two coefficient sets solve the same system up to scale when reg' matches
    rng = np.random.default_rng(1)
    Y = rng.standard_normal((30, 4)).astype(np.float32)

    class D:
        num_test, num_cols = 2, 30
        fold_indptr = np.array([0, 3, 6])
        fold_indices = np.array([1, 2, 3, 4, 5, 6])
        def fold(self, i):
            return self.fold_indices[self.fold_indptr[i]:self.fold_indptr[i + 1]]
    a0, lam = 0.25, 0.01
    xt = fold_in(Y, D(), torusrec_coefs(lam, a0, 30))
    xi = fold_in(Y, D(), implicit_coefs(lam * (3 + a0 * 30) / a0, 1 + 1 / a0))
    assert np.allclose(xt * (1 + a0), xi, rtol=1e-4, atol=1e-6), (xt, xi)
    print("bench_useritem self-test: 5 passed, 0 failed")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("system", nargs="?", choices=("implicit", "torusrec"))
    p.add_argument("data", nargs="?", help="prepared dataset (.h5)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--reg", type=float, default=0.1, help="implicit: regularization; torusrec: lambda (--reg)")
    p.add_argument("--alpha", type=float, default=10.0, help="implicit's alpha")
    p.add_argument("--grid", metavar="R1,..:A1,..", help="implicit: every (reg, alpha) pair, best by Recall@20")
    p.add_argument("--unobserved-weight", type=float, default=0.01, help="torusrec's alpha0")
    p.add_argument("--model", help="torusrec: the `als --out` file")
    p.add_argument("--metrics", help="torusrec: the `als --metrics` file (seconds per epoch)")
    p.add_argument("--compare-topk", metavar="FILE", help="torusrec: `recommend --test` TSV to compare (top 20)")
    p.add_argument("--compare-similar", metavar="FILE", help="torusrec: `recommend --similar` TSV to compare")
    p.add_argument("--sample-items", type=int, metavar="N", help="print N seeded items for --similar, exit")
    p.add_argument("--cg-steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--eval-rows", type=int, default=None, help="the seeded sample of torusrec's --eval-rows N")
    p.add_argument("--no-checks", dest="checks", action="store_false", help="implicit: skip the overlap checks")
    p.add_argument("--json", metavar="OUT.json")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args()
    if a.self_test:
        self_test()
        return 0
    if not a.system or not a.data:
        p.error("SYSTEM and DATA are required")
    if a.system == "torusrec" and not a.model:
        p.error("torusrec needs --model")
    ds = ci.Dataset(a.data)
    if a.sample_items:
        print(sample_items(ds, a.sample_items))
        return 0
    ds.sample(a.eval_rows)
    if a.system == "torusrec":
        results = [run_torusrec(ds, a)]
    elif a.grid:
        regs, alphas = (ci.parse_list(x, w) for x, w in zip(a.grid.split(":", 1), ("reg", "alpha")))
        results = [run_implicit(ds, a, r, al) for r in regs for al in alphas]
    else:
        results = [run_implicit(ds, a, a.reg, a.alpha)]
    for r in results:
        print(line(r), flush=True)
    if a.json:
        best = max(results, key=lambda r: (r["recall_at_20"], r["ndcg_at_20"]))
        with open(a.json, "w") as f:
            json.dump({"results": results, "best": best}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
