"""The ctypes binding of libgear (cmd/libgear): loading, statuses, errors and
the wait loop that keeps blocking calls responsive to Ctrl-C."""

import ctypes
import math
import os
import time

import numpy as np

OK, ERROR, CLOSED, TIMEOUT, INVALID, PENDING = 0, 1, 2, 3, 4, 5

# The slice, in milliseconds, in which blocking calls wait before Python looks
# at its signals again: a Ctrl-C is seen within about this long.
SLICE_MS = 20


class Error(Exception):
    """An error of gear; its text is the Go error's, whole."""


class Closed(Error):
    """The object (table, shard, world, stream) is closed."""


class Timeout(Error):
    """A blocking call's timeout passed first."""


class InvalidArgument(Error, ValueError):
    """An argument gear refuses (a bad name, parameter, handle or size)."""


_CLASSES = {ERROR: Error, CLOSED: Closed, TIMEOUT: Timeout, INVALID: InvalidArgument}

U64_MAX = 2**64 - 1


I32 = (-2**31, 2**31 - 1)
I64 = (-2**63, 2**63 - 1)


def integer(what, v, lo=0, hi=U64_MAX):
    """v as an int from lo to hi (None: no bound), or InvalidArgument naming
    what: a float, a bool, a string or a number out of range is refused, where
    ctypes and numpy would wrap it around silently. The bounds a caller gives
    are those of the C type it passes v as, or of Python's own checks; gear
    checks its own limits behind them. A 0-d integer array counts as its
    number."""
    if isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "iu":
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or \
            (lo is not None and v < lo) or (hi is not None and v > hi):
        span = "2**64-1" if hi == U64_MAX else str(hi)
        want = f"from {lo} to {span}" if hi is not None else f">= {lo}"
        raise InvalidArgument(f"gear: {what} {v!r}: want an integer {want}")
    return int(v)


def u64s(what, vs):
    """vs (a sequence or array of keys) as a contiguous 1-d uint64 array, or
    InvalidArgument naming what: negative, fractional or too large values are
    refused, not wrapped around."""
    a = np.asarray(vs)
    if a.ndim == 0:
        a = a.reshape(1)
    if a.ndim != 1:
        raise InvalidArgument(f"gear: {what}: shape {a.shape}, want one dimension")
    if a.size and a.dtype.kind not in "iu":
        if isinstance(vs, np.ndarray):
            raise InvalidArgument(f"gear: {what}: dtype {a.dtype}, want integers from 0 to 2**64-1")
        # Python numbers that numpy made floats or objects (ints past int64).
        return np.array([integer(what, v) for v in np.asarray(vs, dtype=object).reshape(-1)], np.uint64)
    if a.dtype.kind == "i" and a.size and a.min() < 0:
        raise InvalidArgument(f"gear: {what} {int(a.min())}: want an integer from 0 to 2**64-1")
    return np.ascontiguousarray(a, np.uint64)

_u64, _i64, _i32, _dbl = ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32, ctypes.c_double
_p = ctypes.c_void_p
_cp = ctypes.c_char_p
_P = ctypes.POINTER

# Each export's argument types, as gear.h declares them.
_SIGS = {
    "gear_last_error": ([_cp, _i64], _i64),
    "gear_close": ([_u64], _i32),
    "gear_op_wait": ([_u64, _i64], _i32),
    "gear_op_cancel": ([_u64], _i32),
    "gear_op_result": ([_u64, _P(_u64)], _i32),
    "gear_init": ([_P(_u64)], _i32),
    "gear_world_info": ([_u64, _cp, _i64, _P(_i64)], _i32),
    "gear_segment_name": ([_cp, _i64, _cp, _i64, _P(_i64)], _i32),
    "gear_allreduce": ([_u64, _p, _i64, _i32, _i32, _P(_u64)], _i32),
    "gear_broadcast": ([_u64, _p, _i64, _i32, _i32, _P(_u64)], _i32),
    "gear_allgather": ([_u64, _p, _i64, _p, _i32, _P(_u64)], _i32),
    "gear_barrier": ([_u64, _P(_u64)], _i32),
    "gear_table_create": ([_cp, _i64, _cp, _i64, _u64, _i64, _P(_u64)], _i32),
    "gear_table_restore": ([_cp, _i64, _cp, _i64, _cp, _i64, _u64, _i64, _P(_u64)], _i32),
    "gear_table_checkpoint": ([_u64, _cp, _i64, _P(_u64)], _i32),
    "gear_shard_attach": ([_cp, _i64, _i64, _P(_u64)], _i32),
    "gear_shard_layout": ([_u64, _cp, _i64, _P(_i64)], _i32),
    "gear_shard_allocate": ([_u64, _i64, _P(_i64)], _i32),
    "gear_shard_commit": ([_u64, _i64, _i32, _u64, _dbl, _P(_u64)], _i32),
    "gear_shard_abort": ([_u64, _i64], _i32),
    "gear_shard_insert": ([_u64, _i64, _p, _p, _i32, _p, _i64, _P(_i64)], _i32),
    "gear_shard_stage": ([_u64, _P(_u64)], _i32),
    "gear_shard_put": ([_u64, _i64, _i32, _u64, _dbl, _P(_u64)], _i32),
    "gear_shard_put_staged": ([_u64], _i32),
    "gear_shard_unlink": ([_u64], _i32),
    "gear_table_sample": ([_u64, _i64, _i64, _i32, _p, _p, _p, _p, _p, _i32, _p, _p, _P(_i64), _P(_u64)], _i32),
    "gear_table_mutate": ([_u64, _i64, _p, _p, _i64, _p], _i32),
    "gear_table_reset": ([_u64], _i32),
    "gear_table_info": ([_u64, _cp, _i64, _P(_i64)], _i32),
    "gear_table_wait_admitted": ([_u64, _i64], _i32),
    "gear_param_publisher": ([_u64, _cp, _i64, _i64, _P(_u64)], _i32),
    "gear_param_publish": ([_u64, _u64, _p, _i64, _P(_u64)], _i32),
    "gear_param_reader": ([_u64, _cp, _i64, _P(_u64)], _i32),
    "gear_param_len": ([_u64, _P(_i64)], _i32),
    "gear_param_read": ([_u64, _u64, _i64, _p, _i64, _P(_u64)], _i32),
    "gear_line_latency": ([_i64, _P(_u64)], _i32),
}


def _load():
    path = os.environ.get("GEAR_LIB") or os.path.join(os.path.dirname(__file__), "libgear.so")
    if not os.path.exists(path):
        raise ImportError(
            f"gear: {path} is missing: build it with `make python` (or set GEAR_LIB to a libgear.so)")
    # Lazy binding: the NVML symbols that go-nvml (through package gmi) leaves
    # undefined are resolved only if a GPU's library is ever loaded.
    lib = ctypes.CDLL(path, mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    # The same library through PyDLL: its calls keep the GIL, which spares
    # the GIL's release and retaking (a good part of a short call's cost)
    # and keeps other Python threads out while it runs. Only calls that
    # never wait go through it (gear_shard_put with ms 0, gear_shard_put_staged).
    fast = ctypes.PyDLL(path, mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    for name, (args, res) in _SIGS.items():
        for lb in (lib, fast):
            fn = getattr(lb, name)
            fn.argtypes, fn.restype = args, res
    return lib, fast


lib, fast = _load()


def last_error():
    """The calling thread's last error text from libgear."""
    buf = ctypes.create_string_buffer(512)
    n = lib.gear_last_error(buf, len(buf))
    if n > len(buf):
        buf = ctypes.create_string_buffer(n)
        n = lib.gear_last_error(buf, len(buf))
    return buf.raw[:n].decode("utf-8", "replace")


def check(status):
    """Raise the exception of status (a libgear call's) unless it is OK."""
    if status != OK:
        raise _CLASSES.get(status, Error)(last_error())


def text(fn, *args):
    """Call a libgear function that writes text into a buffer; return the text."""
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = _i64()
        check(fn(*args, buf, size, ctypes.byref(n)))
        if n.value <= size:
            return buf.raw[: n.value].decode()
        size = n.value


def deadline(timeout):
    """When timeout (seconds; None or inf: no limit; 0 or less: one try)
    passes, on time.monotonic's clock, or None. A timeout that is not a
    number, or NaN, raises InvalidArgument: callers take the deadline
    before they start anything."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)) or timeout != timeout:
        raise InvalidArgument(f"gear: timeout {timeout!r}: want seconds, or None for no limit")
    if timeout == math.inf:
        return None
    return time.monotonic() + max(float(timeout), 0.0)


def remaining_ms(end):
    """The next slice to wait, in ms: SLICE_MS, or less before the deadline,
    and at least 1: a call whose deadline has passed (timeout 0 too) still
    gets one try, a sample of a table that can be sampled its batch."""
    if end is None:
        return SLICE_MS
    left = end - time.monotonic()
    return max(1, min(SLICE_MS, int(left * 1000)))


def sliced(call, timeout, what):
    """Call call(ms) in slices of SLICE_MS until it returns anything but
    TIMEOUT or timeout (seconds; None: forever) passes. Between slices Python
    runs its signal handlers, so Ctrl-C raises KeyboardInterrupt at once."""
    end = deadline(timeout)
    while True:
        st = call(remaining_ms(end))
        if st != TIMEOUT:
            check(st)
            return
        if end is not None and time.monotonic() >= end:
            raise Timeout(f"gear: {what}: timed out after {timeout} s")


def run_op(start, timeout, what):
    """Start an operation (start(byref(op)) -> status), wait for it in slices
    and return its result handle. On Ctrl-C or timeout the operation is
    cancelled and waited for before the exception propagates."""
    end = deadline(timeout)  # a bad timeout is refused before the operation starts
    op = _u64()
    check(start(ctypes.byref(op)))
    try:
        while True:
            st = lib.gear_op_wait(op, remaining_ms(end))
            if st != PENDING:
                check(st)
                res = _u64()
                check(lib.gear_op_result(op, ctypes.byref(res)))
                return res.value
            if end is not None and time.monotonic() >= end:
                lib.gear_op_cancel(op)
                lib.gear_op_wait(op, -1)
                raise Timeout(f"gear: {what}: timed out after {timeout} s")
    except BaseException:
        lib.gear_op_cancel(op)
        lib.gear_op_wait(op, -1)
        raise
    finally:
        lib.gear_close(op)


def line_latency_ns(rounds=20000, timeout=10):
    """How long one cache line takes to pass between the first two CPUs of
    this process, in ns: the mean of rounds hand-overs (gear_line_latency).
    What two writer processes reach against one follows it (python/bench.py
    reports the ratio for each speed it saw); `gearbench line` prints it too."""
    rounds = integer("line_latency_ns: rounds", rounds, 8, I64[1])
    return run_op(lambda out: lib.gear_line_latency(rounds, out), timeout, "line latency") / 1000


def path(what, p):
    """p (a str or os.PathLike) as a str, or InvalidArgument naming what."""
    if not isinstance(p, (str, os.PathLike)):
        raise InvalidArgument(f"gear: {what}: path {p!r} ({type(p).__name__}): want a str or a path")
    p = os.fspath(p)
    if not isinstance(p, str):
        raise InvalidArgument(f"gear: {what}: path {p!r}: want a str, not bytes")
    return p


def cstr(s):
    if not isinstance(s, str):
        raise InvalidArgument(f"gear: {s!r} ({type(s).__name__}): want a str")
    b = s.encode()
    return b, len(b)
