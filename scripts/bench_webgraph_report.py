"""The table of scripts/bench_webgraph.sh, from its manifest, logs and metrics files."""

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_metrics import load_jsonl, train_seconds  # noqa: E402

E = os.environ
UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def parse_size(s):
    m = re.match(r"([0-9.]+)\s*([kMGT]?B)", s)
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def gib(b):
    return f"{b / 2**30:.2f} GiB" if b is not None else "-"


def gen_facts(path):
    """(nodes, arcs, seconds, peak RSS per rank) from a generation log."""
    nodes = arcs = secs = rss = None
    try:
        text = open(path).read()
    except OSError:
        return nodes, arcs, secs, rss
    m = re.search(r"-> K = \d+: ([0-9,]+) nodes, ([0-9,]+) arcs", text)
    if m:
        nodes, arcs = (int(x.replace(",", "")) for x in m.groups())
    m = re.search(r"^wrote .* in ([0-9.]+) s .*peak RSS ([0-9.]+ [kMGT]?B) per rank", text, re.M)
    if m:
        secs, rss = float(m.group(1)), parse_size(m.group(2))
    return nodes, arcs, secs, rss


def eval_facts(epochs):
    for e in reversed(epochs):
        if e.get("recall"):
            secs = e.get("eval_seconds", (e.get("phases") or {}).get("eval"))
            rows = e.get("eval_rows", e["recall"].get("test_rows"))
            return secs, rows
    return None, None


rows = [ln.rstrip("\n").split("\t") for ln in open(E["MANIFEST"]) if ln.strip()]
out = [
    "# ALX's WebGraph family on one box",
    "",
    E["DESCRIBE"],
    "",
    f"iALS, d = {E['DIM']}, {E['EPOCHS']} epochs, CG {E['CG_STEPS']} steps, reg {E['REG']}, "
    f"unobserved weight {E['ALPHA0']}, P = {E['NP']} ranks x {E['THREADS']} thread(s), "
    f"evaluation on {E['EVAL_ROWS']} sampled test rows (the same rows at any P). "
    "Synthetic graphs of the presets' sizes (`generate webgraph`, seed 42, K = 0). "
    "s/epoch: mean training time of epochs 2..N (evaluation timed apart); peak RSS: the "
    "largest rank's high-water mark, and the sum over ranks.",
    "",
    "| variant | nodes | arcs | generate s | generate peak RSS/rank | tables | s/epoch | edges/s "
    "| exchanged/epoch | train peak RSS/rank | all ranks | eval s (rows) | Recall@20 | Recall@50 | measured at |",
    "|---" * 15 + "|",
]
results = {}
implicit = {}
for r in rows:
    tag, scale, dt = r[0], r[1], r[2]
    if dt == "implicit":
        try:
            implicit[tag] = json.load(open(r[4]))
        except (OSError, ValueError):
            implicit[tag] = None
        continue
    nodes, arcs, gsecs, grss = gen_facts(r[3])
    epochs, final = load_jsonl(r[4])
    steady = epochs[1:] or epochs
    spe = sum(map(train_seconds, steady)) / len(steady) if steady else None
    eps = sum(e["edges_per_second"] for e in steady) / len(steady) if steady else None
    exch = sum(e["exchange_bytes"] for e in steady) / len(steady) if steady else None
    esecs, erows = eval_facts(epochs)
    peak = final.get("peak_rss_bytes") if final else None
    np_ = int(E["NP"])
    results[(tag, dt)] = {"spe": spe, "peak": peak, "final": final}
    name = tag if scale == "1" else f"{tag} (scale {scale})"
    at = r[7] if len(r) > 7 else "-"
    if final is None:
        out.append(f"| {name} | {nodes or '-'} | {arcs or '-'} | - | - | {dt} | failed (exit {r[5]}, {r[6]}) |" + " |" * 7 + f" {at} |")
        continue
    out.append(
        f"| {name} | {nodes:,} | {arcs:,} | {gsecs:.1f} | {gib(grss)} | {dt} | {spe:.2f} | "
        f"{eps / 1e6:.1f}M | {exch / 1e9:.2f} GB | {gib(peak)} | {gib(peak * np_) if peak else '-'} | "
        f"{esecs:.1f} ({erows:,}) | {final['recall_at_20']:.4f} | {final['recall_at_50']:.4f} | {at} |"
        if nodes and gsecs is not None
        else f"| {name} | - | - | - | - | {dt} | {spe:.2f} | {eps / 1e6:.1f}M | {exch / 1e9:.2f} GB | "
        f"{gib(peak)} | - | {esecs} ({erows}) | {final['recall_at_20']:.4f} | {final['recall_at_50']:.4f} | {at} |"
    )

if implicit:
    out += [
        "",
        f"## Beside benfred/implicit (same split, d = {E['DIM']}, {E['EPOCHS']} epochs, "
        f"reg {E['IREG']}, alpha {E['IALPHA']}, {E['CORES']} threads; Recall over the same sampled test rows)",
        "",
        "| variant | implicit s/epoch | implicit Recall@20 | torusrec f32 s/epoch | ratio | torusrec bf16 s/epoch | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for tag, j in implicit.items():
        if not j:
            out.append(f"| {tag} | failed | | | | | |")
            continue
        ispe = j.get("seconds_per_epoch_after_first") or j["seconds_per_epoch"]
        cells = []
        for dt in ("f32", "bf16"):
            s = (results.get((tag, dt)) or {}).get("spe")
            cells += [f"{s:.2f}", f"{s / ispe:.2f}x"] if s else ["-", "-"]
        out.append(f"| {tag} | {ispe:.2f} | {j['recall_at_20']:.4f} | " + " | ".join(cells) + " |")

out += ["", "## Targets", ""]


def target(label, ok, detail):
    out.append(f"- {label}: {'met' if ok else 'MISSED'} ({detail})")


for dt in ("f32", "bf16"):
    r = results.get(("de-dense", dt))
    if r and r["final"]:
        total = r["peak"] * int(E["NP"])
        target(f"de-dense {dt}: all ranks under 20 GiB", total < 20 * 2**30, gib(total))
        target(f"de-dense {dt}: at most 3 minutes per epoch", r["spe"] <= 180, f"{r['spe']:.1f} s")
    r = results.get(("in-dense", dt))
    if r and r["final"]:
        target(f"in-dense {dt}: at most 12 s per epoch at P = {E['NP']}", r["spe"] <= 12, f"{r['spe']:.2f} s")
print("\n".join(out))
