#!/usr/bin/env python3
"""Prediction error of a bench_costs output directory with each run's prediction scaled
by the speed probe around its round (mean of the probes before and after it, over the
probe after the calibration): raw, the embedding phases only scaled (embedding x probe +
dense + all-reduce), and the whole step scaled. Medians over each plan's runs.

Usage: python3 docs/experiments/embscale.py out/bench-costs-intel14
"""
import json,statistics,sys,collections
out=sys.argv[1]
probes=collections.OrderedDict()
cal={}
order=collections.defaultdict(list)
for l in open(out+'/probes.tsv'):
    P,w,r,tag,s=l.split('\t'); s=float(s)
    if tag.startswith('cal'): cal[P]=s
    else: order[P].append((w,r,s))
def factor(P,w,r):
    seq=order[P]
    i=[k for k,(ww,rr,_) in enumerate(seq) if ww==w and rr==r][0]
    return (seq[i][2]+seq[i+1][2])/2/cal[P]
plans=collections.defaultdict(list)
pn={'lookup-greedy':'lookup'}
for l in open(out+'/costs-runs.tsv'):
    f=l.split('\t'); w,P,pl,r=f[:4]
    lines=[json.loads(x) for x in open(f"{out}/{w}-{P}-{pn.get(pl,pl)}-r{r}.jsonl") if x.strip()]
    fin=[x for x in lines if x.get('final')][0]
    pr=fin['predicted']; meas=fin['measured']['seconds_per_step']
    k=factor(P,w,r)
    emb=pr['embedding_max']; rest=pr['step']-emb
    plans[(w,P,pl)].append((meas,pr['step'],emb*k+rest,pr['step']*k))
errs=collections.defaultdict(list)
for key,rs in plans.items():
    m=statistics.median(x[0] for x in rs)
    row=[]
    for j,name in [(1,'raw'),(2,'emb-scaled'),(3,'all-scaled')]:
        p=statistics.median(x[j] for x in rs); e=100*(p-m)/m; errs[name].append(abs(e)); row.append(f"{name} {e:+.1f}")
    print(*key, *row)
for n,e in errs.items(): print(n, f"mean {statistics.mean(e):.1f} worst {max(e):.1f}")
