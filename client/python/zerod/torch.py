"""ZerodOptimizer: a torch.optim optimizer whose step zerod runs.

    ddp = DistributedDataParallel(model)
    opt = ZerodOptimizer(ddp, torch.optim.AdamW, lr=1e-3)     # the two lines
    for x, y in data:
        loss_fn(ddp(x), y).backward(); opt.step(); opt.zero_grad()

How an iteration goes:
- The optimizer registers its own DDP comm hook. For DDP bucket i the hook
  copies the bucket's gradient (one copy) into zerod bucket i's gradient
  buffer and hands it over (zc_bucket_ready); the torch future it returns to
  DDP completes from zc_future_then() once zerod has averaged the bucket (the
  client's pump thread runs the callback, with no lock of the client held).
  Its value is the bucket's own gradient, so p.grad after backward holds this
  rank's local gradient (what zerod consumed) and accumulating without
  zero_grad() adds up as with DDP.
- Direct gradients (CPU, step_mode="interleaved", every rank on one
  node: where zerod only reads the gradient buffers): each .grad is a
  view of its place in zerod's gradient buffer, so backward accumulates
  into zerod's memory and the hook hands the bucket over without a copy.
  DDP must keep .grad as its bucket views (gradient_as_bucket_view=True):
  the optimizer turns it on when DDP was built without it and has run no
  iteration (DDP's reducer built again, as its __setstate__ does). The
  hook re-points (Tensor.set_) each .grad it finds elsewhere (the first
  iteration's, DDP's views after its rebuild) after copying it in: DDP's
  reducer holds the same tensor as its bucket view, so from then on it
  writes there too (set_to_none=True: its one copy of autograd's new
  gradient lands in zerod's buffer), and the future's value, zerod's
  buffer, is what those views alias, so DDP copies nothing back.
  zero_grad() waits for the step first. Re-plans and close() give the
  re-pointed tensors memory of their own (a copy) before the buffers go.
  ZEROD_TORCH_GRADS=copy, at_end, CUDA and several nodes: the copy below
  (one per gradient: DDP's .grad stays its bucket view). On CUDA zerod
  averages the gradient buffers in place (NCCL), so a .grad there would
  change under a read between backward and step(); the one device-to-device
  copy keeps .grad this rank's own.
- zerod steps the parameters while backward goes on (interleaved) or after
  the last bucket (at_end). The parameters are views into the registered
  parameter buffers, so the updates land in place. opt.step() waits for the
  iteration's step future; without a backward since the last step it does
  nothing. The next forward waits for it too (it reads the parameters).
- Hyperparameters (param_groups' lr, betas...) are sent with zc_set_hyper()
  just before bucket 0 of each iteration when they changed: a scheduler's
  step() after opt.step() reaches the next iteration, the one torch would use
  it for. A change made after backward began cannot reach the step zerod is
  already running: opt.step() raises then, rather than step with old values.
- DDP's first iteration runs on its initial buckets and is stepped; DDP then
  rebuilds its buckets at the start of the next forward. A forward pre-hook
  on the wrapped module sees the rebuilt layout (reducer's
  _get_zeros_like_grad_buckets()) before any parameter is read, and registers
  the new plan with zerod (re-planning: the state moves by param_id), on the
  CPU and on CUDA alike. With a libzeroclient without re-planning (or one
  that re-plans host buffers only) the old plan stays and each DDP bucket's
  parameters are copied one by one into their place in it, handing zerod
  buckets over once all their parameters arrived (correct, less overlap).
- Buffers: the first plan's are a memfd this process creates, seals and maps
  (zc_register_buffers()): the parameters' storage is that mapping and keeps
  it alive, close() or not. A re-plan's are the library's (zc_alloc_buffers()
  is how libzeroclient re-plans). ZEROD_TORCH_BUFFERS=library takes the
  library's from the start. shared_params=True: the library's from the
  start, the parameters in one memfd of rank 0's that the others open
  (zc_alloc_buffers_shared()), and a re-plan's in a new one the same way.
  bf16/fp16 parameters get buckets of their dtype.
- CUDA parameters (all on one device): the buffers are two uint8 device
  tensors from torch's allocator, registered over CUDA IPC
  (ZC_BUFFERS_CUDA), the parameters views into them, typed by their bucket
  (fp32, bf16 or fp16: zerod keeps the fp32 masters on the device). The hook's copy runs on
  the current stream and zc_bucket_ready_cuda() records the bucket's ready
  event behind it; the torch future still completes from the host future.
  Waiting for a step adds zc_step_wait_cuda() on the current stream, so the
  next kernels that read the parameters run after zerod's writes. After
  DDP's rebuild it re-plans: two new device tensors, the parameters copied
  into them by the new layout on the current stream (then synchronised),
  zc_register_buffers() of them (new IPC handles and event rings) and
  zc_register_plan(), which moves the state (moments, steps, the fp32
  masters of bf16/fp16 parameters) out of zerod's devices and into the new
  layout by param_id; the parameters become views into the new buffers (the
  old ones are freed with their last reference). Checked on the CUDA test
  double (tests/torch/test_cuda.py); tests/gpu/torch_cuda.py checks it on a
  GPU.
- Checkpoints: checkpoint(dir) / restore(dir) write and load the optimizer
  state with the parameters (libzeroclient's zc_checkpoint/zc_restore:
  checksummed files, restorable onto another world size or layout), and
  step() takes the checkpoints an operator asks for with `zeroctl checkpoint
  JOB [DIR]` at the iteration zerod names.
- find_unused_parameters=True: a parameter is unused on a rank for the
  step where its p.grad is None when its bucket is handed over (the
  bucket's mask, zc_bucket_ready_ex), and zerod skips its step only where
  it is unused on every rank, which is where torch.optim skips it. So a
  parameter used in an earlier ddp.no_sync() micro-batch is used (its
  accumulated gradient is averaged), and one that zero_grad(
  set_to_none=False) left zeros in is stepped with them, as torch steps it.
- Frozen parameters (requires_grad=False when DDP and the optimizer are
  built) may stay in the param groups: DDP leaves them out of its buckets,
  so they are out of the plan, never stepped and have no state_dict()
  state, as in torch. Freezing or unfreezing one later raises at the next
  forward or step() (DDP's buckets and the plan were made without it).
- An error of zerod's in the comm hook (a peer rank died: ZC_EJOBFAILED
  naming it) is raised out of backward as the ZerodError it is: the hook's
  future completes and a callback queued on the autograd engine raises it
  after DDP's finalize (an exception set on the future would reach DDP's
  C++ reducer as a value that is no Tensor).
- Gradient clipping and loss scaling run in zerod (at_end mode): the
  max_grad_norm option, set_grad_scale(). Doing either on p.grad after
  backward (clip_grad_norm_, GradScaler.unscale_) would be too late: zerod
  consumed the gradients. The optimizer records each gradient's version once
  DDP finished backward, and step() raises if one changed since.
"""
import os
import secrets
import socket as _socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import _lib
from .client import Client, Plan

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_KINDS = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw"}
_STATE_KEYS = (("momentum_buffer", _lib.STATE_MOMENTUM_BUFFER),
               ("exp_avg", _lib.STATE_EXP_AVG), ("exp_avg_sq", _lib.STATE_EXP_AVG_SQ),
               ("max_exp_avg_sq", _lib.STATE_MAX_EXP_AVG_SQ))


def _hyper(kind, g):
    """zc_param_group fields of a torch param group."""
    h = {"lr": float(g["lr"]), "weight_decay": float(g["weight_decay"]),
         "maximize": bool(g.get("maximize", False))}
    if kind == "sgd":
        h.update(momentum=float(g["momentum"]), dampening=float(g["dampening"]),
                 nesterov=bool(g["nesterov"]))
    else:
        h.update(beta1=float(g["betas"][0]), beta2=float(g["betas"][1]), eps=float(g["eps"]),
                 amsgrad=bool(g["amsgrad"]))
    return h


def _sgd_keeps_empty_momentum():
    """Whether this torch's SGD without momentum records {'momentum_buffer':
    None} for a parameter it stepped (torch 1.x) or keeps no state for it
    (torch 2.x): asked of torch itself, once, so state_dict() matches the
    installed torch's format."""
    global _SGD_EMPTY_MOMENTUM
    if _SGD_EMPTY_MOMENTUM is None:
        x = torch.zeros(1, requires_grad=True)
        x.grad = torch.ones(1)
        o = torch.optim.SGD([x], lr=0.1)
        o.step()
        _SGD_EMPTY_MOMENTUM = "momentum_buffer" in o.state.get(x, {})
    return _SGD_EMPTY_MOMENTUM


_SGD_EMPTY_MOMENTUM = None


def _allocator_without_ipc():
    """The setting, if any, under which torch's CUDA allocator hands out
    memory CUDA IPC cannot export: expandable segments (cuMemMap) or the
    stream-ordered allocator (cudaMallocAsync)."""
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        conf = os.environ.get(var, "").replace(" ", "")
        for opt in conf.split(","):
            if opt in ("expandable_segments:True", "backend:cudaMallocAsync"):
                return f"{var}={conf}"
    return None


def _rounds_to(wide, t):
    """Whether fp32 tensor wide, rounded to t's dtype, is t (None: no)."""
    return isinstance(wide, torch.Tensor) and wide.numel() == t.numel() and torch.equal(
        wide.detach().to("cpu", t.dtype).reshape(-1), t.detach().cpu().reshape(-1))


def _as_torch(t, p):
    """fp32 state t as torch's own optimizer keeps it: in p's dtype, on p's
    device."""
    return t.to(p.device, p.dtype)


def bucket_views(mem, offsets, numels, dtypes):
    """Bucket b's numels[b] elements of dtypes[b] from byte offsets[b] of
    mem, a 1-D uint8 tensor (of any device): typed views, no copy. The CUDA
    buffers are one such tensor each, the offsets libzeroclient's."""
    out = []
    for off, n, dt in zip(offsets, numels, dtypes):
        size = torch.empty(0, dtype=dt).element_size()
        if off % size or off + n * size > mem.numel():
            raise ValueError(f"zerod: a bucket of {n} x {dt} at byte {off} does not fit "
                             f"a buffer of {mem.numel()} bytes")
        out.append(mem[off:off + n * size].view(dt))
    return out


def _elastic_job_id():
    """Under torchrun, a job id its restarts keep (TORCHELASTIC_RUN_ID, one
    per torchrun run, --rdzv_id): a restarted worker group rejoins the job
    zerod kept after a worker died. None elsewhere."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run:
        return None
    name = "torch-elastic-" + "".join(c if c.isalnum() or c in "._-" else "-" for c in run)
    return name[:64]


def _zerod_comm_hook(state, bucket):
    return state._on_bucket(bucket)


def _grads_as_bucket_views(ddp):
    """Whether DDP keeps each .grad as a view of its bucket
    (gradient_as_bucket_view=True), turning it on if DDP was built without:
    then the gradients can be zerod's memory (direct gradients, above).
    Without it DDP's reducer copies each .grad into a bucket of its own and
    back. Turned on only before DDP's first iteration, by building its
    reducer again as DDP's own __setstate__ does (torch 1.13's private
    methods; where they differ it stays off, with the two copies)."""
    import inspect
    if ddp.gradient_as_bucket_view:
        return True
    need = ("_build_params_for_reducer", "_build_debug_param_to_name_mapping",
            "_ddp_init_helper")
    if getattr(ddp, "num_iterations", 1) != 0 or getattr(ddp, "_has_rebuilt_buckets", True) \
            or not all(hasattr(ddp, n) for n in need):
        return False
    try:
        args = list(inspect.signature(ddp._ddp_init_helper).parameters)
    except (TypeError, ValueError):
        return False
    if args != ["parameters", "expect_sparse_gradient", "param_to_name_mapping",
                "static_graph"]:
        return False
    ddp.gradient_as_bucket_view = True
    try:
        parameters, sparse = ddp._build_params_for_reducer()
        names = ddp._build_debug_param_to_name_mapping(parameters)
        ddp._ddp_init_helper(parameters, sparse, names, ddp.static_graph)
        if ddp.static_graph:
            ddp.reducer._set_static_graph()
            ddp.logger._set_static_graph()
    except Exception:
        ddp.gradient_as_bucket_view = False
        raise
    return True


class ZerodOptimizer(torch.optim.Optimizer):
    """torch.optim.SGD / Adam / AdamW run by zerod, through DDP's comm hook.

    ddp_model: a DistributedDataParallel (CPU, gloo or any backend: zerod
    does the reduction itself), its parameters on the CPU or on one CUDA
    device. params: parameters or param groups (default:
    all of the model's); every parameter DDP reduces must be in one group.
    shard: "bucket" or "slice"; step_mode: "interleaved" or "at_end".
    max_grad_norm: clip the averaged gradients' global norm in zerod
    (step_mode="at_end" only: ValueError otherwise).
    socket / job_id: the daemon's socket (default: $ZEROD_SOCKET...) and the
    job's id (default: $ZEROD_JOB_ID, else one rank 0 draws and broadcasts).
    shared_params: on the CPU, every rank of a job on one node keeps its
    parameters in one buffer (ZC_BUFFERS_SHARED_PARAMS), which zerod writes
    once per step instead of once per rank: rank 0 creates it and tells the
    others over the process group (its pid and fd, which they open through
    /proc/PID/fd/N: the same user). DDP's bucket rebuild re-plans into a
    new shared buffer the same way (rank 0 copies the parameters in by the
    new layout). params_shared says whether the registered buffers are
    shared.
    Every rank constructs it, calls state_dict()/load_state_dict() and
    close() together (they are collective, like DDP's own construction).
    """

    # CUDA buffers whatever the parameters' device: for a subclass whose
    # _device_bytes(), _stream() and _device_sync() reach device memory
    # other than torch's (tests/torch/test_cuda.py: the CUDA test double's)
    _DEVICE_BUFFERS = False

    def __init__(self, ddp_model, optimizer_class=torch.optim.AdamW, params=None,
                 shard="bucket", step_mode="interleaved", max_grad_norm=0.0,
                 socket=None, job_id=None, shared_params=False, **defaults):
        if not isinstance(ddp_model, DistributedDataParallel):
            raise TypeError("ZerodOptimizer: ddp_model must be a DistributedDataParallel")
        kind = _KINDS.get(optimizer_class)
        if kind is None:
            raise ValueError(f"ZerodOptimizer: {optimizer_class!r} is not supported "
                             "(torch.optim.SGD, Adam or AdamW)")
        if shard not in ("bucket", "slice") or step_mode not in ("interleaved", "at_end"):
            raise ValueError("ZerodOptimizer: shard is 'bucket' or 'slice', step_mode "
                             "'interleaved' or 'at_end'")
        if max_grad_norm and step_mode != "at_end":
            raise ValueError("ZerodOptimizer: max_grad_norm needs step_mode='at_end' (zerod "
                             "clips once every bucket is averaged, before any step): pass "
                             "ZerodOptimizer(..., max_grad_norm=%g, step_mode='at_end')"
                             % max_grad_norm)
        # torch's own class fills in its defaults and checks the values
        ref = optimizer_class(ddp_model.module.parameters() if params is None else params,
                              **defaults)
        self._ready = False
        super().__init__([dict(g) for g in ref.param_groups], dict(ref.defaults))
        del ref
        self.kind, self.shard, self.step_mode = kind, shard, step_mode
        self.max_grad_norm = float(max_grad_norm)
        self.shared_params = bool(shared_params)
        self.params_shared = False  # the registered buffers are shared
        self.ddp = ddp_model
        self.lib = _lib.Lib.get()
        self.last_grad_norm = float("nan")
        self.found_inf = False
        self.last_checkpoint_error = None  # of the last checkpoint zeroctl asked for

        # stable ids: a parameter's index in the model's parameters(), + 1
        self._model_params = list(ddp_model.module.parameters())
        self._pid = {id(p): i + 1 for i, p in enumerate(self._model_params)}
        self._group_of = {}
        # requires_grad of every parameter of the groups, as built: DDP's
        # buckets (and so the plan) are fixed by it (_check_frozen)
        names = {id(p): n for n, p in ddp_model.module.named_parameters()}
        self._requires = [(p, p.requires_grad, names.get(id(p), "?"))
                          for g in self.param_groups for p in g["params"]]
        for gi, g in enumerate(self.param_groups):
            for p in g["params"]:
                if id(p) not in self._pid:
                    raise ValueError("ZerodOptimizer: a parameter of the param groups is not "
                                     "one of the DDP model's")
                if p.dtype not in _DTYPES and p.requires_grad:
                    raise NotImplementedError(f"ZerodOptimizer: {p.dtype} parameters (fp32, "
                                              "bf16 or fp16 only)")
                self._group_of[id(p)] = gi
        self.device = self._device()
        self.cuda = self.device.type == "cuda" or self._DEVICE_BUFFERS
        if self.shared_params and self.cuda:
            raise NotImplementedError("ZerodOptimizer: shared_params=True with CUDA "
                                      "parameters (shared parameter buffers are host memory)")
        if self.shared_params:
            self.lib.require("shared_params")
        self.find_unused = bool(ddp_model.find_unused_parameters)
        if self.find_unused:
            self.lib.require("masks")  # else unused parameters would get zero-grad steps
        if self.max_grad_norm:
            self.lib.require("clip")

        pg = ddp_model.process_group
        self.rank, self.world = dist.get_rank(pg), dist.get_world_size(pg)
        job_id = job_id or os.environ.get("ZEROD_JOB_ID") or _elastic_job_id()
        if not job_id:
            box = [f"torch-{secrets.token_hex(6)}" if self.rank == 0 else None]
            dist.broadcast_object_list(box, src=dist.get_global_rank(pg, 0)
                                       if hasattr(dist, "get_global_rank") else 0, group=pg)
            job_id = box[0]
        self.job_id = job_id
        # zerod only reads the gradient buffers (interleaved steps, one
        # node: the fused pass) where .grad may be them (direct gradients)
        here = (_socket.gethostname(), os.path.realpath(
            socket or os.environ.get("ZEROD_SOCKET") or "default"))
        nodes = [None] * self.world
        dist.all_gather_object(nodes, here, group=pg)
        self.bucket_views = _grads_as_bucket_views(ddp_model)
        self._direct_ok = step_mode == "interleaved" and not self.cuda and \
            len(set(nodes)) == 1 and os.environ.get("ZEROD_TORCH_GRADS") != "copy"
        self._direct = False  # the registered layout's gradients are direct
        self._pointed = {}  # id -> each tensor made a view of zerod's gradients
        lr_env, ls_env = os.environ.get("LOCAL_RANK"), os.environ.get("LOCAL_WORLD_SIZE")
        self.client = Client(self.rank, self.world, job_id, socket=socket,
                             local_rank=int(lr_env) if lr_env and ls_env else None,
                             local_size=int(ls_env) if lr_env and ls_env else None)

        self._step_iter = None  # iteration handed over and not yet waited for
        self._steps_done = 0
        self._sent = None  # hypers zerod has, per group
        self._sent_iter = None  # the hypers sent for the iteration under way
        self._grad_scale = None
        self._versions = None
        self._failure = None  # a bucket's zerod error, raised at the end of backward
        self._rebuilt_seen = False
        self._layout = None
        # the iteration a recovered job goes on at (a worker died, this
        # process is its group's restart): None for a fresh start
        self.resumed_iteration = None
        try:
            self._set_layout(self._read_layout(), first=True)
        except BaseException:
            self.client.close()
            raise
        ddp_model.register_comm_hook(self, _zerod_comm_hook)
        self._pre = ddp_model.module.register_forward_pre_hook(self._before_forward)
        self._ready = True

    def _device(self):
        """The parameters' device: the CPU, or one CUDA device (then the
        buffers are device memory, registered over CUDA IPC)."""
        devs = {p.device for g in self.param_groups for p in g["params"]}
        if len(devs) != 1 or next(iter(devs)).type not in ("cpu", "cuda"):
            raise NotImplementedError(f"ZerodOptimizer: parameters on {sorted(map(str, devs))}: "
                                      "all on the CPU or all on one CUDA device")
        dev = next(iter(devs))
        if dev.type == "cuda":
            self.lib.require("cuda")
            if self.ddp.find_unused_parameters:
                raise NotImplementedError("ZerodOptimizer: find_unused_parameters=True with "
                                          "CUDA parameters (zc_bucket_ready_cuda takes no "
                                          "unused-segment mask yet)")
            why = _allocator_without_ipc()
            if why:
                raise NotImplementedError(f"ZerodOptimizer: CUDA parameters with {why}: zerod "
                                          "opens the buffers over CUDA IPC, which memory of "
                                          "that allocator cannot give (cudaIpcGetMemHandle)")
        return dev

    def _cuda_buffers(self, plan, layout, dts):
        """A plan's buffers as device memory (one uint8 tensor each, from
        torch's allocator, kept by self), registered over CUDA IPC (the first
        plan's, or a re-plan's: zc_register_buffers() again); per bucket its
        typed parameter and gradient views. The previous buffers stay in
        self._old_mem until the new plan is registered."""
        n = self.client.buffer_bytes(plan)
        gmem, pmem = self._device_bytes(n), self._device_bytes(n)
        self.client.register_cuda_buffers(plan, gmem.data_ptr(), pmem.data_ptr())
        self._old_mem = (getattr(self, "_gmem", None), getattr(self, "_pmem", None))
        self._gmem, self._pmem = gmem, pmem
        nb = range(len(layout))
        numels = [sum(p.numel() for p in ps) for _, ps, _ in layout]
        return (bucket_views(pmem, [self.client.param_offset(b) for b in nb], numels, dts),
                bucket_views(gmem, [self.client.grad_offset(b) for b in nb], numels, dts))

    def _device_bytes(self, n):
        return torch.empty(n, dtype=torch.uint8, device=self.device)

    def _stream(self):
        # the current stream of the parameters' device, which is the
        # buffers' (whatever device is current now); its handle is 0 for
        # that device's default stream, which libzeroclient resolves with
        # the buffers' device made current around the record and the wait
        dev = self.device if self.device.index is not None else \
            torch.device("cuda", torch.cuda.current_device())
        return torch.cuda.current_stream(dev).cuda_stream

    def _device_sync(self):
        torch.cuda.synchronize(self.device)

    # -- layout and plan -----------------------------------------------------
    def _read_layout(self):
        """DDP's buckets now: per bucket its parameters in buffer order, and
        whether they tile its buffer back to back."""
        out = []
        for b in self.ddp.reducer._get_zeros_like_grad_buckets():
            ps = list(b.parameters())
            off, tiled = 0, True
            for p, g in zip(ps, b.gradients()):
                tiled = tiled and g.storage_offset() == off
                off += p.numel()
            out.append((tuple(id(p) for p in ps), ps, tiled and off == b.buffer().numel()))
        reduced = {k for ids, _, _ in out for k in ids}
        for p in self._model_params:
            if id(p) in reduced and id(p) not in self._group_of:
                raise ValueError("ZerodOptimizer: every parameter DDP reduces must be in a "
                                 "param group (give it lr=0 to freeze it)")
        # a frozen parameter (requires_grad=False when DDP was built) is in
        # no DDP bucket: it stays in its group, out of the plan, and is never
        # stepped (its grad stays None), as torch.optim never steps it
        for p, needs_grad, name in self._requires:
            if id(p) not in reduced and needs_grad:
                raise ValueError(f"ZerodOptimizer: parameter {name} of the param groups is "
                                 "not one DDP reduces (ignored by DDP?)")
        return out

    def _set_layout(self, layout, first):
        # a re-plan declares the groups first registered: the hyperparameters
        # in force (zc_set_hyper's) stay with the job
        if first:
            self._plan_groups = [_hyper(self.kind, g) for g in self.param_groups]
        # a bucket's dtype is its parameters' (DDP buckets by dtype): a bf16
        # model gets bf16 buckets, with fp32 masters in zerod
        dts = [ps[0].dtype for _, ps, _ in layout]
        plan = Plan(self.kind, self.shard, self.step_mode, self._plan_groups,
                    [[(self._group_of[id(p)], p.numel(), self._pid[id(p)]) for p in ps]
                     for _, ps, _ in layout], self.max_grad_norm, [_DTYPES[d] for d in dts])
        self.low_precision = any(d != torch.float32 for d in dts)
        if not first:  # the old buffers may go: no .grad may stay in them
            self._wait_step()
            self._release_grads()
        if self.cuda:  # a re-plan's too: new device buffers, the parameters copied below
            if not first:
                self._wait_step()
            pbufs, gbufs = self._cuda_buffers(plan, layout, dts)
        elif not first:
            self._wait_step()
            if self.params_shared:  # into a new shared buffer, rank 0 copying
                self._share_buffers(plan)
            else:
                self.client.alloc_buffers(plan)
        elif self.shared_params:
            self._share_buffers(plan)
        elif self.lib.has("zc_register_buffers") and os.environ.get("ZEROD_TORCH_BUFFERS") \
                != "library":
            # the first plan's buffers are memory this process owns: the
            # parameters' storage keeps it mapped, close() or not
            self.client.register_buffers(plan)
        else:
            self.client.alloc_buffers(plan)
        if not self.cuda:
            pbufs = [torch.frombuffer(self.client.param_buffer(b), dtype=dts[b])
                     for b in range(len(layout))]
        where = {}  # param id -> (bucket, segment, offset)
        for b, (_, ps, _) in enumerate(layout):
            off = 0
            for s, p in enumerate(ps):
                where[id(p)] = (b, s, off)
                # a host re-plan's zc_alloc_buffers() copied them; a shared
                # buffer takes rank 0's (equal on every rank after DDP's
                # broadcast), before its zc_register_plan(), which every
                # rank's waits for
                if (first and not (self.params_shared and self.rank != 0)) or self.cuda:
                    pbufs[b][off:off + p.numel()].copy_(p.detach().reshape(-1))
                off += p.numel()
        if self.cuda:  # zerod reads the parameters on its own streams
            self._device_sync()
        try:
            self.client.register_plan()
        except BaseException:
            if self.cuda and not first:  # refused: the registered buffers stay
                self._gmem, self._pmem = self._old_mem
            raise
        finally:
            self._old_mem = None  # registered: zerod closed its handles of the old ones
        if not self.cuda:
            # a re-plan's new buffers are the ones to take once it registered
            pbufs = [torch.frombuffer(self.client.param_buffer(b), dtype=dts[b])
                     for b in range(len(layout))]
            gbufs = [torch.frombuffer(self.client.grad_buffer(b), dtype=dts[b])
                     for b in range(len(layout))]
        with torch.no_grad():
            for b, (_, ps, _) in enumerate(layout):
                for p in ps:
                    _, _, off = where[id(p)]
                    p.data = pbufs[b][off:off + p.numel()].view_as(p)
        self._layout, self._where = layout, where
        self._pbufs, self._gbufs = pbufs, gbufs
        self._route = None  # DDP bucket i = zerod bucket i
        self._param_ptr = {id(p): p.data_ptr() for _, ps, _ in layout for p in ps}
        self._direct = self._direct_ok and all(t for _, _, t in layout)
        # where each parameter's .grad is when it is direct
        self._grad_ptr = {id(p): gbufs[b].data_ptr() + off * p.element_size()
                          for p, (b, _, off) in ((p, where[id(p)]) for _, ps, _ in layout
                                                 for p in ps)}
        if first:
            self._sent = [dict(h) for h in self._plan_groups]
            # a recovered job: the parameters above are zerod's, the state
            # is, and the script's param groups are sent again at the first
            # iteration (the values zerod held came from before the death)
            rec = self.client.recovered()
            if rec is not None:
                self.resumed_iteration = rec
                self._steps_done = rec
                self._sent = [None] * len(self._plan_groups)

    def _share_buffers(self, plan):
        """A plan's buffers (the first, or a re-plan's) with the parameters
        in one memfd every rank shares: rank 0 creates it (a re-plan's
        filled from the registered buffers), and the process group carries
        its handle (host, pid, fd) to the others, which open it. A failure
        on rank 0 is carried too, so that no rank waits for a handle."""
        pg = self.ddp.process_group
        src = dist.get_global_rank(pg, 0) if hasattr(dist, "get_global_rank") else 0
        box, err = [None], None
        if self.rank == 0:
            try:
                box = [(_socket.gethostname(),) + self.client.alloc_buffers_shared(plan)]
            except BaseException as e:
                err, box = e, [("error", str(e))]
        dist.broadcast_object_list(box, src=src, group=pg)
        if err is not None:
            raise err
        if box[0][0] == "error":
            raise RuntimeError(f"ZerodOptimizer: rank 0 could not share its parameters: "
                               f"{box[0][1]}")
        host, pid, fd = box[0]
        if self.rank != 0:
            if host != _socket.gethostname():
                raise NotImplementedError(f"ZerodOptimizer: shared_params=True on a job over "
                                          f"several nodes (rank 0 on {host}): one node only")
            self.client.alloc_buffers_shared(plan, (pid, fd))
        self.params_shared = True

    def _route_by_param(self, ddp_layout):
        """Map a DDP layout onto the registered plan parameter by parameter."""
        self._route = [list(ps) for _, ps, _ in ddp_layout]
        self._release_grads()
        self._direct = False
        self._zb_need = [len(ps) for _, ps, _ in self._layout]
        self._zb_have = [0] * len(self._layout)
        self._zb_next = 0

    def _check_frozen(self):
        """A parameter frozen or unfrozen since construction: DDP's buckets
        and zerod's plan were made from the flags as they were, so the step
        would silently differ from torch's. Raise, naming it."""
        for p, needs_grad, name in self._requires:
            if p.requires_grad == needs_grad:
                continue
            if p.requires_grad:
                why = ("unfrozen (requires_grad=True) after DDP and ZerodOptimizer were built: "
                       "it is in neither DDP's buckets nor zerod's plan, so zerod would never "
                       "step it")
            else:
                why = ("frozen (requires_grad=False) after DDP and ZerodOptimizer were built: "
                       "DDP's buckets and zerod's plan still hold it")
            raise RuntimeError(f"ZerodOptimizer: parameter {name} was {why}. Set "
                               "requires_grad before building them, or build both again "
                               "(state_dict() / load_state_dict() carry the state over)")

    def _before_forward(self, module, inputs):
        self._wait_step()  # forward reads the parameters: the step lands first
        self._check_frozen()
        if torch.is_grad_enabled() and self.ddp._has_rebuilt_buckets and not self._rebuilt_seen:
            self._rebuilt_seen = True
            layout = self._read_layout()
            if [k for k, _, _ in layout] != [k for k, _, _ in self._layout]:
                try:
                    self._set_layout(layout, first=False)
                except _lib.ZerodError as e:
                    # a library without re-planning refuses a second
                    # zc_alloc_buffers() or zc_register_buffers() (ZC_ESTATE:
                    # CUDA buffers before it re-planned them), changing
                    # nothing; an older one refused to re-plan bf16/fp16
                    # buckets (ZC_ENOTSUP) and kept the registered plan
                    if not (e.name == "ZC_ESTATE" and "buffers already" in e.reason) and \
                            e.name != "ZC_ENOTSUP":
                        raise
                    self._route_by_param(layout)
        if self._direct and torch.is_grad_enabled():
            self._point_grads()

    # -- direct gradients ----------------------------------------------------
    def _point_grads(self):
        """Make every .grad that is not yet a view of its place in zerod's
        gradient buffers one: its values copied there, then the tensor itself
        re-pointed (set_: DDP's reducer holds the same tensor as its bucket
        view, gradient_as_bucket_view=True, so it writes there too). The next
        backward accumulates into zerod's memory; its hook copies nothing."""
        with torch.no_grad():
            for _, ps, _ in self._layout:
                for p in ps:
                    if p.grad is not None and p.grad.data_ptr() != self._grad_ptr[id(p)]:
                        self._point(p)

    def _point(self, p):
        """p.grad's values into its place in zerod's gradient buffer, and
        p.grad re-pointed there when its layout is p's."""
        g = p.grad
        b, _, off = self._where[id(p)]
        self._gbufs[b][off:off + p.numel()].copy_(g.reshape(-1))
        if g.dtype == p.dtype and g.shape == p.shape and g.is_contiguous() and \
                p.is_contiguous() and not g.is_sparse:
            g.set_(self._gbufs[b].storage(), off, p.shape, p.stride())
            self._pointed[id(g)] = g

    def _release_grads(self):
        """Every tensor _point_grads() re-pointed gets memory of its own again
        (a copy of its values): before the buffers it views go (a re-plan,
        close()), so that neither .grad nor DDP's bucket views outlive them."""
        with torch.no_grad():
            for g in self._pointed.values():
                g.set_(g.clone())
        self._pointed = {}

    # -- the comm hook -------------------------------------------------------
    def _begin_iteration(self):
        self._wait_step()
        for g, group in enumerate(self.param_groups):
            h = _hyper(self.kind, group)
            if h != self._sent[g]:
                self.client.set_hyper(g, h)
                self._sent[g] = h
        self._sent_iter = [dict(h) for h in self._sent]
        if self._grad_scale is not None:
            self.client.set_grad_scale(1.0 / self._grad_scale)
        self._iter = self.client.iteration()
        self._versions = None

    def _unused_words(self, ps):
        """The segments with no gradient on this rank: where p.grad is None.
        A parameter used in this backward has one; so does one used in an
        earlier no_sync() micro-batch (DDP counts it as used and reduces
        what accumulated) and one that zero_grad(set_to_none=False) left
        zeros in (torch steps it: zerod steps it where any rank has one)."""
        if not self.find_unused:
            return None
        words = [0] * ((len(ps) + 63) // 64)
        for s, p in enumerate(ps):
            if p.grad is None:
                words[s // 64] |= 1 << (s % 64)
        return words

    def _hand_over(self, zb, value):
        """zc_bucket_ready(zb); a torch future completed from its zc future."""
        ps = self._layout[zb][1]
        if self.cuda:  # the copies into the buffer may still run on this stream
            f = self.client.bucket_ready_cuda(zb, self._stream())
        else:
            f = self.client.bucket_ready(zb, self._unused_words(ps))
        fut = torch.futures.Future()

        def done(result, msg):
            # DDP's reducer reads the future's value in C++, where an
            # exception set on it would be a value that is no Tensor ("Unable
            # to cast"): the future completes, and _after_backward raises
            # the error itself, as zerod's ZerodError
            if result < 0 and self._failure is None:
                self._failure = _lib.ZerodError(f"zerod bucket {zb}", result, msg)
            fut.set_result(value)
        self.client.then(f, done)
        if zb == len(self._layout) - 1:
            self._step_iter = self._iter
        return fut

    def _queue_after_backward(self):
        """_after_backward once DDP finished backward: queued from bucket 0's
        hook, it queues itself again when backward's nodes are done, so it
        runs after DDP's finalize (which waited for every bucket's future)."""
        engine = torch.autograd.Variable._execution_engine
        try:
            engine.queue_callback(lambda: engine.queue_callback(self._after_backward))
        except RuntimeError:  # a hook run outside backward (DDP's join)
            pass

    def _after_backward(self):
        """Raise a bucket's zerod error out of backward (a callback's Python
        exception keeps its type through the autograd engine); else note
        the gradients' versions, so a later in-place edit
        (clip_grad_norm_) is seen."""
        self._raise_failure()
        self._note_versions()

    def _raise_failure(self):
        if self._failure is not None:
            e, self._failure = self._failure, None
            self._step_iter = None  # its step future failed too
            raise e

    def _on_bucket(self, bucket):
        """The comm hook. An error here would reach the script wrapped in
        the reducer's RuntimeError: it is kept, the bucket's future
        completes, and _after_backward (or step()) raises it as it is."""
        if bucket.index() == 0:
            self._queue_after_backward()
        if self._failure is None:
            try:
                return self._hook(bucket)
            except Exception as e:
                self._failure = e
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    def _hook(self, bucket):
        i = bucket.index()
        if i == 0:
            self._begin_iteration()
        if self._route is None:
            ids, ps, tiled = self._layout[i]
            if tuple(id(p) for p in bucket.parameters()) != ids:
                raise RuntimeError("ZerodOptimizer: DDP's bucket %d is not the one registered "
                                   "with zerod (DDP rebuilt its buckets without a forward?)" % i)
            if self._direct:
                # backward wrote the direct gradients in place; any other
                # (the first iteration's, DDP's bucket views before they
                # were re-pointed) is copied and re-pointed, a locally
                # unused one zeroed (DDP's bucket holds 0 for it)
                gb = self._gbufs[i]
                with torch.no_grad():
                    for p in ps:
                        g = p.grad
                        if g is None:
                            _, _, off = self._where[id(p)]
                            gb[off:off + p.numel()].zero_()
                        elif g.data_ptr() != self._grad_ptr[id(p)]:
                            self._point(p)
                # the future's value is zerod's buffer: DDP's copy back into
                # its bucket views is skipped where they are it (is_alias_of)
                return self._hand_over(i, gb)
            if tiled:
                self._gbufs[i].copy_(bucket.buffer())
            else:
                for p, g in zip(ps, bucket.gradients()):
                    _, _, off = self._where[id(p)]
                    self._gbufs[i][off:off + p.numel()].copy_(g.reshape(-1))
            return self._hand_over(i, bucket.buffer())
        # the registered plan differs from DDP's layout: place each parameter
        if i == 0:
            self._zb_have = [0] * len(self._layout)
            self._zb_next = 0
        last = None
        for p, g in zip(bucket.parameters(), bucket.gradients()):
            zb, _, off = self._where[id(p)]
            self._gbufs[zb][off:off + p.numel()].copy_(g.reshape(-1))
            self._zb_have[zb] += 1
        while self._zb_next < len(self._layout) and \
                self._zb_have[self._zb_next] == self._zb_need[self._zb_next]:
            last = self._hand_over(self._zb_next, bucket.buffer())
            self._zb_next += 1
        if last is None:
            last = torch.futures.Future()
            last.set_result(bucket.buffer())
        else:  # its value must be this DDP bucket's gradient
            buf = bucket.buffer()
            last = last.then(lambda f: (f.value(), buf)[1])
        return last

    def _note_versions(self):
        self._versions = [(id(p.grad), p.grad._version) if p.grad is not None else None
                          for g in self.param_groups for p in g["params"]]

    # -- torch.optim.Optimizer -------------------------------------------------
    def add_param_group(self, param_group):
        if getattr(self, "_ready", False):
            raise NotImplementedError("ZerodOptimizer: the plan is registered with zerod; "
                                      "give every param group to the constructor")
        super().add_param_group(param_group)

    def zero_grad(self, *args, **kwargs):
        """torch's, after the step under way: with direct gradients .grad is
        zerod's buffer, which zerod reads until the step is done."""
        if getattr(self, "_direct", False):
            self._wait_step()
        return super().zero_grad(*args, **kwargs)

    def _wait_step(self):
        it = self._step_iter
        if it is None:
            return
        self._step_iter = None
        self._steps_done += 1
        f = self.client.step_future(it)
        try:
            self.client.wait(f)
            if self.cuda:  # this stream's next reads of the parameters come after zerod's writes
                self.client.step_wait_cuda(f, self._stream())
            if self.lib.has("zc_step_info"):
                self.found_inf, _, self.last_grad_norm = self.client.step_info(f)
        finally:
            self.client.free(f)

    def _check(self):
        if self._versions is not None:
            now = [(id(p.grad), p.grad._version) if p.grad is not None else None
                   for g in self.param_groups for p in g["params"]]
            if now != self._versions:
                raise RuntimeError(
                    "ZerodOptimizer: gradients were changed after backward (clip_grad_norm_, "
                    "GradScaler.unscale_, an edit of p.grad?): zerod had consumed them already "
                    "and the step did not see the change. Clip with "
                    "ZerodOptimizer(max_grad_norm=...) and scale with set_grad_scale() "
                    "(step_mode='at_end').")
        self._check_frozen()
        for g in self.param_groups:
            for p in g["params"]:
                if id(p) in self._param_ptr and p.data_ptr() != self._param_ptr[id(p)]:
                    raise RuntimeError("ZerodOptimizer: a parameter's storage was replaced "
                                       "(p.data = ...): zerod updates the registered buffer; "
                                       "copy into the parameter instead (p.copy_())")
        if self._sent_iter is not None:
            for g, group in enumerate(self.param_groups):
                if _hyper(self.kind, group) != self._sent_iter[g]:
                    raise RuntimeError(
                        f"ZerodOptimizer: param group {g}'s hyperparameters changed after "
                        "backward began; zerod stepped this iteration with the values from "
                        "before it. Change them before backward (a scheduler's step() after "
                        "opt.step() does).")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._raise_failure()
        self._wait_step()
        self._check()
        self._versions = None
        self._sent_iter = None
        self._operator_checkpoint()
        return loss

    def set_grad_scale(self, scale):
        """The loss scale of the coming iterations (loss * scale was
        backpropagated): zerod unscales the averaged gradients and skips the
        step on every rank where one is not finite (found_inf after step()).
        at_end mode; None turns it off."""
        self.lib.require("grad_scale")
        if self.step_mode != "at_end":
            raise ValueError("ZerodOptimizer.set_grad_scale: step_mode='at_end' only")
        self._grad_scale = None if scale is None else float(scale)

    def params_changed(self):
        """Say that bf16/fp16 parameters were edited in place between
        iterations (model.load_state_dict(), an EMA swap, p.mul_()...): zerod
        reloads its fp32 masters from them before the next step. Every rank
        calls it, after its edit. Without it, the next step of an edited
        low-precision parameter fails the job with ZC_EPARAMEDIT. fp32
        parameters need no call (zerod steps them where they are)."""
        if not self.low_precision:
            return
        self._wait_step()
        self.client.params_changed()

    # -- state (the state part of libzeroclient) ------------------------------
    def _planned(self):
        """The parameters of the groups in zerod's plan (not the frozen)."""
        return [p for g in self.param_groups for p in g["params"] if id(p) in self._where]

    def _segment_states(self, tensors):
        ps = self._planned()
        segs = (_lib.SegmentState * len(ps))()
        for s, p in zip(segs, ps):
            b, k, _ = self._where[id(p)]
            s.size, s.bucket, s.segment = _lib.ctypes.sizeof(s), b, k
            for name, _ in _STATE_KEYS + (("master", _lib.STATE_MASTER),):
                t = tensors.get((id(p), name))
                if t is not None:
                    setattr(s, name, _lib.ctypes.cast(t.data_ptr(), _lib.c_fptr))
        return ps, segs

    def _needs(self, g):
        if self.kind == "sgd":
            return ["momentum_buffer"] if g["momentum"] else []
        return ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if g["amsgrad"] else [])

    def state_dict(self):
        """torch's format (plain torch.optim loads it). Collective: every rank
        calls it between iterations.

        bf16/fp16 parameters: torch's keys hold what torch's own optimizer
        would (its state tensors in the parameter's dtype: zerod's fp32
        moments rounded; step as a float tensor), and extra keys hold zerod's
        fp32 values exactly: 'zerod_master' (the fp32 master whose rounding
        is the parameter) and 'zerod_' + each moment ('zerod_exp_avg',
        'zerod_exp_avg_sq', 'zerod_max_exp_avg_sq', 'zerod_momentum_buffer').
        Plain torch keeps the extra keys and never reads them; a
        ZerodOptimizer's load_state_dict() takes them, so a round trip loses
        nothing. A parameter whose state zerod keeps only a master of (Adam
        before its first step) is left out, as torch leaves it out."""
        self.lib.require("state")
        self._wait_step()
        tensors = {}
        for g in self.param_groups:
            for p in g["params"]:
                names = self._needs(g) + (["master"] if p.dtype != torch.float32 else [])
                for name in names:
                    # fp32 host memory: libzeroclient writes the state there
                    tensors[(id(p), name)] = torch.zeros(p.shape, dtype=torch.float32)
        ps, segs = self._segment_states(tensors)
        self.client.get_state(segs)
        at = {id(p): k for k, p in enumerate(ps)}
        # a frozen parameter keeps what load_state_dict() gave it, as in torch
        for p in list(self.state):
            if id(p) in at:
                del self.state[p]
        for g in self.param_groups:
            for p in g["params"]:
                if id(p) not in at:
                    continue
                s = segs[at[id(p)]]
                low = p.dtype != torch.float32
                st = {}
                if not s.present & ~_lib.STATE_MASTER:
                    # torch 1.x's SGD without momentum keeps
                    # {'momentum_buffer': None} once it stepped a parameter
                    # (torch 2.x keeps nothing); zerod keeps nothing
                    if self.kind == "sgd" and not g["momentum"] and self._steps_done \
                            and not self.find_unused and _sgd_keeps_empty_momentum():
                        st["momentum_buffer"] = None
                    else:
                        continue
                elif self.kind == "sgd":
                    st["momentum_buffer"] = _as_torch(tensors[(id(p), "momentum_buffer")], p) \
                        if s.present & _lib.STATE_MOMENTUM_BUFFER else None
                else:
                    st["step"] = torch.tensor(float(s.step))
                    for name, bit in _STATE_KEYS[1:]:
                        if s.present & bit:
                            st[name] = _as_torch(tensors[(id(p), name)], p)
                if low:
                    for name, bit in _STATE_KEYS:
                        if s.present & bit:
                            st["zerod_" + name] = tensors[(id(p), name)].to(p.device)
                    if s.present & _lib.STATE_MASTER:
                        st["zerod_master"] = tensors[(id(p), "master")].to(p.device)
                self.state[p] = st
        return super().state_dict()

    def load_state_dict(self, state_dict):
        """Loads torch's format (from plain torch.optim too) into zerod: the
        param groups' hyperparameters and every parameter's state, for the
        next iteration. Collective: every rank calls it between iterations.

        bf16/fp16 parameters: the fp32 'zerod_*' keys of state_dict() are
        taken as they are, each where it rounds to what it stands beside
        (a moment to torch's key, the master to the parameter: load the
        model's weights first); otherwise (a state plain torch saved, or
        stepped since it loaded ours) the moments are torch's widened to fp32
        and the master is the parameter widened."""
        self.lib.require("state")
        self._wait_step()
        # the fp32 extras, before torch's load casts them to the parameters'
        # dtype; torch's load sees the state without them
        to_mine = dict(zip((k for g in state_dict["param_groups"] for k in g["params"]),
                           (p for g in self.param_groups for p in g["params"])))
        extra, stripped = {}, {}
        for k, st in state_dict["state"].items():
            plain = {n: v for n, v in st.items() if not str(n).startswith("zerod_")}
            stripped[k] = plain
            if len(plain) != len(st) and k in to_mine:
                extra[id(to_mine[k])] = {n[len("zerod_"):]: v for n, v in st.items()
                                         if str(n).startswith("zerod_")}
        super().load_state_dict(dict(state_dict, state=stripped))
        tensors = {}
        for g in self.param_groups:
            for p in g["params"]:
                x = extra.get(id(p), {}) if p.dtype != torch.float32 else {}
                for name, _ in _STATE_KEYS:
                    t = self.state.get(p, {}).get(name)
                    if t is not None:
                        # zerod's fp32 value where it rounds to torch's, else
                        # torch's widened (plain torch stepped since)
                        if _rounds_to(x.get(name), t):
                            t = x[name]
                        tensors[(id(p), name)] = t.detach().to("cpu", torch.float32).contiguous()
                # the master only where it rounds to the parameter: a stale
                # one (plain torch stepped since, or the model's weights were
                # loaded after) gives way to the parameter widened
                if _rounds_to(x.get("master"), p):
                    tensors[(id(p), "master")] = \
                        x["master"].detach().to("cpu", torch.float32).contiguous()
        for g in self.param_groups:
            for p in g["params"]:
                for name, _ in _STATE_KEYS + (("master", _lib.STATE_MASTER),):
                    t = tensors.get((id(p), name))
                    if t is not None and t.numel() != p.numel():
                        raise ValueError(f"ZerodOptimizer.load_state_dict: {name} of "
                                         f"{t.numel()} elements for a parameter of "
                                         f"{p.numel()}")
        ps, segs = self._segment_states(tensors)
        for s, p in zip(segs, ps):
            st = self.state.get(p, {})
            present = 0
            if "step" in st:
                s.step = float(st["step"])
                present |= _lib.STATE_STEP
            for name, bit in _STATE_KEYS + (("master", _lib.STATE_MASTER),):
                if (id(p), name) in tensors:
                    present |= bit
            s.present = present
        self.client.set_state(segs)
        for g, group in enumerate(self.param_groups):
            h = _hyper(self.kind, group)
            self.client.set_hyper(g, h)
            self._sent[g] = h

    # -- checkpoints (zc_checkpoint / zc_restore, docs/CHECKPOINT.md) -------
    def checkpoint(self, directory):
        """Write the optimizer state and the parameters to `directory`
        (every rank, between iterations: after opt.step()). Returns once the
        state is staged; rank 0's client writes the files in the background
        (checkpoint_wait() says when they are durable). fp32 parameters
        only (bf16/fp16: ZC_ENOTSUP); the param groups' hyperparameters and
        the schedulers are the script's, as with torch.save(opt.state_dict())."""
        self.lib.require("checkpoint")
        self._wait_step()
        self.client.checkpoint(directory)

    def checkpoint_wait(self, timeout_ms=-1):
        """True once the last checkpoint() is on disk, False while it is
        still being written after timeout_ms (< 0: no limit); a failed write
        raises ZerodError (ZC_ECKPT with the reason)."""
        self.lib.require("checkpoint")
        return self.client.checkpoint_wait(timeout_ms)

    def restore(self, directory):
        """Load a checkpoint() (every rank, before the first backward or
        between iterations): the parameters, which are views into zerod's
        buffers, take its values, zerod its optimizer state, and the job
        goes on at its iteration. The world size, shard and step mode and
        DDP's bucket layout may differ from the run that wrote it. A
        missing, corrupt or mismatched checkpoint raises ZerodError
        (ZC_ECKPT naming what is wrong) and changes nothing. Returns the
        iteration the job goes on at (the checkpoint's: the number of
        iterations stepped before it), for the script's scheduler and data
        position."""
        self.lib.require("checkpoint")
        self._wait_step()
        self.client.restore(directory)
        return self.client.iteration()

    def _operator_checkpoint(self):
        """`zeroctl checkpoint JOB [DIR]`: the daemon names an iteration and
        every rank checkpoints when it is between iterations there (step()
        asks after each iteration). A failed request is warned about and
        kept in last_checkpoint_error; training goes on."""
        if not self.lib.has("zc_checkpoint_due"):
            return
        directory = self.client.checkpoint_due()
        if directory is None:
            return
        try:
            self.client.checkpoint(directory)
            self.last_checkpoint_error = None
        except _lib.ZerodError as e:
            import warnings
            self.last_checkpoint_error = e
            warnings.warn(f"ZerodOptimizer: the checkpoint zeroctl asked for into {directory} "
                          f"failed: {e}")

    def close(self):
        """Leave the job (every rank). Parameters in this process's own
        buffers (the first plan's, while DDP's layout kept it) stay where they
        are: their storage keeps the memory mapped; those in the library's
        (a re-plan's) become copies."""
        if getattr(self, "client", None) is None:
            return
        self._wait_step()
        self._release_grads()
        self._pre.remove()
        if self.client.own is None and not self.cuda:  # the library's mapping goes with it
            with torch.no_grad():
                for p in self._model_params:
                    if id(p) in self._param_ptr:
                        p.data = p.data.clone()
        self.client.close()
        self.client = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
