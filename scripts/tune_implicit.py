#!/usr/bin/env python3
"""Tune benfred/implicit's iALS (regularization x alpha) on the same validation split
that `torusrec tune` uses, then train the chosen setting on the full training rows and
report its test recall — the peer of `torusrec tune` in scripts/bench_tune.sh.

    scripts/tune_implicit.py out/bench/cnr-k1.h5 --regs 1e-3:1:4 --alphas 10:1000:3 \\
        --epochs 8 --dim 128 --val-fraction 0.1 --val-seed 1 --eval-rows 5000 \\
        --final-eval-rows all --json out/bench/tune-implicit-cnr-k1.json

Validation split (src/als/tune/, the test protocol of docs/design.md on training
rows): among the rows of /train that have arcs, the floor(r * fraction) rows with the
smallest (hash3(val_seed, 14, row), row) are validation rows; a validation row's arcs
(sorted) are Fisher-Yates shuffled by SplitMix64(hash3(val_seed, 15, row)) and the first
max(1, floor(n/4)) are held out, the rest are visible. Validation rows leave training;
they are folded in from their visible arcs and scored against the held-out ones, exactly
as compare_implicit.py scores test rows. The script prints the split's sizes and digest
(the same line `torusrec tune` prints) so the two can be checked to be one split.

Training, fold-in and Recall@K are compare_implicit.py's (run()): the same d, epochs, CG
steps and exact recall; --eval-rows N evaluates the seeded sample torusrec's --eval-rows
N evaluates (hash3(split seed, 13, row)).
"""

import copy
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_implicit as ci  # noqa: E402  (sets the BLAS thread variables first)

np = ci.np
sp = ci.sp
json = ci.json

VAL_ROWS_STREAM = 14  # rng::stream::VAL_ROWS
VAL_HOLDOUT_STREAM = 15  # rng::stream::VAL_HOLDOUT_SHUFFLE
GOLDEN = 0x9E3779B97F4A7C15
M64 = ci.M64


class SplitMix64:
    """src/rng.rs SplitMix64 (next_u64, below, shuffle) on Python ints."""

    def __init__(self, state):
        self.state = state

    def next_u64(self):
        self.state = (self.state + GOLDEN) & M64
        return ci.mix64(self.state)

    def below(self, n):
        return (self.next_u64() * n) >> 64

    def shuffle(self, a):
        for i in range(len(a) - 1, 0, -1):
            j = self.below(i + 1)
            a[i], a[j] = a[j], a[i]


def parse_values(s):
    """`torusrec tune --reg`'s syntax: a list `a,b,c` or `LO:HI:N` (N log-spaced)."""
    if ":" in s:
        lo, hi, n = s.split(":")
        lo, hi, n = float(lo), float(hi), int(n)
        if n < 1 or lo <= 0 or hi < lo:
            ci.die(f"{s!r}: a log range needs 0 < LO <= HI and N >= 1")
        if n == 1:
            return [lo]
        return [lo if i == 0 else hi if i == n - 1 else
                10 ** (math.log10(lo) + i / (n - 1) * (math.log10(hi) - math.log10(lo)))
                for i in range(n)]
    vals = [float(x) for x in s.split(",") if x.strip()]
    if not vals:
        ci.die(f"{s!r}: an empty list")
    return vals


def validation_split(ds, fraction, seed):
    """A copy of `ds` whose training rows exclude the validation rows and whose test set
    is the validation set; and the split's sizes (as `torusrec tune` prints them)."""
    indptr = ds.train.indptr.astype(np.int64)
    indices = ds.train.indices
    lens = np.diff(indptr)
    rows = np.flatnonzero(lens > 0)
    k = math.floor(len(rows) * fraction)
    keys = sorted((ci.hash3(seed, VAL_ROWS_STREAM, int(r)), int(r)) for r in rows)
    val = sorted(r for _, r in keys[:k])
    folds, holds = [], []
    for r in val:
        a = [int(x) for x in indices[indptr[r]:indptr[r + 1]]]
        SplitMix64(ci.hash3(seed, VAL_HOLDOUT_STREAM, r)).shuffle(a)
        h = min(max(1, len(a) // 4), len(a))
        holds.append(sorted(a[:h]))
        folds.append(sorted(a[h:]))
    v = copy.copy(ds)
    keep = np.ones(ds.num_rows, dtype=bool)
    keep[val] = False
    train = ds.train.tocsr(copy=True)
    train = sp.diags(keep.astype(np.float32)) @ train
    train.eliminate_zeros()
    train.sort_indices()
    v.train = train.astype(np.float32).tocsr()
    v.nnz = int(v.train.nnz)
    v.test_rows = np.array(val, dtype=np.int64)

    def csr(parts):
        lens = np.array([len(p) for p in parts], dtype=np.int64)
        ip = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        ix = np.array([x for p in parts for x in p], dtype=np.int64)
        return ip, ix

    v.fold_indptr, v.fold_indices = csr(folds)
    v.hold_indptr, v.hold_indices = csr(holds)
    digest = 0
    for r, hold in zip(val, holds):
        digest = (digest + ci.mix64(r ^ 0x5851F42D4C957F2D)) & M64
        for c in hold:
            digest = (digest + ci.mix64(((r << 32) | c) ^ 0x2545F4914F6CDD1D)) & M64
    stats = {"rows": len(val), "visible_arcs": int(v.fold_indptr[-1]),
             "holdout_arcs": int(v.hold_indptr[-1]), "train_arcs": v.nnz,
             "digest": f"{digest:016x}"}
    return v, stats


def main(argv=None):
    p = ci.argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=ci.argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="prepared dataset (.h5)")
    p.add_argument("--regs", default="1e-3:1:4", help="implicit regularization values (list or LO:HI:N)")
    p.add_argument("--alphas", default="10:1000:3", help="implicit alpha values (list or LO:HI:N)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--epochs", type=int, default=8, help="ALS iterations of every point")
    p.add_argument("--final-epochs", type=int, default=None, help="iterations of the final run (default --epochs)")
    p.add_argument("--cg-steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--val-seed", type=int, default=1)
    p.add_argument("--eval-rows", default="10000", help="validation rows scored per point: N or all")
    p.add_argument("--final-eval-rows", default=None, help="test rows of the final run: N or all (default --eval-rows)")
    p.add_argument("--json", metavar="OUT.json")
    a = p.parse_args(argv)
    if not 0 < a.val_fraction < 1:
        ci.die("--val-fraction must be in (0, 1)")
    rows_n = lambda s: None if s == "all" else int(s)  # noqa: E731
    regs, alphas = parse_values(a.regs), parse_values(a.alphas)
    err = lambda m: print(m, file=sys.stderr)  # noqa: E731

    t0 = time.perf_counter()
    ds = ci.Dataset(a.data)
    val, stats = validation_split(ds, a.val_fraction, a.val_seed)
    val.sample(rows_n(a.eval_rows))
    print(f"validation: {stats['rows']} rows (fraction {a.val_fraction}, seed {a.val_seed}, digest "
          f"{stats['digest']}), {stats['visible_arcs']} visible and {stats['holdout_arcs']} held-out arcs; "
          f"{stats['train_arcs']} training arcs left", flush=True)
    results = []
    t_search = time.perf_counter()
    for reg in regs:
        for alpha in alphas:
            r = ci.run(val, a.dim, a.epochs, reg, alpha, a.cg_steps, a.threads, a.seed, verify_rows=1, log=err)
            seconds = r["fit_seconds"] + r["eval_seconds"]
            results.append({"reg": reg, "alpha": alpha, "epochs": a.epochs,
                            "val_recall_at_20": r["recall_at_20"], "val_recall_at_50": r["recall_at_50"],
                            "val_rows": r["test_rows"], "seconds": seconds})
            print(f"point {len(results):>3}/{len(regs) * len(alphas)}  reg {reg:<10g} alpha {alpha:<10g} "
                  f"epochs {a.epochs}  val R@20 {r['recall_at_20']:.4f}  R@50 {r['recall_at_50']:.4f}  "
                  f"{seconds:.1f} s", flush=True)
    search_seconds = time.perf_counter() - t_search
    best = max(enumerate(results),
               key=lambda x: (x[1]["val_recall_at_20"], x[1]["val_recall_at_50"], -x[0]))[1]
    print(f"best: reg {best['reg']:g} alpha {best['alpha']:g}  validation Recall@20 "
          f"{best['val_recall_at_20']:.4f}  Recall@50 {best['val_recall_at_50']:.4f}", flush=True)
    del val
    ds.sample(rows_n(a.final_eval_rows or a.eval_rows))
    fe = a.final_epochs or a.epochs
    r = ci.run(ds, a.dim, fe, best["reg"], best["alpha"], a.cg_steps, a.threads, a.seed, log=err)
    print(f"final: test Recall@20 {r['recall_at_20']:.4f}  Recall@50 {r['recall_at_50']:.4f}  over "
          f"{r['test_rows']} test rows ({fe} epochs, fit {r['fit_seconds']:.1f} s)", flush=True)
    out = {"system": "implicit", "data": a.data, "grid": {"regs": regs, "alphas": alphas},
           "validation": {"fraction": a.val_fraction, "seed": a.val_seed, "stats": stats},
           "results": results, "best": best, "search_seconds": search_seconds,
           "final": {"epochs": fe, "test_recall_at_20": r["recall_at_20"],
                     "test_recall_at_50": r["recall_at_50"], "test_rows": r["test_rows"],
                     "fit_seconds": r["fit_seconds"]},
           "seconds": time.perf_counter() - t0, "versions": ci.versions()}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
