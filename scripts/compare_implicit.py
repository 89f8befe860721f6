#!/usr/bin/env python3
"""Train benfred/implicit's CPU iALS on a torusrec prepared dataset and evaluate it
exactly like `torusrec als` does (docs/design.md), so the two can be compared.

    scripts/compare_implicit.py out/cnr-k1.h5 --dim 128 --epochs 16 --reg 0.1 --alpha 10 \
        --cg-steps 3 --threads 2 --json out/bench/implicit.json
    scripts/compare_implicit.py out/cnr-k1.h5 --grid "0.01,0.1,1:1,10,40" --epochs 8

Training data: `/train` (num_rows x num_cols, ones; test rows are empty there) as
implicit's user_items. implicit's objective (0.5+): the confidence of an observed cell
is alpha * 1 (NOT 1 + alpha), of every other cell 1; preference 1 on observed cells;
plain (unscaled) L2 regularization. So a row's exact solution is

    x_u = (Y^T Y + (alpha - 1) Y_u^T Y_u + reg I)^{-1} alpha Y_u^T 1

which is what `AlternatingLeastSquares.recalculate_user` computes; we solve it in numpy
for every test row from its visible arcs (`/test/fold`) and check a few rows against
`recalculate_user`.

Recall (docs/design.md): score every column, drop the row's visible arcs, take the top K
(higher score first, ties to the lower column id), recall = |topK & holdout| /
min(K, |holdout|), averaged over ALL test rows; K = 20 and 50.
"""

import os
import sys

# One BLAS thread: implicit parallelizes over rows itself, and the comparison with
# torusrec (OPENBLAS_NUM_THREADS=1 per rank) must not get hidden BLAS threads.
for _v in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "BLIS_NUM_THREADS",
           "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REQUIREMENTS = os.path.join(HERE, "requirements-bench.txt")
NEEDED = ("numpy", "scipy", "h5py", "implicit", "threadpoolctl")


def ensure_packages():
    """Install the pinned packages (binary wheels from PyPI) if any is missing."""
    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if not missing:
        return
    print(f"compare_implicit: installing {', '.join(missing)} from {REQUIREMENTS}", file=sys.stderr)
    base = [sys.executable, "-m", "pip", "install", "--quiet", "--only-binary=:all:", "-r", REQUIREMENTS]
    if subprocess.call(base) != 0:
        # Debian's externally managed Python: install for this user instead.
        if subprocess.call(base + ["--user", "--break-system-packages"]) != 0:
            sys.exit("compare_implicit: pip install failed; run "
                     f"`{sys.executable} -m pip install -r {REQUIREMENTS}` by hand")
    importlib.invalidate_caches()
    import site
    if hasattr(site, "getusersitepackages"):
        user_site = site.getusersitepackages()
        if user_site not in sys.path and os.path.isdir(user_site):
            sys.path.append(user_site)


ensure_packages()

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import threadpoolctl  # noqa: E402
import implicit  # noqa: E402
from implicit.cpu.als import AlternatingLeastSquares  # noqa: E402  (CPU: use_gpu=False)

KS = (20, 50)
MAX_K = max(KS)


def die(msg, code=2):
    print(f"compare_implicit: error: {msg}", file=sys.stderr)
    sys.exit(code)


# ---------------------------------------------------------------------------------------
# data


M64 = (1 << 64) - 1
EVAL_ROWS_STREAM = 13  # rng::stream::EVAL_ROWS


def mix64(z):
    """src/rng.rs mix64 (SplitMix64's finalizer) on Python ints."""
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def hash3(seed, stream, i):
    """src/rng.rs hash3."""
    return mix64((mix64((mix64(seed ^ 0x9e3779b97f4a7c15) + stream) & M64) + i) & M64)


class Dataset:
    """The parts of a prepared dataset (docs/design.md, version 1) that the comparison needs."""

    def __init__(self, path):
        self.path = path
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            die(f"{path}: cannot open as HDF5: {e}")
        with f:
            fmt = f.attrs.get("format")
            if isinstance(fmt, bytes):
                fmt = fmt.decode()
            if fmt != "torusrec-dataset":
                die(f"{path}: not a torusrec prepared dataset (format={fmt!r})")
            self.num_rows = int(f.attrs["num_rows"])
            self.num_cols = int(f.attrs["num_cols"])
            self.split_seed = int(f.attrs["seed"])
            indptr = f["/train/indptr"][:]
            indices = f["/train/indices"][:]
            self.test_rows = f["/test/rows"][:].astype(np.int64)
            self.fold_indptr = f["/test/fold/indptr"][:].astype(np.int64)
            self.fold_indices = f["/test/fold/indices"][:].astype(np.int64)
            self.hold_indptr = f["/test/holdout/indptr"][:].astype(np.int64)
            self.hold_indices = f["/test/holdout/indices"][:].astype(np.int64)
        if len(indptr) != self.num_rows + 1 or int(indptr[-1]) != len(indices):
            die(f"{path}: /train/indptr does not match num_rows / /train/indices")
        t = len(self.test_rows)
        if len(self.fold_indptr) != t + 1 or len(self.hold_indptr) != t + 1:
            die(f"{path}: /test/fold or /test/holdout indptr does not have |/test/rows| + 1 entries")
        small = len(indices) < 2**31 - 1
        itype = np.int32 if small else np.int64
        data = np.ones(len(indices), dtype=np.float32)
        self.train = sp.csr_matrix(
            (data, indices.astype(itype), indptr.astype(itype)), shape=(self.num_rows, self.num_cols)
        )
        self.nnz = len(indices)

    def sample(self, n):
        """Keep only the n test rows torusrec's `--eval-rows n` evaluates: the n with the
        smallest hash3(split seed, EVAL_ROWS stream, row id) (src/als/eval/mod.rs)."""
        t = len(self.test_rows)
        if n is None or n >= t:
            return
        keys = sorted((hash3(self.split_seed, EVAL_ROWS_STREAM, int(r)), int(r), i)
                      for i, r in enumerate(self.test_rows))
        keep = sorted(k[2] for k in keys[:n])

        def sub(indptr, indices):
            parts = [indices[indptr[i]:indptr[i + 1]] for i in keep]
            lens = np.array([len(x) for x in parts], dtype=np.int64)
            return (np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                    np.concatenate(parts) if parts else np.zeros(0, np.int64))

        self.fold_indptr, self.fold_indices = sub(self.fold_indptr, self.fold_indices)
        self.hold_indptr, self.hold_indices = sub(self.hold_indptr, self.hold_indices)
        self.test_rows = self.test_rows[keep]

    @property
    def num_test(self):
        return len(self.test_rows)

    def fold(self, i):
        return self.fold_indices[self.fold_indptr[i]:self.fold_indptr[i + 1]]

    def holdout(self, i):
        return self.hold_indices[self.hold_indptr[i]:self.hold_indptr[i + 1]]


# ---------------------------------------------------------------------------------------
# fold-in and evaluation


def fold_in(Y, reg, alpha, ds, batch=512):
    """Exact implicit fold-in of every test row from its visible arcs (float64 solve)."""
    d = Y.shape[1]
    t = ds.num_test
    YtY = Y.T.astype(np.float64) @ Y.astype(np.float64)
    base = YtY + reg * np.eye(d)
    X = np.zeros((t, d), dtype=np.float32)
    for b0 in range(0, t, batch):
        b1 = min(t, b0 + batch)
        A = np.repeat(base[None, :, :], b1 - b0, axis=0)
        B = np.zeros((b1 - b0, d))
        for i in range(b0, b1):
            idx = ds.fold(i)
            if len(idx) == 0:
                continue  # b = 0: x = 0, every column scores 0
            Yu = Y[idx].astype(np.float64)
            A[i - b0] += (alpha - 1.0) * (Yu.T @ Yu)
            B[i - b0] = alpha * Yu.sum(axis=0)
        X[b0:b1] = np.linalg.solve(A, B[:, :, None])[:, :, 0]
    return X


def check_fold_in(model, X, ds, rows):
    """Largest relative difference between our fold-in and implicit's recalculate_user."""
    worst = 0.0
    n = ds.num_cols
    for i in rows:
        idx = ds.fold(i)
        m = sp.csr_matrix((np.ones(len(idx), dtype=np.float32), (np.zeros(len(idx), dtype=np.int32), idx)),
                          shape=(1, n))
        ref = np.asarray(model.recalculate_user(0, m), dtype=np.float64)
        ours = X[i].astype(np.float64)
        nref = np.linalg.norm(ref)
        err = np.linalg.norm(ours - ref) / nref if nref > 0 else np.linalg.norm(ours)
        worst = max(worst, float(err))
    return worst


def topk_rows(S, k):
    """Top k of each row of S (best first: higher score, then lower column id).

    Rows of S may hold -inf (masked columns, never returned) and NaN (never returned).
    Returns a list of int64 arrays (shorter than k only if a row has fewer candidates).
    """
    n = S.shape[1]
    kk = min(k, n)
    lowest = np.finfo(S.dtype).min  # -inf is below it: masked columns never qualify

    def threshold(rows):
        # the kk-th largest score of each row; every column at least that good is a
        # candidate (ties at the boundary are all kept, then broken by column id)
        return np.maximum(np.partition(rows, n - kk, axis=1)[:, n - kk], lowest)

    thr = threshold(S)
    r, c = np.nonzero(S >= thr[:, None])
    starts = np.searchsorted(r, np.arange(S.shape[0] + 1))
    out = []
    for i in range(S.shape[0]):
        cand = c[starts[i]:starts[i + 1]]
        scores = S[i, cand]
        if len(cand) < kk:
            # too few: NaN took top slots in the partition (or the row has fewer than kk
            # rankable columns); redo this row with NaN as -inf
            row = np.where(np.isnan(S[i]), -np.inf, S[i])
            cand = np.flatnonzero(row >= threshold(row[None, :])[0])
            scores = row[cand]
        order = np.lexsort((cand, -scores))
        out.append(cand[order[:k]].astype(np.int64))
    return out


def recall_at(top, holdout, k):
    if len(holdout) == 0:
        return 0.0
    hits = np.count_nonzero(np.isin(top[:k], holdout, assume_unique=True))
    return hits / min(k, len(holdout))


def evaluate(X, Y, ds, threads, block_bytes=128 << 20):
    """Recall@20 and @50 averaged over all test rows (docs/design.md)."""
    n = Y.shape[0]
    t = ds.num_test
    YT = np.ascontiguousarray(Y.T, dtype=np.float32)
    block = max(1, min(t, block_bytes // (4 * max(n, 1))))

    def one_block(b0):
        b1 = min(t, b0 + block)
        S = X[b0:b1] @ YT
        lo, hi = ds.fold_indptr[b0], ds.fold_indptr[b1]
        lens = np.diff(ds.fold_indptr[b0:b1 + 1])
        S[np.repeat(np.arange(b1 - b0), lens), ds.fold_indices[lo:hi]] = -np.inf
        sums = np.zeros(len(KS))
        for j, top in enumerate(topk_rows(S, MAX_K)):
            h = ds.holdout(b0 + j)
            for q, k in enumerate(KS):
                sums[q] += recall_at(top, h, k)
        return sums

    # blocks in `threads` Python threads (numpy releases the GIL), one BLAS thread each
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"), \
            concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
        parts = list(pool.map(one_block, range(0, t, block)))
    sums = np.sum(parts, axis=0) if parts else np.zeros(len(KS))
    return {f"at{k}": float(sums[q] / max(t, 1)) for q, k in enumerate(KS)}


# ---------------------------------------------------------------------------------------
# one run


def versions():
    return {
        "implicit": implicit.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "h5py": h5py.__version__,
        "threadpoolctl": threadpoolctl.__version__,
        "python": platform.python_version(),
    }


def run(ds, dim, epochs, reg, alpha, cg_steps, threads, seed, verify_rows=3, log=print):
    model = AlternatingLeastSquares(
        factors=dim, regularization=reg, alpha=alpha, iterations=epochs, use_cg=True,
        calculate_training_loss=False, num_threads=threads, random_state=seed, dtype=np.float32,
    )
    model.cg_steps = cg_steps  # the constructor has no cg_steps argument in 0.7; the solver reads this
    epoch_seconds = []

    def on_epoch(iteration, elapsed, _loss):
        epoch_seconds.append(float(elapsed))

    t0 = time.perf_counter()
    model.fit(ds.train, show_progress=False, callback=on_epoch)
    fit_seconds = time.perf_counter() - t0
    Y = np.asarray(model.item_factors, dtype=np.float32)
    if not np.all(np.isfinite(Y)):
        log(f"warning: reg={reg} alpha={alpha}: the item factors are not all finite")

    t1 = time.perf_counter()
    X = fold_in(Y, reg, alpha, ds)
    fold_seconds = time.perf_counter() - t1
    # check a few rows (the longest fold-ins and the first) against implicit's own solve
    lens = np.diff(ds.fold_indptr)
    rows = sorted(set(np.argsort(-lens, kind="stable")[:max(0, verify_rows - 1)].tolist()
                      + ([0] if ds.num_test and verify_rows else [])))
    fold_err = check_fold_in(model, X, ds, rows) if rows else None
    if fold_err is not None and fold_err > 1e-3:
        log(f"warning: fold-in differs from implicit's recalculate_user by {fold_err:.2e} (relative)")

    t2 = time.perf_counter()
    rec = evaluate(X, Y, ds, threads)
    eval_seconds = time.perf_counter() - t2
    after_first = epoch_seconds[1:] or epoch_seconds
    return {
        "system": "implicit",
        "data": ds.path,
        "seconds_per_epoch": fit_seconds / epochs,
        "seconds_per_epoch_after_first": float(np.mean(after_first)) if after_first else None,
        "epoch_seconds": epoch_seconds,
        "fit_seconds": fit_seconds,
        "edges_per_second": ds.nnz / float(np.mean(after_first)) if after_first else None,
        "recall_at_20": rec["at20"],
        "recall_at_50": rec["at50"],
        "test_rows": ds.num_test,
        "train_nnz": ds.nnz,
        "num_rows": ds.num_rows,
        "num_cols": ds.num_cols,
        "dim": dim,
        "epochs": epochs,
        "reg": reg,
        "alpha": alpha,
        "cg_steps": cg_steps,
        "threads": threads,
        "seed": seed,
        "use_gpu": False,
        "foldin_seconds": fold_seconds,
        "eval_seconds": eval_seconds + fold_seconds,
        "foldin_check_rows": len(rows),
        "foldin_max_rel_err": fold_err,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "versions": versions(),
    }


def summary(r):
    chk = "" if r["foldin_max_rel_err"] is None else f"  fold-in check {r['foldin_max_rel_err']:.1e}"
    return (f"implicit {r['versions']['implicit']}: {os.path.basename(r['data'])} d={r['dim']} "
            f"epochs={r['epochs']} reg={r['reg']:g} alpha={r['alpha']:g} cg_steps={r['cg_steps']} "
            f"threads={r['threads']}  {r['seconds_per_epoch']:.3f} s/epoch (fit {r['fit_seconds']:.1f} s)  "
            f"Recall@20 {r['recall_at_20']:.4f}  Recall@50 {r['recall_at_50']:.4f}  "
            f"over {r['test_rows']} test rows  eval {r['eval_seconds']:.1f} s{chk}")


# ---------------------------------------------------------------------------------------
# command line


def parse_list(s, what):
    try:
        vals = [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        die(f"--grid: {what} list {s!r} is not comma-separated numbers")
    if not vals:
        die(f"--grid: empty {what} list")
    return vals


def self_test():
    """Checks of the ranking and recall rules on hand-made scores."""
    S = np.array([[0.5, 0.9, 0.5, 0.1, 0.9, np.nan, -np.inf, 0.5]], dtype=np.float32)
    assert topk_rows(S.copy(), 3)[0].tolist() == [1, 4, 0], topk_rows(S.copy(), 3)
    assert topk_rows(S.copy(), 5)[0].tolist() == [1, 4, 0, 2, 7]
    assert topk_rows(S.copy(), 50)[0].tolist() == [1, 4, 0, 2, 7, 3]  # NaN and -inf never ranked
    S2 = np.zeros((2, 100), dtype=np.float32)
    S2[1, 10] = -np.inf
    t = topk_rows(S2, 20)
    assert t[0].tolist() == list(range(20)) and t[1].tolist() == list(range(10)) + list(range(11, 21))
    top = np.arange(50)
    assert recall_at(top, np.array([3, 30, 100]), 20) == 1 / 3
    assert recall_at(top, np.array([3, 30, 100]), 50) == 2 / 3
    assert recall_at(top, np.arange(40), 20) == 1.0
    assert recall_at(top, np.array([], dtype=np.int64), 20) == 0.0
    print("compare_implicit self-test: 8 passed, 0 failed")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", help="prepared dataset (.h5) from `torusrec prepare` or `generate`")
    p.add_argument("--dim", type=int, default=128, help="factors (d)")
    p.add_argument("--epochs", type=int, default=16, help="ALS iterations")
    p.add_argument("--reg", type=float, default=0.1, help="implicit's regularization (unscaled L2)")
    p.add_argument("--alpha", type=float, default=10.0, help="confidence of an observed cell (implicit: alpha * 1)")
    p.add_argument("--cg-steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="implicit's num_threads (also the evaluation's threads)")
    p.add_argument("--seed", type=int, default=42, help="implicit's random_state")
    p.add_argument("--grid", metavar="R1,R2,..:A1,A2,..",
                   help="train every (reg, alpha) pair; report the best by Recall@20")
    p.add_argument("--eval-rows", type=int, default=None, metavar="N",
                   help="evaluate the same seeded sample of N test rows as torusrec's --eval-rows N "
                        "(default: all test rows)")
    p.add_argument("--verify-rows", type=int, default=3, help="test rows checked against recalculate_user (0: none)")
    p.add_argument("--json", metavar="OUT.json", help="write the result(s) here")
    p.add_argument("--self-test", action="store_true", help="check the ranking rules and exit")
    a = p.parse_args(argv)
    if a.self_test:
        self_test()
        return 0
    if not a.data:
        p.error("the dataset path is required")
    for name in ("dim", "epochs", "cg_steps", "threads"):
        if getattr(a, name) < 1:
            die(f"--{name.replace('_', '-')} must be at least 1")

    t0 = time.perf_counter()
    ds = Dataset(a.data)
    ds.sample(a.eval_rows)
    print(f"data: {a.data}: {ds.num_rows} rows x {ds.num_cols} cols, {ds.nnz} training arcs, "
          f"{ds.num_test} test rows (read in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)

    if not a.grid:
        r = run(ds, a.dim, a.epochs, a.reg, a.alpha, a.cg_steps, a.threads, a.seed, a.verify_rows)
        print(summary(r))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(r, f, indent=1)
                f.write("\n")
        return 0

    if ":" not in a.grid:
        die("--grid wants REGS:ALPHAS, e.g. 0.01,0.1,1:1,10,40")
    regs_s, alphas_s = a.grid.split(":", 1)
    regs, alphas = parse_list(regs_s, "reg"), parse_list(alphas_s, "alpha")
    results = []
    for reg in regs:
        for alpha in alphas:
            r = run(ds, a.dim, a.epochs, reg, alpha, a.cg_steps, a.threads, a.seed, a.verify_rows,
                    log=lambda m: print(m, file=sys.stderr))
            print(summary(r), file=sys.stderr)
            results.append(r)
    best = max(results, key=lambda r: (r["recall_at_20"], r["recall_at_50"]))
    cell = {(r["reg"], r["alpha"]): r for r in results}
    print(f"implicit grid on {os.path.basename(a.data)}, d={a.dim}, {a.epochs} epochs, "
          f"cg_steps={a.cg_steps}, {a.threads} threads: Recall@20 / Recall@50")
    print("| reg \\ alpha | " + " | ".join(f"{x:g}" for x in alphas) + " |")
    print("|---" * (len(alphas) + 1) + "|")
    for reg in regs:
        print(f"| {reg:g} | " + " | ".join(
            f"{cell[(reg, al)]['recall_at_20']:.4f} / {cell[(reg, al)]['recall_at_50']:.4f}" for al in alphas) + " |")
    print(f"best: reg={best['reg']:g} alpha={best['alpha']:g}  Recall@20 {best['recall_at_20']:.4f}  "
          f"Recall@50 {best['recall_at_50']:.4f}  {best['seconds_per_epoch']:.3f} s/epoch")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"system": "implicit", "grid": results, "best": best, "versions": versions()}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
