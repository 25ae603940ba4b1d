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
Last, parity with PyTorch's own ZeroRedundancyOptimizer(overlap_with_ddp=True)
at world 1 (issue 9 §6), through its hook_with_zero_step (ZERO_CASES says why
not the interleaved one): torch's overlap mode makes no update in its
first iterations (until DDP has rebuilt its buckets); ZerodOptimizer steps
every one. So each zerod iteration is given the batch of an iteration that
torch did step, from the same starting parameters, and the parameters must
agree after each within rtol 1e-5, atol 1e-6; it prints how many iterations
torch dropped.
libzeroclient loads the CUDA runtime torch already loaded (libcudart.so.13)
unless $ZEROD_CUDART names another.

ZEROD_TORCH_CUDA_DRYRUN=1 runs the same cases on the CPU (gloo, zerod's host
backend, no CUDA buffers), so the script's own logic is checked on machines
with no GPU (meson test torch-gpu-script, with any torch): that is not the GPU
check. torch's overlapped hooks refuse gloo (it may hang with several ranks);
the dry run, at world 1, lets them run.

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
import traceback

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "client", "python"))
RTOL, ATOL, ITERS = 1e-5, 1e-6, 12

# torch's default allocator: under expandable segments or cudaMallocAsync
# (set on some machines) CUDA IPC cannot export its memory, and
# ZerodOptimizer refuses CUDA parameters, naming the setting
for _var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
    os.environ.pop(_var, None)

try:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
except ImportError as e:
    print(f"1..0 # SKIP no torch for {sys.executable}: {e}")
    sys.exit(77)
DRY = os.environ.get("ZEROD_TORCH_CUDA_DRYRUN") == "1"
if not DRY and not torch.cuda.is_available():
    print("1..0 # SKIP torch sees no GPU")
    sys.exit(77)
DEV = torch.device("cpu") if DRY else torch.device("cuda", 0)
DDP_KW = {} if DRY else dict(device_ids=[0])
KIND = "host" if DRY else "CUDA"


class Skip(Exception):
    pass


def views_of_buffers(opt, model):
    """Asserts every parameter is a view into one of the registered parameter
    buffers (no copies); returns where those buffers are."""
    spans = [(b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()) for b in opt._pbufs]
    for n, p in model.named_parameters():
        assert p.device == DEV and any(lo <= p.data_ptr() < hi for lo, hi in spans), \
            f"{n} is not a view into the registered parameter buffers"
    return spans


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
    dev = DEV
    dist._DEFAULT_FIRST_BUCKET_BYTES = first_bucket
    torch.manual_seed(7)
    model = Net().to(dev)
    ref = copy.deepcopy(model)
    kw = dict(DDP_KW, bucket_cap_mb=0.01)  # several DDP buckets
    ddp_z, ddp_r = nn.parallel.DistributedDataParallel(model, **kw), \
        nn.parallel.DistributedDataParallel(ref, **kw)
    opt_z = ZerodOptimizer(ddp_z, cls, groups(model), shard=shard, step_mode=step_mode,
                           socket=sock, job_id=f"torchcuda-{name}", **hyper)
    opt_r = cls(groups(ref), **hyper)
    sched = [torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5)
             for o in (opt_z, opt_r)] if "steplr" in name else []
    first = views_of_buffers(opt_z, model)
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
    # a re-plan's buffers, if DDP rebuilt its buckets
    replanned = views_of_buffers(opt_z, model) != first
    assert opt_z._route is None, "DDP's rebuilt buckets were mapped onto the first plan"
    route = f"re-planned onto new {KIND} buffers" if replanned else "one plan"
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


def lowp_on_cpu(dtype):
    """Why this torch cannot run a model of dtype on the CPU over gloo (torch
    1.x: no fp16 matmul, no bf16 broadcast), or None."""
    try:
        m = nn.Linear(2, 2).to(dtype)
        m(torch.ones(1, 2, dtype=dtype)).sum().backward()
        dist.broadcast(m.weight.detach().clone(), 0)
    except RuntimeError as e:
        return f"torch {torch.__version__} on the CPU: {e}"
    return None


def run_lowp_case(name, dtype, cls, hyper, shard, step_mode, sock):
    from zerod.torch import ZerodOptimizer
    why = lowp_on_cpu(dtype) if DRY else None
    if why:
        raise Skip(why)
    dev = DEV
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1024
    torch.manual_seed(7)
    model = Net().to(dev, dtype)
    ref = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    ddp_z = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01, **DDP_KW)
    opt_z = ZerodOptimizer(ddp_z, cls, groups(model), shard=shard, step_mode=step_mode,
                           socket=sock, job_id=f"torchcuda-{name}", **hyper)
    names = [n for n, _ in model.named_parameters()]
    decay = [ref[i] for i, n in enumerate(names) if n.endswith("weight")]
    nodecay = [ref[i] for i, n in enumerate(names) if n.endswith("bias")]
    opt_r = cls([{"params": decay}, {"params": nodecay, "weight_decay": 0.0}], **hyper)
    first = views_of_buffers(opt_z, model)
    assert all(p.dtype == dtype for p in model.parameters()), "a parameter changed its dtype"
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
    replanned = views_of_buffers(opt_z, model) != first
    nb = len(opt_z._layout)
    opt_z.close()
    route = ", re-planned (masters moved)" if replanned else ""
    return f"{ITERS} iterations, {nb} zerod {dtype} buckets{route}, largest difference " \
        f"{worst:.3g} ulp"


# torch's overlapped step through hook_with_zero_step. Its other hook,
# hook_with_zero_step_interleaved, steps the same way bucket by bucket in the
# all-reduces' callbacks, and races where those run on several threads (it
# counts a bucket as seen before broadcasting it; on gloo's threads, the dry
# run, an iteration then fails "Missing at least one broadcast handle"), so
# the parity is taken through the first.
ZERO_CASES = [
    ("zero-overlap-adamw-bucket-at_end", torch.optim.AdamW,
     dict(lr=0.01, weight_decay=0.01), "bucket", "at_end", "hook_with_zero_step"),
    ("zero-overlap-sgd-momentum-slice-interleaved", torch.optim.SGD,
     dict(lr=0.05, momentum=0.9), "slice", "interleaved", "hook_with_zero_step"),
]


def run_zero_case(name, cls, hyper, shard, step_mode, hook_name, sock):
    """DDP + ZeroRedundancyOptimizer(overlap_with_ddp=True) with torch's own
    overlapped hook against DDP + ZerodOptimizer, world 1."""
    from torch.distributed.algorithms.ddp_comm_hooks import ddp_zero_hook
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from zerod.torch import ZerodOptimizer
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1024
    torch.manual_seed(7)
    model = Net().to(DEV)
    ref = copy.deepcopy(model)
    kw = dict(DDP_KW, bucket_cap_mb=0.01)
    ddp_r = nn.parallel.DistributedDataParallel(ref, **kw)
    zero = ZeroRedundancyOptimizer(ref.parameters(), optimizer_class=cls,
                                   overlap_with_ddp=True, **hyper)
    hook = getattr(ddp_zero_hook, hook_name)
    if DRY:  # torch refuses gloo here for fear of hangs with several ranks; world 1 has none
        real = dist.get_backend
        dist.get_backend = lambda group=None: "nccl"
        try:
            ddp_r.register_comm_hook(None, hook(allreduce_hook, ddp_r, zero))
        finally:
            dist.get_backend = real
    else:
        ddp_r.register_comm_hook(None, hook(allreduce_hook, ddp_r, zero))
    ddp_z = nn.parallel.DistributedDataParallel(model, **kw)
    opt_z = ZerodOptimizer(ddp_z, cls, model.parameters(), shard=shard,
                           step_mode=step_mode, socket=sock, job_id=f"torchcuda-{name}",
                           **hyper)
    dropped, stepped, worst = 0, 0, 0.0
    for it in range(ITERS + 4):
        g = torch.Generator().manual_seed(2000 + it)
        x = torch.randn(32, 16, generator=g).to(DEV)
        y = torch.randn(32, 8, generator=g).to(DEV)
        before = [p.detach().clone() for p in ref.parameters()]
        ((ddp_r(x) - y) ** 2).mean().backward()  # torch's step runs in the hook
        zero.zero_grad(set_to_none=True)
        if all(torch.equal(b, p.detach()) for b, p in zip(before, ref.parameters())):
            if stepped:
                raise AssertionError(f"iteration {it}: torch's overlapped ZeRO made no update "
                                     f"after it had started stepping")
            dropped += 1  # torch's warm-up: zerod skips this batch too
            continue
        stepped += 1
        ((ddp_z(x) - y) ** 2).mean().backward()
        opt_z.step()
        opt_z.zero_grad(set_to_none=True)
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            worst = max(worst, (p.detach() - q.detach()).abs().max().item())
            if not torch.allclose(p.detach(), q.detach(), rtol=RTOL, atol=ATOL):
                raise AssertionError(f"torch's step {stepped}: {n} differs, largest |diff| "
                                     f"{(p.detach() - q.detach()).abs().max().item():.3g}")
    if stepped < ITERS - 2:
        raise AssertionError(f"torch's overlapped ZeRO stepped only {stepped} of "
                             f"{ITERS + 4} iterations")
    opt_z.close()
    return f"{stepped} steps against {hook_name}, which dropped its first {dropped} " \
        f"iterations (zerod steps every one), largest |diff| {worst:.3g}"


def main():
    zerod = os.environ.get("ZEROD_BIN") or os.path.join(TOP, "build-gpu", "daemon", "zerod")
    os.environ.setdefault("ZEROD_LIBZEROCLIENT",
                          os.path.join(os.path.dirname(os.path.dirname(zerod)), "client",
                                       "libzeroclient.so.1"))
    run = tempfile.mkdtemp(prefix="zerod-torchcuda-")
    sock = os.path.join(run, "zerod.sock")
    log = open(os.path.join(run, "zerod.log"), "w")
    d = subprocess.Popen([zerod, "--socket", sock, "--backend", "host" if DRY else "cuda"],
                         stdout=log, stderr=log)
    failed = 0
    try:
        # a cold driver (no persistence daemon) makes zerod's first
        # context slow: up to 60 s
        for _ in range(2400):
            if os.path.exists(sock) or d.poll() is not None:
                break
            time.sleep(0.025)
        if not os.path.exists(sock):
            print(f"1..0 # zerod --backend {KIND.lower()} did not start:\n" +
                  open(log.name).read()[-2000:])
            return 1
        if not DRY:
            torch.cuda.set_device(0)
        dist.init_process_group("gloo" if DRY else "nccl",
                                init_method="file://" + os.path.join(run, "store"),
                                rank=0, world_size=1)
        runs = [(c, run_case) for c in CASES] + [(c, run_lowp_case) for c in LOWP_CASES] + \
            [(c, run_zero_case) for c in ZERO_CASES]
        print(f"1..{len(runs)}" + (" # dry run on the CPU: not the GPU check" if DRY else ""),
              flush=True)
        for i, (case, fn) in enumerate(runs, 1):
            try:
                print(f"ok {i} - torch-cuda {case[0]} # {fn(*case, sock)}", flush=True)
            except Skip as e:
                print(f"ok {i} - torch-cuda {case[0]} # SKIP {e}", flush=True)
            except Exception as e:  # the next case still runs
                failed += 1
                print("# " + traceback.format_exc().rstrip().replace("\n", "\n# "))
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
