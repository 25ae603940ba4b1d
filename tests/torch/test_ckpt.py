#!/usr/bin/python3
"""Checkpoints through the PyTorch binding: ZerodOptimizer.checkpoint() /
restore() (libzeroclient's zc_checkpoint / zc_restore), and the checkpoint an
operator asks for with `zeroctl checkpoint JOB DIR`, which step() takes at
the iteration zerod names. A run that restores a checkpoint into a fresh
model, DDP and optimizer and goes on ends with the parameters of the run
that never stopped, bit for bit (same data, same zerod arithmetic)."""
import gc
import json
import os
import subprocess

import torch
import torch.distributed as dist
import torch.nn as nn

import harness
from oracle import OPTS, Net

ADAM = {"lr": 0.01, "amsgrad": True, "weight_decay": 0.001}
SGD = {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}


def batch(it, rank):
    g = torch.Generator().manual_seed(1000 * it + rank)
    return torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)


def make(cfg, seed, shard):
    from zerod.torch import ZerodOptimizer
    torch.manual_seed(seed)
    model = Net()
    # small buckets: several zerod buckets, and DDP's rebuild changes them
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
    opt = ZerodOptimizer(ddp, OPTS[cfg["opt"]], shard=shard,
                         step_mode=cfg.get("step_mode", "interleaved"), **cfg["hyper"])
    return model, ddp, opt


def train(ddp, opt, first, last, rank, at=None, then=None):
    for it in range(first, last):
        x, y = batch(it, rank)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if at is not None and it == at:
            then()


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def restore_equals_uninterrupted(cfg, rank, world):
    d = os.path.join(os.environ["ZEROD_TORCH_RUN"], "ck")
    n, at = cfg["iters"], cfg["at"]
    model, ddp, opt = make(cfg, 1, "bucket")
    train(ddp, opt, 0, n, rank, at=at, then=lambda: opt.checkpoint(d))
    assert opt.checkpoint_wait(), "the checkpoint is not durable"
    ref = params(model)
    opt.close()
    del ddp, opt
    gc.collect()
    # a fresh model (other initial values), DDP and optimizer, in the shard
    # mode the case names: the checkpoint's parameters and state come back
    model2, ddp2, opt2 = make(cfg, 2, cfg.get("restore_shard", "bucket"))
    assert not all(torch.equal(a, b) for a, b in zip(params(model2), ref))
    resumed = opt2.restore(d)  # the iteration it goes on at
    assert resumed == at + 1 == opt2.client.iteration(), (resumed, opt2.client.iteration())
    train(ddp2, opt2, at + 1, n, rank)
    got = params(model2)
    worst = max(float((a - b).abs().max()) for a, b in zip(got, ref))
    assert all(torch.equal(a, b) for a, b in zip(got, ref)), \
        f"after restore the parameters differ from the uninterrupted run's by {worst}"
    opt2.close()
    dist.barrier()
    return {"iterations": n, "checkpoint_after": at, "max_diff": worst}


def current_generation(d):
    """The directory d's current checkpoint is in: its newest ckpt-SEQ
    (docs/CHECKPOINT.md, "Generations"), or d itself (the older layout)."""
    gens = [f for f in os.listdir(d) if f.startswith("ckpt-") and f[5:].isdigit()] \
        if os.path.isdir(d) else []
    return os.path.join(d, max(gens, key=lambda f: int(f[5:]))) if gens else d


def corrupt_refused(cfg, rank, world):
    from zerod import ZerodError
    d = os.path.join(os.environ["ZEROD_TORCH_RUN"], "ck")
    model, ddp, opt = make(cfg, 1, "bucket")
    train(ddp, opt, 0, 3, rank, at=1, then=lambda: opt.checkpoint(d))
    assert opt.checkpoint_wait()
    dist.barrier()
    if rank == 0:  # flip one byte of the data file
        g = current_generation(d)
        data = [f for f in os.listdir(g) if f != "MANIFEST" and not f.startswith(".")]
        with open(os.path.join(g, sorted(data)[0]), "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x40]))
    dist.barrier()
    before = params(model)
    try:
        opt.restore(d)
    except ZerodError as e:
        assert e.name == "ZC_ECKPT", e
        assert all(torch.equal(a, b) for a, b in zip(params(model), before)), \
            "a refused restore changed the parameters"
        train(ddp, opt, 3, 5, rank)  # and the job goes on
        opt.close()
        dist.barrier()
        return {"error": str(e)[:160]}
    raise AssertionError("a corrupt checkpoint was restored")


def zeroctl_asks(cfg, rank, world):
    run = os.environ["ZEROD_TORCH_RUN"]
    d = os.path.join(run, "asked")
    model, ddp, opt = make(cfg, 1, "bucket")

    def ask():
        if rank == 0:
            out = subprocess.run([os.environ["ZEROCTL_BIN"], "-o", "json", "checkpoint",
                                  opt.job_id, d], capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            json.dump(json.loads(out.stdout), open(os.path.join(run, "asked.json"), "w"))
        dist.barrier()  # every rank goes on only once zerod was asked

    train(ddp, opt, 0, cfg["iters"], rank, at=1, then=ask)
    assert opt.last_checkpoint_error is None, opt.last_checkpoint_error
    assert opt.checkpoint_wait(30000), "the asked-for checkpoint is not durable"
    dist.barrier()
    asked = json.load(open(os.path.join(run, "asked.json")))["checkpoint"]
    g = current_generation(d)
    manifest = open(os.path.join(g, "MANIFEST")).read() if os.path.exists(
        os.path.join(g, "MANIFEST")) else ""
    assert manifest, f"no manifest in {d}: {os.listdir(d) if os.path.isdir(d) else 'no dir'}"
    # the checkpoint restores: into a fresh optimizer, at the named iteration
    ref = params(model)
    opt.close()
    del ddp, opt
    gc.collect()
    model2, ddp2, opt2 = make(cfg, 2, "bucket")
    opt2.restore(d)
    it = opt2.client.iteration()
    assert it == asked["iteration"], (it, asked)
    train(ddp2, opt2, it, cfg["iters"], rank)
    assert all(torch.equal(a, b) for a, b in zip(params(model2), ref))
    opt2.close()
    dist.barrier()
    return {"asked": asked}


CASES = {
    "restore-equals-uninterrupted-adam-amsgrad-w2": dict(
        world=2, opt="adam", hyper=ADAM, iters=8, at=3, what="restore"),
    "restore-into-slice-mode-sgd-w3-at_end": dict(
        world=3, opt="sgd", hyper=SGD, iters=7, at=2, step_mode="at_end",
        restore_shard="slice", what="restore"),
    "corrupt-checkpoint-refused-nothing-changed-w2": dict(
        world=2, opt="adam", hyper=ADAM, what="corrupt"),
    "zeroctl-checkpoint-taken-by-step-w2": dict(
        world=2, opt="adamw", hyper={"lr": 0.01, "weight_decay": 0.05}, iters=7,
        what="zeroctl"),
}
for _cfg in CASES.values():
    _cfg["needs"] = "checkpoint"


def rank_main(name, cfg, rank, world):
    what = cfg["what"]
    if what == "zeroctl" and not os.environ.get("ZEROCTL_BIN"):
        raise harness.Skip("no $ZEROCTL_BIN (meson's test setup gives it)")
    return {"restore": restore_equals_uninterrupted, "corrupt": corrupt_refused,
            "zeroctl": zeroctl_asks}[what](cfg, rank, world)


if __name__ == "__main__":
    harness.main(CASES, rank_main)
