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
        out.append(f"| {r['system']} | {r['dim']} | {params(r)} | {r.get('epochs', '-')} | "
                   f"{f(r.get('seconds_per_epoch_after_first'), '.4f')} | {rec} | {r['ndcg_at_20']:.4f} | "
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
print("\n".join(out))
