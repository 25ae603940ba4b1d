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


CASES = {
    "bucket-views-over-libzeroclient-offsets-are-the-parameters": dict(world=2, what="views"),
    "bucket-views-bf16-fp16-typed-at-their-offsets": dict(world=1, what="lowp"),
    "cuda-calls-on-host-buffers-refused-job-goes-on": dict(world=2, what="bindings",
                                                           needs="cuda"),
    "cuda-buffers-without-a-cuda-runtime-enotsup": dict(world=1, what="noruntime",
                                                        needs="cuda"),
}


def rank_main(name, cfg, rank, world):
    what = cfg["what"]
    if what == "views":
        return views_are_the_parameters(rank)
    if what == "lowp":
        return lowp_views(rank)
    if what == "bindings":
        return bindings_on_host_buffers(rank)
    return cuda_buffers_without_runtime(rank)


if __name__ == "__main__":
    harness.main(CASES, rank_main)
