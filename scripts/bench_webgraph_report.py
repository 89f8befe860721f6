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


def run_facts(path):
    """The memory estimate of rank 0 (bytes) and the layout line from a run log."""
    est = layout = None
    try:
        text = open(path).read()
    except OSError:
        return est, layout
    m = re.search(r"memory estimate for rank 0: ([0-9.]+ [kMGT]?B) .*?; limit ([^;]+); CSR ([^;]+); gather (.*)$", text, re.M)
    if m:
        est = parse_size(m.group(1))
        layout = f"CSR {m.group(3)}; gather {m.group(4)}"
    return est, layout


rows = [ln.rstrip("\n").split("\t") for ln in open(E["MANIFEST"]) if ln.strip()]
out = [
    "# ALX's WebGraph family on one box",
    "",
    E["DESCRIBE"],
    "",
    f"iALS, d = {E['DIM']}, {E['EPOCHS']} epochs, CG {E['CG_STEPS']} steps, reg {E['REG']}, "
    f"unobserved weight {E['ALPHA0']}, P = {E['NP']} ranks x {E['THREADS']} thread(s), "
    f"evaluation rows: `--eval-rows {E['EVAL_ROWS']}` (auto: at most a quarter of an epoch). "
    "Synthetic graphs of the presets' sizes (`generate webgraph`, seed 42, K = 0); de-sparse "
    f"with `--mem-per-rank {E.get('DESPARSE_MEM', '-')}`. "
    "s/epoch: mean training time of epochs 2..N (evaluation timed apart); peak RSS: the "
    "largest rank's high-water mark; estimate: the refusal check's estimate for rank 0; "
    "read/epoch: bytes the ranks read back from their CSR spill files per epoch (from "
    "storage, the rest came from the page cache). Rows marked `@base` ran the binary "
    "before the out-of-core layout in the same invocation.",
    "",
    "| variant | nodes | arcs | generate s | generate peak RSS/rank | tables | s/epoch | edges/s "
    "| exchanged/epoch | read/epoch (storage) | train peak RSS/rank | estimate/rank | eval s (rows) | eval / epoch "
    "| Recall@20 | Recall@50 | measured at |",
    "|---" * 17 + "|",
]
results = {}
implicit = {}
layouts = []
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
    est, layout = run_facts(r[6])
    steady = epochs[1:] or epochs
    spe = sum(map(train_seconds, steady)) / len(steady) if steady else None
    eps = sum(e["edges_per_second"] for e in steady) / len(steady) if steady else None
    exch = sum(e["exchange_bytes"] for e in steady) / len(steady) if steady else None
    rd = sum(e.get("read_bytes", 0) for e in steady) / len(steady) if steady else 0
    rds = sum(e.get("storage_read_bytes", 0) for e in steady) / len(steady) if steady else 0
    esecs, erows = eval_facts(epochs)
    peak = final.get("peak_rss_bytes") if final else None
    results[(tag, dt)] = {"spe": spe, "peak": peak, "final": final, "est": est, "esecs": esecs}
    name = tag if scale == "1" else f"{tag} (scale {scale})"
    at = r[7] if len(r) > 7 else "-"
    if layout:
        layouts.append(f"- {name} {dt}: {layout}")
    if final is None:
        out.append(f"| {name} | {nodes or '-'} | {arcs or '-'} | - | - | {dt} | failed (exit {r[5]}, {r[6]}) |" + " |" * 9 + f" {at} |")
        continue
    gen = f"{gsecs:.1f} | {gib(grss)}" if gsecs is not None else "- | -"
    share = f"{100 * esecs / spe:.0f} %" if esecs is not None and spe else "-"
    out.append(
        f"| {name} | {nodes or 0:,} | {arcs or 0:,} | {gen} | {dt} | {spe:.2f} | "
        f"{eps / 1e6:.1f}M | {exch / 1e9:.2f} GB | {rd / 1e9:.2f} GB ({rds / 1e9:.2f}) | {gib(peak)} | {gib(est)} | "
        f"{esecs:.1f} ({erows:,}) | {share} | {final['recall_at_20']:.4f} | {final['recall_at_50']:.4f} | {at} |"
    )
if layouts:
    out += ["", "Layouts chosen (from the run logs):", ""] + layouts

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
r = results.get(("de-sparse", "bf16"))
if r and r["final"]:
    target("de-sparse bf16: every rank under 8 GiB peak RSS", r["peak"] < 8 * 2**30, gib(r["peak"]))
    target("de-sparse bf16: at most 5 minutes per epoch", r["spe"] <= 300, f"{r['spe']:.1f} s")
r = results.get(("de-dense", "bf16"))
if r and r["final"]:
    target("de-dense bf16: every rank under 4 GiB", r["peak"] < 4 * 2**30, gib(r["peak"]))
for (tag, dt), r in sorted(results.items()):
    if dt.endswith("@base") or not r["final"]:
        continue
    base = results.get((tag, dt + "@base"))
    if base and base["final"] and base["spe"]:
        ratio = r["spe"] / base["spe"]
        target(f"{tag} {dt}: no more than 5% slower than before (same run)", ratio <= 1.05,
               f"{r['spe']:.2f} s vs {base['spe']:.2f} s = {ratio:.3f}x; peak RSS {gib(r['peak'])} vs {gib(base['peak'])}")
    if r["est"] and r["peak"]:
        err = r["est"] / r["peak"] - 1
        target(f"{tag} {dt}: estimate within 10% of the measured peak", abs(err) <= 0.10,
               f"{gib(r['est'])} vs {gib(r['peak'])}, {100 * err:+.1f}%")
    if r["esecs"] is not None and r["spe"]:
        target(f"{tag} {dt}: default evaluation at most 25% of an epoch", r["esecs"] <= 0.25 * r["spe"],
               f"{r['esecs']:.1f} s of {r['spe']:.1f} s")

# ALX's dense variant: what one box would need with the out-of-core layout, by the
# estimate's terms (bf16, d = DIM, P ranks), and the projection.
d = int(E["DIM"])
nodes, arcs = 136_500_000, 22_200_000_000
p = int(E["NP"])
tables = 2 * nodes * d * 2 / p
offsets = 2 * (nodes / p + 1) * 8 + 2 * nodes / p * 4
gather = 2 * 2**30
rest = 256 * 2**20 + gather + 256 * 2**20 + 64 * 2**20
prepared = arcs * 4 * 2 + (nodes + 1) * 8 * 2
out += [
    "",
    "## ALX's dense variant on one box (136.5M nodes, 22.2B arcs; not run)",
    "",
    f"- Memory per rank at P = {p}, d = {d}, bf16, with a 2 GiB gather buffer: tables "
    f"{tables / 2**30:.1f} GiB + row offsets and counts {offsets / 2**30:.1f} GiB + CSR buffer, "
    f"gather, exchange rounds and base {rest / 2**30:.1f} GiB = "
    f"**{(tables + offsets + rest) / 2**30:.1f} GiB per rank, {p * (tables + offsets + rest) / 2**30:.0f} GiB in all** "
    "(the tables alone exceed this box's 23 GiB: more ranks on more nodes, not more disk, is what it needs).",
    f"- Disk: the prepared file {prepared / 1e9:.0f} GB and the ranks' spill files as much again: "
    f"**{2 * prepared / 1e9:.0f} GB**; an epoch reads the spills once ({prepared / 1e9:.0f} GB).",
]
try:
    proj = open(E["ALX_PROJECT"]).read().strip()
    out += ["- `torusrec project als --webgraph dense` on this machine's calibrated rates:", "", "```", proj, "```"]
except (OSError, KeyError):
    pass
print("\n".join(out))
