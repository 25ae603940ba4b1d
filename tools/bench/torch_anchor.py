#!/usr/bin/python3
"""torch_anchor.py: the torch side of zerod-bench --vs-torch.

What zerod replaces, measured the way zerod-bench measures zerod: W processes
on this machine over gloo (loopback), DistributedDataParallel with 25 MB
buckets over a stack of bias-free Linear layers with the benchmark's parameter
count (one layer per zerod bucket), and ZeroRedundancyOptimizer wrapping
Adam / AdamW / SGD with the same hyperparameters.

ZeroRedundancyOptimizer runs as a plain step after backward
(overlap_with_ddp=False): its overlapped mode, the DDP hooks
hook_with_zero_step[_interleaved], refuses every backend but NCCL/HCCL, and
this is CPU torch with gloo. So one synced iteration is: zero_grad, forward,
backward with DDP's bucketed all-reduce overlapping it, then the ZeRO step
(each rank steps its shard, then broadcasts it).

Backward compute is subtracted: every iteration is also run under no_sync()
(the same forward and backward, no communication, no step), interleaved with
the synced ones so that noise hits both alike, and
    torch_iter_ms = median(synced) - median(no_sync),
each iteration's time being the slowest rank's. The batch is 1: Debian's
torch computes with the reference BLAS, so compute is slow, and the less of
it there is to subtract, the less noise it adds. Prints one JSON line.

Debian's python3-torch (1.13, CPU only): run with /usr/bin/python3.
"""
import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def optimizer_kwargs(a):
    if a.optim == "sgd":
        return torch.optim.SGD, dict(lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    cls = torch.optim.Adam if a.optim == "adam" else torch.optim.AdamW
    return cls, dict(lr=a.lr, weight_decay=a.weight_decay)


def make_model(a):
    width = max(1, round(math.sqrt(a.params / a.layers)))
    layers = [torch.nn.Linear(width, width, bias=False) for _ in range(a.layers)]
    return torch.nn.Sequential(*layers), (a.batch, width)


def worker(rank, a, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # One core per process, as zerod-bench's trainers and the machine allow.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.world))
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    torch.manual_seed(0)  # the same initial model on every rank
    model, shape = make_model(a)
    ddp = DDP(model, bucket_cap_mb=a.bucket_cap_mb)
    cls, kw = optimizer_kwargs(a)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=cls, **kw)
    torch.manual_seed(1 + rank)  # different data per rank
    x = torch.randn(*shape)

    def iteration(sync):
        opt.zero_grad()
        if sync:
            ddp(x).square().mean().backward()
            opt.step()
        else:
            with ddp.no_sync():
                ddp(x).square().mean().backward()

    n = a.warmup + a.iters
    times = torch.zeros(2, n, dtype=torch.float64)
    for i in range(n):
        for k, sync in ((0, False), (1, True)):
            dist.barrier()
            t0 = time.perf_counter()
            iteration(sync)
            times[k, i] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if rank == 0:
        compute = statistics.median(times[0, a.warmup:].tolist()) * 1e3
        synced = statistics.median(times[1, a.warmup:].tolist()) * 1e3
        print(json.dumps({
            "torch_iter_ms": round(synced - compute, 3),
            "torch_synced_ms": round(synced, 3),
            "torch_compute_ms": round(compute, 3),
            "torch_params": sum(p.numel() for p in model.parameters()),
            "torch_version": torch.__version__,
            "world": a.world,
            "layers": a.layers,
            "width": shape[1],
            "bucket_cap_mb": a.bucket_cap_mb,
            "optimizer": cls.__name__,
        }), flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", type=int, default=25_000_000)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--optim", choices=["sgd", "adam", "adamw"], default="adam")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    a = p.parse_args()
    mp.spawn(worker, args=(a, free_port()), nprocs=a.world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
