#!/usr/bin/env python3
# Per setting of a bench_costs output directory: measured against predicted seconds
# per step of the embedding phases, the dense phase, the all-reduce and the step
# (medians over the runs; measured over the timed steps after the first interval).
# Usage: python3 docs/experiments/phases.py out/bench-costs7
import json,glob,statistics as st,sys,re
O=sys.argv[1]
rows={}
for f in sorted(glob.glob(O+"/*-r*.jsonl")):
    m=re.match(r".*/(.*)-(\d)-(\w+)-r(\d)\.jsonl",f); w,p,k,r=m.groups()
    L=[json.loads(l) for l in open(f) if l.strip()]
    fin=[x for x in L if x.get("final")][0]; ep=[x for x in L if not x.get("final")][1:]
    n=sum(x["steps"] for x in ep)
    ph={q:sum(x["seconds_"+q] for x in ep)/n for q in ["lookup","pool","dense","backward","update","allreduce"]}
    emb=ph["lookup"]+ph["pool"]+ph["backward"]+ph["update"]
    pr=fin["predicted"]
    rows.setdefault((w,p,k),[]).append((emb,ph["dense"],ph["allreduce"],fin["measured"]["seconds_per_step"],pr["embedding_max"],pr["dense"],pr["allreduce"],pr["step"]))
print("setting                         emb meas/pred      dense meas/pred     allred meas/pred   step meas/pred")
for key,v in rows.items():
    med=lambda i: st.median(x[i] for x in v)
    print(f"{key[0]:15s} {key[1]} {key[2]:10s} {med(0):.4f}/{med(4):.4f} {100*(med(4)/med(0)-1):+5.1f}%  {med(1):.4f}/{med(5):.4f} {100*(med(5)/med(1)-1):+5.1f}%  {med(2):.4f}/{med(6):.4f}  {med(3):.4f}/{med(7):.4f} {100*(med(7)/med(3)-1):+5.1f}%")
