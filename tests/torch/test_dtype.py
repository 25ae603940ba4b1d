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
import gc

import torch
import torch.distributed as dist
import torch.nn as nn

import harness
from oracle import Net, data

DT = {"bf16": torch.bfloat16, "f16": torch.float16}
OPTS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}
MOMENTS = ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")


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
    no_broadcast()
    dt = DT[cfg["dtype"]]
    torch.manual_seed(7)
    model = (Net() if cfg.get("model") != "elementwise" else Elementwise()).to(dt)
    sd = torch_warmup(cfg, model, rank) if cfg.get("from_torch") else None
    ref = copy.deepcopy(model)
    ddp_z = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    ddp_r = nn.parallel.DistributedDataParallel(ref, bucket_cap_mb=0.001)
    ddp_r.register_comm_hook(None, divide_first_hook if cfg.get("control") else fp32_rule_hook)
    cls, hyper = OPTS[cfg["opt"]], cfg["hyper"]
    opt_z = ZerodOptimizer(ddp_z, cls, shard=cfg.get("shard", "bucket"),
                           step_mode=cfg.get("step_mode", "interleaved"), **hyper)
    masters = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
    opt_r = cls(masters, **hyper)
    if sd is not None:
        # plain torch's bf16 state into zerod; the reference takes it as
        # torch does (moments cast to its fp32 masters' dtype, widened)
        opt_z.load_state_dict(sd)
        opt_r.load_state_dict(sd)
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
        x, y = data(rank, it + cfg.get("from_torch", 0))
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
    if sd is not None:
        res["loaded_from_torch_at"] = cfg["from_torch"]
    opt_z.close()
    dist.barrier()
    return res


def no_broadcast():
    import torch.nn.parallel.distributed as ddp_mod
    ddp_mod._sync_module_states = lambda *a, **k: None  # see the docstring
    dist._DEFAULT_FIRST_BUCKET_BYTES = 512


def loss_of(out, y):
    return ((out - y).float() ** 2).mean()


def torch_warmup(cfg, model, rank):
    """cfg["from_torch"] iterations of plain torch on the bf16 model itself
    (its optimizer's state in bf16, no masters), averaged by the fp32 rule;
    its state_dict(), which holds bf16 moments."""
    dt = DT[cfg["dtype"]]
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    ddp.register_comm_hook(None, fp32_rule_hook)
    opt = OPTS[cfg["opt"]](model.parameters(), **cfg["hyper"])
    for it in range(cfg["from_torch"]):
        x, y = data(rank, it)
        loss_of(ddp(x.to(dt)), y.to(dt)).backward()
        opt.step()
        opt.zero_grad()
    sd = opt.state_dict()
    for st in sd["state"].values():
        for name in MOMENTS:
            if st.get(name) is not None:
                assert st[name].dtype == dt and st[name].abs().sum() > 0, (name, st[name])
    return sd


def zerod_run(cfg, rank, reload_at):
    """A ZerodOptimizer run of cfg["iters"] iterations on the bf16 model;
    at reload_at its state_dict() goes into a new DDP and ZerodOptimizer.
    The parameters after every iteration, the state dict and a copy of the
    model at the reload, and the final state dict."""
    from zerod.torch import ZerodOptimizer
    dt, cls = DT[cfg["dtype"]], OPTS[cfg["opt"]]
    torch.manual_seed(7)
    model = Net().to(dt)

    def new_opt():
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
        return ddp, ZerodOptimizer(ddp, cls, shard=cfg.get("shard", "bucket"),
                                   step_mode=cfg.get("step_mode", "interleaved"),
                                   **cfg["hyper"])
    ddp, opt = new_opt()
    hist, at = [], {}
    for it in range(cfg["iters"]):
        if it == reload_at:
            sd = opt.state_dict()
            snap = Net().to(dt)  # not a deepcopy: that would copy zerod's hooks
            snap.load_state_dict(model.state_dict())
            at = {"sd": sd, "model": snap}
            opt.close()
            ddp = opt = None  # the old DDP's reducer goes with them
            gc.collect()
            ddp, opt = new_opt()
            opt.load_state_dict(sd)
        x, y = data(rank, it)
        loss_of(ddp(x.to(dt)), y.to(dt)).backward()
        opt.step()
        opt.zero_grad()
        hist.append([p.detach().clone() for p in model.parameters()])
    final = opt.state_dict()
    opt.close()
    return hist, at, final


def check_zerod_keys(sd, model, dt, steps):
    """torch's keys in dt, the fp32 'zerod_*' ones rounding to them, the
    masters rounding to the parameters."""
    n = 0
    for i, p in enumerate(model.parameters()):
        st = sd["state"][i]
        assert st["zerod_master"].dtype == torch.float32, st["zerod_master"].dtype
        assert torch.equal(st["zerod_master"].to(dt), p.detach()), f"master {i}"
        if "step" in st:
            assert float(st["step"]) == steps, st["step"]
        for name in MOMENTS:
            if st.get(name) is not None:
                assert st[name].dtype == dt and st["zerod_" + name].dtype == torch.float32
                assert torch.equal(st["zerod_" + name].to(dt), st[name]), (i, name)
                n += 1
    assert n, "no moments in the state dict"
    return n


def roundtrip(cfg, rank, world):
    """ZerodOptimizer -> state_dict -> new ZerodOptimizer continues exactly
    as the uninterrupted run (fp32 masters and moments kept); the same state
    dict loads into plain torch over the bf16 model, which steps on; its
    state (with our fp32 keys, stale now) loads back into zerod, which takes
    torch's values and leaves the parameters alone."""
    no_broadcast()
    dt, k = DT[cfg["dtype"]], cfg["reload_at"]
    whole, _, final_a = zerod_run(cfg, rank, None)
    split, at, final_b = zerod_run(cfg, rank, k)
    for it, (pa, pb) in enumerate(zip(whole, split)):
        for a, b in zip(pa, pb):
            assert torch.equal(a, b), f"iteration {it}: the reloaded run differs"
    for i, st in final_a["state"].items():
        for name, t in st.items():
            if isinstance(t, torch.Tensor):
                assert torch.equal(t, final_b["state"][i][name]), (i, name)
    n = check_zerod_keys(at["sd"], at["model"], dt, k)
    # zerod's state into plain torch: it keeps torch's keys in bf16 and steps
    ref = at["model"]
    opt = OPTS[cfg["opt"]](ref.parameters(), **cfg["hyper"])
    opt.load_state_dict(at["sd"])
    before = [p.detach().clone() for p in ref.parameters()]
    for i, p in enumerate(ref.parameters()):
        st, saved = opt.state[p], at["sd"]["state"][i]
        for name in MOMENTS:
            if saved.get(name) is not None:
                assert st[name].dtype == dt and torch.equal(st[name], saved[name]), (i, name)
    x, y = data(0, k)  # every rank alike: the models stay equal
    loss_of(ref(x.to(dt)), y.to(dt)).backward()
    opt.step()
    moved = sum(int((p != q).sum()) for p, q in zip(ref.parameters(), before))
    assert moved and all(torch.isfinite(p).all() for p in ref.parameters()), moved
    for p in ref.parameters():
        assert "zerod_master" in opt.state[p]  # kept by torch, stale after its step
        if "step" in opt.state[p]:
            assert float(opt.state[p]["step"]) == k + 1, opt.state[p]["step"]
    # and back into zerod: the stale fp32 keys give way to torch's values
    # (moments widened, the master the parameter widened)
    from zerod.torch import ZerodOptimizer
    opt.zero_grad()
    after = [p.detach().clone() for p in ref.parameters()]
    back = ZerodOptimizer(nn.parallel.DistributedDataParallel(ref, bucket_cap_mb=0.001),
                          OPTS[cfg["opt"]], **cfg["hyper"])
    back.load_state_dict(opt.state_dict())
    bsd = back.state_dict()
    for i, (p, q) in enumerate(zip(ref.parameters(), after)):
        st = bsd["state"][i]
        assert torch.equal(p, q), f"parameter {i} changed by the load"
        assert torch.equal(st["zerod_master"], q.float()), f"master {i}"
        for name in MOMENTS:
            if opt.state[p].get(name) is not None:
                assert torch.equal(st["zerod_" + name], opt.state[p][name].float()), (i, name)
    back.close()
    dist.barrier()
    return {"iterations_equal": len(whole), "reload_at": k, "moments_saved": n,
            "plain_torch_values_moved": moved}


CASES = {
    "bf16-adamw-w2-bucket-interleaved": dict(
        world=2, dtype="bf16", opt="adamw", hyper={"lr": 0.01, "weight_decay": 0.05}),
    # state_dict()/load_state_dict() of bf16 parameters: zerod -> zerod is
    # exact, plain torch's bf16 state loads into zerod (then matches the fp32
    # rule reference) and zerod's into plain torch
    "bf16-state-roundtrip-exact-adamw-amsgrad-w2-bucket": dict(
        world=2, dtype="bf16", opt="adamw",
        hyper={"lr": 0.01, "weight_decay": 0.05, "amsgrad": True}, what="roundtrip",
        reload_at=4, iters=9),
    "bf16-state-roundtrip-exact-sgd-momentum-w2-slice-at_end": dict(
        world=2, dtype="bf16", opt="sgd", hyper={"lr": 0.05, "momentum": 0.9},
        what="roundtrip", shard="slice", step_mode="at_end", reload_at=3, iters=7),
    "bf16-state-from-plain-torch-adamw-w2": dict(
        world=2, dtype="bf16", opt="adamw", hyper={"lr": 0.01, "weight_decay": 0.05},
        from_torch=4, iters=6),
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
    _cfg["needs"] = "state" if _cfg.get("what") or _cfg.get("from_torch") else "dtype"


def rank_main(name, cfg, rank, world):
    if cfg.get("what") == "roundtrip":
        return roundtrip(cfg, rank, world)
    if not cfg.get("control"):
        return compare(cfg, rank, world)
    try:
        compare(cfg, rank, world)
    except AssertionError as e:
        return {"caught": str(e)[:120]}
    raise AssertionError("the comparison did not see a different rounding")


if __name__ == "__main__":
    harness.main(CASES, rank_main)
