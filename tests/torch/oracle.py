"""DDP + ZerodOptimizer against DDP + plain torch.optim, in one rank process:
the same model, the same data (different on every rank), the same schedule;
parameters compared after every iteration within RTOL/ATOL. Options a case
sets: accum (micro-batches per iteration, all but the last under
ddp.no_sync()), frozen (Net's first layer requires_grad=False, left in the
param groups), set_to_none, zero_grad_every, unused (use_side's patterns)."""
import copy
import gc

import torch
import torch.distributed as dist
import torch.nn as nn

from harness import ATOL, RTOL, Skip  # noqa: F401  (Skip re-exported)

OPTS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


class Net(nn.Module):
    """A small MLP; `side` is used only in some iterations (unused-parameter
    cases), chosen by the input's marker."""

    def __init__(self, width=24):
        super().__init__()
        self.a = nn.Linear(8, width)
        self.b = nn.Linear(width, width)
        self.side = nn.Linear(width, width)
        self.c = nn.Linear(width, 4)

    def forward(self, x, use_side=True):
        h = torch.tanh(self.a(x))
        h = torch.tanh(self.b(h))
        if use_side == "touch":  # in the graph, with a zero gradient
            h = h + 0.0 * torch.tanh(self.side(h))
        elif use_side:
            h = h + torch.tanh(self.side(h))
        return self.c(h)


def groups(model, two):
    if not two:
        return model.parameters()
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    nodecay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": decay}, {"params": nodecay, "weight_decay": 0.0}]


def schedule(opt, kind):
    if kind == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    if kind == "warmup":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 5))
    return None


def data(rank, it):
    g = torch.Generator().manual_seed(1000 * it + rank)
    # rank-dependent scale and offset: the average does not nearly cancel
    x = torch.randn(16, 8, generator=g) * (1 + 0.3 * rank) + 0.1 * rank
    y = torch.randn(16, 4, generator=g) + 0.5
    return x, y


def use_side(rank, it, cfg, micro=0):
    """unused: 'some' (unused on some ranks in some iterations), 'all'
    (unused on every rank in some iterations), 'nosync' (with accum: used
    in every micro-batch; in the first only, on every rank; in micro-batch
    rank % accum only; in none) or None."""
    u = cfg.get("unused")
    if u == "nosync":
        return [True, micro == 0, micro == rank % cfg["accum"], False][it % 4]
    if u == "all":
        return it % 3 != 1
    if u == "some":
        return (it + rank) % 3 != 0 if it % 4 else True
    return True


def make(cfg, rank):
    from zerod.torch import ZerodOptimizer
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1024  # several DDP buckets, small model
    torch.manual_seed(7)
    model = Net()
    if cfg.get("frozen"):  # before DDP, as fine-tuning scripts freeze
        for p in model.a.parameters():
            p.requires_grad_(False)
    ref = copy.deepcopy(model)
    kw = dict(bucket_cap_mb=0.002, find_unused_parameters=bool(cfg.get("unused")))
    ddp_z, ddp_r = nn.parallel.DistributedDataParallel(model, **kw), \
        nn.parallel.DistributedDataParallel(ref, **kw)
    cls = OPTS[cfg["opt"]]
    hyper = cfg["hyper"]
    zhyper = dict(hyper, **cfg.get("zerod_hyper", {}))  # negative controls
    opt_z = ZerodOptimizer(ddp_z, cls, groups(model, cfg.get("groups")),
                           shard=cfg.get("shard", "bucket"),
                           step_mode=cfg.get("step_mode", "interleaved"),
                           max_grad_norm=cfg.get("clip", 0.0), **zhyper)
    opt_r = cls(groups(ref, cfg.get("groups")), **hyper)
    return ddp_z, opt_z, ddp_r, opt_r


def one_iter(ddp, opt, sched, rank, it, cfg):
    if cfg.get("manual_lr"):
        for g in opt.param_groups:
            g["lr"] = 0.01 * (1 + it % 4) / 4
    k = cfg.get("accum", 1)
    for m in range(k - 1):  # gradient accumulation: no_sync micro-batches first
        with ddp.no_sync():
            x, y = data(rank, it * k + m)
            (((ddp(x, use_side(rank, it, cfg, m)) - y) ** 2).mean() / k).backward()
    x, y = data(rank, it * k + k - 1)
    use = use_side(rank, it, cfg, k - 1)
    if not use and not hasattr(opt, "client") and \
            any(use_side(rank, it, cfg, m) for m in range(k - 1)):
        # the reference: torch 1.13's DDP counts only the synced forward's
        # parameters as used, and where no rank used one there it leaves
        # each rank's accumulated gradient unreduced (the ranks' models
        # drift apart); in the graph with a zero gradient, it reduces the
        # accumulated ones, which is what no_sync() promises
        use = "touch"
    loss = ((ddp(x, use) - y) ** 2).mean() / k
    scale = cfg.get("grad_scale")
    if scale and hasattr(opt, "client"):  # zerod unscales, and skips non-finite steps
        opt.set_grad_scale(scale)
        (loss * (float("inf") if it == cfg.get("inf_at") else scale)).backward()
        opt.step()
        assert opt.found_inf == (it == cfg.get("inf_at")), (it, opt.found_inf)
        opt.zero_grad(set_to_none=cfg.get("set_to_none", True))
        if sched is not None:
            sched.step()
        return loss.item()
    if scale and it == cfg.get("inf_at"):  # the reference: GradScaler skips the step
        opt.zero_grad()
        if sched is not None:
            sched.step()
        return loss.item()
    loss.backward()
    if cfg.get("clip") and not hasattr(opt, "client"):  # the reference
        opt.last_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), cfg["clip"]).item()
    opt.step()
    if (it + 1) % cfg.get("zero_grad_every", 1) == 0:
        opt.zero_grad(set_to_none=cfg.get("set_to_none", True))
    if sched is not None:
        sched.step()
    return loss.item()


def max_diff(a, b):
    worst, bad = 0.0, []
    for (n, p), q in zip(a.module.named_parameters(), b.module.parameters()):
        d = (p.detach() - q.detach()).abs()
        worst = max(worst, d.max().item())
        if not torch.allclose(p.detach(), q.detach(), rtol=RTOL, atol=ATOL):
            bad.append(n)
    return worst, bad


def compare(cfg, rank, world):
    """Train both and compare every iteration; returns the report dict."""
    ddp_z, opt_z, ddp_r, opt_r = make(cfg, rank)
    sz, sr = schedule(opt_z, cfg.get("sched")), schedule(opt_r, cfg.get("sched"))
    iters = cfg.get("iters", 10)
    worst = 0.0
    reload_at = cfg.get("reload_at")
    for it in range(iters):
        if it == reload_at:
            # mid-run: state_dict -> a new optimizer (and scheduler) -> load
            from zerod.torch import ZerodOptimizer
            zsd = opt_z.state_dict()
            ssd = sz.state_dict() if sz is not None else None
            sd = opt_r.state_dict()  # plain torch's state goes into zerod
            check_state_equal(zsd, sd)
            opt_r = OPTS[cfg["opt"]](groups(ddp_r.module, cfg.get("groups")), **cfg["hyper"])
            opt_r.load_state_dict(zsd)  # and zerod's into plain torch
            if ssd is not None:
                sr = schedule(opt_r, cfg.get("sched"))
                sr.load_state_dict(ssd)
            opt_z.close()
            module = ddp_z.module
            ddp_z = opt_z = sz = None  # the old DDP's reducer goes with them
            gc.collect()
            ddp_z = rewrap(module, cfg)
            opt_z = ZerodOptimizer(ddp_z, OPTS[cfg["opt"]],
                                   groups(ddp_z.module, cfg.get("groups")),
                                   shard=cfg.get("shard", "bucket"),
                                   step_mode=cfg.get("step_mode", "interleaved"),
                                   max_grad_norm=cfg.get("clip", 0.0), **cfg["hyper"])
            opt_z.load_state_dict(sd)
            if ssd is not None:
                sz = schedule(opt_z, cfg.get("sched"))
                sz.load_state_dict(ssd)
        lz = one_iter(ddp_z, opt_z, sz, rank, it, cfg)
        lr_ = one_iter(ddp_r, opt_r, sr, rank, it, cfg)
        if cfg.get("clip"):
            nz, nr = opt_z.last_grad_norm, opt_r.last_norm
            assert abs(nz - nr) <= 1e-5 * abs(nr) + 1e-6, f"iteration {it}: norm {nz} vs {nr}"
        d, bad = max_diff(ddp_z, ddp_r)
        worst = max(worst, d)
        if bad:
            raise AssertionError(f"iteration {it}: {bad} differ (max |diff| {d:.3g}, "
                                 f"losses {lz:.6g} vs {lr_:.6g})")
    res = {"iters": iters, "max_abs_diff": worst, "world": world,
           "zerod_buckets": len(opt_z._layout),
           "after_rebuild": "mapped by parameter" if opt_z._route else "one plan per layout"}
    if cfg.get("check_state"):
        check_state_equal(opt_z.state_dict(), opt_r.state_dict())
        res["state_checked"] = True
    opt_z.close()
    dist.barrier()
    return res


def rewrap(module, cfg):
    """A new DDP around the same module (as a restarted script would build)."""
    kw = dict(bucket_cap_mb=0.002, find_unused_parameters=bool(cfg.get("unused")))
    return nn.parallel.DistributedDataParallel(module, **kw)


def check_state_equal(a, b):
    assert a["state"].keys() == b["state"].keys(), (a["state"].keys(), b["state"].keys())
    for k in a["state"]:
        sa, sb = a["state"][k], b["state"][k]
        assert sa.keys() == sb.keys(), (k, sa.keys(), sb.keys())
        for n in sa:
            x, y = sa[n], sb[n]
            if x is None or y is None:
                assert x is None and y is None, (k, n)
                continue
            assert torch.allclose(torch.as_tensor(x).float(), torch.as_tensor(y).float(),
                                  rtol=RTOL, atol=ATOL), (k, n)
    for ga, gb in zip(a["param_groups"], b["param_groups"]):
        assert ga == gb, (ga, gb)
