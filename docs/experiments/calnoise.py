#!/usr/bin/env python3
"""The fitted values of the calibrations docs/experiments/calnoise.sh writes: per
variant (base, exp), each value's range over its files and its coefficient of
variation. Usage: python3 docs/experiments/calnoise.py [out/calnoise]"""
import json, statistics as st, sys, glob, os

d = sys.argv[1] if len(sys.argv) > 1 else "out/calnoise"
for v in ("base", "exp"):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, f"{v}-*.json"))):
        m = json.load(open(f))["fit"]["model"]
        sf = m["pooled_size_factor"]
        for k, x in [
            ("size_1MiB", sf[0][1]),
            ("size_4MiB", sf[1][1]),
            ("size_256MiB", sf[-1][1]),
            ("occ_w64_ns", (m["pooled_occ_s"] + 64 * m["pooled_occ_float_s"]) * 1e9),
            ("example_ns", m["pooled_example_s"] * 1e9),
            ("interference", m["interference"]),
        ]:
            out.setdefault(k, []).append(x)
    for k, x in out.items():
        cv = 100 * st.pstdev(x) / st.mean(x) if st.mean(x) else 0.0
        print(f"{v:5s} {k:13s} {min(x):.3g}-{max(x):.3g} (cv {cv:.0f} %) n={len(x)}")
