"""ctypes binding of libzeroclient (zeroclient.h), the trainer side of zerod.

No compiled extension: the library is found through $ZEROD_LIBZEROCLIENT (a
path), else its soname libzeroclient.so.1 (the installed library). The
structs below mirror zeroclient.h's size-first structs, with the fields this
round's API adds (masks and clipping, state, dtypes) appended; a library that
predates a field reads it as its default as long as it is 0 ("ABI" in
zeroclient.h), and the code that would set it checks first that the library
has the functions of that part (`require`), so an older library gives a
NotImplementedError naming the missing C function, never a silent difference.
"""
import ctypes
import os
import threading

c_u32, c_u64, c_i32, c_dbl = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32, ctypes.c_double
c_fptr = ctypes.POINTER(ctypes.c_float)


class ParamGroup(ctypes.Structure):
    _fields_ = [("size", c_u32), ("nesterov", ctypes.c_bool), ("amsgrad", ctypes.c_bool),
                ("maximize", ctypes.c_bool), ("reserved", ctypes.c_uint8),
                ("lr", c_dbl), ("momentum", c_dbl), ("dampening", c_dbl),
                ("weight_decay", c_dbl), ("beta1", c_dbl), ("beta2", c_dbl), ("eps", c_dbl),
                ("max_grad_norm", c_dbl)]  # sem


class Segment(ctypes.Structure):
    _fields_ = [("size", c_u32), ("group", c_u32), ("offset", c_u64), ("numel", c_u64),
                ("param_id", c_u64)]  # state


class Bucket(ctypes.Structure):
    _fields_ = [("size", c_u32), ("nsegments", c_u32), ("numel", c_u64),
                ("segments", ctypes.POINTER(Segment)),
                ("dtype", c_u32), ("reserved2", c_u32)]  # dtype


class Plan(ctypes.Structure):
    _fields_ = [("size", c_u32), ("optimizer", c_u32), ("shard_mode", c_u32),
                ("step_mode", c_u32), ("ngroups", c_u32), ("nbuckets", c_u32),
                ("groups", ctypes.POINTER(ParamGroup)), ("buckets", ctypes.POINTER(Bucket)),
                ("max_grad_norm", c_dbl)]  # sem


class Config(ctypes.Structure):
    _fields_ = [("size", c_u32), ("rank", c_u32), ("world_size", c_u32),
                ("local_rank", c_u32), ("local_size", c_u32),
                ("connect_timeout_ms", c_i32), ("register_timeout_ms", c_i32),
                ("reserved", c_u32), ("socket", ctypes.c_char_p), ("job_id", ctypes.c_char_p),
                ("rdzv", ctypes.c_char_p), ("job_secret", ctypes.c_char_p),
                ("nnodes", c_u32), ("node_rank", c_u32), ("has_node_rank", c_u32),
                ("reserved2", c_u32)]


class Buffers(ctypes.Structure):  # zc_register_buffers
    _fields_ = [("size", c_u32), ("grad_fd", c_i32), ("grad_offset", c_u64),
                ("param_fd", c_i32), ("reserved", c_u32), ("param_offset", c_u64)]


class SharedParams(ctypes.Structure):  # shared_params: zc_alloc_buffers_shared
    _fields_ = [("size", c_u32), ("pid", c_i32), ("fd", c_i32), ("reserved", c_u32)]


class BuffersCuda(ctypes.Structure):  # cuda: zc_register_buffers, kind ZC_BUFFERS_CUDA
    """The whole zc_buffers (Buffers is its first 32 bytes, what the host
    path has always sent): kind and the two device pointers."""
    _fields_ = Buffers._fields_ + [("kind", c_u32), ("reserved2", c_u32),
                                   ("grad_dev", ctypes.c_void_p), ("param_dev", ctypes.c_void_p)]


class Ready(ctypes.Structure):  # sem: zc_bucket_ready_ex
    _fields_ = [("size", c_u32), ("bucket", c_u32), ("nwords", c_u32), ("reserved", c_u32),
                ("unused", ctypes.POINTER(c_u64))]


class StepInfo(ctypes.Structure):  # sem: zc_step_info
    _fields_ = [("size", c_u32), ("found_inf", c_u32), ("iteration", c_u64),
                ("grad_norm", c_dbl)]


class SegmentState(ctypes.Structure):  # state: zc_get_state / zc_set_state
    _fields_ = [("size", c_u32), ("bucket", c_u32), ("segment", c_u32), ("present", c_u32),
                ("step", c_dbl), ("momentum_buffer", c_fptr), ("exp_avg", c_fptr),
                ("exp_avg_sq", c_fptr), ("max_exp_avg_sq", c_fptr), ("master", c_fptr)]


STATE_STEP, STATE_MOMENTUM_BUFFER, STATE_EXP_AVG = 1, 2, 4
STATE_EXP_AVG_SQ, STATE_MAX_EXP_AVG_SQ, STATE_MASTER = 8, 16, 32
OPT_SGD, OPT_ADAM, OPT_ADAMW = 1, 2, 3
SHARD_BUCKET, SHARD_SLICE = 1, 2
STEP_INTERLEAVED, STEP_AT_END = 1, 2
DTYPE_F32, DTYPE_BF16, DTYPE_F16 = 0, 1, 2
BUFFERS_HOST, BUFFERS_CUDA = 0, 1
NO_ITERATION = 2**64 - 1
ZC_ETIMEDOUT = -1014  # zeroclient.h's ZC_ERRORS (zc_checkpoint_wait's "still writing")

FutureCallback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)

_vp, _int = ctypes.c_void_p, ctypes.c_int
# name: (restype, argtypes); every function of zeroclient.h this package calls
_SIGNATURES = {
    "zc_version": (ctypes.c_uint, []),
    "zc_strerror": (ctypes.c_char_p, [_int]),
    "zc_strerror_name": (ctypes.c_char_p, [_int]),
    "zc_error_message": (ctypes.c_char_p, []),
    "zc_connect": (_int, [ctypes.POINTER(Config), ctypes.POINTER(_vp)]),
    "zc_close": (None, [_vp]),
    "zc_alloc_buffers": (_int, [_vp, ctypes.POINTER(Plan)]),
    "zc_register_buffers": (_int, [_vp, ctypes.POINTER(Plan), ctypes.POINTER(Buffers)]),
    "zc_alloc_buffers_shared": (_int, [_vp, ctypes.POINTER(Plan), ctypes.POINTER(SharedParams),
                                       ctypes.POINTER(SharedParams)]),
    "zc_plan_buffer_bytes": (_int, [ctypes.POINTER(Plan), ctypes.POINTER(c_u64)]),
    "zc_grad_buffer": (_vp, [_vp, c_u32]),
    "zc_param_buffer": (_vp, [_vp, c_u32]),
    "zc_register_plan": (_int, [_vp]),
    "zc_recovered": (_int, [_vp, ctypes.POINTER(c_u64)]),
    "zc_error_recoverable": (_int, [_int]),
    "zc_bucket_ready": (_int, [_vp, c_u32, ctypes.POINTER(_vp)]),
    "zc_step_future": (_int, [_vp, c_u64, ctypes.POINTER(_vp)]),
    "zc_iteration": (c_u64, [_vp]),
    "zc_set_hyper": (_int, [_vp, c_u32, ctypes.POINTER(ParamGroup)]),
    "zc_last_error": (_int, [_vp]),
    "zc_future_poll": (_int, [_vp]),
    "zc_future_wait": (_int, [_vp, _int]),
    "zc_future_then": (_int, [_vp, FutureCallback, _vp]),
    "zc_future_message": (ctypes.c_char_p, [_vp]),
    "zc_future_free": (None, [_vp]),
    "zc_fd": (_int, [_vp]),
    "zc_dispatch": (_int, [_vp]),
    # sem: unused-segment masks, clipping, grad scale
    "zc_bucket_ready_ex": (_int, [_vp, ctypes.POINTER(Ready), ctypes.POINTER(_vp)]),
    "zc_set_grad_scale": (_int, [_vp, c_dbl]),
    "zc_step_info": (_int, [_vp, ctypes.POINTER(StepInfo)]),
    # state: optimizer state out and in, re-planning
    "zc_get_state": (_int, [_vp, ctypes.POINTER(SegmentState), c_u32]),
    "zc_set_state": (_int, [_vp, ctypes.POINTER(SegmentState), c_u32]),
    # dtype
    "zc_grad_ptr": (_vp, [_vp, c_u32]),
    "zc_param_ptr": (_vp, [_vp, c_u32]),
    "zc_params_changed": (_int, [_vp]),
    # cuda: device buffers over CUDA IPC, ready and done events (streams as
    # cudaStream_t, e.g. torch.cuda.current_stream().cuda_stream)
    "zc_bucket_ready_cuda": (_int, [_vp, c_u32, _vp, ctypes.POINTER(_vp)]),
    "zc_step_wait_cuda": (_int, [_vp, _vp]),
    # checkpoint: the optimizer state and parameters on disk (docs/CHECKPOINT.md)
    "zc_checkpoint": (_int, [_vp, ctypes.c_char_p]),
    "zc_checkpoint_wait": (_int, [_vp, _int]),
    "zc_restore": (_int, [_vp, ctypes.c_char_p]),
    "zc_checkpoint_due": (_int, [_vp, ctypes.c_char_p, ctypes.c_size_t]),
}
# the functions of this round's parts, by part: the first one names the part
PARTS = {
    "masks": "zc_bucket_ready_ex",
    "clip": "zc_step_info",
    "grad_scale": "zc_set_grad_scale",
    "state": "zc_get_state",
    "replan": "zc_get_state",
    "dtype": "zc_params_changed",
    "own_buffers": "zc_register_buffers",
    "cuda": "zc_bucket_ready_cuda",
    "checkpoint": "zc_checkpoint",
    "shared_params": "zc_alloc_buffers_shared",
}


class ZerodError(RuntimeError):
    """A libzeroclient call failed: code (negative), name (ZC_E... or errno
    name) and the library's reason."""

    def __init__(self, call, code, reason):
        # the library's reasons often begin with the function's name: said once
        if reason.startswith(f"{call}: "):
            reason = reason[len(call) + 2:]
        self.call, self.code, self.reason = call, code, reason
        self.name = Lib.get().strerror_name(code)
        super().__init__(f"{call}: {self.name} ({code}): {reason}")

    @property
    def recoverable(self):
        """True if the job lives on without this process (ZC_ERANKLOST: a
        trainer died, zerod keeps the job for --rejoin-timeout): restart the
        worker group (torchrun --max-restarts) and the job goes on from
        zerod's memory, no checkpoint read (ZerodOptimizer.resumed_iteration)."""
        lib = Lib.get()
        return lib.has("zc_error_recoverable") and lib.fn("zc_error_recoverable")(self.code) == 1


class Lib:
    """The loaded libzeroclient; one per process (Lib.get())."""

    _one = None
    _lock = threading.Lock()

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._one is None:
                cls._one = cls(os.environ.get("ZEROD_LIBZEROCLIENT") or "libzeroclient.so.1")
            return cls._one

    def __init__(self, path):
        try:
            self.dll = ctypes.CDLL(path)
        except OSError as e:
            raise ImportError(f"zerod: cannot load libzeroclient ({path}): {e}; install zerod "
                              "or set ZEROD_LIBZEROCLIENT to the library's path") from e
        self.path = path
        self._fns = {}

    def has(self, name):
        try:
            self.fn(name)
            return True
        except NotImplementedError:
            return False

    def fn(self, name):
        """The C function `name`, typed; NotImplementedError if this library
        lacks it (an older libzeroclient)."""
        f = self._fns.get(name)
        if f is None:
            try:
                f = getattr(self.dll, name)
            except AttributeError:
                raise NotImplementedError(
                    f"zerod: the loaded libzeroclient ({self.path}) has no {name}(): "
                    "it predates this feature") from None
            f.restype, f.argtypes = _SIGNATURES[name]
            self._fns[name] = f
        return f

    def require(self, part):
        self.fn(PARTS[part])

    def strerror_name(self, code):
        return self.fn("zc_strerror_name")(code).decode()

    def error_message(self):
        return (self.fn("zc_error_message")() or b"").decode(errors="replace")

    def check(self, name, *args):
        """Call `name`; raise ZerodError with this thread's reason if it
        returns < 0."""
        r = self.fn(name)(*args)
        if r < 0:
            raise ZerodError(name, r, self.error_message())
        return r
