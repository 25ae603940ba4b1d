#!/usr/bin/python3
"""DDP + ZerodOptimizer == DDP + torch.optim (tests/torch/oracle.py), >= 10
iterations, 2 and 3 ranks, every optimizer, both shard and step modes,
schedulers, two param groups; one case launched by torchrun."""
import harness
from oracle import compare

SGD = {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}
ADAM = {"lr": 0.01, "amsgrad": True, "weight_decay": 0.001}
ADAMW = {"lr": 0.01, "weight_decay": 0.05}

CASES = {
    "sgd-nesterov-wd-w2-bucket-interleaved": dict(world=2, opt="sgd", hyper=SGD),
    "sgd-nesterov-wd-w3-slice-at_end": dict(world=3, opt="sgd", hyper=SGD, shard="slice",
                                            step_mode="at_end"),
    "adam-amsgrad-w2-slice-interleaved-steplr": dict(world=2, opt="adam", hyper=ADAM,
                                                     shard="slice", sched="step"),
    "adam-amsgrad-w3-bucket-at_end": dict(world=3, opt="adam", hyper=ADAM, step_mode="at_end"),
    "adamw-2groups-w2-bucket-at_end-warmup": dict(world=2, opt="adamw", hyper=ADAMW,
                                                  groups=True, step_mode="at_end",
                                                  sched="warmup", set_to_none=False),
    "adamw-2groups-w3-slice-interleaved-steplr": dict(world=3, opt="adamw", hyper=ADAMW,
                                                      groups=True, shard="slice", sched="step"),
    # launched by torchrun (README: Debian's torch 1.13 under Python 3.11),
    # LOCAL_RANK / LOCAL_WORLD_SIZE from it
    "adamw-w2-slice-interleaved-torchrun": dict(world=2, opt="adamw", hyper=ADAMW,
                                                shard="slice", torchrun=True, iters=6),
    # the check itself: an lr off by 1e-4 relative must be caught
    "control-lr-off-by-1e-4-is-caught": dict(world=2, opt="sgd", hyper=SGD,
                                             zerod_hyper={"lr": SGD["lr"] * (1 + 1e-4)},
                                             expect_fail=True),
}


def rank_main(name, cfg, rank, world):
    if not cfg.get("expect_fail"):
        return compare(cfg, rank, world)
    try:
        compare(cfg, rank, world)
    except AssertionError as e:
        return {"caught": str(e)[:120]}
    raise AssertionError("the oracle did not see a different lr")


if __name__ == "__main__":
    harness.main(CASES, rank_main)
