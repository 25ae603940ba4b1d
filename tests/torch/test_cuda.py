#!/usr/bin/python3
"""The CUDA path of ZerodOptimizer, where this machine can check it (Debian's
torch is CPU-only and there is no GPU): the pure parts on the CPU. The run on
a GPU is tests/gpu/torch_cuda.py, in tests/gpu/run.

- bucket_views() with libzeroclient's bucket offsets (zc_param_ptr) over a
  byte view of the CPU path's own buffer lands on exactly the memory the CPU
  path's parameters are views of: the CUDA path builds its parameter views
  the same way over a device byte tensor.
- bucket_views() types bf16 and fp16 buckets as the CUDA path does for a
  bf16/fp16 model: each view of its dtype at its byte offset, misaligned
  offsets refused.
- The CUDA bindings reach libzeroclient with the right types: on host buffers
  zc_bucket_ready_cuda and zc_step_wait_cuda refuse with ZC_ESTATE (and the
  job trains on), and ZC_BUFFERS_CUDA buffers with no CUDA runtime in the
  process ($ZEROD_CUDART names none) are ZC_ENOTSUP (a zc_buffers of the
  wrong layout would be read as host buffers and refused for their fds).
- ZerodOptimizer's CUDA path itself, on the CUDA test double
  (tests/gpu/cudadouble.c: zerod-double --backend cuda, and the double as
  libzeroclient's CUDA runtime): a subclass only says where device memory
  and streams come from (the double's cudaMalloc, wrapped as CPU tensors, and
  a stream of the double's); everything else is torch.py's CUDA code: the
  parameters views into registered CUDA buffers, the hook's
  zc_bucket_ready_cuda(), zc_step_wait_cuda(), and after DDP's bucket
  rebuild a re-plan onto new device buffers (new IPC handles and event
  rings) with the state moved by param_id. DDP + it against DDP + plain
  torch.optim within the oracle's tolerance, both shard modes.
"""
import ctypes

import torch
import torch.distributed as dist

import harness
from oracle import make, one_iter


def expect_zerod_error(fn, name, words):
    from zerod._lib import ZerodError
    try:
        fn()
    except ZerodError as e:
        assert e.name == name and all(w in e.reason for w in words), str(e)
        return str(e)
    raise AssertionError(f"no error (expected {name} naming {words})")


def check_views(opt):
    """bucket_views() over the parameter buffer's bytes at libzeroclient's
    offsets (the CUDA path's arithmetic: zc_param_ptr(b) less the buffer's
    start) are the very memory of the CPU path's parameters."""
    from zerod.torch import bucket_views
    c = opt.client
    nbytes = c.buffer_bytes(c.plan)
    start = c.lib.fn("zc_param_ptr")(c.h, 0)
    if c.own is not None:  # our own mapping of the memfd (the parameters' storage)
        mem = torch.frombuffer(c.own, dtype=torch.uint8)[c._param_off:c._param_off + nbytes]
    else:  # the library's
        mem = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(start),
                               dtype=torch.uint8)
    c.cuda = (None, start)
    try:
        offsets = [c.param_offset(b) for b in range(len(opt._layout))]
    finally:
        c.cuda = None
    assert offsets[0] == 0 and offsets == sorted(offsets), offsets
    numels = [sum(p.numel() for p in ps) for _, ps, _ in opt._layout]
    views = bucket_views(mem, offsets, numels, [torch.float32] * len(numels))
    checked = 0
    for b, (_, ps, _) in enumerate(opt._layout):
        off = 0
        for p in ps:
            v = views[b][off:off + p.numel()]
            assert v.data_ptr() == p.data_ptr(), (b, off)
            assert torch.equal(v, p.detach().reshape(-1))
            off += p.numel()
            checked += 1
    try:
        bucket_views(mem, [nbytes - 4], [2], [torch.float32])
        raise AssertionError("bucket_views took a bucket past the buffer's end")
    except ValueError as e:
        assert "does not fit" in str(e), e
    return len(offsets), checked


def lowp_views(rank):
    """bucket_views() over one byte tensor with fp32, bf16 and fp16 buckets
    (a mixed model's layout): each view has its dtype, starts at its byte
    offset and writes land in exactly its bytes."""
    from zerod.torch import bucket_views
    mem = torch.zeros(256, dtype=torch.uint8)
    offs, numels = [0, 64, 128], [10, 7, 9]
    dts = [torch.float32, torch.bfloat16, torch.float16]
    views = bucket_views(mem, offs, numels, dts)
    for v, off, n, dt in zip(views, offs, numels, dts):
        assert v.dtype == dt and v.numel() == n, (v.dtype, v.numel())
        assert v.data_ptr() == mem.data_ptr() + off, (dt, off)
        v.fill_(1.5)
    for v, off, n, dt in zip(views, offs, numels, dts):
        size = torch.empty(0, dtype=dt).element_size()
        want = torch.full((n,), 1.5, dtype=dt).view(torch.uint8)
        assert torch.equal(mem[off:off + n * size], want), dt
    assert int(mem[40:64].sum()) == 0 and int(mem[78:128].sum()) == 0
    try:
        bucket_views(mem, [65], [2], [torch.bfloat16])
        raise AssertionError("bucket_views took a misaligned bf16 bucket")
    except ValueError as e:
        assert "does not fit" in str(e), e
    return {"buckets": [str(d) for d in dts]}


def allocator_without_ipc(rank):
    """torch allocator settings whose memory CUDA IPC cannot export are named
    (ZerodOptimizer then refuses CUDA parameters with it); others pass."""
    import os
    from zerod.torch import _allocator_without_ipc
    seen = {}
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for conf, refused in (("expandable_segments:True", True),
                              ("max_split_size_mb:128, expandable_segments:True", True),
                              ("backend:cudaMallocAsync", True),
                              ("expandable_segments:False", False),
                              ("max_split_size_mb:128", False), ("", False)):
            for v in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
                os.environ.pop(v, None)
            os.environ[var] = conf
            why = _allocator_without_ipc()
            assert (why is not None) == refused, (var, conf, why)
            assert why is None or why.startswith(var + "="), why
            seen[f"{var}={conf}"] = why is not None
    return {"refused": sorted(k for k, v in seen.items() if v)}


def views_are_the_parameters(rank):
    cfg = dict(opt="adam", hyper={"lr": 0.01})
    ddp, opt, _, _ = make(cfg, rank)
    first = check_views(opt)
    for it in range(3):  # DDP rebuilds its buckets: a re-plan, several buckets
        one_iter(ddp, opt, None, rank, it, cfg)
    later = check_views(opt)
    assert later[0] > 1, later
    opt.close()
    dist.barrier()
    return {"first_plan": {"buckets": first[0], "params": first[1]},
            "after_rebuild": {"buckets": later[0], "params": later[1]}}


def bindings_on_host_buffers(rank):
    cfg = dict(opt="sgd", hyper={"lr": 0.05, "momentum": 0.9})
    ddp, opt, _, _ = make(cfg, rank)
    one_iter(ddp, opt, None, rank, 0, cfg)
    c = opt.client
    m1 = expect_zerod_error(lambda: c.bucket_ready_cuda(0, 0), "ZC_ESTATE", ["not CUDA buffers"])
    f = c.step_future(0)  # iteration 0 is done (opt.step() waited for it)
    try:
        assert c.wait(f, 0) == 1
        m2 = expect_zerod_error(lambda: c.step_wait_cuda(f, 0), "ZC_ESTATE",
                                ["not CUDA buffers"])
    finally:
        c.free(f)
    for it in range(1, 4):  # the refusals changed nothing
        one_iter(ddp, opt, None, rank, it, cfg)
    opt.close()
    dist.barrier()
    return {"bucket_ready_cuda": m1[:80], "step_wait_cuda": m2[:80]}


def cuda_buffers_without_runtime(rank):
    import os
    from zerod.client import Client, Plan
    # the runtime is loaded at the first CUDA call: none is to be found
    os.environ["ZEROD_CUDART"] = "/nonexistent/libcudart.so.13"
    c = Client(0, 1, f"cudaless-{os.getpid()}", socket=os.environ["ZEROD_SOCKET"])
    try:
        plan = Plan("adam", "bucket", "interleaved", [{"lr": 0.01}], [[(0, 10, 1)]])
        n = c.buffer_bytes(plan)
        assert n >= 40, n
        msg = expect_zerod_error(lambda: c.register_cuda_buffers(plan, 1 << 40, 1 << 41),
                                 "ZC_ENOTSUP", ["no CUDA runtime", "/nonexistent/"])
        assert c.cuda is None and c.plan is None
    finally:
        c.close()
    return {"buffer_bytes": n, "error": msg[:120]}


def double_cuda(cfg, rank, world):
    """ZerodOptimizer's CUDA path over the double's device memory, against
    plain torch, with the re-plan after DDP's rebuild."""
    import copy
    import os

    import torch.nn as nn
    from oracle import OPTS, Net, data, max_diff
    from zerod.torch import ZerodOptimizer

    rt = ctypes.CDLL(os.environ["ZEROD_CUDART"])  # the instance libzeroclient loads
    stream = ctypes.c_void_p()
    assert rt.cudaSetDevice(rank % 4) == 0
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(stream), 1) == 0
    allocs = []

    class DoubleCuda(ZerodOptimizer):
        _DEVICE_BUFFERS = True

        def _device_bytes(self, n):
            ptr = ctypes.c_void_p()
            assert rt.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0
            allocs.append((ptr.value, n))
            return torch.frombuffer((ctypes.c_uint8 * n).from_address(ptr.value),
                                    dtype=torch.uint8)

        def _stream(self):
            return stream.value

        def _device_sync(self):
            assert rt.cudaStreamSynchronize(stream) == 0

    dist._DEFAULT_FIRST_BUCKET_BYTES = 1024  # several DDP buckets, small model
    torch.manual_seed(7)
    model = Net()
    ref = copy.deepcopy(model)
    ddp_z = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.002)
    ddp_r = nn.parallel.DistributedDataParallel(ref, bucket_cap_mb=0.002)
    cls = OPTS[cfg["opt"]]
    opt_z = DoubleCuda(ddp_z, cls, shard=cfg["shard"], step_mode=cfg["step_mode"],
                       **cfg["hyper"])
    opt_r = cls(ref.parameters(), **cfg["hyper"])
    first = [k for k, _, _ in opt_z._layout]
    worst = 0.0
    # the copies per gradient (issue 25 §2): DDP's reducer keeps each .grad
    # as its bucket's view (gradient_as_bucket_view, turned on), so the one
    # copy is the hook's, the bucket into zerod's device buffer; zerod
    # reduces that buffer in place (NCCL), so .grad is not made zerod's
    # memory on CUDA: a read of .grad before step() would race the reduction
    assert ddp_z.gradient_as_bucket_view and not opt_z._direct, \
        (ddp_z.gradient_as_bucket_view, opt_z._direct)
    views, hooks = [], [0]
    hook = opt_z._hook

    def counted(bucket):
        buf = bucket.buffer()
        lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()
        views.extend(p.grad is not None and lo <= p.grad.data_ptr() < hi
                     for p in bucket.parameters())
        hooks[0] += 1
        return hook(bucket)
    opt_z._hook = counted
    for it in range(10):
        for ddp, opt in ((ddp_z, opt_z), (ddp_r, opt_r)):
            x, y = data(rank, it)
            ((ddp(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        d, bad = max_diff(ddp_z, ddp_r)
        worst = max(worst, d)
        assert not bad, f"iteration {it}: {bad} differ (max |diff| {d:.3g})"
    # re-planned: a second pair of device buffers, DDP's buckets its plan
    # (not mapped onto the first), the parameters views into the new ones
    assert views and all(views), f"{views.count(False)} gradients DDP copied into its buckets"
    assert hooks[0] >= 10, hooks
    assert [k for k, _, _ in opt_z._layout] != first, "DDP kept its first buckets"
    assert opt_z._route is None, "the rebuilt buckets were mapped onto the first plan"
    assert len(allocs) == 4, allocs
    (pbase, n) = allocs[3]
    for p in model.parameters():
        assert pbase <= p.data_ptr() < pbase + n, "a parameter outside the new buffers"
    opt_z.close()
    dist.barrier()
    return {"iters": 10, "max_abs_diff": worst, "buckets": [len(first), len(opt_z._layout)]}


CASES = {
    "bucket-views-over-libzeroclient-offsets-are-the-parameters": dict(world=2, what="views"),
    "bucket-views-bf16-fp16-typed-at-their-offsets": dict(world=1, what="lowp"),
    "allocator-settings-without-cuda-ipc-named": dict(world=1, what="allocator"),
    "cuda-calls-on-host-buffers-refused-job-goes-on": dict(world=2, what="bindings",
                                                           needs="cuda"),
    "cuda-buffers-without-a-cuda-runtime-enotsup": dict(world=1, what="noruntime",
                                                        needs="cuda"),
    "cuda-path-on-the-double-replans-adam-bucket": dict(
        world=2, what="double", needs="cuda", double=True, opt="adam", shard="bucket",
        step_mode="interleaved", hyper={"lr": 0.01}),
    "cuda-path-on-the-double-replans-sgd-slice": dict(
        world=2, what="double", needs="cuda", double=True, opt="sgd", shard="slice",
        step_mode="at_end", hyper={"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
}


def rank_main(name, cfg, rank, world):
    what = cfg["what"]
    if what == "views":
        return views_are_the_parameters(rank)
    if what == "lowp":
        return lowp_views(rank)
    if what == "allocator":
        return allocator_without_ipc(rank)
    if what == "bindings":
        return bindings_on_host_buffers(rank)
    if what == "double":
        return double_cuda(cfg, rank, world)
    return cuda_buffers_without_runtime(rank)


if __name__ == "__main__":
    harness.main(CASES, rank_main)
