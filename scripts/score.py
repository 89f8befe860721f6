#!/usr/bin/env python3
"""Score a click log with a torusrec model file, independently of torusrec.

    score.py --model M.h5 --data clicks.h5 [--out S.tsv] [--compare P.tsv] [--tol 1e-5]

Reads the model file (`torusrec embed --out M.h5`, layout in docs/predict.md) and a
click log (`generate clicks`, `prepare clicks`; docs/clicks.md) with numpy and h5py
only, and computes every example's click probability as `torusrec predict` does (in
f64): ids to rows by each table's vocabulary kind, pooling (each row times its id's
weight where the log has `/tables/<t>/weights`), the dense architecture
(mlp, dlrm, dcnv2 stacked or parallel, full or low-rank cross layers), sigmoid.

--out writes `probability<TAB>label` lines (predict's format); --compare reads a
predict output and exits 1 unless every probability is within --tol of this one's
and the labels are equal. Prints the AUC-free summary: examples, max |difference|.
"""

import argparse
import json
import sys

import h5py
import numpy as np


def read_str(attrs, name):
    v = attrs[name]
    return v.decode() if isinstance(v, bytes) else str(v)


class Table:
    """One table of the model: id -> row, with its pooling."""

    def __init__(self, f, t, ts, step):
        self.name = ts["name"]
        self.dim = int(ts["dim"])
        self.vocab = int(ts["vocab"])
        self.kind = ts.get("vocab_kind", "fixed")
        self.pooling = ts.get("pooling", "sum")
        g = f[f"tables/{t}"]
        self.rows = np.asarray(g["rows"][...], dtype=np.float64)
        if self.kind == "hash":
            keys = np.asarray(g["keys"][...], dtype=np.uint64)
            counts = np.asarray(g["counts"][...], dtype=np.uint64)
            seen = np.asarray(g["last_seen"][...], dtype=np.uint64)
            live = counts >= int(ts.get("admit_after", 1))
            evict = str(ts.get("evict", "lfu"))
            if evict.startswith("ttl:"):
                ttl = int(evict[4:])
                age = np.where(seen <= step, step - seen.astype(np.int64), 0)
                live &= age <= ttl
            order = np.argsort(keys, kind="stable")
            self.keys = keys[order]
            self.slot = order
            self.live = live[order]

    def rows_of(self, ids, keyed, where):
        """Row index per id (-1: no row, looks up zeros)."""
        ids = np.asarray(ids, dtype=np.uint64)
        if self.kind == "hash":
            pos = np.searchsorted(self.keys, ids)
            pos_c = np.minimum(pos, max(len(self.keys) - 1, 0))
            if len(self.keys) == 0:
                return np.full(len(ids), -1, dtype=np.int64)
            hit = (self.keys[pos_c] == ids) & self.live[pos_c]
            return np.where(hit, self.slot[pos_c].astype(np.int64), -1)
        if self.kind == "modulo":
            return (ids % np.uint64(self.vocab)).astype(np.int64)
        bad = ids >= np.uint64(self.vocab)
        if bad.any():
            i = int(np.argmax(bad))
            sys.exit(f"score.py: {where}: table {self.name!r}: id {ids[i]} is not below its vocab {self.vocab}")
        return ids.astype(np.int64)

    def pool(self, offsets, rows, weights=None):
        """n x dim pooled embeddings of bags `offsets` over `rows` (-1: no row):
        sum_i w_i row_i with per-id `weights` (else every w_i = 1); a mean divides
        that by the bag's count of rows found (not by the sum of the weights)."""
        n = len(offsets) - 1
        vals = np.zeros((len(rows), self.dim))
        ok = rows >= 0
        vals[ok] = self.rows[rows[ok]]
        if weights is not None:
            vals *= weights[:, None]
        csum = np.vstack([np.zeros((1, self.dim)), np.cumsum(vals, axis=0)])
        out = csum[offsets[1:]] - csum[offsets[:-1]]
        if self.pooling == "mean":
            # Over the rows found: an id without a row is left out of its bag.
            found = np.concatenate([[0], np.cumsum(ok)])
            lens = (found[offsets[1:]] - found[offsets[:-1]]).astype(np.float64)
            out[lens > 0] /= lens[lens > 0, None]
        return out.reshape(n, self.dim)


def mlp_layers(flat, layers):
    """[(W in x out, b)] of an MLP's flat parameters."""
    out, off = [], 0
    for a, b in zip(layers[:-1], layers[1:]):
        w = flat[off:off + a * b].reshape(a, b)
        off += a * b
        out.append((w, flat[off:off + b]))
        off += b
    assert off == len(flat), "MLP parameters do not match their widths"
    return out


def mlp_forward(x, params, relu_last):
    for i, (w, b) in enumerate(params):
        x = x @ w + b
        if i + 1 < len(params) or relu_last:
            x = np.maximum(x, 0.0)
    return x


def subnet(f, name):
    d = f[f"dense/{name}"]
    flat = np.asarray(d[...], dtype=np.float64)
    layers = [int(v) for v in d.attrs["layers"]]
    relu_last = bool(int(np.asarray(d.attrs["relu_last"]).ravel()[0]))
    return mlp_layers(flat, layers), relu_last


def cross_forward(f, x0):
    g = f["dense"]
    d = int(g.attrs["cross_dim"])
    n_layers = int(g.attrs["cross_layers"])
    r = int(g.attrs["cross_rank"])
    p = np.asarray(f["dense/cross"][...], dtype=np.float64)
    x, off = x0, 0
    for _ in range(n_layers):
        if r == 0:
            w = p[off:off + d * d].reshape(d, d)
            off += d * d
        else:
            u = p[off:off + d * r].reshape(d, r)
            off += d * r
            v = p[off:off + d * r].reshape(d, r)
            off += d * r
            w = u @ v.T
        b = p[off:off + d]
        off += d
        x = x0 * (x @ w.T + b) + x
    assert off == len(p), "cross parameters do not match their shape"
    return x


def logits(f, spec, x, n_dense):
    arch = read_str(f["dense"].attrs, "arch") if "dense" in f else "mlp"
    if arch == "mlp":
        flat = np.asarray(f["mlp/params"][...], dtype=np.float64)
        layers = [int(v) for v in f["mlp/params"].attrs["layers"]]
        return mlp_forward(x, mlp_layers(flat, layers), False)[:, 0]
    if arch == "dlrm":
        g = f["dense"]
        dim, n_sparse = int(g.attrs["dim"]), int(g.attrs["n_sparse"])
        bottom, rl = subnet(f, "bottom")
        top, _ = subnet(f, "top")
        v0 = mlp_forward(x[:, n_sparse * dim:], bottom, rl)
        vs = [v0] + [x[:, k * dim:(k + 1) * dim] for k in range(n_sparse)]
        pairs = [np.sum(vs[i] * vs[j], axis=1) for i in range(1, n_sparse + 1) for j in range(i)]
        z = np.column_stack([v0] + pairs)
        return mlp_forward(z, top, False)[:, 0]
    if arch == "dcnv2":
        xl = cross_forward(f, x)
        deep, rl = subnet(f, "deep")
        if read_str(f["dense"].attrs, "structure") == "stacked":
            return mlp_forward(xl, deep, rl)[:, 0]
        head, _ = subnet(f, "head")
        tower = mlp_forward(x, deep, rl)
        return mlp_forward(np.hstack([xl, tower]), head, False)[:, 0]
    sys.exit(f"score.py: unknown arch {arch!r}")


def score(model, data):
    f = h5py.File(model, "r")
    if read_str(f.attrs, "format") != "torusrec-embed-model":
        sys.exit(f"score.py: {model}: not a torusrec model file")
    spec = json.loads(read_str(f.attrs, "spec"))
    step = int(f.attrs["step"])
    tables = [Table(f, t, ts, step) for t, ts in enumerate(spec["table"])]
    d = h5py.File(data, "r")
    keyed = read_str(d.attrs, "schema") == "torusrec-clicks-v2"
    n = int(d.attrs["examples"])
    parts = []
    for t, tab in enumerate(tables):
        g = d[f"tables/{t}"]
        offsets = np.asarray(g["offsets"][...], dtype=np.int64)
        ids = np.asarray(g["ids"][...])
        w = None
        if "weights" in g:
            w = np.asarray(g["weights"][...], dtype=np.float64)
            if len(w) != len(ids):
                sys.exit(f"score.py: {data} table {t}: {len(w)} weights for {len(ids)} ids")
        rows = tab.rows_of(ids, keyed, f"{data} table {t}")
        parts.append(tab.pool(offsets, rows, w))
    dense = np.asarray(d["dense"][...], dtype=np.float64).reshape(n, -1)
    x = np.hstack(parts + [dense])
    z = logits(f, spec, x, dense.shape[1])
    labels = np.asarray(d["labels"][...], dtype=np.float64)
    return 1.0 / (1.0 + np.exp(-z)), labels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out")
    ap.add_argument("--compare")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    p, y = score(a.model, a.data)
    if a.out:
        with open(a.out, "w") as o:
            for pi, yi in zip(p, y):
                o.write(f"{pi:.9f}\t{int(yi)}\n")
    if a.compare:
        rows = np.loadtxt(a.compare, ndmin=2)
        if rows.shape[0] != len(p):
            sys.exit(f"score.py: {a.compare}: {rows.shape[0]} lines, {len(p)} examples")
        diff = float(np.max(np.abs(rows[:, 0] - p))) if len(p) else 0.0
        labels_ok = bool(np.all(rows[:, 1] == y))
        print(f"score.py: {len(p)} examples, max |difference| {diff:.3e} (tolerance {a.tol:g}), labels {'equal' if labels_ok else 'DIFFER'}")
        if diff > a.tol or not labels_ok:
            sys.exit(1)
    elif not a.out:
        print(f"score.py: {len(p)} examples scored (give --out or --compare)")


if __name__ == "__main__":
    main()
