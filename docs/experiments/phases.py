#!/usr/bin/env python3
"""Per setting of a bench_costs output directory: measured against predicted seconds
per step of the embedding phases, the dense phase, the all-reduce and the whole step
(medians over the plan's runs; measured over the timed intervals after the first).
Runs without a final record (a bench still running) are left out.

Usage: python3 docs/experiments/phases.py out/bench-costs7
"""
import glob
import json
import re
import statistics
import sys

EMBEDDING = ["lookup", "pool", "backward", "update"]
# (name, measured key, predicted key) of each column.
COLUMNS = [
    ("embedding", "embedding", "embedding_max"),
    ("dense", "dense", "dense"),
    ("all-reduce", "allreduce", "allreduce"),
    ("step", "step", "step"),
]


def run(path):
    """The measured and predicted seconds per step of one run's metrics."""
    lines = [json.loads(l) for l in open(path) if l.strip()]
    final = next((x for x in lines if x.get("final")), None)
    if final is None:
        return None  # a run still going (or killed): no final record yet
    timed = [x for x in lines if not x.get("final")][1:]
    steps = sum(x["steps"] for x in timed)
    per_step = lambda q: sum(x["seconds_" + q] for x in timed) / steps
    measured = {q: per_step(q) for q in ["dense", "allreduce"]}
    measured["embedding"] = sum(per_step(q) for q in EMBEDDING)
    measured["step"] = final["measured"]["seconds_per_step"]
    return measured, final["predicted"]


def main(out):
    runs = {}
    for path in sorted(glob.glob(out + "/*-r*.jsonl")):
        m = re.match(r".*/(.+)-(\d+)-(\w+)-r\d+\.jsonl$", path)
        if m is None or m.group(1).startswith("probe"):
            continue  # the speed probe's runs (probe-W-P-rN.jsonl) are not a plan's
        r = run(path)
        if r is not None:
            runs.setdefault(m.groups(), []).append(r)
    print("workload P planner: " + "; ".join(f"{c[0]} measured / predicted s" for c in COLUMNS))
    for (workload, p, planner), rs in runs.items():
        cells = []
        for _, mk, pk in COLUMNS:
            meas = statistics.median(r[0][mk] for r in rs)
            pred = statistics.median(r[1][pk] for r in rs)
            cells.append(f"{meas:.4f} / {pred:.4f} ({100 * (pred / meas - 1):+.1f} %)")
        print(f"{workload} {p} {planner}: " + "; ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1])
