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

--zerod PATH (zerod-bench --torch-zerod) also runs the real
zerod.torch.ZerodOptimizer end to end in the same run: this script starts
PATH on a private socket, and every rank builds a second copy of the model
(the same initial values, the same input) under DDP with the same buckets and
ZerodOptimizer of the same class and hyperparameters. Its synced iterations
(zero_grad, forward, backward through its comm hook, opt.step() waiting for
zerod's step) are interleaved with the other two kinds, and
    torch_zerod_iter_ms = median(ZerodOptimizer's synced) - median(no_sync),
so what the Python package costs (the hook, the copy into zerod's buffer,
ctypes, the pump thread) is in it. --libzeroclient and --pythonpath say where
the library and the zerod package are (zerod-bench passes the build's).
--zerod-shared (zerod-bench --torch-zerod --shared-params) runs a third copy
the same way with ZerodOptimizer(shared_params=True), the ranks sharing one
parameter buffer: torch_zerod_shared_iter_ms, torch_zerod_shared_max_diff.

--plain also runs what a user has without ZeRO: DDP + plain torch.optim of
the same class, each on its own copy of the model, in the same interleaved
rounds: the default optimizer (torch_plain_iter_ms), foreach=True
(torch_plain_foreach_iter_ms), DDP(gradient_as_bucket_view=True) with the
default optimizer (torch_plain_gabv_iter_ms) and with foreach=True
(torch_plain_gabv_foreach_iter_ms), each minus the same no_sync median; and
torch_plain_best_ms / torch_plain_best the fastest of them and its name.

--allreduce-only is the gloo anchor of zerod-bench --daemons, independent of
zerod: --world processes over torch.distributed's gloo backend on loopback,
each iteration dist.all_reduce (SUM) of every bucket (--bucket-numel
elements, the last one shorter) in turn, timed from the first bucket's start
to the last one's end on every rank (the slowest rank's); prints
torch_gloo_allreduce_ms, the median over --iters after --warmup.

--cuda (zerod-bench --gpu, with --zerod and a torch built with CUDA) is the
GPU row of issue 25 §4: world 1 over NCCL, the model on cuda:0, DDP +
ZeroRedundancyOptimizer(overlap_with_ddp=True) through torch's
hook_with_zero_step(allreduce_hook) against DDP + ZerodOptimizer on a
`zerod --backend cuda`, interleaved with no_sync iterations, each timed to
torch.cuda.synchronize(): torch_cuda_zero_overlap_ms and torch_cuda_zerod_ms
(each minus the no_sync median). Without CUDA it prints
{"not_run": "..."} and exits 0.

Debian's python3-torch (1.13, CPU only): run with /usr/bin/python3.
"""
import argparse
import json
import math
import os
import socket
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
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
    kinds = [(ddp, opt, False), (ddp, opt, True)]
    names = ["no_sync", "zero"]
    if a.zerod:
        sys.path.insert(0, a.pythonpath)
        from zerod.torch import ZerodOptimizer
        torch.manual_seed(0)  # the same initial model as torch's
        model_z, _ = make_model(a)
        ddp_z = DDP(model_z, bucket_cap_mb=a.bucket_cap_mb)
        opt_z = ZerodOptimizer(ddp_z, cls, **kw)
        kinds.append((ddp_z, opt_z, True))
        names.append("zerod")
        if a.zerod_shared:
            torch.manual_seed(0)
            model_s, _ = make_model(a)
            ddp_s = DDP(model_s, bucket_cap_mb=a.bucket_cap_mb)
            opt_s = ZerodOptimizer(ddp_s, cls, shared_params=True, **kw)
            kinds.append((ddp_s, opt_s, True))
            names.append("zerod_shared")
    if a.plain:
        for gabv in (False, True):
            torch.manual_seed(0)
            model_p, _ = make_model(a)
            ddp_p = DDP(model_p, bucket_cap_mb=a.bucket_cap_mb, gradient_as_bucket_view=gabv)
            for fe in (False, True):
                kinds.append((ddp_p, cls(ddp_p.parameters(), **kw, **({"foreach": True} if fe else {})), True))
                names.append("plain" + ("_gabv" if gabv else "") + ("_foreach" if fe else ""))
    torch.manual_seed(1 + rank)  # different data per rank
    x = torch.randn(*shape)

    def iteration(model, optim, sync):
        optim.zero_grad()
        if sync:
            model(x).square().mean().backward()
            optim.step()
        else:
            with model.no_sync():
                model(x).square().mean().backward()

    n = a.warmup + a.iters
    times = torch.zeros(len(kinds), n, dtype=torch.float64)
    for i in range(n):
        # (not `model`: that name is ZeRO's model, compared with zerod's below)
        for k, (m, optim, sync) in enumerate(kinds):
            dist.barrier()
            t0 = time.perf_counter()
            iteration(m, optim, sync)
            times[k, i] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    extra = {}
    if a.zerod:
        # after the run: zerod's parameters must be torch's (the same model,
        # data and optimizer), else the times compare different work
        diff = max((p - q).abs().max().item()
                   for p, q in zip(model.parameters(), model_z.parameters()))
        zsynced = statistics.median(times[names.index("zerod"), a.warmup:].tolist()) * 1e3
        extra = {"torch_zerod_synced_ms": round(zsynced, 3), "torch_zerod_max_diff": diff}
        opt_z.close()
        if a.zerod_shared:
            extra["torch_zerod_shared_max_diff"] = max(
                (p - q).abs().max().item()
                for p, q in zip(model.parameters(), model_s.parameters()))
            extra["torch_zerod_shared_synced_ms"] = round(statistics.median(
                times[names.index("zerod_shared"), a.warmup:].tolist()) * 1e3, 3)
            opt_s.close()
    if rank == 0:
        compute = statistics.median(times[0, a.warmup:].tolist()) * 1e3
        synced = statistics.median(times[1, a.warmup:].tolist()) * 1e3
        if a.zerod:
            extra["torch_zerod_iter_ms"] = round(extra["torch_zerod_synced_ms"] - compute, 3)
            if a.zerod_shared:
                extra["torch_zerod_shared_iter_ms"] = round(
                    extra["torch_zerod_shared_synced_ms"] - compute, 3)
            extra["vs_torch_zerod"] = round((synced - compute) / extra["torch_zerod_iter_ms"], 3) \
                if extra["torch_zerod_iter_ms"] > 0 else None
        plain = {}
        for k, name in enumerate(names):
            if name.startswith("plain"):
                m = statistics.median(times[k, a.warmup:].tolist()) * 1e3
                plain[name] = round(m - compute, 3)
                extra[f"torch_{name}_iter_ms"] = plain[name]
        if plain:
            best = min(plain, key=plain.get)
            extra["torch_plain_best"] = best
            extra["torch_plain_best_ms"] = plain[best]
        print(json.dumps({
            **extra,
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


def allreduce_worker(rank, a, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.world))
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    numel = a.bucket_numel or -(-a.params // a.layers)
    buf = torch.full((a.params,), 1e-3 * (rank + 1), dtype=torch.float32)
    buckets = [buf[o:o + numel] for o in range(0, a.params, numel)]
    n = a.warmup + a.iters
    times = torch.zeros(n, dtype=torch.float64)
    for i in range(n):
        buf.fill_(1e-3 * (rank + 1))
        dist.barrier()
        t0 = time.perf_counter()
        for b in buckets:
            dist.all_reduce(b)
        times[i] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({
            "torch_gloo_allreduce_ms": round(statistics.median(times[a.warmup:].tolist()) * 1e3, 3),
            "torch_gloo_allreduce_min_ms": round(min(times[a.warmup:].tolist()) * 1e3, 3),
            "buckets": len(buckets),
            "world": a.world,
            "torch_version": torch.__version__,
        }), flush=True)
    dist.destroy_process_group()


def cuda_worker(a, port):
    if not torch.cuda.is_available():
        print(json.dumps({"not_run": "not run: torch for %s sees no CUDA device" % sys.executable}),
              flush=True)
        return
    from torch.distributed.algorithms.ddp_comm_hooks import ddp_zero_hook
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    sys.path.insert(0, a.pythonpath)
    from zerod.torch import ZerodOptimizer
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl", rank=0, world_size=1)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    cls, kw = optimizer_kwargs(a)
    torch.manual_seed(0)
    model, shape = make_model(a)
    model = model.to(dev)
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=a.bucket_cap_mb)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=cls, overlap_with_ddp=True,
                                   **kw)
    ddp.register_comm_hook(None, ddp_zero_hook.hook_with_zero_step(allreduce_hook, ddp, zero))
    torch.manual_seed(0)
    model_z, _ = make_model(a)
    model_z = model_z.to(dev)
    ddp_z = DDP(model_z, device_ids=[0], bucket_cap_mb=a.bucket_cap_mb)
    opt_z = ZerodOptimizer(ddp_z, cls, **kw)
    x = torch.randn(*shape, device=dev)

    def nosync():
        with ddp.no_sync():
            ddp(x).square().mean().backward()
        zero.zero_grad(set_to_none=True)

    def zero_it():
        ddp(x).square().mean().backward()  # torch's step runs in the hook
        zero.zero_grad(set_to_none=True)

    def zerod_it():
        opt_z.zero_grad()
        ddp_z(x).square().mean().backward()
        opt_z.step()

    kinds = [nosync, zero_it, zerod_it]
    warm = max(a.warmup, 4)  # torch's overlap mode steps only after DDP's rebuild
    times = [[] for _ in kinds]
    for i in range(warm + a.iters):
        for k, fn in enumerate(kinds):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            if i >= warm:
                times[k].append(time.perf_counter() - t0)
    opt_z.close()
    m = [statistics.median(t) * 1e3 for t in times]
    print(json.dumps({
        "torch_cuda_compute_ms": round(m[0], 3),
        "torch_cuda_zero_overlap_ms": round(m[1] - m[0], 3),
        "torch_cuda_zerod_ms": round(m[2] - m[0], 3),
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name(0),
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
    p.add_argument("--zerod", help="also run ZerodOptimizer on this zerod binary")
    p.add_argument("--libzeroclient", help="libzeroclient.so.1 for it")
    p.add_argument("--zerod-shared", action="store_true",
                   help="with --zerod: also ZerodOptimizer(shared_params=True)")
    p.add_argument("--pythonpath", help="the directory holding the zerod package",
                   default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "client", "python"))
    p.add_argument("--plain", action="store_true",
                   help="also DDP + plain torch.optim (default, foreach, gradient_as_bucket_view)")
    p.add_argument("--allreduce-only", action="store_true",
                   help="only torch's gloo all_reduce of the buckets (zerod-bench --daemons)")
    p.add_argument("--bucket-numel", type=int, default=0)
    p.add_argument("--cuda", action="store_true",
                   help="world 1 on cuda:0: ZeRO(overlap_with_ddp=True) vs ZerodOptimizer")
    a = p.parse_args()
    if a.cuda and not torch.cuda.is_available():
        print(json.dumps({"not_run": "not run: torch for %s sees no CUDA device"
                          % sys.executable}), flush=True)
        return 0
    if a.allreduce_only:
        mp.spawn(allreduce_worker, args=(a, free_port()), nprocs=a.world, join=True)
        return 0
    if not a.zerod:
        mp.spawn(worker, args=(a, free_port()), nprocs=a.world, join=True)
        return 0
    run = tempfile.mkdtemp(prefix="zerod-anchor-")
    log = open(os.path.join(run, "zerod.log"), "w")
    sock = os.path.join(run, "zerod.sock")
    backend = ["--backend", "cuda"] if a.cuda else []
    zerod = subprocess.Popen([a.zerod, "--socket", sock] + backend, stdout=log, stderr=log)
    try:
        for _ in range(400):
            if os.path.exists(sock) or zerod.poll() is not None:
                break
            time.sleep(0.025)
        if not os.path.exists(sock):
            raise RuntimeError("zerod did not start: " + open(log.name).read())
        os.environ["ZEROD_SOCKET"] = sock
        if a.libzeroclient:
            os.environ["ZEROD_LIBZEROCLIENT"] = a.libzeroclient
        if a.cuda:
            cuda_worker(a, free_port())
        else:
            mp.spawn(worker, args=(a, free_port()), nprocs=a.world, join=True)
    finally:
        zerod.send_signal(signal.SIGTERM)
        try:
            zerod.wait(timeout=10)
        except subprocess.TimeoutExpired:
            zerod.kill()
            zerod.wait()
        shutil.rmtree(run, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
