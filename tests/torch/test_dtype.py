#!/usr/bin/python3
"""bf16 / fp16 parameters: a model in bf16 (fp16) gets bf16 (fp16) buckets,
zerod keeps fp32 masters. The reference is plain torch doing the same by
hand, in the same script: DDP over the same low-precision model with a comm
hook that sums the ranks' widened gradients in fp32, divides once and rounds
back (zeroclient.h's rule for low-precision buckets), fp32 master copies
stepped by torch.optim with the widened averaged gradient, and the
parameters set to the masters rounded (torch's .to() rounds to nearest
even, as zerod does). The parameters must then agree exactly, or within one
unit in the last place where a master sits on a rounding boundary (counted
and bounded). torch 1.13's gloo cannot broadcast bf16, which DDP does once at
construction: every rank builds the same model from the same seed, so that
broadcast is skipped here (both models alike)."""
import copy

import torch
import torch.distributed as dist
import torch.nn as nn

import harness
from oracle import Net, data

DT = {"bf16": torch.bfloat16, "f16": torch.float16}
OPTS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}


class Elementwise(nn.Module):
    """fp16 on CPU has no matmul in torch 1.13: elementwise ops only."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8) * 0.5 + 1)
        self.b = nn.Parameter(torch.randn(8) * 0.1)
        self.v = nn.Parameter(torch.randn(8) * 0.5)

    def forward(self, x, use_side=True):
        h = x * self.w + self.b
        h = h * h.abs()  # no tanh for Half on CPU either
        return (h * self.v)[:, :4]


def fp32_rule_hook(state, bucket):
    world = dist.get_world_size()
    wide = bucket.buffer().float()
    fut = dist.all_reduce(wide, async_op=True).get_future()
    return fut.then(lambda f: (f.value()[0] / world).to(bucket.buffer().dtype))


def divide_first_hook(state, bucket):
    """The negative control: torch's DDP order (divide by the world size in
    the bucket's dtype, then sum), which rounds differently."""
    world = dist.get_world_size()
    wide = (bucket.buffer() / world).float()
    fut = dist.all_reduce(wide, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].to(bucket.buffer().dtype))


def ulps(a, b):
    """|a - b| in units of the last place of a's dtype at b's magnitude."""
    eps = torch.finfo(a.dtype).eps
    return ((a.float() - b.float()).abs() / (b.float().abs() * eps).clamp_min(
        torch.finfo(a.dtype).tiny)).max().item()


def compare(cfg, rank, world):
    from zerod.torch import ZerodOptimizer
    import torch.nn.parallel.distributed as ddp_mod
    ddp_mod._sync_module_states = lambda *a, **k: None  # see the docstring
    dist._DEFAULT_FIRST_BUCKET_BYTES = 512
    dt = DT[cfg["dtype"]]
    torch.manual_seed(7)
    model = (Net() if cfg.get("model") != "elementwise" else Elementwise()).to(dt)
    ref = copy.deepcopy(model)
    ddp_z = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    ddp_r = nn.parallel.DistributedDataParallel(ref, bucket_cap_mb=0.001)
    ddp_r.register_comm_hook(None, divide_first_hook if cfg.get("control") else fp32_rule_hook)
    cls, hyper = OPTS[cfg["opt"]], cfg["hyper"]
    opt_z = ZerodOptimizer(ddp_z, cls, shard=cfg.get("shard", "bucket"),
                           step_mode=cfg.get("step_mode", "interleaved"), **hyper)
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    opt_r = cls(masters, **hyper)
    kinds = {str(b.dtype) for b in opt_z._pbufs}
    assert kinds == {str(dt)}, kinds
    worst, off = 0.0, 0
    for it in range(cfg.get("iters", 10)):
        if it == cfg.get("edit_at"):
            # every rank edits the parameters in place between iterations
            with torch.no_grad():
                for p, q, m in zip(model.parameters(), ref.parameters(), masters):
                    p.mul_(0.5)
                    q.mul_(0.5)
                    m.copy_(q)  # the reference's masters: the edited values
            if cfg.get("tell", True):
                opt_z.params_changed()
            else:
                x, y = data(rank, it)
                try:  # the bucket's future fails inside backward (DDP raises)
                    ((ddp_z(x.to(dt)) - y.to(dt)).float() ** 2).mean().backward()
                    opt_z.step()
                except Exception as e:  # noqa: B902  (the job failed: which error)
                    assert "ZC_EPARAMEDIT" in str(e), e
                    return {"refused": str(e)[:120]}
                raise AssertionError("a step over edited bf16 parameters was taken")
        x, y = data(rank, it)
        x, y = x.to(dt), y.to(dt)
        ((ddp_z(x) - y).float() ** 2).mean().backward()
        opt_z.step()
        opt_z.zero_grad()
        ((ddp_r(x) - y).float() ** 2).mean().backward()
        for m, p in zip(masters, ref.parameters()):
            m.grad = p.grad.float()
        opt_r.step()
        opt_r.zero_grad()
        with torch.no_grad():
            for m, p in zip(masters, ref.parameters()):
                p.copy_(m)
                p.grad = None
        for p, q in zip(model.parameters(), ref.parameters()):
            assert p.dtype == dt
            if not torch.equal(p, q):
                u = ulps(p, q)
                assert u <= 1.0 + 1e-6, f"iteration {it}: {u:.3g} ulps apart"
                worst = max(worst, u)
                off += int((p != q).sum())
    n = sum(p.numel() for p in model.parameters()) * cfg.get("iters", 10)
    assert off <= n // 100, f"{off} of {n} parameter values a unit apart"
    res = {"dtype": cfg["dtype"], "zerod_buckets": len(opt_z._layout), "ulps_max": worst,
           "values_one_ulp_apart": off, "values_compared": n,
           "after_rebuild": "mapped by parameter" if opt_z._route else "one plan per layout"}
    if cfg.get("state"):
        try:
            opt_z.state_dict()
        except NotImplementedError as e:
            res["state_dict"] = str(e)[:80]
        else:
            raise AssertionError("state_dict() of bf16 parameters did not raise")
    opt_z.close()
    dist.barrier()
    return res


CASES = {
    "bf16-adamw-w2-bucket-interleaved": dict(
        world=2, dtype="bf16", opt="adamw", hyper={"lr": 0.01, "weight_decay": 0.05},
        state=True),
    # 3 ranks: dividing by the world size rounds (by 2 it would not); the
    # fp32 sum of three widened bf16 values is exact in any order
    "bf16-sgd-momentum-w3-slice-at_end": dict(
        world=3, dtype="bf16", opt="sgd", hyper={"lr": 0.05, "momentum": 0.9},
        shard="slice", step_mode="at_end"),
    "f16-adamw-w2-slice-interleaved": dict(
        world=2, dtype="f16", opt="adamw", hyper={"lr": 0.01, "weight_decay": 0.05},
        model="elementwise", shard="slice"),
    # parameters edited between iterations: params_changed() reloads the
    # masters; without it the step fails, naming the edit
    "bf16-edit-params_changed-adamw-w2": dict(
        world=2, dtype="bf16", opt="adamw", hyper={"lr": 0.01, "weight_decay": 0.05},
        edit_at=5),
    "bf16-edit-without-params_changed-fails": dict(
        world=2, dtype="bf16", opt="sgd", hyper={"lr": 0.05, "momentum": 0.9}, edit_at=4,
        tell=False),
    # the check itself: DDP's divide-first rounding must be told apart
    "control-divide-first-rounding-is-caught": dict(
        world=3, dtype="bf16", opt="sgd", hyper={"lr": 0.05, "momentum": 0.9},
        control=True),
}
for _cfg in CASES.values():
    _cfg["needs"] = "dtype"


def rank_main(name, cfg, rank, world):
    if not cfg.get("control"):
        return compare(cfg, rank, world)
    try:
        compare(cfg, rank, world)
    except AssertionError as e:
        return {"caught": str(e)[:120]}
    raise AssertionError("the comparison did not see a different rounding")


if __name__ == "__main__":
    harness.main(CASES, rank_main)
