"""zerod.Client: one trainer rank's connection to its zerod (zc_client).

Futures a caller hands to then() complete on the client's own thread (the
pump): it waits for them one by one, in the order they were handed over,
in zc_future_wait(), which processes every completion that arrived (the fast
path's ring as well as the ZeroMQ socket), and then runs the callback and
frees the future. Something has to call into the client for completions to
be seen (zeroclient.h), and the thread that waits for a hook's future (DDP's
reducer, inside backward) waits in torch, not in libzeroclient. The pump
holds no lock of the client while it sleeps, and the callbacks it runs hold
none either. (A pump in poll(zc_fd) + zc_dispatch() would not do: zc_fd
wakes for the ZeroMQ socket, and with the fast path the completions come
through the ring, so it would see them only at its poll timeout.)
"""
import ctypes
import fcntl
import mmap
import os
import queue
import threading

from . import _lib
from ._lib import Lib, ZerodError

OPTIMIZERS = {"sgd": _lib.OPT_SGD, "adam": _lib.OPT_ADAM, "adamw": _lib.OPT_ADAMW}
SHARDS = {"bucket": _lib.SHARD_BUCKET, "slice": _lib.SHARD_SLICE}
STEP_MODES = {"interleaved": _lib.STEP_INTERLEAVED, "at_end": _lib.STEP_AT_END}
DTYPES = {"f32": (_lib.DTYPE_F32, 4), "bf16": (_lib.DTYPE_BF16, 2), "f16": (_lib.DTYPE_F16, 2)}


def param_group(h):
    """A zc_param_group from a dict of zerod's names (lr, momentum, ...)."""
    g = _lib.ParamGroup()
    g.size = ctypes.sizeof(g)
    g.lr, g.beta1, g.beta2, g.eps = 1e-3, 0.9, 0.999, 1e-8
    for k, v in h.items():
        setattr(g, k, v)
    return g


class Plan:
    """A plan in Python terms: optimizer, shard and step mode names, groups (dicts
    of zc_param_group fields), buckets (lists of (group, numel, param_id)
    segments, in buffer order), max_grad_norm (0: none), dtypes (per bucket:
    "f32", "bf16" or "f16"; None: all f32)."""

    def __init__(self, optimizer, shard, step_mode, groups, buckets, max_grad_norm=0.0,
                 dtypes=None):
        self.optimizer, self.shard, self.step_mode = optimizer, shard, step_mode
        self.groups, self.buckets, self.max_grad_norm = groups, buckets, max_grad_norm
        self.dtypes = dtypes or ["f32"] * len(buckets)

    def to_c(self, with_param_ids):
        """The zc_plan and everything it points to (kept alive by the tuple)."""
        groups = (_lib.ParamGroup * len(self.groups))(*[param_group(g) for g in self.groups])
        keep, cb = [], []
        for segs in self.buckets:
            arr = (_lib.Segment * len(segs))()
            off = 0
            for s, (group, numel, pid) in zip(arr, segs):
                s.size, s.group, s.offset, s.numel = ctypes.sizeof(s), group, off, numel
                s.param_id = pid if with_param_ids else 0
                off += numel
            keep.append(arr)
            b = _lib.Bucket()
            b.size, b.nsegments, b.numel = ctypes.sizeof(b), len(segs), off
            b.segments = arr
            b.dtype = DTYPES[self.dtypes[len(cb)]][0]
            cb.append(b)
        buckets = (_lib.Bucket * len(cb))(*cb)
        p = _lib.Plan()
        p.size = ctypes.sizeof(p)
        p.optimizer = OPTIMIZERS[self.optimizer]
        p.shard_mode = SHARDS[self.shard]
        p.step_mode = STEP_MODES[self.step_mode]
        p.ngroups, p.nbuckets = len(self.groups), len(cb)
        p.groups, p.buckets = groups, buckets
        p.max_grad_norm = self.max_grad_norm
        return p, (groups, buckets, keep)


class Client:
    """zc_client of one rank. Thread-safe as libzeroclient is; close() must
    not race with other calls."""

    def __init__(self, rank, world_size, job_id, socket=None, local_rank=None,
                 local_size=None, connect_timeout_ms=0, register_timeout_ms=0):
        self.lib = Lib.get()
        cfg = _lib.Config()
        cfg.size = ctypes.sizeof(cfg)
        cfg.rank, cfg.world_size = rank, world_size
        cfg.local_rank = rank if local_rank is None else local_rank
        cfg.local_size = world_size if local_size is None else local_size
        cfg.connect_timeout_ms, cfg.register_timeout_ms = connect_timeout_ms, register_timeout_ms
        cfg.socket = socket.encode() if socket else None
        cfg.job_id = job_id.encode()
        h = ctypes.c_void_p()
        self.lib.check("zc_connect", ctypes.byref(cfg), ctypes.byref(h))
        self.h = h
        self.plan = None
        self._keep = None
        self.own = None  # the mmap of this process's memfd, while the buffers are in it
        self.cuda = None  # (grad_dev, param_dev) of CUDA buffers
        self._stop = False
        self._queue = queue.SimpleQueue()  # (zc_future*, fn), or None: stop
        self._pump = threading.Thread(target=self._run_pump, name="zerod-pump", daemon=True)
        self._pump.start()

    # -- the pump --------------------------------------------------------
    def _run_pump(self):
        wait = self.lib.fn("zc_future_wait")
        while True:
            item = self._queue.get()
            if item is None:
                return
            f, fn = item
            r = 0
            while not self._stop:
                r = wait(f, 1000)  # 1 done, 0 not yet (look at _stop), < 0 failed
                if r != 0:
                    break
            msg = ""
            if r < 0:
                msg = (self.lib.fn("zc_future_message")(f) or b"").decode(errors="replace") \
                    or self.lib.error_message()
            elif r == 0:
                r, msg = -125, "the client was closed before the future completed"
            self.lib.fn("zc_future_free")(f)
            try:
                fn(min(r, 0), msg)
            except BaseException as e:  # the pump must go on: say it
                import traceback
                traceback.print_exception(type(e), e, e.__traceback__)

    def close(self):
        if self.h is None:
            return
        self._stop = True
        self._queue.put(None)
        if self._pump is not threading.current_thread():
            self._pump.join()
        self.lib.fn("zc_close")(self.h)
        self.h = None

    # -- buffers and plan ----------------------------------------------------
    def alloc_buffers(self, plan):
        """zc_alloc_buffers(plan): the first time, or (with the state part) a
        new layout of the same parameters between iterations."""
        cplan, keep = plan.to_c(self.lib.has("zc_get_state"))
        if any(d != "f32" for d in plan.dtypes):
            self.lib.require("dtype")
        if plan.max_grad_norm or any(g.get("max_grad_norm") for g in plan.groups):
            self.lib.require("clip")
        self.lib.check("zc_alloc_buffers", self.h, ctypes.byref(cplan))
        if self.plan is not None:  # a re-plan: back to these if it is refused
            self._prev = (self.plan, self._keep, self.own, self.cuda)
        self.plan, self._keep = plan, (cplan, keep)
        self.own = None  # a re-plan's buffers are the library's

    def alloc_buffers_shared(self, plan, handle=None):
        """zc_alloc_buffers_shared(plan): the first plan's buffers, or a
        re-plan's, the library's, the parameters in one memfd the job's
        local ranks share (ZC_BUFFERS_SHARED_PARAMS). handle None: this rank
        creates it (its client keeps it open until close(); a re-plan's is
        filled from the registered buffers); else (pid, fd), what the
        creating rank's call returned, opened through /proc/PID/fd/N.
        Returns the handle (pid, fd) for the other local ranks."""
        self.lib.require("shared_params")
        cplan, keep = plan.to_c(self.lib.has("zc_get_state"))
        if any(d != "f32" for d in plan.dtypes):
            self.lib.require("dtype")
        if plan.max_grad_norm or any(g.get("max_grad_norm") for g in plan.groups):
            self.lib.require("clip")
        src = None
        if handle is not None:
            src = _lib.SharedParams()
            src.size, (src.pid, src.fd) = ctypes.sizeof(src), handle
        out = _lib.SharedParams()
        out.size, out.fd = ctypes.sizeof(out), -1
        self.lib.check("zc_alloc_buffers_shared", self.h, ctypes.byref(cplan),
                       ctypes.byref(src) if src is not None else None, ctypes.byref(out))
        if self.plan is not None:  # a re-plan: back to these if it is refused
            self._prev = (self.plan, self._keep, self.own, self.cuda)
        self.plan, self._keep = plan, (cplan, keep)
        self.own = None  # the library's buffers
        return out.pid, out.fd

    def register_buffers(self, plan):
        """The first plan's buffers in memory this process owns: a memfd it
        creates (gradients, then parameters at the next page), seals against
        shrinking and growing and maps, handed to zerod with
        zc_register_buffers(). The buffers grad_buffer() / param_buffer()
        return are then views into that mapping (self.own), which lives as
        long as they do, zc_close() or not."""
        self.lib.require("own_buffers")
        cplan, keep = plan.to_c(self.lib.has("zc_get_state"))
        if any(d != "f32" for d in plan.dtypes):
            self.lib.require("dtype")
        n = ctypes.c_uint64()
        self.lib.check("zc_plan_buffer_bytes", ctypes.byref(cplan), ctypes.byref(n))
        param_off = (n.value + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        fd = os.memfd_create("zerod-torch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, param_off + n.value)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            mm = mmap.mmap(fd, param_off + n.value, mmap.MAP_SHARED,
                           mmap.PROT_READ | mmap.PROT_WRITE)
            b = _lib.Buffers()
            b.size, b.grad_fd, b.grad_offset = ctypes.sizeof(b), fd, 0
            b.param_fd, b.param_offset = fd, param_off
            self.lib.check("zc_register_buffers", self.h, ctypes.byref(cplan), ctypes.byref(b))
        finally:
            os.close(fd)  # zerod and the library keep mappings, not the fd
        self.plan, self._keep = plan, (cplan, keep)
        self.own, self._param_off = mm, param_off

    def buffer_bytes(self, plan):
        """zc_plan_buffer_bytes(plan): the size of each of its two buffers."""
        cplan, _ = plan.to_c(self.lib.has("zc_get_state"))
        n = ctypes.c_uint64()
        self.lib.check("zc_plan_buffer_bytes", ctypes.byref(cplan), ctypes.byref(n))
        return n.value

    def register_cuda_buffers(self, plan, grad_dev, param_dev):
        """A plan's buffers in device memory this process allocated
        (grad_dev, param_dev: device addresses of buffer_bytes(plan) bytes
        each, on one device): zc_register_buffers() of kind ZC_BUFFERS_CUDA,
        which sends zerod their CUDA IPC handles and the event rings. The
        buffers are then device memory only: grad_offset() / param_offset()
        say where each bucket starts; grad_buffer() / param_buffer() refuse.
        After the plan was registered, a re-plan (put the parameters in the
        new buffers, then register_plan()); a library that cannot re-plan
        CUDA buffers refuses with ZC_ESTATE (buffers already)."""
        self.lib.require("cuda")
        cplan, keep = plan.to_c(self.lib.has("zc_get_state"))
        b = _lib.BuffersCuda()
        b.size, b.grad_fd, b.param_fd = ctypes.sizeof(b), -1, -1
        b.kind, b.grad_dev, b.param_dev = _lib.BUFFERS_CUDA, grad_dev, param_dev
        # the whole struct, typed as its host prefix (zc_register_buffers's
        # argtypes): b.size tells the library how much there is
        self.lib.check("zc_register_buffers", self.h, ctypes.byref(cplan),
                       ctypes.cast(ctypes.pointer(b), ctypes.POINTER(_lib.Buffers)))
        if self.plan is not None:  # a re-plan: back to these if it is refused
            self._prev = (self.plan, self._keep, self.own, self.cuda)
        self.plan, self._keep = plan, (cplan, keep)
        self.cuda = (grad_dev, param_dev)

    def _offset(self, fn, bucket, base):
        at = self.lib.fn(fn)(self.h, bucket)
        if not at:
            raise ZerodError(fn, -22, self.lib.error_message())
        return at - base

    def grad_offset(self, bucket):
        """CUDA buffers: where bucket's gradients start in the gradient
        buffer, in bytes (zc_grad_ptr() less grad_dev)."""
        return self._offset("zc_grad_ptr", bucket, self.cuda[0])

    def param_offset(self, bucket):
        return self._offset("zc_param_ptr", bucket, self.cuda[1])

    def register_plan(self):
        prev, self._prev = getattr(self, "_prev", None), None
        try:
            self.lib.check("zc_register_plan", self.h)
        except ZerodError:
            if prev is not None:  # the library went back to the registered plan
                self.plan, self._keep, self.own, self.cuda = prev
            raise

    def _buffer(self, name, bucket):
        if self.cuda is not None:
            raise ZerodError(name, -22, "the buffers are CUDA device memory: "
                             "grad_offset() / param_offset() say where a bucket is")
        dtype = self.plan.dtypes[bucket]
        n = sum(s[1] for s in self.plan.buckets[bucket]) * DTYPES[dtype][1]
        if self.own is not None:  # where the library says, in our own mapping
            at = self.lib.fn("zc_grad_ptr")(self.h, bucket)
            base = self.lib.fn("zc_grad_ptr")(self.h, 0)
            if not at or not base:
                raise ZerodError("zc_grad_ptr", -22, self.lib.error_message())
            off = at - base + (self._param_off if "param" in name else 0)
            return memoryview(self.own)[off:off + n]
        if dtype != "f32" or self.lib.has("zc_grad_ptr"):
            name = name.replace("_buffer", "_ptr")  # zc_grad_ptr: any dtype
        ptr = self.lib.fn(name)(self.h, bucket)
        if not ptr:
            raise ZerodError(name, -22, self.lib.error_message())
        return (ctypes.c_uint8 * n).from_address(ptr)

    def grad_buffer(self, bucket):
        """Bucket's gradient buffer as a ctypes byte array (buffer protocol):
        its numel elements of the bucket's dtype."""
        return self._buffer("zc_grad_buffer", bucket)

    def param_buffer(self, bucket):
        return self._buffer("zc_param_buffer", bucket)

    # -- iterations --------------------------------------------------------
    def then(self, f, fn):
        """fn(result, message) on the pump once future f settled (result 0,
        or < 0 with the reason); f is freed before fn runs. Futures settle in
        the order they were handed to then()."""
        self._queue.put((f, fn))

    def bucket_ready(self, bucket, unused=None):
        """Hand bucket over; returns its zc_future* (the caller frees it or
        gives it to then()). unused: bit mask words (ints) of segments with no
        gradient on this rank (the masks part), or None."""
        f = ctypes.c_void_p()
        if unused is None:
            self.lib.check("zc_bucket_ready", self.h, bucket, ctypes.byref(f))
        else:
            words = (ctypes.c_uint64 * len(unused))(*unused)
            r = _lib.Ready()
            r.size, r.bucket, r.nwords = ctypes.sizeof(r), bucket, len(unused)
            r.unused = words
            self.lib.check("zc_bucket_ready_ex", self.h, ctypes.byref(r), ctypes.byref(f))
        return f.value

    def bucket_ready_cuda(self, bucket, stream):
        """CUDA buffers: zc_bucket_ready_cuda(bucket, stream): the ready
        event is recorded on stream (a cudaStream_t as an int; 0: the legacy
        default stream) and zerod waits for it on the device; returns the
        zc_future* as bucket_ready() does."""
        f = ctypes.c_void_p()
        self.lib.check("zc_bucket_ready_cuda", self.h, bucket, stream or None, ctypes.byref(f))
        return f.value

    def step_wait_cuda(self, f, stream):
        """CUDA buffers: stream waits on the device for the parameter updates
        of the completed step future f (zc_step_wait_cuda)."""
        self.lib.check("zc_step_wait_cuda", f, stream or None)

    def iteration(self):
        return self.lib.fn("zc_iteration")(self.h)

    def recovered(self):
        """After register_plan(): the iteration a recovered job goes on at
        (its ranks rejoined after a trainer died), or None for a fresh start
        (or a library without recovery)."""
        if not self.lib.has("zc_recovered"):
            return None
        it = ctypes.c_uint64()
        r = self.lib.check("zc_recovered", self.h, ctypes.byref(it))
        return it.value if r == 1 else None

    def step_future(self, iteration):
        f = ctypes.c_void_p()
        self.lib.check("zc_step_future", self.h, iteration, ctypes.byref(f))
        return f.value

    def wait(self, f, timeout_ms=-1):
        """Wait for future f (not freed here): 1 done, 0 timed out; raises on
        failure with the daemon's reason."""
        r = self.lib.fn("zc_future_wait")(f, timeout_ms)
        if r < 0:
            msg = (self.lib.fn("zc_future_message")(f) or b"").decode(errors="replace")
            raise ZerodError("zc_future_wait", r, msg or self.lib.error_message())
        return r

    def step_info(self, f):
        """(found_inf, iteration, grad_norm) of a completed step future."""
        info = _lib.StepInfo()
        info.size = ctypes.sizeof(info)
        self.lib.check("zc_step_info", f, ctypes.byref(info))
        return bool(info.found_inf), info.iteration, info.grad_norm

    def free(self, f):
        self.lib.fn("zc_future_free")(f)

    def set_hyper(self, group, hyper):
        g = param_group(hyper)
        self.lib.check("zc_set_hyper", self.h, group, ctypes.byref(g))

    def params_changed(self):
        """zc_params_changed(): bf16/fp16 parameters were edited; zerod
        reloads their fp32 masters before the next step."""
        self.lib.check("zc_params_changed", self.h)

    def set_grad_scale(self, inv_scale):
        self.lib.check("zc_set_grad_scale", self.h, float(inv_scale))

    def last_error(self):
        r = self.lib.fn("zc_last_error")(self.h)
        return r, (self.lib.error_message() if r < 0 else "")

    # -- optimizer state (the state part) ----------------------------------
    def get_state(self, segs):
        """segs: SegmentState array with bucket/segment and float pointers
        filled in; fills step/present and the arrays."""
        self.lib.check("zc_get_state", self.h, segs, len(segs))

    def set_state(self, segs):
        self.lib.check("zc_set_state", self.h, segs, len(segs))

    # -- checkpoints (the checkpoint part) ---------------------------------
    def checkpoint(self, directory):
        """zc_checkpoint(): every rank, between iterations; rank 0's client
        writes dir in the background."""
        self.lib.check("zc_checkpoint", self.h, os.fsencode(directory))

    def checkpoint_wait(self, timeout_ms=-1):
        """zc_checkpoint_wait(): True once the last checkpoint is durable,
        False if it is still being written after timeout_ms; a failed write
        raises ZerodError (ZC_ECKPT with the reason)."""
        r = self.lib.fn("zc_checkpoint_wait")(self.h, int(timeout_ms))
        if r == _lib.ZC_ETIMEDOUT:
            return False
        if r < 0:
            raise ZerodError("zc_checkpoint_wait", r, self.lib.error_message())
        return True

    def restore(self, directory):
        self.lib.check("zc_restore", self.h, os.fsencode(directory))

    def checkpoint_due(self):
        """zc_checkpoint_due(): the directory an operator asked for with
        `zeroctl checkpoint` when this rank is at the iteration it named,
        else None."""
        buf = ctypes.create_string_buffer(4096)
        r = self.lib.check("zc_checkpoint_due", self.h, buf, len(buf))
        return os.fsdecode(buf.value) if r == 1 else None
