"""Reading torusrec's `--metrics` JSON lines, shared by the benchmark scripts."""

import json


def load_jsonl(path):
    """The per-epoch objects and the final object (or None) of a metrics file."""
    epochs, final = [], None
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    o = json.loads(line)
                except ValueError:
                    continue
                if o.get("final"):
                    final = o
                elif "epoch" in o:
                    epochs.append(o)
    except OSError:
        pass
    return epochs, final


def train_seconds(e):
    """An epoch's training seconds: `seconds` excludes evaluation and checkpoints in
    metrics that carry `eval_seconds`; older files included them."""
    if "eval_seconds" in e:
        return e["seconds"]
    ph = e.get("phases") or {}
    return e["seconds"] - ph.get("eval", 0.0) - ph.get("checkpoint", 0.0)
