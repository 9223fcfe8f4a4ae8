"""The parameter service (roles' Publisher and Reader): a trainer publishes a
flat float32 vector with a version; actors read the latest."""

import ctypes

import numpy as np

from . import _lib
from ._lib import lib
from .world import World


class Publisher:
    """The write end of the parameter service name, for vectors of n float32s."""

    def __init__(self, world, name, n, timeout=None):
        _check_world("Publisher", world)
        b, bn = _lib.cstr(name)
        self.n = n = _lib.integer("Publisher: n", n, *_lib.I64)  # its range is the service's to check
        self._h = _lib.run_op(lambda out: lib.gear_param_publisher(world._handle(), b, bn, n, out), timeout, "publisher")

    def publish(self, version, params, timeout=None):
        """Publish params (n float32s; a torch CPU tensor too) as version, which
        must exceed the last one. The vector is copied."""
        if not isinstance(params, np.ndarray) and hasattr(params, "numpy"):
            params = params.detach().numpy() if hasattr(params, "detach") else params.numpy()
        a = np.ascontiguousarray(params, np.float32).reshape(-1)
        if a.size != self.n:
            raise ValueError(f"gear: publish: {a.size} parameters, want {self.n}")
        version = _lib.integer("publish: version", version)
        h = self._handle()
        _lib.run_op(lambda out: lib.gear_param_publish(h, version, a.ctypes.data, a.size, out), timeout, "publish")

    def _handle(self):
        if self._h is None:
            raise _lib.Closed("gear: parameter publisher closed")
        return self._h

    def close(self):
        if self._h is not None:
            h, self._h = self._h, None
            _lib.check(lib.gear_close(h))

    def __del__(self):
        # The service's segment is the publisher's: dropped, it goes too.
        try:
            self.close()
        except Exception:
            pass


class Reader:
    """The read end of the parameter service name; waits for its publisher."""

    def __init__(self, world, name, timeout=None):
        _check_world("Reader", world)
        b, bn = _lib.cstr(name)
        self._h = _lib.run_op(lambda out: lib.gear_param_reader(world._handle(), b, bn, out), timeout, "reader")
        n = ctypes.c_int64()
        _lib.check(lib.gear_param_len(self._h, ctypes.byref(n)))
        self.n = n.value
        self.version = 0
        self.params = np.zeros(self.n, np.float32)

    def read(self, min_version=0, timeout=None):
        """Take the newest version (waiting up to timeout seconds for one of at
        least min_version) into self.params; returns its version (0: none
        published yet)."""
        min_version = _lib.integer("read: min_version", min_version)
        if self._h is None:
            raise _lib.Closed("gear: parameter reader closed")
        h = self._h
        v = ctypes.c_uint64()
        _lib.sliced(lambda ms: lib.gear_param_read(h, min_version, ms, self.params.ctypes.data, self.n,
                                                    ctypes.byref(v)), timeout, "read parameters")
        if v.value:
            self.version = v.value
        return self.version

    def close(self):
        if self._h is not None:
            h, self._h = self._h, None
            _lib.check(lib.gear_close(h))

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _check_world(what, world):
    """InvalidArgument unless world is a World (gear.init's)."""
    if not isinstance(world, World):
        raise _lib.InvalidArgument(f"gear: {what}: world {world!r}: want the World of gear.init()")
