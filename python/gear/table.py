"""Replay tables over gear shards: Table (the owner, who samples) and Writer
(any process on the host, which inserts rows in place)."""

import atexit
import collections.abc
import ctypes
import json
import keyword
import os
import sys
import weakref

import numpy as np

from . import _lib
from ._lib import lib

# store's dtype names as numpy dtypes (bfloat16 has none: its bits as uint16).
_NUMPY = {
    "float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": np.uint16,
    "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
    "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "bool": np.bool_,
}

_NULL = ctypes.c_void_p(0)

# Every table and writer, and every shard handle, still open: at exit the
# tables and writers close; a handle that views still hold then keeps its
# mapping (a view may be read until the process ends), and the owner's
# segment name goes, so that nothing is left behind in /dev/shm.
_shards = weakref.WeakSet()
_keepers = weakref.WeakSet()


@atexit.register
def _close_all():
    for s in list(_shards):
        try:
            s.close()
        except Exception:
            pass
    for k in list(_keepers):
        if k.h is not None:
            try:
                lib.gear_shard_unlink(k.h)
            except Exception:
                pass


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ValueError(f"gear: table spec: cannot write {v!r} ({type(v).__name__})")


def table_spec(trajectory_length=1, **table):
    """A job spec's [table] section as TOML, from its keys (the job spec's
    names: name, capacity, trajectory_length, sampler, priority_exponent,
    remover, max_times_sampled, packed, columns as a list of dicts with name,
    dtype and shape, rate_limiter as a dict with kind, min_size_to_sample,
    samples_per_insert, error_buffer). gear checks the names and numbers
    (jobs.Table.Build), not this function; trajectory_length defaults to 1
    here (a job spec must give it)."""
    table["trajectory_length"] = trajectory_length
    lines = ["[table]"]
    sub = {}
    for k, v in table.items():
        if v is None:
            continue
        if k in ("columns", "rate_limiter"):
            sub[k] = v
        else:
            lines.append(f"{k} = {_toml_value(v)}")
    if "rate_limiter" in sub:
        lines.append("[table.rate_limiter]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in sub["rate_limiter"].items() if v is not None]
    for col in sub.get("columns", ()):
        lines.append("[[table.columns]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in col.items() if v is not None]
    return "\n".join(lines) + "\n"


class Column:
    """One column of a shard: name, dtype (numpy), shape of a frame, length
    (frames per row) and the shape of one row, row_shape: shape when length
    is 1, else (length, *shape)."""

    def __init__(self, d, base):
        self.name = d["name"]
        self.gear_dtype = d["dtype"]
        self.dtype = np.dtype(_NUMPY[d["dtype"]])
        self.shape = tuple(d["shape"] or ())
        self.length = d["length"]
        self.row_shape = self.shape if self.length == 1 else (self.length,) + self.shape
        self.block_bytes = d["block_bytes"]
        self.stage_offset = d["stage_offset"]
        # The numpy scalar type insert takes as it is (np.float32(1.0) for a
        # float32 column of one element).
        self.scalar = self.dtype.type if self.row_shape == () else None
        cap = base["capacity"]
        # Every row's block of this column, viewed in the shard's mapping.
        raw = np.lib.stride_tricks.as_strided(
            base["mapping"][d["offset"]:], shape=(cap, d["block_bytes"]), strides=(d["stride"], 1))
        self.rows = raw.view(self.dtype).reshape((cap,) + self.row_shape)

    def view(self, row):
        """Row row's block of this column: a numpy view of the shard of shape
        row_shape (0-d for a scalar column, so that view[...] = v writes it)."""
        if self.rows is None:
            raise _lib.Closed(f"gear: column {self.name!r}: its table or writer is closed")
        return self.rows[row:row + 1].reshape(self.row_shape)

    def check(self, value, n=None):
        """value as an array of this column's dtype and shape (n rows of it
        when n is given), or ValueError naming the column."""
        want = self.row_shape if n is None else (n,) + self.row_shape
        if not isinstance(value, np.ndarray) and hasattr(value, "numpy"):
            value = _tensor_array(value)
        if isinstance(value, np.ndarray):
            a = value
            if a.dtype != self.dtype:
                raise ValueError(f"gear: column {self.name!r}: dtype {a.dtype}, want {self.dtype} ({self.gear_dtype})")
        else:
            a = self._fit(value)
        if a.shape != want:
            if a.size == int(np.prod(want)) and n is not None and a.shape[:1] == (n,) and self.length == 1 and \
                    a.shape[1:] == (1,) + self.shape:
                a = a.reshape(want)
            else:
                raise ValueError(f"gear: column {self.name!r}: shape {a.shape}, want {want}")
        return np.ascontiguousarray(a)

    def _fit(self, value):
        """value (Python numbers, lists, numpy scalars) converted to this
        column's dtype, or ValueError naming the column when a value would
        change on the way: an integer out of the column's range, a fraction
        into an integer column, a finite number that overflows a float
        column, anything but 0 and 1 into a bool one. A bfloat16 column
        takes numbers (rounded to the nearest bfloat16), stored as their
        bits, and uint16 values as bits."""
        try:
            raw = np.asarray(value)
            bf16 = self.gear_dtype == "bfloat16"
            if raw.dtype.kind == "O" and (self.dtype.kind == "f" or bf16):
                raw = np.asarray(value, dtype=np.float64)  # Python ints past 64 bits
        except (TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"gear: column {self.name!r}: {value!r}: {e}") from None
        if bf16 and raw.dtype == np.uint16:
            return raw  # bfloat16 bits already, as numpy holds them
        dt, k = (np.dtype(np.float32) if bf16 else self.dtype), raw.dtype.kind
        if k not in "biuf":
            raise ValueError(f"gear: column {self.name!r}: {value!r} is not a number of {dt} ({self.gear_dtype})")
        with np.errstate(all="ignore"):
            a = raw.astype(dt)
            if dt.kind == "f":
                ok = not np.any(np.isfinite(raw) & ~np.isfinite(a))
            elif dt.kind == "b":
                ok = k == "b" or bool(np.all((raw == 0) | (raw == 1)))
            else:
                ok = bool(np.all(a == raw)) and (k != "f" or bool(np.all(np.isfinite(raw))))
        if not ok:
            raise ValueError(f"gear: column {self.name!r}: {value!r} does not fit {self.gear_dtype}")
        return _bfloat16_bits(a) if bf16 else a


def _bfloat16_bits(f):
    """float32 values as bfloat16 bits (uint16), rounded to nearest even; NaN
    stays a quiet NaN."""
    u = np.ascontiguousarray(f, np.float32).view(np.uint32)
    bits = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), bits.reshape(np.shape(f)))


def _tensor_array(t):
    """A torch tensor (or anything with numpy()) as a numpy array without a
    copy where torch allows: detached from autograd, a bfloat16 tensor as
    its bits (uint16), as gear stores bfloat16."""
    if hasattr(t, "detach"):
        t = t.detach()
    if str(getattr(t, "dtype", "")) == "torch.bfloat16":
        import torch
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


class Pending:
    """A row being written in place: pending[col] is the column's block as a
    numpy view of the shard (shape Column.row_shape) to fill; commit makes the
    row selectable, abort gives it back. The views are the writer's from
    allocate until commit or abort, and must not be touched after."""

    def __init__(self, shard, row):
        self._shard, self.row = shard, row

    def _row(self, what):
        if self.row is None:
            raise _lib.InvalidArgument(f"gear: {what}: the row was committed or aborted already")
        return self.row

    def __getitem__(self, col):
        return self._shard.columns[col].view(self._row("pending row"))

    def __setitem__(self, col, value):
        c = self._shard.columns[col]
        c.view(self._row("pending row"))[...] = c.check(value)

    def commit(self, priority=1.0, key=None):
        """Commit the row with priority and key (None: its insertion sequence,
        which is returned). A priority gear refuses (NaN) or a key outside 0
        to 2**64-1 raises InvalidArgument, and the row stays pending."""
        row = self._row("commit")
        priority = _priority(priority)
        k = 0 if key is None else _lib.integer("commit: key", key)
        seq = ctypes.c_uint64()
        _lib.check(lib.gear_shard_commit(self._shard._handle(), row, key is not None, k, priority, ctypes.byref(seq)))
        self.row = None
        return seq.value

    def abort(self):
        _lib.check(lib.gear_shard_abort(self._shard._handle(), self._row("abort")))
        self.row = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # Leaving the block without a commit (an exception, a bad column
        # write) gives the row back.
        if self.row is not None:
            self.abort()

    def __del__(self):
        # A Pending dropped uncommitted would keep its row until its writer
        # closes: give it back.
        try:
            if self.row is not None:
                self.abort()
        except Exception:
            pass


def _priority(p):
    """p as a float, or InvalidArgument: a real number (a Python or numpy
    number, a one-element array or tensor), not a string, a bool or None.
    Which numbers gear takes (not NaN; for the owner also what its selectors
    take) is libgear's to check."""
    if isinstance(p, (str, bytes, bytearray, bool, np.bool_)) or p is None:
        raise _lib.InvalidArgument(f"gear: priority {p!r}: want a number")
    try:
        return float(p)
    except (TypeError, ValueError):
        raise _lib.InvalidArgument(f"gear: priority {p!r}: want a number") from None


def _priorities(ps):
    """ps (one priority, or a sequence, array or tensor of them) as a 1-d
    float64 array, or InvalidArgument: numbers only, as _priority takes
    them (an array of numbers at once; anything else one by one, since numpy
    would make None NaN, and strings and bools numbers)."""
    if not isinstance(ps, np.ndarray) and hasattr(ps, "numpy"):
        ps = _tensor_array(ps)
    if isinstance(ps, np.ndarray):
        if ps.dtype.kind not in "iuf":
            raise _lib.InvalidArgument(f"gear: priorities of dtype {ps.dtype}: want a number each")
        return ps.astype(np.float64).reshape(-1)
    if isinstance(ps, float):
        return np.array([ps])
    return np.array([_priority(p) for p in np.asarray(ps, dtype=object).reshape(-1)], np.float64)


def _fast_insert(shard):
    """shard's insert, written out for its columns (None where a column's name
    cannot be a parameter): each column a keyword parameter rather than an
    entry of **columns, checked and written without a loop. It behaves as
    _Shard.insert, which it calls for anything but the common case (a key, a
    missing or unknown column, a closed shard); every column is checked before
    any is written. It holds the shard weakly, so that a dropped table still
    closes at once."""
    names = shard._order
    if any(not n.isidentifier() or keyword.iskeyword(n) or n.startswith("__") or
           n in ("priority", "key", "timeout") for n in names):
        return None
    g = {"__ref": weakref.ref(shard), "__miss": _MISSING, "__generic": _Shard.insert, "__nd": np.ndarray,
         "__given": _given}
    params = ", ".join(f"{n}=__miss" for n in names)
    missing = " or ".join(f"{n} is __miss" for n in names)
    kwargs = ", ".join(f"{n}={n}" for n in names)
    src = [f"def insert(priority=1.0, key=None, timeout=None, {params}, **__extra):",
           "    __s = __ref()",
           "    __h = __s._h",
           f"    if __h is None or key is not None or __extra or {missing}:",
           f"        return __generic(__s, priority, key, timeout, **__given(__extra, {kwargs}))"]
    for i, n in enumerate(names):
        view, at, dtype, shape, scalar, c = shard._stage[n]
        g.update({f"__v{i}": view, f"__a{i}": at, f"__d{i}": dtype, f"__s{i}": shape, f"__t{i}": scalar, f"__c{i}": c})
        src += [f"    __t = type({n})",
                f"    if __t is not __t{i}:",
                f"        if __t is not __nd or ({n}.dtype is not __d{i} and {n}.dtype != __d{i}) or {n}.shape != __s{i}:",
                f"            {n} = __c{i}.check({n})"]
    src += [f"    __v{i}[__a{i}] = {n}" for i, n in enumerate(names)]
    src += ["    if priority != __s._staged_prio:",
            "        __s._stage_priority(priority)",
            "    __st = __s._put_staged(__h)",
            "    if __st:  # not _lib.OK (0)",
            "        __s._put_slow(__st, priority, key, timeout)"]
    exec(compile("\n".join(src), f"<gear insert of {shard.segment}>", "exec"), g)
    f = g.pop("insert")  # f holds g (its globals): g must not hold f
    f.__doc__, f.__qualname__ = _Shard.insert.__doc__, f"{type(shard).__name__}.insert"
    return f


# A column not given to a generated insert.
_MISSING = object()

# The staged priority of a handle that has staged none that a later call may
# compare with: unequal to every priority (None too), so that the next insert
# checks and stages its own.
_UNSTAGED = object()


def _given(extra, **columns):
    """The columns a generated insert was given, for _Shard.insert."""
    cols = {k: v for k, v in columns.items() if v is not _MISSING}
    cols.update(extra)
    return cols


class _Shard:
    """What owners and writers share: the layout, and inserting."""

    def _open(self, handle):
        self._h = handle
        self._keeper = _Keeper(handle)
        _shards.add(self)
        lay = json.loads(_lib.text(lib.gear_shard_layout, handle))
        self.segment = lay["segment"]
        self.capacity = lay["capacity"]
        # The shard's mapping in this process, valid until close. Every view
        # of it has it as base, and it holds the keeper: a table or writer
        # dropped while views of its rows live stays open until they go.
        self._mapping = (ctypes.c_char * lay["mapping_len"]).from_address(lay["mapping_addr"])
        self._mapping._keeper = self._keeper
        base = {"capacity": self.capacity, "mapping": np.frombuffer(self._mapping, dtype=np.uint8)}
        self.mapping_address, self.mapping_size = lay["mapping_addr"], lay["mapping_len"]
        self.columns = {d["name"]: Column(d, base) for d in lay["columns"]}
        self._order = list(self.columns)
        self._ptrs = (ctypes.c_void_p * len(self._order))()
        # The staging row of insert: libgear's memory, viewed per column.
        addr = ctypes.c_uint64()
        _lib.check(lib.gear_shard_stage(handle, ctypes.byref(addr)))
        self._stage_mem = (ctypes.c_char * (lay["stage_bytes"] + 8)).from_address(addr.value)
        self._stage_bytes = np.frombuffer(self._stage_mem, np.uint8)
        self._stage = {}
        for c in self.columns.values():
            raw = self._stage_bytes[c.stage_offset:c.stage_offset + c.block_bytes]
            # A 0-d view is set fastest at (), an array's at ...
            # (view, index to set it at, dtype, row shape, numpy scalar type,
            # column): what insert reads per column, unpacked at once.
            self._stage[c.name] = (raw.view(c.dtype).reshape(c.row_shape), () if c.row_shape == () else ...,
                                   c.dtype, c.row_shape, c.scalar, c)
        self._put = _lib.fast.gear_shard_put
        # insert's one-argument call: the priority lies in the staging row,
        # written when it changes (ctypes converts each argument of a call,
        # a good part of a short call's cost).
        self._put_staged = _lib.fast.gear_shard_put_staged
        self._stage_prio = self._stage_bytes[lay["stage_priority"]:lay["stage_priority"] + 8].view(np.float64).reshape(())
        self._staged_prio = _UNSTAGED
        fast = _fast_insert(self)
        if fast is not None and type(self).insert is _Shard.insert:
            self.insert = fast

    def _handle(self):
        if self._h is None:
            raise _lib.Closed(f"gear: shard {self.segment!r} closed")
        return self._h

    def allocate(self, timeout=None):
        """A free row to write in place (a Pending), waiting up to timeout
        seconds (None: no limit) while the shard is full."""
        row = ctypes.c_int64()
        h = self._handle()
        _lib.sliced(lambda ms: lib.gear_shard_allocate(h, ms, ctypes.byref(row)), timeout, "allocate")
        return Pending(self, row.value)

    def insert(self, priority=1.0, key=None, timeout=None, **columns):
        """Insert one row: every column by name, as an array of its dtype and
        row shape (Python numbers and numpy scalars are converted; numpy
        arrays and tensors must have the column's dtype). A wrong dtype or shape
        raises ValueError naming the column, and nothing is inserted. The
        values are written into the handle's staging row (memory of
        libgear's), which one call (gear_shard_put_staged, or gear_shard_put
        with a key) copies into a free row of the shard and commits. Waits up
        to timeout seconds (None: no limit) while the shard is full. Not for
        two threads on one handle at once."""
        h = self._h
        if h is None:
            self._handle()  # raises Closed: the staging row is freed
        stage = self._stage
        if len(columns) != len(stage):
            self._check_names(columns)
        for name, v in columns.items():
            try:
                view, at, dtype, shape, scalar, c = stage[name]
            except KeyError:
                self._check_names(columns)
            t = type(v)
            if t is not scalar:
                if t is np.ndarray:
                    if (v.dtype is not dtype and v.dtype != dtype) or v.shape != shape:
                        v = c.check(v)
                else:
                    v = c.check(v)
            view[at] = v
        if key is None:
            if priority != self._staged_prio:
                self._stage_priority(priority)
            st = self._put_staged(h)
        else:
            st = self._put(h, 0, 1, _lib.integer("insert: key", key), _priority(priority), None)
        if st:  # not _lib.OK (0)
            self._put_slow(st, priority, key, timeout)

    def _stage_priority(self, priority):
        """Write priority into the staging row, where gear_shard_put_staged
        reads it; insert calls this only when the priority changes."""
        self._staged_prio = _UNSTAGED
        self._stage_prio[()] = _priority(priority)
        if isinstance(priority, (float, int, np.generic)):
            self._staged_prio = priority  # immutable: the next call may compare with it

    def _put_slow(self, st, priority, key, timeout):
        """insert's path when no row is free at once: the staging row's copy
        goes through gear_shard_insert, which waits without the GIL."""
        if st != _lib.TIMEOUT:
            _lib.check(st)
        row = self._stage_bytes.copy()
        ptrs = (ctypes.c_void_p * len(self._order))(
            *[row.ctypes.data + self.columns[c].stage_offset for c in self._order])
        prio = np.full(1, priority, np.float64)
        keys = np.full(1, key or 0, np.uint64)
        kp = _NULL if key is None else keys.ctypes.data
        done = ctypes.c_int64()
        h = self._handle()
        _lib.sliced(lambda ms: lib.gear_shard_insert(h, 1, kp, prio.ctypes.data, len(ptrs), ptrs, ms,
                                                     ctypes.byref(done)), timeout, "insert")

    def _check_names(self, columns):
        missing, extra = set(self._order) - set(columns), set(columns) - set(self._order)
        raise ValueError(f"gear: insert: columns missing {sorted(missing)}, unknown {sorted(extra)}")

    def insert_batch(self, columns, priorities=1.0, keys=None, timeout=None):
        """Insert n rows in one call: columns maps every column's name to an
        array of n rows (shape (n, *row_shape); with trajectory_length 1 also
        (n, 1, *row_shape), as a sample gives them); priorities and keys (None:
        insertion sequences) are n numbers or one. All arrays are checked
        first: a wrong dtype or shape raises ValueError naming the column, and
        nothing is inserted. Waits up to timeout seconds (None: no limit) for
        free rows; returns n."""
        if not isinstance(columns, collections.abc.Mapping):
            raise _lib.InvalidArgument(f"gear: insert_batch: columns {type(columns).__name__}: want a mapping of"
                                       f" each column's name to its rows")
        if set(columns) != set(self._order):
            self._check_names(columns)
        n = len(columns[self._order[0]])
        arrs = [self.columns[c].check(columns[c], n) for c in self._order]
        prio = _priorities(priorities)
        if prio.size not in (1, n):
            raise _lib.InvalidArgument(f"gear: insert_batch: {prio.size} priorities for {n} rows: want 1 or {n}")
        prio = np.ascontiguousarray(np.broadcast_to(prio if prio.size != 1 else prio[0], (n,)))
        kp = _NULL
        if keys is not None:
            keys = _lib.u64s("insert_batch: keys", keys)
            if keys.size not in (1, n):
                raise _lib.InvalidArgument(f"gear: insert_batch: {keys.size} keys for {n} rows: want 1 or {n}")
            keys = np.ascontiguousarray(np.broadcast_to(keys if len(keys) != 1 else keys[0], (n,)))
            kp = keys.ctypes.data
        ptrs = self._ptrs
        for i, a in enumerate(arrs):
            ptrs[i] = a.ctypes.data
        done = ctypes.c_int64()
        h = self._handle()
        total = [0]

        def call(ms):
            st = lib.gear_shard_insert(h, n - total[0], kp if kp is _NULL else kp + 8 * total[0],
                                       prio.ctypes.data + 8 * total[0], len(arrs),
                                       ptrs if total[0] == 0 else self._advance(arrs, total[0]), ms, ctypes.byref(done))
            total[0] += done.value
            return st
        try:
            _lib.sliced(call, timeout, "insert")
        except _lib.Error as e:
            # The rows before the one that failed are in: say how many.
            e.inserted = total[0]
            e.args = (f"{e.args[0] if e.args else e} ({total[0]} of {n} rows inserted before it)",) + e.args[1:]
            raise
        return n

    def _advance(self, arrs, k):
        p = (ctypes.c_void_p * len(arrs))()
        for i, a in enumerate(arrs):
            p[i] = a.ctypes.data + k * self.columns[self._order[i]].block_bytes
        return p

    def close(self):
        """Close this handle: the owner's removes the shard. The table or
        writer is closed at once (Closed from every call). A view of the
        shard's rows that outlives it (Column.rows, a Pending's, a kept
        batch's, and whatever numpy made of them) keeps the mapping: the
        handle closes, and the owner's shard goes, when the last such view
        goes, or at exit. A table or writer that is only dropped closes
        likewise."""
        if self._h is None:
            return
        self._h = None
        keeper, self._keeper = self._keeper, None
        # Drop this object's own views of the mapping: whatever still holds
        # the keeper then (through the mapping) is a view of the caller's.
        for c in self.columns.values():
            c.rows = None
        self._mapping = None
        if sys.getrefcount(keeper) <= 2:  # the name keeper, and the call's argument
            keeper.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Keeper:
    """Owns a shard's handle: closes it at close, or when the last reference
    goes (the table or writer, and the base of every view of its mapping),
    or at exit."""

    def __init__(self, h):
        self.h = h
        _keepers.add(self)

    def close(self):
        if self.h is not None:
            h, self.h = self.h, None
            _lib.check(lib.gear_close(h))

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Writer(_Shard):
    """A process's handle on another process's shard, for inserting rows
    (insert, insert_batch, or allocate and commit in place)."""

    def __init__(self, segment, timeout=10.0):
        """Attach to the shard segment (a Table's segment), waiting up to timeout
        seconds (None: no limit) for its owner to create it and set it up;
        Timeout then, saying which. Ctrl-C interrupts the wait."""
        b, n = _lib.cstr(segment)
        h = ctypes.c_uint64()
        try:
            _lib.sliced(lambda ms: lib.gear_shard_attach(b, n, ms, ctypes.byref(h)), timeout, "attach")
        except _lib.Timeout:
            raise _lib.Timeout(f"gear: Writer: no shard {segment!r} ready after {timeout} s: {_lib.last_error()}") from None
        self._open(h.value)


class Sample:
    """A sampled batch: keys, probabilities, priorities, rows (the shard's
    rows), times_sampled (numpy arrays of len(sample)) and data, a dict of each
    collected column's array of shape (len(sample), *row_shape).

    With copy=True (the default) data holds one gathered array per column,
    the caller's, and the batch is already released. With copy=False data is
    empty and view(col, i) gives item i's block as a zero-copy numpy view of
    the shard, valid until release() (which the with statement calls): until
    then the rows stay as they were, also those the sample deleted
    (max_times_sampled)."""

    _META = ("keys", "probabilities", "priorities", "rows", "times_sampled")

    def __init__(self, shard, n):
        self._shard = shard
        self._full = {"keys": np.empty(n, np.uint64), "probabilities": np.empty(n, np.float64),
                      "priorities": np.empty(n, np.float64), "rows": np.empty(n, np.int64),
                      "times_sampled": np.empty(n, np.int64)}
        self._data = {}
        self._args = None
        self._copy = True
        self._batch = None
        self.data = {}

    def _trim(self, k):
        f = self._full
        for name in self._META:
            setattr(self, name, f[name][:k])
        self.data = {c: a[:k] for c, a in self._data.items()}

    def __len__(self):
        return len(self.keys)

    def view(self, col, i):
        if self._batch is None:
            raise ValueError("gear: view: only a batch sampled with copy=False (and not released) has views")
        return self._shard.columns[col].view(int(self.rows[i]))

    def release(self):
        if self._batch is not None:
            b, self._batch = self._batch, None
            _lib.check(lib.gear_close(b))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        # A kept batch dropped without release: its rows would stay pinned.
        try:
            self.release()
        except Exception:
            pass


def _extra_rows(what, n):
    """extra_rows as gear_table_create takes it: -1 for None (the default)."""
    return -1 if n is None else _lib.integer(f"{what}: extra_rows", n, 0, _lib.I64[1])


class Table(_Shard):
    """A replay table over a shard that this process owns. Writers in other
    processes attach by its segment name (Writer(table.segment)) and insert;
    the owner samples, updates priorities, deletes, checkpoints."""

    def __init__(self, spec=None, segment=None, seed=0, extra_rows=None, _handle=None, **table):
        """Create the table and its shard.

        spec: the table, as a job spec's TOML (a whole job spec or its [table]
        alone), or a path to a .toml file; or leave it None and give the
        [table] keys as keyword arguments (table_spec). segment: the shard's
        shared-memory name (default: segment_name("table.<name>.<rank>")).
        seed fixes the sampler's choices. extra_rows are rows beyond the
        table's capacity for writers in flight (rows allocated, not yet
        admitted); by default the capacity or as many rows as 8 MiB hold,
        whichever is fewer, and from 1024 to 16384.
        """
        if _handle is None:
            seed = _lib.integer("Table: seed", seed)
            extra_rows = _extra_rows("Table", extra_rows)
            spec = _spec_text(spec, table)
            segment = segment or _default_segment(spec)
            s, sn = _lib.cstr(spec)
            g, gn = _lib.cstr(segment)
            h = ctypes.c_uint64()
            _lib.check(lib.gear_table_create(s, sn, g, gn, seed, extra_rows, ctypes.byref(h)))
            _handle = h.value
        self._open(_handle)
        self.name = self.info()["name"]

    @classmethod
    def restore(cls, path, spec=None, segment=None, seed=0, extra_rows=None, timeout=None, **table):
        """Make a table from the checkpoint at path (written by checkpoint),
        with the layout spec describes and the extra_rows of the table
        checkpointed."""
        seed = _lib.integer("Table.restore: seed", seed)
        extra_rows = _extra_rows("Table.restore", extra_rows)
        spec = _spec_text(spec, table)
        segment = segment or _default_segment(spec)
        s, sn = _lib.cstr(spec)
        p, pn = _lib.cstr(_lib.path("Table.restore", path))
        g, gn = _lib.cstr(segment)
        h = _lib.run_op(lambda out: lib.gear_table_restore(s, sn, p, pn, g, gn, seed, extra_rows, out), timeout, "restore")
        return cls(_handle=h)

    def sample(self, n, timeout=None, columns=None, copy=True, out=None):
        """Sample a batch of 1 to n items (Reverb's flexible batch), waiting up
        to timeout seconds (None: no limit) for the rate limiter to allow the
        first; Timeout then. columns names the columns to collect (None: all).
        Returns a Sample; see its doc for copy. out, a Sample an earlier call
        returned for the same n and columns, is refilled instead of a new one
        (its arrays are overwritten: the fast path for a training loop)."""
        n = _lib.integer("sample: n", n, 1, _lib.I64[1])
        if out is not None and not isinstance(out, Sample):
            raise _lib.InvalidArgument(f"gear: sample: out {out!r}: want a Sample this table returned")
        if out is not None and out._shard is not self:
            raise _lib.InvalidArgument("gear: sample: out is a sample of another table")
        if out is not None and out._batch is not None:
            raise _lib.InvalidArgument("gear: sample: out holds a batch sampled with copy=False; release it, or "
                                       "leave out None")
        if out is None or out._args is None or out._n != n or out._cols != columns or not copy or not out._copy:
            out = self._new_sample(n, columns, copy)
        h = self._handle()
        got, batch = out._got, out._batchp
        args = out._args
        _lib.sliced(lambda ms: lib.gear_table_sample(h, n, ms, *args), timeout, "sample")
        if not copy:
            out._batch = out._batch_h.value
        out._trim(got._obj.value)
        return out

    def _new_sample(self, n, columns, copy):
        out = Sample(self, n)
        out._n, out._cols, out._copy = n, columns, copy
        cols = self._order if columns is None else list(columns)
        for c in cols:
            if c not in self.columns:
                raise ValueError(f"gear: sample: unknown column {c!r} (have {self._order})")
        if len(set(cols)) != len(cols):
            raise _lib.InvalidArgument(f"gear: sample: columns {cols} name a column twice")
        ncols = len(cols) if copy else 0
        idx = (ctypes.c_int32 * max(ncols, 1))(*[self._order.index(c) for c in cols[:ncols]])
        dst = (ctypes.c_void_p * max(ncols, 1))()
        if copy:
            for j, c in enumerate(cols):
                col = self.columns[c]
                out._data[c] = np.empty((n,) + col.row_shape, col.dtype)
                dst[j] = out._data[c].ctypes.data
        out._batch_h = ctypes.c_uint64()
        out._got, out._batchp = ctypes.byref(ctypes.c_int64()), ctypes.byref(out._batch_h)
        out._keep = (idx, dst)
        out._args = (0 if copy else 1, out._full["keys"].ctypes.data, out._full["probabilities"].ctypes.data,
                     out._full["priorities"].ctypes.data, out._full["rows"].ctypes.data,
                     out._full["times_sampled"].ctypes.data, ncols, idx, dst, out._got, out._batchp)
        return out

    def update_priorities(self, keys, priorities):
        """Set the priorities of the items with keys (Reverb's update_priorities)."""
        k = _lib.u64s("update_priorities: keys", keys)
        p = np.ascontiguousarray(priorities, np.float64).reshape(-1)
        if k.shape != p.shape:
            raise ValueError(f"gear: update_priorities: {k.shape} keys and {p.shape} priorities")
        _lib.check(lib.gear_table_mutate(self._handle(), len(k), k.ctypes.data, p.ctypes.data, 0, _NULL))

    def delete(self, keys):
        """Delete the items with keys."""
        k = _lib.u64s("delete: keys", keys)
        _lib.check(lib.gear_table_mutate(self._handle(), 0, _NULL, _NULL, len(k), k.ctypes.data))

    def reset(self):
        """Delete every item."""
        _lib.check(lib.gear_table_reset(self._handle()))

    def info(self):
        """The table's state as a dict (size, max_size, inserts, samples,
        deletes, sampler, remover, limiter, ...: sample.ShardInfo's fields)."""
        return json.loads(_lib.text(lib.gear_table_info, self._handle()))

    def __len__(self):
        return self.info()["size"]

    def wait_admitted(self, timeout=None):
        """Wait until every row committed to the shard so far is in the table
        (admitted, or refused); writers commit, the table admits them in the
        background."""
        h = self._handle()
        _lib.sliced(lambda ms: lib.gear_table_wait_admitted(h, ms), timeout, "wait_admitted")

    def checkpoint(self, path, timeout=None):
        """Write the shard's committed rows to path (atomically replaced)."""
        p, pn = _lib.cstr(_lib.path("checkpoint", path))
        h = self._handle()
        _lib.run_op(lambda out: lib.gear_table_checkpoint(h, p, pn, out), timeout, "checkpoint")


def _spec_text(spec, table):
    if spec is not None and not isinstance(spec, (str, dict, os.PathLike)):
        raise _lib.InvalidArgument(f"gear: Table: spec {spec!r}: want TOML text, a .toml path or a dict of [table] keys")
    if spec is None:
        if not table:
            raise ValueError("gear: Table: give a spec or the [table] keys")
        return table_spec(**table)
    if table:
        raise ValueError("gear: Table: give a spec or the [table] keys, not both")
    if isinstance(spec, dict):
        return table_spec(**spec)
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and spec.endswith(".toml") and "\n" not in spec):
        with open(spec) as f:
            return f.read()
    return spec


def _default_segment(spec):
    import re
    from .world import segment_name
    m = re.search(r'^\s*name\s*=\s*"([^"]*)"', spec.split("[table]", 1)[-1], re.M)
    return segment_name(f"table.{m.group(1) if m else 'replay'}.{os.environ.get('GEAR_RANK', '0')}")
