#!/usr/bin/python3
"""What ZerodOptimizer cannot do the torch way fails loudly, never silently
differs: clip_grad_norm_ / an edit of p.grad after backward (zerod consumed
the gradients), an lr change after backward began (zerod already stepped),
p.data replaced, add_param_group after construction; and what it does
support behaves as torch: opt.step() without a backward changes nothing,
gradients accumulate without zero_grad()."""
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
    cfg = dict(opt="sgd", hyper={"lr": 0.05, "momentum": 0.9})
    ddp, opt, _, _ = make(cfg, rank)
    one_iter(ddp, opt, None, rank, 0, cfg)  # a normal iteration first
    one_iter(ddp, opt, None, rank, 1, cfg)  # (DDP rebuilt its buckets)
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


CASES = {
    "clip_grad_norm_-after-backward-raises": dict(world=2, what="clip_grad_norm_"),
    "grad-edit-after-backward-raises": dict(world=2, what="grad-edit"),
    "lr-change-after-backward-raises": dict(world=2, what="lr-after-backward"),
    "p.data-replaced-raises": dict(world=2, what="p.data-replaced"),
    "add_param_group-after-construction-raises": dict(world=2, what="add_param_group"),
    "step-without-backward-changes-nothing": dict(world=2, what="nobackward"),
    # torch's accumulation: zero_grad() every other iteration only
    "accumulate-without-zero_grad": dict(world=2, opt="sgd", iters=10, zero_grad_every=2,
                                         hyper={"lr": 0.05, "momentum": 0.9}),
    # the lr set by hand at the top of each iteration, as warm-up loops do
    "manual-lr-each-iteration": dict(world=2, opt="adamw", iters=10, manual_lr=True,
                                     hyper={"lr": 0.01, "weight_decay": 0.01}),
}


def rank_main(name, cfg, rank, world):
    what = cfg.get("what")
    if what == "nobackward":
        return step_without_backward(rank)
    if what:
        return misuse(what, rank)
    return compare(cfg, rank, world)


if __name__ == "__main__":
    harness.main(CASES, rank_main)
