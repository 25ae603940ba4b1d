#!/usr/bin/env python3
"""tests/gpu/torch_cuda.py — ZerodOptimizer on a GPU (issue 12 §3), run by
tests/gpu/run: DDP + ZerodOptimizer against DDP + torch.optim in one process,
world size 1 (NCCL refuses two ranks on one GPU), the model on cuda:0.

zerod runs with --backend cuda; ZerodOptimizer's buffers are device tensors
registered over CUDA IPC (ZC_BUFFERS_CUDA), its hook copies DDP's bucket on
the current stream and hands it over with zc_bucket_ready_cuda(), and step()
orders the stream after zerod's writes with zc_step_wait_cuda(). Checked:
the parameters are views into the registered parameter buffer (no copies)
and, after every iteration, agree with plain torch within rtol 1e-5, atol
1e-6 (world 1: the average is the gradient); prints the largest difference.
Then a bf16 and an fp16 model (bf16/fp16 buckets, fp32 masters in zerod on
the device): the reference is torch's optimizer over fp32 copies stepped
with the model's widened gradients, rounded to the model's dtype; the
parameters must equal it within one unit in the last place of their dtype
(the masters' kernel arithmetic may differ from torch's in the last fp32
bits, which rounding almost always hides).
libzeroclient loads the CUDA runtime torch already loaded (libcudart.so.13)
unless $ZEROD_CUDART names another.

    ZEROD_BIN=build-gpu/daemon/zerod \\
    ZEROD_LIBZEROCLIENT=build-gpu/client/libzeroclient.so.1 python3 tests/gpu/torch_cuda.py

TAP on stdout; exit 77 without torch or a GPU.
"""
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "client", "python"))
RTOL, ATOL, ITERS = 1e-5, 1e-6, 12

try:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
except ImportError as e:
    print(f"1..0 # SKIP no torch for {sys.executable}: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("1..0 # SKIP torch sees no GPU")
    sys.exit(77)


class Net(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.a = nn.Linear(16, width)
        self.b = nn.Linear(width, width)
        self.c = nn.Linear(width, 8)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def groups(model):
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    nodecay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": decay}, {"params": nodecay, "weight_decay": 0.0}]


# name, optimizer, hyperparameters, shard, step mode, DDP's first bucket's
# bytes (torch's 1 MiB: one bucket, then several after DDP's rebuild, for
# which ZerodOptimizer re-plans onto new CUDA buffers, the state moving by
# param_id; 1 KiB: several from the start)
CASES = [
    ("adamw-bucket-interleaved-2groups-steplr", torch.optim.AdamW,
     dict(lr=0.01, weight_decay=0.01), "bucket", "interleaved", 1 << 20),
    ("adam-amsgrad-slice-at_end", torch.optim.Adam,
     dict(lr=0.01, amsgrad=True), "slice", "at_end", 1024),
    ("sgd-nesterov-bucket-interleaved", torch.optim.SGD,
     dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01), "bucket", "interleaved",
     1024),
]


def run_case(name, cls, hyper, shard, step_mode, first_bucket, sock):
    from zerod.torch import ZerodOptimizer
    dev = torch.device("cuda", 0)
    dist._DEFAULT_FIRST_BUCKET_BYTES = first_bucket
    torch.manual_seed(7)
    model = Net().to(dev)
    ref = copy.deepcopy(model)
    kw = dict(device_ids=[0], bucket_cap_mb=0.01)  # several DDP buckets
    ddp_z, ddp_r = nn.parallel.DistributedDataParallel(model, **kw), \
        nn.parallel.DistributedDataParallel(ref, **kw)
    opt_z = ZerodOptimizer(ddp_z, cls, groups(model), shard=shard, step_mode=step_mode,
                           socket=sock, job_id=f"torchcuda-{name}", **hyper)
    opt_r = cls(groups(ref), **hyper)
    sched = [torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5)
             for o in (opt_z, opt_r)] if "steplr" in name else []
    lo = opt_z._pmem.data_ptr()
    hi = lo + opt_z._pmem.numel()
    assert all(lo <= p.data_ptr() < hi for p in model.parameters()), \
        "a parameter is not a view into the registered parameter buffer"
    worst = 0.0
    for it in range(ITERS):
        g = torch.Generator().manual_seed(1000 + it)
        x = torch.randn(32, 16, generator=g).to(dev)
        y = torch.randn(32, 8, generator=g).to(dev)
        for d, o in ((ddp_z, opt_z), (ddp_r, opt_r)):
            ((d(x) - y) ** 2).mean().backward()
            o.step()
            o.zero_grad(set_to_none=True)
        for s in sched:
            s.step()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            worst = max(worst, (p.detach() - q.detach()).abs().max().item())
            if not torch.allclose(p.detach(), q.detach(), rtol=RTOL, atol=ATOL):
                raise AssertionError(f"iteration {it}: {n} differs, largest |diff| "
                                     f"{(p.detach() - q.detach()).abs().max().item():.3g}")
    lo2 = opt_z._pmem.data_ptr()  # a re-plan's buffers, if DDP rebuilt its buckets
    hi2 = lo2 + opt_z._pmem.numel()
    assert all(lo2 <= p.data_ptr() < hi2 for p in model.parameters()), \
        "a parameter is not a view into the registered parameter buffer"
    assert opt_z._route is None, "DDP's rebuilt buckets were mapped onto the first plan"
    route = "re-planned onto new CUDA buffers" if lo2 != lo else "one plan"
    nb = len(opt_z._layout)
    opt_z.close()
    return f"{ITERS} iterations, {nb} zerod buckets ({route} after DDP's rebuild), " \
        f"largest |diff| {worst:.3g}"


LOWP_CASES = [
    ("bf16-adamw-bucket-interleaved", torch.bfloat16, torch.optim.AdamW,
     dict(lr=0.01, weight_decay=0.01), "bucket", "interleaved"),
    ("fp16-adam-slice-at_end", torch.float16, torch.optim.Adam,
     dict(lr=0.01), "slice", "at_end"),
]


def run_lowp_case(name, dtype, cls, hyper, shard, step_mode, sock):
    from zerod.torch import ZerodOptimizer
    dev = torch.device("cuda", 0)
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1024
    torch.manual_seed(7)
    model = Net().to(dev, dtype)
    ref = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    ddp_z = nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=0.01)
    opt_z = ZerodOptimizer(ddp_z, cls, groups(model), shard=shard, step_mode=step_mode,
                           socket=sock, job_id=f"torchcuda-{name}", **hyper)
    names = [n for n, _ in model.named_parameters()]
    decay = [ref[i] for i, n in enumerate(names) if n.endswith("weight")]
    nodecay = [ref[i] for i, n in enumerate(names) if n.endswith("bias")]
    opt_r = cls([{"params": decay}, {"params": nodecay, "weight_decay": 0.0}], **hyper)
    lo = opt_z._pmem.data_ptr()
    hi = lo + opt_z._pmem.numel()
    assert all(lo <= p.data_ptr() < hi and p.dtype == dtype for p in model.parameters()), \
        "a parameter is not a view of its dtype into the registered parameter buffer"
    eps = torch.finfo(dtype).eps
    worst = 0.0
    for it in range(ITERS):
        g = torch.Generator().manual_seed(1000 + it)
        x = torch.randn(32, 16, generator=g).to(dev, dtype)
        y = torch.randn(32, 8, generator=g).to(dev, dtype)
        ((ddp_z(x) - y) ** 2).float().mean().backward()
        for p, q in zip(model.parameters(), ref):  # world 1: the average is the gradient
            q.grad = p.grad.detach().float().clone()
        opt_z.step()
        opt_z.zero_grad(set_to_none=True)
        opt_r.step()
        opt_r.zero_grad(set_to_none=True)
        for n, p, q in zip(names, model.parameters(), ref):
            want = q.detach().to(dtype).float()
            ulps = ((p.detach().float() - want).abs() /
                    (want.abs().clamp_min(torch.finfo(dtype).tiny) * eps)).max().item()
            worst = max(worst, ulps)
            if ulps > 1.0:
                raise AssertionError(f"iteration {it}: {n} differs by {ulps:.3g} ulp of "
                                     f"{dtype} from the fp32 reference rounded")
    lo2 = opt_z._pmem.data_ptr()  # a re-plan's buffers, if DDP rebuilt its buckets
    hi2 = lo2 + opt_z._pmem.numel()
    assert all(lo2 <= p.data_ptr() < hi2 for p in model.parameters()), \
        "a parameter is not a view into the registered parameter buffer"
    nb = len(opt_z._layout)
    opt_z.close()
    route = ", re-planned (masters moved)" if lo2 != lo else ""
    return f"{ITERS} iterations, {nb} zerod {dtype} buckets{route}, largest difference " \
        f"{worst:.3g} ulp"


def main():
    zerod = os.environ.get("ZEROD_BIN") or os.path.join(TOP, "build-gpu", "daemon", "zerod")
    os.environ.setdefault("ZEROD_LIBZEROCLIENT",
                          os.path.join(os.path.dirname(os.path.dirname(zerod)), "client",
                                       "libzeroclient.so.1"))
    run = tempfile.mkdtemp(prefix="zerod-torchcuda-")
    sock = os.path.join(run, "zerod.sock")
    log = open(os.path.join(run, "zerod.log"), "w")
    d = subprocess.Popen([zerod, "--socket", sock, "--backend", "cuda"], stdout=log,
                         stderr=log)
    failed = 0
    try:
        for _ in range(400):
            if os.path.exists(sock) or d.poll() is not None:
                break
            time.sleep(0.025)
        if not os.path.exists(sock):
            print("1..0 # zerod --backend cuda did not start:\n" +
                  open(log.name).read()[-2000:])
            return 1
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method="file://" + os.path.join(run, "store"),
                                rank=0, world_size=1)
        print(f"1..{len(CASES) + len(LOWP_CASES)}", flush=True)
        runs = [(c, run_case) for c in CASES] + [(c, run_lowp_case) for c in LOWP_CASES]
        for i, (case, fn) in enumerate(runs, 1):
            try:
                print(f"ok {i} - torch-cuda {case[0]} # {fn(*case, sock)}", flush=True)
            except Exception as e:  # the next case still runs
                failed += 1
                print(f"not ok {i} - torch-cuda {case[0]} # {type(e).__name__}: {e}",
                      flush=True)
        if failed:
            print("# zerod's log:\n# " + open(log.name).read()[-3000:].replace("\n", "\n# "))
    finally:
        d.terminate()
        try:
            d.wait(timeout=10)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()
        shutil.rmtree(run, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no teardown of NCCL and zerod's client in an order that hangs
