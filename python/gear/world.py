"""gear.init: the rank's world and its collectives over numpy arrays."""

import ctypes
import json

import numpy as np

from . import _lib
from ._lib import lib

_DTYPES = {np.dtype(np.float32): 1, np.dtype(np.float64): 2, np.dtype(np.int32): 3, np.dtype(np.int64): 4}
_OPS = {"sum": 1, "max": 2, "min": 3}


def _array(a, what, writable=True):
    """a (a numpy array, or a torch CPU tensor) as a numpy array sharing its memory."""
    if not isinstance(a, np.ndarray) and hasattr(a, "numpy"):
        a = a.numpy()
    if not isinstance(a, np.ndarray):
        raise ValueError(f"gear: {what}: want a numpy array (or a CPU tensor), got {type(a).__name__}")
    if a.dtype not in _DTYPES:
        raise ValueError(f"gear: {what}: dtype {a.dtype}: want float32, float64, int32 or int64")
    if not a.flags.c_contiguous or (writable and not a.flags.writeable):
        raise ValueError(f"gear: {what}: the array must be C-contiguous and writable")
    return a


class World:
    """The calling process's world (gear.init returns it): rank, size,
    local_rank, local_size, node_rank, num_nodes, role, role_rank, role_size,
    job_id, and the collectives. Collectives are called by every rank in the
    same order; they reduce or fill the given arrays in place (mpi4py's
    Allreduce with MPI.IN_PLACE) and wait until this rank's part is done, for
    at most timeout seconds (None: no limit). A Ctrl-C ends the wait
    (KeyboardInterrupt) and cancels the collective; the communicator then
    fails for every rank, as it does after a timeout."""

    def __init__(self, handle):
        self._h = handle
        info = json.loads(_lib.text(lib.gear_world_info, handle))
        for k, v in info.items():
            setattr(self, k, v)

    def allreduce(self, buf, op="sum", timeout=None):
        """Reduce buf (float32, float64, int32 or int64; a torch CPU tensor too)
        in place over every rank with op ("sum", "max" or "min"); returns buf."""
        a = _array(buf, "allreduce")
        if op not in _OPS:
            raise ValueError(f"gear: allreduce: op {op!r}: want one of {sorted(_OPS)}")
        _lib.run_op(lambda out: lib.gear_allreduce(self._handle(), a.ctypes.data, a.size, _DTYPES[a.dtype], _OPS[op], out),
                    timeout, "allreduce")
        return buf

    def broadcast(self, buf, root=0, timeout=None):
        """Overwrite buf on every rank with root's buf; returns buf."""
        a = _array(buf, "broadcast")
        root = _lib.integer("broadcast: root", root, *_lib.I32)  # gear_broadcast checks the world's ranks
        _lib.run_op(lambda out: lib.gear_broadcast(self._handle(), a.ctypes.data, a.size, _DTYPES[a.dtype], root, out),
                    timeout, "broadcast")
        return buf

    def allgather(self, buf, out=None, timeout=None):
        """Gather buf from every rank: returns out (made when None), of shape
        (size, *buf.shape), rank r's buf at out[r]."""
        a = _array(buf, "allgather", writable=False)
        if out is None:
            out = np.empty((self.size,) + a.shape, a.dtype)
        o = _array(out, "allgather out")
        if o.dtype != a.dtype or o.shape != (self.size,) + a.shape:
            raise ValueError(f"gear: allgather: out is {o.shape} {o.dtype}: want {(self.size,) + a.shape} {a.dtype}")
        _lib.run_op(lambda op: lib.gear_allgather(self._handle(), a.ctypes.data, a.size, o.ctypes.data, _DTYPES[a.dtype], op),
                    timeout, "allgather")
        return out

    def barrier(self, timeout=None):
        """Return once every rank has called barrier."""
        _lib.run_op(lambda out: lib.gear_barrier(self._handle(), out), timeout, "barrier")

    def _handle(self):
        if self._h is None:
            raise _lib.Closed("gear: world closed")
        return self._h

    def close(self):
        """Leave the world (closes its communicator); idempotent."""
        if self._h is not None:
            h, self._h = self._h, None
            _lib.check(lib.gear_close(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"gear.World(rank={self.rank}, size={self.size}, local_rank={self.local_rank}, role={self.role!r})"


# The world this process joined, while it is open: a rank joins its job once
# (the job's rendezvous refuses a second join), so init gives it again.
_joined = None


def init(timeout=None):
    """Join the world gearrun (or SLURM) describes in the environment, a world
    of one otherwise, and build its communicator (shared memory within a host,
    TCP across hosts). Waits for every rank, for at most timeout seconds. A
    second call while that world is open returns it again (as MPI is
    initialized once a process); after its close() a rank of a job cannot
    join again, and a process alone gets a new world of one."""
    global _joined
    if _joined is not None and _joined._h is not None:
        return _joined
    _joined = World(_lib.run_op(lib.gear_init, timeout, "init"))
    return _joined


def segment_name(what):
    """The shared-memory segment name of this job for what (rank.SegmentName):
    every rank of a gearrun job gets the same name; a process started alone
    gets one of its own."""
    b, n = _lib.cstr(what)
    return _lib.text(lib.gear_segment_name, b, n)
