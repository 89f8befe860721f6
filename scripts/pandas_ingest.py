#!/usr/bin/env python3
"""The pandas reference for `torusrec prepare clicks --format criteo`.

    python3 scripts/pandas_ingest.py FILE [FILE ...]

Reads Criteo-format files (label, I1..I13, C1..C26, tab-separated, no header; plain
or .gz) with pandas.read_csv in chunks (memory bounded by the chunk, not the file),
applies the same transforms as torusrec (missing dense values 0, negatives clamped
to 0, then ln(1 + x) as float32; the hex categorical values parsed to 64-bit keys,
missing ones left missing) and prints one JSON line:

    {"bytes": ..., "seconds": ..., "mb_per_s": ..., "examples": ...}

`bytes` is the size of the input files as stored (for plain files the text bytes
that torusrec reports too; for .gz files the compressed size, where torusrec reports
the text it decompressed); MB is 10^6 bytes. Nothing is written: this
measures parsing and transforming, the part both tools share.
"""

import json
import os
import sys
import time

import numpy as np
import pandas as pd

N_DENSE = 13
N_CAT = 26
DENSE = [f"I{i}" for i in range(1, N_DENSE + 1)]
CAT = [f"C{i}" for i in range(1, N_CAT + 1)]
COLUMNS = ["label"] + DENSE + CAT
CHUNK_ROWS = 1 << 18


def hex_keys(col: pd.Series) -> np.ndarray:
    """Hex strings to int64 keys (the u64 bits); missing values become -1 here."""
    out = np.full(len(col), -1, dtype=np.int64)
    present = col.notna().to_numpy()
    if present.any():
        vals = [int(s, 16) for s in col[present]]
        out[present] = np.array(vals, dtype=np.uint64).view(np.int64)
    return out


def transform(chunk: pd.DataFrame):
    labels = chunk["label"].to_numpy(dtype=np.float32)
    if not np.isin(labels, (0.0, 1.0)).all():
        raise ValueError("a label is not 0 or 1")
    dense = chunk[DENSE].fillna(0).to_numpy(dtype=np.float64)
    dense = np.log1p(np.maximum(dense, 0.0)).astype(np.float32)
    keys = np.stack([hex_keys(chunk[c]) for c in CAT], axis=1)
    return labels, dense, keys


def main(paths):
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    dtypes = {"label": np.int8}
    dtypes.update({c: "float64" for c in DENSE})  # integers with missing values
    dtypes.update({c: "string" for c in CAT})
    total_bytes = sum(os.path.getsize(p) for p in paths)
    examples = 0
    t0 = time.perf_counter()
    for p in paths:
        reader = pd.read_csv(
            p,
            sep="\t",
            header=None,
            names=COLUMNS,
            dtype=dtypes,
            chunksize=CHUNK_ROWS,
            compression="infer",
            na_filter=True,
            keep_default_na=False,
            na_values=[""],
        )
        for chunk in reader:
            labels, _, _ = transform(chunk)
            examples += len(labels)
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "bytes": total_bytes,
                "seconds": round(seconds, 3),
                "mb_per_s": round(total_bytes / 1e6 / max(seconds, 1e-9), 2),
                "examples": examples,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
