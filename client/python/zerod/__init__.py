"""zerod: the Python side of zerod, the per-node daemon that runs data-parallel
training's all-reduce + sharded optimizer step. zerod.Client binds
libzeroclient (ctypes); zerod.torch.ZerodOptimizer is the torch.optim
optimizer with its own DDP comm hook."""
from ._lib import Lib, ZerodError
from .client import Client, Plan

__all__ = ["Client", "Lib", "Plan", "ZerodError"]
__version__ = "0.1.0"
