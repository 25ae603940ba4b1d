#!/usr/bin/python3
"""torch_phases.py: where an iteration of DDP + ZerodOptimizer goes (issue 25
§2's profile), against the same iteration under no_sync() and DDP + plain
torch.optim, in one run: the phases zero_grad, forward, backward and step,
each the median over --iters (after --warmup) of rank 0's times, and the CPU
time zerod spent per iteration of each kind (utime + stime of the daemon
process from /proc, summed over the kind's iterations: clock ticks, so read
it over many iterations).

    /usr/bin/python3 tools/bench/torch_phases.py --zerod build/daemon/zerod \\
        --libzeroclient build/client/libzeroclient.so.1 [--params 25000000]

The model, data and DDP settings are torch_anchor.py's (bias-free Linear
layers, one per bucket, batch 1, 25 MB buckets, one thread per rank); the
kinds alternate iteration by iteration after a barrier. Prints one line per
kind and one JSON line.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_anchor  # noqa: E402  (make_model, free_port)

PHASES = ("zero_grad", "forward", "backward", "step", "total")


def daemon_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def worker(rank, a, port, zpid):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    sys.path.insert(0, a.pythonpath)
    from zerod.torch import ZerodOptimizer
    kinds = []
    for name in ("no_sync", "plain_adam", "zerod", "zerod_shared"):
        torch.manual_seed(0)
        model, shape = torch_anchor.make_model(a)
        ddp = DDP(model, bucket_cap_mb=25)
        if name.startswith("zerod"):
            opt = ZerodOptimizer(ddp, torch.optim.Adam, shared_params=name == "zerod_shared")
        else:
            opt = torch.optim.Adam(ddp.parameters())
        kinds.append((name, ddp, opt))
    torch.manual_seed(1 + rank)
    x = torch.randn(*shape)
    times = {n: [] for n, _, _ in kinds}
    ticks = {n: 0 for n, _, _ in kinds}
    for i in range(a.warmup + a.iters):
        for name, ddp, opt in kinds:
            dist.barrier()
            k0 = daemon_ticks(zpid) if rank == 0 else 0
            t0 = time.perf_counter()
            opt.zero_grad()
            t1 = time.perf_counter()
            if name == "no_sync":
                with ddp.no_sync():
                    y = ddp(x)
                    t2 = time.perf_counter()
                    y.square().mean().backward()
                t3 = t4 = time.perf_counter()
            else:
                y = ddp(x)
                t2 = time.perf_counter()
                y.square().mean().backward()
                t3 = time.perf_counter()
                opt.step()
                t4 = time.perf_counter()
            if i >= a.warmup:
                times[name].append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0))
                if rank == 0:
                    ticks[name] += daemon_ticks(zpid) - k0
    if rank == 0:
        hz = os.sysconf("SC_CLK_TCK")
        out = {}
        for name in times:
            med = [statistics.median(t[p] for t in times[name]) * 1e3 for p in range(5)]
            cpu = ticks[name] / hz / a.iters * 1e3
            out[name] = dict(zip(PHASES, (round(m, 2) for m in med)), zerod_cpu_ms=round(cpu, 2))
            print(f"{name:13s} " + " ".join(f"{p} {m:7.2f}" for p, m in zip(PHASES, med)) +
                  f"  zerod CPU {cpu:6.2f} ms/iteration", flush=True)
        print(json.dumps({"params": a.params, "world": a.world, "iters": a.iters, **out}),
              flush=True)
    for name, _, opt in kinds:
        if name.startswith("zerod"):
            opt.close()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--zerod", required=True)
    p.add_argument("--libzeroclient", required=True)
    p.add_argument("--pythonpath", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))
    p.add_argument("--params", type=int, default=25_000_000)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    run = tempfile.mkdtemp(prefix="zerod-phases-")
    sock = os.path.join(run, "zerod.sock")
    log = open(os.path.join(run, "zerod.log"), "w")
    z = subprocess.Popen([a.zerod, "--socket", sock], stdout=log, stderr=log)
    try:
        for _ in range(400):
            if os.path.exists(sock) or z.poll() is not None:
                break
            time.sleep(0.025)
        os.environ["ZEROD_SOCKET"] = sock
        os.environ["ZEROD_LIBZEROCLIENT"] = a.libzeroclient
        mp.spawn(worker, args=(a, torch_anchor.free_port(), z.pid), nprocs=a.world, join=True)
    finally:
        z.send_signal(signal.SIGTERM)
        z.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
