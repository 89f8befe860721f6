#!/usr/bin/env python3
"""bench/useritem.md from scripts/bench_useritem.sh's results.jsonl (stdout)."""

import json
import os
import sys

rs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
env = os.environ


def f(x, spec):
    return "-" if x is None else format(x, spec)


def params(r):
    if r["system"] == "implicit":
        return f"reg {r['reg']:g}, alpha {r['alpha']:g}"
    return f"reg {r['reg']:g}, alpha0 {r['unobserved_weight']:g}"


out = ["# User-item benchmark: torusrec vs implicit (issue 18)", "",
       f"torusrec {env.get('COMMIT', '?')}; CPU: {env.get('CPU', '?')}; **loaded** (2 cores shared with other "
       "jobs, `nice -n 19`): seconds are noisy.", "",
       f"torusrec: `mpirun -np {env['P']} ... als --threads 1 --solver cg --cg-steps 3`, "
       f"OPENBLAS_NUM_THREADS=1; implicit 0.7.3: CG (3 steps), {env['P']} threads. Same prepared split "
       "(strong generalization, seed 42); both scored by scripts/bench_useritem.py `score` (each system's "
       "own fold-in objective, then the same ranking, Recall@20 and NDCG@20 over all test users; "
       "definitions in the script's docstring). s/epoch: mean of epochs 2..N, evaluation excluded.", ""]


def table(case, title):
    rows = [r for r in rs if r["case"] == case]
    if not rows:
        return
    out.extend([f"## {title}", "",
                "| system | d | params | epochs | s/epoch | Recall@20 | NDCG@20 | test users | "
                "fold-in overlap@20 (mapped) | similar overlap@21 (ties) |",
                "|---|---|---|---|---|---|---|---|---|---|"])
    for r in rows:
        fo = "-" if "foldin_overlap_at_20" not in r else (
            f"{r['foldin_overlap_at_20']:.4f} ({f(r.get('foldin_overlap_mapped_at_20'), '.4f')})")
        so = "-" if "similar_overlap_at_21" not in r else (
            f"{r['similar_overlap_at_21']:.4f} ({r['similar_overlap_ties_at_21']:.4f})")
        own = r.get("torusrec_recall_at_20")
        rec = f(r["recall_at_20"], ".4f") + ("" if own is None else f" (own {own:.4f})")
        own_n = r.get("torusrec_ndcg_at_20")
        ndcg = f"{r['ndcg_at_20']:.4f}" + ("" if own_n is None else f" (own {own_n:.4f})")
        out.append(f"| {r['system']} | {r['dim']} | {params(r)} | {r.get('epochs', '-')} | "
                   f"{f(r.get('seconds_per_epoch_after_first'), '.4f')} | {rec} | {ndcg} | "
                   f"{r['test_rows']} | {fo} | {so} |")
    out.append("")
    for d in sorted({r["dim"] for r in rows}):
        t = max((r for r in rows if r["dim"] == d and r["system"] == "torusrec"),
                key=lambda r: r["recall_at_20"], default=None)
        i = max((r for r in rows if r["dim"] == d and r["system"] == "implicit"),
                key=lambda r: r["recall_at_20"], default=None)
        if t and i and t.get("seconds_per_epoch_after_first") and i.get("seconds_per_epoch_after_first"):
            out.append(f"- d={d}, best of each: torusrec / implicit Recall@20 {t['recall_at_20']:.4f} / "
                       f"{i['recall_at_20']:.4f}, NDCG@20 {t['ndcg_at_20']:.4f} / {i['ndcg_at_20']:.4f}, "
                       f"s/epoch ratio **{t['seconds_per_epoch_after_first'] / i['seconds_per_epoch_after_first']:.2f}x**")
    out.append("")


table("ml-grid", "ml-latest-small, 3x3 grids at d=64")
table("ml-best", "ml-latest-small, the best of each grid at d=64 and 128")
for case in dict.fromkeys(r["case"] for r in rs if r["case"].startswith("syn")):
    r0 = next(r for r in rs if r["case"] == case)
    what = (f"3x3 grids at d={r0['dim']}" if case.endswith("-grid")
            else "the best settings of a grid (the log's `synthetic settings from` line)")
    table(case, f"synthetic `{os.path.basename(r0['data'])}` (scripts/gen_useritem.py), {what}")
def best_of(case, d, metric):
    """Each system's row of `case` at dimension `d` with the highest `metric`."""
    best = {}
    for sysname in ("torusrec", "implicit"):
        c = [r for r in rs if r["case"] == case and r["dim"] == d and r["system"] == sysname]
        if c:
            best[sysname] = max(c, key=lambda r: r[metric])
    return best


def targets():
    """The issue's targets, each (case, d) with both systems' best by Recall@20."""
    lines = ["## Against the issue's targets", "",
             "| case | d | Recall@20 >= implicit's | NDCG@20 >= implicit's | s/epoch <= 0.3x implicit's |",
             "|---|---|---|---|---|"]
    for case in dict.fromkeys(r["case"] for r in rs if not r["case"].endswith("-grid")):
        for d in sorted({r["dim"] for r in rs if r["case"] == case}):
            best = best_of(case, d, "recall_at_20")
            if len(best) < 2:
                continue
            t, i = best["torusrec"], best["implicit"]
            yes = lambda ok: "yes" if ok else "**no**"
            ts, isec = t.get("seconds_per_epoch_after_first"), i.get("seconds_per_epoch_after_first")
            ratio = f"{ts / isec:.2f}x: {yes(ts / isec <= 0.3)}" if ts and isec else "-"
            lines.append(f"| {case} | {d} | {t['recall_at_20']:.4f} vs {i['recall_at_20']:.4f}: "
                         f"{yes(t['recall_at_20'] >= i['recall_at_20'])} | {t['ndcg_at_20']:.4f} vs "
                         f"{i['ndcg_at_20']:.4f}: {yes(t['ndcg_at_20'] >= i['ndcg_at_20'])} | {ratio} |")
    lines += ndcg_tuned()
    fo = [r["foldin_overlap_at_20"] for r in rs if "foldin_overlap_at_20" in r]
    so = [r["similar_overlap_ties_at_21"] for r in rs if "similar_overlap_ties_at_21" in r]
    if fo:
        lines += ["", f"Fold-in overlap@20 with implicit's `recommend(recalculate_user=True)` (the script's "
                  f"formula on implicit's factors), every implicit run: min {min(fo):.4f} (target >= 0.95). "
                  f"Similar overlap@21 with `similar_items` (ties counted): min {min(so):.4f}. Against the real "
                  "`torusrec recommend --history` / `similar`: not measured yet (hook below)."]
    return lines + [""]


def ndcg_tuned():
    """NDCG@20 with each system tuned for it: its best NDCG@20 over the same grid."""
    lines = []
    for case in dict.fromkeys(r["case"] for r in rs if r["case"].endswith("-grid")):
        for d in sorted({r["dim"] for r in rs if r["case"] == case}):
            best = best_of(case, d, "ndcg_at_20")
            if len(best) < 2:
                continue
            t, i = best["torusrec"], best["implicit"]
            ok = "yes" if t["ndcg_at_20"] >= i["ndcg_at_20"] else "**no**"
            lines.append(f"- {case}, d={d}, each system at its best NDCG@20 of its 3x3 grid: torusrec "
                         f"{t['ndcg_at_20']:.4f} ({params(t)}) vs implicit {i['ndcg_at_20']:.4f} "
                         f"({params(i)}): {ok}")
    if lines:
        lines = ["", "The table picks each system's setting by Recall@20. Tuned for NDCG@20 instead (the "
                 "same grids, each system's best NDCG@20):", ""] + lines
    return lines


out += ["## Commands", "", "```sh",
        "python3 -m venv /work/bench-venv && /work/bench-venv/bin/pip install --only-binary=:all: "
        "-r scripts/requirements-bench.txt",
        "# ml-latest-small grids + best at d=64,128, then the 2M synthetic (grids + best at d=64,128)",
        "PYTHON=/work/bench-venv/bin/python BIN=... ML=.../ml-latest-small/ratings.csv nice -n 19 "
        "scripts/bench_useritem.sh",
        "# the 20M synthetic at the 2M grid's best settings, added to the same report",
        "RUN_ML=0 SYN_USERS=1000000 SYN_ITEMS=200000 SYN_INTERACTIONS=20100000 SYN_GRID=0 "
        "SYN_BEST_FROM=syn-2000000-grid SYN_DIMS=64 SYN_EPOCHS=5 SYN_EVAL_ROWS=2000 "
        "PYTHON=... BIN=... nice -n 19 scripts/bench_useritem.sh",
        "# and the same at d=128 (settings from the d=64 grid)",
        "RUN_ML=0 ... SYN_DIMS=128 SYN_GRID_DIM=64 ... scripts/bench_useritem.sh",
        "```", "",
        "Synthetic runs score a seeded sample of 2,000 test users (`--eval-rows 2000` in both systems' "
        "scoring, torusrec's sample rule); ml-latest-small scores all 67. Grids pick by Recall@20.", ""]
out += targets()
out += ["## Notes", "",
        "- **Speed.** On ml-latest-small an epoch is 0.01-0.5 s and the load of the shared machine swings "
        "identical runs by up to 30x (torusrec reg 0.01, alpha0 0.1 at d = 64 gave 0.012 and 0.39 s/epoch "
        "in two runs of this script): read the s/epoch ratio from the synthetic rows, and re-measure on an "
        "idle machine.",
        "- **Scorer.** `score` in scripts/bench_useritem.py folds each test user in from its visible items "
        "against the item table by an exact float64 solve of the system's own objective (implicit: "
        "`recalculate_user`'s; torusrec: docs/als.md's per-row equations, binary confidence), then ranks every "
        "item but the visible ones (ties to the lower id) and computes Recall@20 = |top20 & H| / min(20, |H|) "
        "and NDCG@20 = sum over hits at rank r of 1/log2(r+1), over the ideal DCG of min(20, |H|) hits, "
        "averaged over all test users. `(own x)` is torusrec's own Recall@20 (and, from binaries that "
        "print it, NDCG@20, docs/als.md) of the same model (its `--metrics` final line): equal to the "
        "script's to 4 decimals, so the script's torusrec fold-in is torusrec's.",
        "- **Fold-in overlap@20**: mean |ours & theirs| / 20 between the script's implicit-objective fold-in and "
        "implicit's own `recommend(users, fold, N=20, filter_already_liked_items=True, recalculate_user=True)` "
        "on implicit's factors, over the scored test users. *(mapped)*: the same, but folding in with "
        "torusrec's objective mapped onto implicit's: alpha0 = 1/(alpha - 1) and lambda = reg alpha0 / "
        "(median |I_u| + alpha0 n_items) (torusrec / alpha0 is implicit with alpha' = 1 + 1/alpha0, a "
        "per-user reg' = lambda (|I_u| + alpha0 n_items) / alpha0 and preference 1/(1 + alpha0); the last only "
        "scales x_u); what is left is the frequency-scaled regularization. alpha = 1 has no mapping (-).",
        "- **Similar overlap@21**: implicit's `similar_items(items, N=21)` against cosine top 21 of the same "
        "factors (the item itself included, as implicit), over 1,000 seeded items with a training interaction. "
        "*(ties)*: an item of implicit's also counts when its cosine ties our 21st within 1e-5; the exact-id "
        "figure is lower on ml-latest-small because its cold items, rated by one and the same user, have "
        "parallel factors (cosine ties) that the two top-k codes order differently.",
        "- **Not measured here**: the overlap with the real `torusrec recommend --history` and `torusrec similar` "
        "(being added elsewhere). Hook: `scripts/bench_useritem.py torusrec DATA --model M.h5 --compare-topk "
        "FILE` reads `row<TAB>item` lines in rank order and reports their top-20 overlap with the script's "
        "fold-in of the same model. The cnr-2000 K = 1 row of bench/als.md is not touched here.",
        ""]
print("\n".join(out))
