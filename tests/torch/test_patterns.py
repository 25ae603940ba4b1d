#!/usr/bin/python3
"""Training patterns PyTorch scripts use, each against DDP + plain
torch.optim after every iteration (tests/torch/oracle.py): gradient
accumulation under ddp.no_sync() with find_unused_parameters=True (a
parameter used in an earlier micro-batch only is used, as DDP counts it),
zero_grad(set_to_none=False) (a parameter no rank used still has a zero
gradient, and torch steps it), frozen layers left in the param groups."""
import harness
from oracle import compare

SGD = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}
ADAMW = {"lr": 0.01, "weight_decay": 0.05}

CASES = {
    # DDP(find_unused_parameters=True) + no_sync micro-batches
    "nosync-unused-adamw-w2-bucket-interleaved": dict(world=2, opt="adamw", hyper=ADAMW,
                                                      unused="nosync", accum=3, iters=8,
                                                      needs="masks"),
    "nosync-unused-adamw-w3-slice-at_end": dict(world=3, opt="adamw", hyper=ADAMW,
                                                unused="nosync", accum=3, iters=8,
                                                shard="slice", step_mode="at_end",
                                                check_state=True, needs="masks"),
    "nosync-unused-sgd-w2-slice-interleaved": dict(world=2, opt="sgd", hyper=SGD,
                                                   unused="nosync", accum=2, iters=8,
                                                   shard="slice", needs="masks"),
    "nosync-unused-sgd-w3-bucket-at_end": dict(world=3, opt="sgd", hyper=SGD,
                                               unused="nosync", accum=3, iters=8,
                                               step_mode="at_end", needs="masks"),
    # zero_grad(set_to_none=False): unused everywhere, yet stepped with zeros
    "set_to_none-False-unused-all-sgd-momentum-w3-bucket": dict(
        world=3, opt="sgd", hyper=SGD, unused="all", set_to_none=False, iters=8,
        check_state=True, needs="masks"),
    "set_to_none-False-nosync-adamw-w2-slice-at_end": dict(
        world=2, opt="adamw", hyper=ADAMW, unused="nosync", accum=2, set_to_none=False,
        iters=8, shard="slice", step_mode="at_end", check_state=True, needs="masks"),
    # a frozen first layer in the groups: never stepped, no state
    "frozen-layer-in-groups-adamw-w2-bucket-interleaved": dict(
        world=2, opt="adamw", hyper=ADAMW, frozen=True, iters=8, check_state=True,
        needs="state"),
    "frozen-layer-2groups-sgd-w3-slice-at_end-unused": dict(
        world=3, opt="sgd", hyper=SGD, frozen=True, groups=True, unused="some", iters=8,
        shard="slice", step_mode="at_end", check_state=True, needs="masks"),
}


def rank_main(name, cfg, rank, world):
    return compare(cfg, rank, world)


if __name__ == "__main__":
    harness.main(CASES, rank_main)
