#!/usr/bin/python3
"""What ZerodOptimizer cannot do the torch way fails loudly, never silently
differs: clip_grad_norm_ / an edit of p.grad after backward (zerod consumed
the gradients), an lr change after backward began (zerod already stepped),
p.data replaced, add_param_group after construction; and what it does
support behaves as torch: opt.step() without a backward changes nothing,
gradients accumulate without zero_grad(); and backward writes the gradients
into zerod's buffers without a copy (direct-gradients-*)."""
import torch
import torch.distributed as dist

import harness
from oracle import compare, data, make, one_iter


def expect_raise(fn, words):
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        assert all(w in msg for w in words), msg
        return msg
    except NotImplementedError as e:
        msg = str(e)
        assert all(w in msg for w in words), msg
        return msg
    raise AssertionError(f"no error (expected one naming {words})")


def backward(ddp, rank, it):
    x, y = data(rank, it)
    ((ddp(x) - y) ** 2).mean().backward()


def misuse(name, rank):
    cfg = dict(opt="sgd", hyper={"lr": 0.05, "momentum": 0.9}, frozen=name == "unfreeze")
    ddp, opt, _, _ = make(cfg, rank)
    one_iter(ddp, opt, None, rank, 0, cfg)  # a normal iteration first
    one_iter(ddp, opt, None, rank, 1, cfg)  # (DDP rebuilt its buckets)
    if name in ("freeze", "unfreeze"):  # the next forward refuses
        ddp.module.a.weight.requires_grad_(name == "unfreeze")
        msg = expect_raise(lambda: backward(ddp, rank, 2),
                           ["a.weight", "was " + ("frozen" if name == "freeze" else "unfrozen"),
                            "build both again"])
        opt.close()
        dist.barrier()
        return {"error": msg[:100]}
    backward(ddp, rank, 2)
    if name == "clip_grad_norm_":
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.01)
        msg = expect_raise(opt.step, ["clip_grad_norm_", "max_grad_norm"])
    elif name == "grad-edit":
        next(ddp.parameters()).grad.mul_(0.5)
        msg = expect_raise(opt.step, ["gradients were changed after backward"])
    elif name == "lr-after-backward":
        opt.param_groups[0]["lr"] = 0.01
        msg = expect_raise(opt.step, ["param group 0", "changed after backward began"])
    elif name == "p.data-replaced":
        p = next(ddp.parameters())
        p.data = p.data.clone()
        msg = expect_raise(opt.step, ["storage was replaced"])
    elif name == "add_param_group":
        opt.step()
        msg = expect_raise(lambda: opt.add_param_group({"params": [torch.nn.Parameter(
            torch.zeros(2))]}), ["constructor"])
    opt.close()
    dist.barrier()
    return {"error": msg[:100]}


def peer_dies(rank):
    """Rank 1 exits between iterations; rank 0's next backward raises
    zerod's own ZerodError with the daemon's reason (not torch's cast
    error around it), and so does step(): ZC_ERANKLOST, recoverable (the
    job waits for the worker group's restart, tests/torch/test_torchrun.py)."""
    import os
    import time
    from zerod import ZerodError
    cfg = dict(opt="sgd", hyper={"lr": 0.05, "momentum": 0.9})
    ddp, opt, _, _ = make(cfg, rank)
    for it in range(2):
        one_iter(ddp, opt, None, rank, it, cfg)
    dist.barrier()
    if rank == 1:
        os._exit(0)  # no close(): zerod sees the process go
    time.sleep(0.5)
    try:
        backward(ddp, rank, 2)
        opt.step()
    except ZerodError as e:
        # the job waits for its restarted ranks (--rejoin-timeout): the
        # error says so, and that it is not the job's end
        assert e.name == "ZC_ERANKLOST" and "rank 1 (pid" in e.reason and \
            "--rejoin-timeout" in e.reason and e.recoverable, e
        assert "Unable to cast" not in str(e), e
        return {"error": str(e)[:120]}
    raise AssertionError("no ZerodError after rank 1 died")


def step_without_backward(rank):
    cfg = dict(opt="adam", hyper={"lr": 0.05})
    ddp, opt, _, _ = make(cfg, rank)
    one_iter(ddp, opt, None, rank, 0, cfg)
    before = [p.detach().clone() for p in ddp.parameters()]
    opt.step()
    opt.step()
    same = all(torch.equal(a, p.detach()) for a, p in zip(before, ddp.parameters()))
    assert same, "opt.step() without backward changed the parameters"
    opt.close()
    dist.barrier()
    return {"unchanged": True}


def own_buffers_outlive_close(rank):
    """One DDP bucket, which the rebuild keeps as it is: the whole run is on the
    first plan's buffers, a memfd this process mapped. The parameters are
    views into that mapping, zerod's steps land there, and close() leaves
    them there (their storage keeps the mapping), unchanged and usable."""
    import ctypes
    from zerod.torch import ZerodOptimizer
    torch.manual_seed(3)
    model = torch.nn.Linear(6, 3, bias=False)  # one parameter: DDP's rebuild keeps it
    ref = torch.nn.Linear(6, 3, bias=False)
    ref.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp_r = torch.nn.parallel.DistributedDataParallel(ref)
    opt = ZerodOptimizer(ddp, torch.optim.SGD, lr=0.1, momentum=0.9)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for it in range(4):
        x, _ = data(rank, it)
        for d, o in ((ddp, opt), (ddp_r, opt_r)):
            d(x[:, :6]).square().mean().backward()
            o.step()
            o.zero_grad()
    mm = opt.client.own
    assert mm is not None, "the buffers are not this process's (re-planned?)"
    lo = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    inside = [lo <= p.data_ptr() < lo + len(mm) for p in model.parameters()]
    assert all(inside), inside
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=harness.RTOL, atol=harness.ATOL), (p, q)
    before = [(p.data_ptr(), p.detach().clone()) for p in model.parameters()]
    opt.close()
    for (ptr, v), p in zip(before, model.parameters()):
        assert p.data_ptr() == ptr and torch.equal(p.detach(), v)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2)  # still ordinary, writable tensors
    dist.barrier()
    return {"own_buffers": len(mm), "params_in_them": len(inside)}


def direct_grads(cfg, rank):
    """Backward writes the gradients straight into zerod's gradient buffers:
    DDP (built without gradient_as_bucket_view) gets it turned on, and from
    the iteration after DDP's bucket rebuild on no .grad is copied into
    zerod's buffers (ZerodOptimizer._point, which copies, is not called),
    each .grad after backward is its place there, and the parameters stay
    torch's. set_to_none=True too: DDP's reducer then copies autograd's new
    gradient into its bucket view, which is zerod's buffer."""
    from oracle import max_diff
    ddp, opt, ddp_r, opt_r = make(cfg, rank)
    assert ddp.gradient_as_bucket_view and opt._direct, (ddp.gradient_as_bucket_view,
                                                         opt._direct)
    copies, placed = [], []
    point = opt._point
    opt._point = lambda p: (copies.append(p.shape), point(p))[1]
    hook = opt._hook

    def checked(bucket):  # after backward wrote this bucket's gradients
        placed.extend(p.grad is not None and p.grad.data_ptr() == opt._grad_ptr[id(p)]
                      for p in bucket.parameters())
        return hook(bucket)
    opt._hook = checked
    for it in range(6):
        if it == 2:  # DDP rebuilt its buckets at iteration 1's forward
            copies.clear()
            placed.clear()
        one_iter(ddp, opt, None, rank, it, cfg)
        one_iter(ddp_r, opt_r, None, rank, it, cfg)
        worst, bad = max_diff(ddp, ddp_r)
        assert not bad, (it, bad, worst)
    assert not copies, f"{len(copies)} gradients copied into zerod's buffers"
    assert placed and all(placed), placed
    opt.close()
    dist.barrier()
    return {"copied_after_rebuild": len(copies), "in_place": len(placed)}


def library_buffers(cfg, rank, world):
    import os
    os.environ["ZEROD_TORCH_BUFFERS"] = "library"
    res = compare(cfg, rank, world)
    return res


CASES = {
    "clip_grad_norm_-after-backward-raises": dict(world=2, what="clip_grad_norm_"),
    "grad-edit-after-backward-raises": dict(world=2, what="grad-edit"),
    "lr-change-after-backward-raises": dict(world=2, what="lr-after-backward"),
    "p.data-replaced-raises": dict(world=2, what="p.data-replaced"),
    "add_param_group-after-construction-raises": dict(world=2, what="add_param_group"),
    "freeze-after-construction-raises": dict(world=2, what="freeze"),
    "unfreeze-after-construction-raises": dict(world=2, what="unfreeze"),
    "peer-death-raises-ZerodError": dict(world=2, what="peer"),
    "step-without-backward-changes-nothing": dict(world=2, what="nobackward"),
    # torch's accumulation: zero_grad() every other iteration only
    "accumulate-without-zero_grad": dict(world=2, opt="sgd", iters=10, zero_grad_every=2,
                                         hyper={"lr": 0.05, "momentum": 0.9}),
    # the lr set by hand at the top of each iteration, as warm-up loops do
    "own-buffers-outlive-close": dict(world=2, what="own", needs="own_buffers"),
    "library-buffers-from-the-start-adam-w2": dict(world=2, opt="adam", iters=10,
                                                   what="library",
                                                   hyper={"lr": 0.01, "amsgrad": True}),
    # the gradients are zerod's buffers: no copy once DDP rebuilt its buckets
    "direct-gradients-zero_grad": dict(world=2, opt="adam", what="direct", set_to_none=False,
                                       hyper={"lr": 0.01}),
    "direct-gradients-set_to_none": dict(world=2, opt="adamw", what="direct",
                                         set_to_none=True, hyper={"lr": 0.01}),
    "manual-lr-each-iteration": dict(world=2, opt="adamw", iters=10, manual_lr=True,
                                     hyper={"lr": 0.01, "weight_decay": 0.01}),
}


def rank_main(name, cfg, rank, world):
    what = cfg.get("what")
    if what == "peer":
        return peer_dies(rank)
    if what == "nobackward":
        return step_without_backward(rank)
    if what == "own":
        return own_buffers_outlive_close(rank)
    if what == "direct":
        return direct_grads(cfg, rank)
    if what == "library":
        return library_buffers(cfg, rank, world)
    if what:
        return misuse(what, rank)
    return compare(cfg, rank, world)


if __name__ == "__main__":
    harness.main(CASES, rank_main)
