"""Peer baseline for `scripts/bench_ctr.sh`: TorchRec's own click models trained on a
torusrec click log, so both sides see the same examples in the same order.

Models (TorchRec 1.9, `torchrec.models.dlrm`):
  mlp    EmbeddingBagCollection ++ dense -> MLP (the model of bench/peers/torchrec_peer.py)
  dlrm   DLRM(ebc, dense_in_features, dense_arch_layer_sizes, over_arch_layer_sizes):
         bottom MLP (ReLU on every layer) to D, InteractionArch (pairwise dots of the F + 1
         vectors, triu order), over arch (ReLU MLP, last layer linear)
  dcnv2  DLRM_DCN(..., dcn_num_layers, dcn_low_rank_dim): the interaction replaced by
         LowRankCrossNet on [bottom output | F pooled embeddings], then the over arch

Data: the torusrec click log (schema torusrec-clicks-v1, HDF5, read with h5py):
/dense [N, n_dense] f32, /labels [N], /tables/<t>/offsets [N+1] u64, /tables/<t>/ids u32;
the model's tables (vocab, dim, pooling) from the `spec_json` attribute. Step i takes the
global batch of examples [i G, (i + 1) G), G = procs x batch, rank r the r-th slice of it
(torusrec --data reads the same ranges); the last --eval-examples examples are held out
and scored after training (AUC and log loss over all of them, gathered to rank 0).
Tables: row-wise Adagrad (FBGEMM fused, in backward) at --emb-lr; dense: Adagrad at
--dense-lr, all-reduced by DDP (DistributedModelParallel's data-parallel wrapper).
Timing: steps after the first --warmup, examples/s = G x timed steps / max rank time.

  python torchrec_ctr.py --log clicks.h5 --arch dlrm --procs 2 --batch 2048 --steps 200 \
      --bottom 512,256,64 --top 512,256 --eval-examples 65536
"""
import argparse, json, os, sys, time


def load(path, first, n):
    """Examples [first, first + n) of the log: dense, labels, per-table lengths and ids."""
    import h5py, numpy as np
    with h5py.File(path, "r") as f:
        dense = f["dense"][first:first + n]
        y = f["labels"][first:first + n]
        lens, vals = [], []
        for t in range(len(f["tables"])):
            off = f[f"tables/{t}/offsets"][first:first + n + 1].astype(np.int64)
            vals.append(f[f"tables/{t}/ids"][off[0]:off[-1]].astype(np.int64))
            lens.append(np.diff(off))
    return dense, y, lens, vals


def auc(p, y):
    import numpy as np
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(len(p)); ranks[order] = np.arange(1, len(p) + 1)
    # ties get their mean rank
    ps = p[order]; i = 0
    while i < len(ps):
        j = i
        while j + 1 < len(ps) and ps[j + 1] == ps[i]:
            j += 1
        if j > i:
            ranks[order[i:j + 1]] = (i + j + 2) / 2.0
        i = j + 1
    pos = y == 1
    npos, nneg = pos.sum(), (~pos).sum()
    return (ranks[pos].sum() - npos * (npos + 1) / 2) / (npos * nneg)


def worker(rank, a):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(a.port))
    import numpy as np, torch, torch.distributed as dist, h5py
    from torch import nn
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=a.procs)
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
    from torch.distributed.optim import _apply_optimizer_in_backward

    with h5py.File(a.log, "r") as f:
        spec = json.loads(f.attrs["spec_json"])
        N = int(f.attrs["examples"])
    tables = spec["table"] if "table" in spec else spec["tables"]
    F, nd, B, P = len(tables), spec["n_dense"], a.batch, a.procs
    G = P * B
    train = N - a.eval_examples
    steps = a.steps
    if steps * G > train:
        sys.exit(f"{a.log}: {train} training examples, {steps} steps of {G} need {steps * G}")
    names = [f"f{t}" for t in range(F)]
    t0 = time.perf_counter()

    def kjt(lens, vals):
        return KeyedJaggedTensor(keys=names, values=torch.from_numpy(np.concatenate(vals)),
                                 lengths=torch.from_numpy(np.concatenate(lens)))

    batches = []
    for i in range(steps):
        d, y, l, v = load(a.log, i * G + rank * B, B)
        batches.append((torch.from_numpy(d), kjt(l, v), torch.from_numpy(y)))
    load_s = time.perf_counter() - t0

    pool = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}
    ebc = EmbeddingBagCollection(device=torch.device("meta"), tables=[
        EmbeddingBagConfig(name=f"t{t}", embedding_dim=tb["dim"], num_embeddings=int(tb["vocab"]),
                           feature_names=[names[t]], pooling=pool[tb.get("pooling", "sum")])
        for t, tb in enumerate(tables)])
    bottom = [int(x) for x in a.bottom.split(",")]
    top = [int(x) for x in a.top.split(",")] + [1]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            if a.arch == "mlp":
                self.ebc = ebc
                w = [sum(tb["dim"] for tb in tables) + nd] + top
                layers = []
                for i in range(len(w) - 1):
                    layers += [nn.Linear(w[i], w[i + 1])] + ([nn.ReLU()] if i + 2 < len(w) else [])
                self.mlp = nn.Sequential(*layers)
            elif a.arch == "dlrm":
                self.m = DLRM(embedding_bag_collection=ebc, dense_in_features=nd,
                              dense_arch_layer_sizes=bottom, over_arch_layer_sizes=top)
            else:
                self.m = DLRM_DCN(embedding_bag_collection=ebc, dense_in_features=nd,
                                  dense_arch_layer_sizes=bottom, over_arch_layer_sizes=top,
                                  dcn_num_layers=a.cross_layers, dcn_low_rank_dim=a.cross_rank)

        def forward(self, dense, k):
            if a.arch == "mlp":
                return self.mlp(torch.cat([self.ebc(k).values(), dense], 1)).squeeze(1)
            return self.m(dense, k).squeeze(1)

    torch.manual_seed(a.seed)
    model = Net()
    emb = model.ebc if a.arch == "mlp" else model.m.sparse_arch.embedding_bag_collection
    _apply_optimizer_in_backward(RowWiseAdagrad, emb.parameters(), {"lr": a.emb_lr, "eps": 1e-8})
    sharders = [EmbeddingBagCollectionSharder()]
    pg = dist.group.WORLD
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=P, local_world_size=P,
                                       compute_device="cpu", ddr_cap=10 << 30))
    plan = planner.collective_plan(model, sharders, pg)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg),
                                   device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda ps: torch.optim.Adagrad(ps, lr=a.dense_lr))
    opt = CombinedOptimizer([dmp.fused_optimizer, dense_opt])
    lossf = nn.BCEWithLogitsLoss()

    losses = []
    for i in range(steps):
        if i == a.warmup:
            dist.barrier(); t0 = time.perf_counter()
        d, k, y = batches[i]
        loss = lossf(dmp(d, k), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    el = time.perf_counter() - t0
    el_t = torch.tensor([el]); dist.all_reduce(el_t, op=dist.ReduceOp.MAX)

    # Held-out: the last eval_examples, cut into P contiguous slices, in batches.
    E = a.eval_examples
    per = (E + P - 1) // P
    lo, hi = train + rank * per, min(train + (rank + 1) * per, N)
    probs, labels = [], []
    with torch.no_grad():
        # every rank runs the same number of forward passes (the sharded lookups are
        # collective); a rank past its slice feeds an empty-ish batch of its last rows
        nb = (per + B - 1) // B
        for j in range(nb):
            s = lo + j * B
            n = max(0, min(B, hi - s))
            d, y, l, v = load(a.log, min(s, N - 1) if n == 0 else s, max(n, 1))
            logit = dmp(torch.from_numpy(d), kjt(l, v))
            if n > 0:
                probs.append(torch.sigmoid(logit).numpy()); labels.append(y)
    p = np.concatenate(probs) if probs else np.zeros(0, np.float32)
    yv = np.concatenate(labels) if labels else np.zeros(0, np.float32)
    got = [None] * P
    dist.all_gather_object(got, (p, yv))
    if rank == 0:
        p = np.concatenate([g[0] for g in got]).astype(np.float64)
        yv = np.concatenate([g[1] for g in got])
        pc = np.clip(p, 1e-7, 1 - 1e-7)
        ll = -np.mean(yv * np.log(pc) + (1 - yv) * np.log(1 - pc))
        timed = steps - a.warmup
        eps = G * timed / el_t.item()
        print(f"# arch={a.arch} procs={P} threads/proc={a.threads} batch/rank={B} steps={steps} "
              f"data load {load_s:.1f}s, step {1000 * el_t.item() / timed:.1f} ms, "
              f"loss first5={np.mean(losses[:5]):.4f} last5={np.mean(losses[-5:]):.4f}", flush=True)
        print(f"torchrec {a.arch} examples/s={eps:.0f} auc={auc(p, yv):.4f} logloss={ll:.5f} "
              f"eval={len(p)}", flush=True)
    dist.barrier()
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)  # skip teardown: gloo/TBE teardown aborts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--arch", default="dlrm", choices=["mlp", "dlrm", "dcnv2"])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--eval-examples", type=int, default=65536)
    ap.add_argument("--bottom", default="512,256,64")
    ap.add_argument("--top", default="512,256")
    ap.add_argument("--cross-layers", type=int, default=3)
    ap.add_argument("--cross-rank", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--emb-lr", type=float, default=0.02)
    ap.add_argument("--dense-lr", type=float, default=0.002)
    ap.add_argument("--port", type=int, default=29519)
    a = ap.parse_args()
    if a.threads is None:
        a.threads = max(1, 2 // a.procs)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(a,), nprocs=a.procs, join=True)


if __name__ == "__main__":
    main()
