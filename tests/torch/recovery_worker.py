#!/usr/bin/python3
"""A torchrun worker (tests/torch/test_torchrun.py): DDP + ZerodOptimizer
written the way a user writes it, with no recovery code but the one line
that moves the loop to opt.resumed_iteration. argv: OUT KILLS [OPTIONS],
where KILLS is "restart:rank:iteration,..." (this worker SIGKILLs itself at
that iteration of that restart round; "-": never) and OPTIONS is
"shared,at_end", a part of it or "-" (ZerodOptimizer's shared_params=True,
step_mode="at_end"). Rank 0 writes the final parameters and moments, and
the iteration each round resumed at, to OUT."""
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from zerod.torch import ZerodOptimizer

ITERS = 12


def data(rank, it):
    g = torch.Generator().manual_seed(1000 * it + rank)
    return torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)


def main():
    out, kills = sys.argv[1], sys.argv[2]
    opts = sys.argv[3].split(",") if len(sys.argv) > 3 else []
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    die_at = {}
    for k in ([] if kills == "-" else kills.split(",")):
        rd, rk, it = (int(v) for v in k.split(":"))
        if rd == restart and rk == rank:
            die_at = it
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ddp = DDP(model)
    opt = ZerodOptimizer(ddp, torch.optim.Adam, lr=0.01, shared_params="shared" in opts,
                         step_mode="at_end" if "at_end" in opts else "interleaved")
    start = opt.resumed_iteration or 0  # the only line recovery needs
    for it in range(start, ITERS):
        if die_at == it:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = data(rank, it)
        opt.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()
        opt.step()
    st = opt.state_dict()["state"]  # every rank: zerod's state comes in a round
    if rank == 0:
        log = out + ".resumed"
        with open(log, "a") as f:
            f.write(f"{restart} {start}\n")
        torch.save([p.detach().clone() for p in model.parameters()] +
                   [v[k] for _, v in sorted(st.items()) for k in ("exp_avg", "exp_avg_sq")], out)
        with open(out + ".state.json", "w") as f:
            json.dump({str(k): int(v["step"]) for k, v in st.items()}, f)
    opt.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
