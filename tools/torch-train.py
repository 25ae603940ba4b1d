#!/usr/bin/python3
"""An example PyTorch training script on zerod: a small MLP on synthetic
regression data, DDP, and ZerodOptimizer instead of torch.optim (the two
lines marked below). tools/torch-demo.sh starts zerod and the ranks.

    torch-train.py --rank R --world W --store FILE [--iters N] [--shard bucket|slice]
                   [--step-mode interleaved|at_end] [--compare] [--device cpu|cuda]

--device cpu (the default): DDP over gloo, zerod's host backend. --device
cuda: rank R's model on cuda:R, DDP over NCCL, and ZerodOptimizer's buffers
in device memory that zerod (--backend cuda) opens over CUDA IPC; one GPU
per rank.

--compare trains the same model with plain torch.optim beside it and prints
the largest parameter difference (zerod's sum-then-divide rounding).
"""
import argparse
import copy
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from zerod.torch import ZerodOptimizer

ap = argparse.ArgumentParser()
ap.add_argument("--rank", type=int, required=True)
ap.add_argument("--world", type=int, required=True)
ap.add_argument("--store", required=True)
ap.add_argument("--iters", type=int, default=40)
ap.add_argument("--shard", default="bucket")
ap.add_argument("--step-mode", default="interleaved")
ap.add_argument("--compare", action="store_true")
ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
a = ap.parse_args()

torch.set_num_threads(1)
dev = torch.device("cuda", a.rank) if a.device == "cuda" else torch.device("cpu")
ddp_kw = dict(device_ids=[a.rank]) if a.device == "cuda" else {}
if a.device == "cuda":
    torch.cuda.set_device(dev)
dist.init_process_group("nccl" if a.device == "cuda" else "gloo",
                        init_method="file://" + a.store, rank=a.rank, world_size=a.world)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                      nn.Linear(256, 1)).to(dev)
ref = copy.deepcopy(model) if a.compare else None

ddp = DistributedDataParallel(model, **ddp_kw)
# no weight decay on biases: two param groups
groups = [{"params": [p for p in model.parameters() if p.dim() > 1]},
          {"params": [p for p in model.parameters() if p.dim() == 1], "weight_decay": 0.0}]
opt = ZerodOptimizer(ddp, torch.optim.AdamW, groups, lr=3e-3, weight_decay=0.01,  # <- zerod
                     shard=a.shard, step_mode=a.step_mode)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 10))
if ref is not None:
    ddp_r = DistributedDataParallel(ref, **ddp_kw)
    opt_r = torch.optim.AdamW([{"params": [p for p in ref.parameters() if p.dim() > 1]},
                               {"params": [p for p in ref.parameters() if p.dim() == 1],
                                "weight_decay": 0.0}], lr=3e-3, weight_decay=0.01)
    sched_r = torch.optim.lr_scheduler.LambdaLR(opt_r, lambda i: min(1.0, (i + 1) / 10))

# the target: a fixed random function; every rank draws its own samples
w_true = torch.randn(32, generator=torch.Generator().manual_seed(1))
gen = torch.Generator().manual_seed(100 + a.rank)
worst = 0.0
t0 = time.monotonic()
for it in range(a.iters):
    x = torch.randn(64, 32, generator=gen)
    y = torch.sin(x @ w_true).unsqueeze(1)
    x, y = x.to(dev), y.to(dev)
    loss = nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()
    if ref is not None:
        nn.functional.mse_loss(ddp_r(x), y).backward()
        opt_r.step()
        opt_r.zero_grad(set_to_none=True)
        sched_r.step()
        worst = max(worst, max((p - q).abs().max().item()
                               for p, q in zip(model.parameters(), ref.parameters())))
    avg = loss.detach().clone()
    dist.all_reduce(avg)
    if a.rank == 0 and (it % 5 == 0 or it == a.iters - 1):
        print(f"iteration {it:3d}  loss {avg.item() / a.world:.5f}  lr {sched.get_last_lr()[0]:.5f}",
              flush=True)
dt = time.monotonic() - t0
if a.rank == 0:
    print(f"{a.iters} iterations in {dt:.2f} s on {a.world} ranks ({a.shard}, {a.step_mode}, "
          f"{a.device})"
          + (f"; largest difference from torch.optim.AdamW: {worst:.3g}" if ref is not None
             else ""), flush=True)
opt.close()
dist.barrier()
