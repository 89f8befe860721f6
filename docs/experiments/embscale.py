#!/usr/bin/env python3
"""Prediction error of a bench_costs output directory with each run's prediction scaled
by the speed probe around its round (the mean of the probes before and after it, over
the probe after the calibration): raw, the embedding phases only scaled (embedding x
probe + dense + all-reduce), and the whole step scaled. Medians over each plan's runs.

Usage: python3 docs/experiments/embscale.py out/bench-costs-intel14
"""
import collections
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from phases import run  # noqa: E402  (one run's measured and predicted seconds)

# The run files' planner names (costs-runs.tsv says lookup-greedy, the files lookup).
FILE_NAME = {"lookup-greedy": "lookup"}
SCALINGS = ["raw", "embedding scaled", "step scaled"]


def probe_factors(out):
    """(P, workload, round) -> the probe's seconds around that round over after the calibration."""
    calibration, rounds = {}, collections.defaultdict(list)
    for line in open(out + "/probes.tsv"):
        p, workload, rnd, tag, secs = line.rstrip("\n").split("\t")
        if tag.startswith("cal"):
            calibration[p] = float(secs)
        else:
            rounds[p].append(((workload, rnd), float(secs)))
    factors = {}
    for p, seq in rounds.items():
        # Each round's probe ran before it; the next entry (a round or the end) after it.
        for (key, before), (_, after) in zip(seq, seq[1:]):
            factors[(p, *key)] = (before + after) / 2 / calibration[p]
    return factors


def main(out):
    factors = probe_factors(out)
    plans = collections.defaultdict(list)
    for line in open(out + "/costs-runs.tsv"):
        workload, p, planner, rnd = line.split("\t")[:4]
        name = FILE_NAME.get(planner, planner)
        measured, predicted = run(f"{out}/{workload}-{p}-{name}-r{rnd}.jsonl")
        k = factors[(p, workload, rnd)]
        embedding = predicted["embedding_max"]
        rest = predicted["step"] - embedding
        preds = [predicted["step"], embedding * k + rest, predicted["step"] * k]
        plans[(workload, p, planner)].append((measured["step"], preds))
    errors = collections.defaultdict(list)
    for key, rs in plans.items():
        measured = statistics.median(m for m, _ in rs)
        cells = []
        for j, scaling in enumerate(SCALINGS):
            pred = statistics.median(preds[j] for _, preds in rs)
            error = 100 * (pred - measured) / measured
            errors[scaling].append(abs(error))
            cells.append(f"{scaling} {error:+.1f}")
        print(*key, *cells)
    for scaling in SCALINGS:
        e = errors[scaling]
        print(f"{scaling}: mean {statistics.mean(e):.1f} %, worst {max(e):.1f} %")


if __name__ == "__main__":
    main(sys.argv[1])
