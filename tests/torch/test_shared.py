#!/usr/bin/python3
"""Shared parameter buffers through the PyTorch binding:
ZerodOptimizer(..., shared_params=True) on the CPU. The ranks keep their
parameters in one memfd (rank 0 creates it, the others open it from the pid
and fd it broadcasts), zerod writes each updated parameter once, and the
run ends with the parameters of the same run with shared_params=False, bit
for bit, through DDP's bucket rebuild, which both re-plan onto: into each
rank's own buffers, and into a new shared buffer."""
import gc

import torch
import torch.nn as nn

import harness
from oracle import OPTS, Net

ADAM = {"lr": 0.01, "amsgrad": True, "weight_decay": 0.001}
SGD = {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}


def batch(it, rank):
    g = torch.Generator().manual_seed(1000 * it + rank)
    return torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)


def maps_shared():
    """Whether this process maps the shared parameter memfd."""
    with open("/proc/self/maps") as f:
        return any("memfd:zerod-shared-params" in line for line in f)


def run(cfg, rank, shared):
    from zerod.torch import ZerodOptimizer
    torch.manual_seed(1)
    model = Net()
    # small buckets: several zerod buckets, and DDP's rebuild changes them
    # (a re-plan); DDP's default: one bucket, which the rebuild keeps
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cfg.get("cap_mb", 0.004))
    opt = ZerodOptimizer(ddp, OPTS[cfg["opt"]], shard=cfg["shard"],
                         step_mode=cfg["step_mode"], shared_params=shared, **cfg["hyper"])
    assert opt.params_shared == shared, (opt.params_shared, shared)
    if shared:
        assert maps_shared(), "shared_params=True, but no shared parameter memfd is mapped"
    layout0 = [k for k, _, _ in opt._layout]
    shared_iters = 0
    for it in range(cfg["iters"]):
        x, y = batch(it, rank)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        shared_iters += opt.params_shared
    replanned = [k for k, _, _ in opt._layout] != layout0
    assert ddp._has_rebuilt_buckets and replanned and opt._route is None, \
        "DDP's rebuild was not re-planned"
    if shared:
        assert maps_shared(), "after the re-plan no shared parameter memfd is mapped"
    out = [p.detach().clone() for p in model.parameters()]
    opt.close()
    del ddp, opt
    gc.collect()
    return out, shared_iters


def shared_equals_own(name, cfg, rank, world):
    ref, _ = run(cfg, rank, False)
    got, shared_iters = run(cfg, rank, True)
    assert shared_iters == cfg["iters"], \
        f"{shared_iters} of {cfg['iters']} iterations on a shared buffer"
    worst = max(float((a - b).abs().max()) for a, b in zip(got, ref))
    assert all(torch.equal(a, b) for a, b in zip(got, ref)), \
        f"shared_params=True ends {worst} away from shared_params=False"
    return {"iterations": cfg["iters"], "iterations_shared": shared_iters,
            "rebuilt_buckets": "re-planned, shared", "max_diff": worst}


CASES = {
    "shared-equals-own-adam-amsgrad-bucket-interleaved-w2": dict(
        world=2, opt="adam", hyper=ADAM, shard="bucket", step_mode="interleaved", iters=12),
    "shared-equals-own-sgd-nesterov-slice-at_end-w2": dict(
        world=2, opt="sgd", hyper=SGD, shard="slice", step_mode="at_end", iters=12),
    "shared-equals-own-one-bucket-adamw-slice-interleaved-w2": dict(
        world=2, opt="adamw", hyper={"lr": 0.01, "weight_decay": 0.05}, shard="slice",
        step_mode="interleaved", iters=12, cap_mb=25),
}
for _cfg in CASES.values():
    _cfg["needs"] = "shared_params"


if __name__ == "__main__":
    harness.main(CASES, shared_equals_own)
