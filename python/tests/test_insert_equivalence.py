"""The insert generated for a table's columns against the generic one
(_Shard.insert), call for call: two tables of the same spec take the same
inputs, valid and not, through one each; every call must end alike (the same
exception type and message, or none) and the tables must hold the same rows."""

import numpy as np
import pytest

COLUMNS = [
    {"name": "obs", "dtype": "float32", "shape": [3]},
    {"name": "a", "dtype": "int32"},
    {"name": "r", "dtype": "float64"},
    {"name": "done", "dtype": "bool"},
    {"name": "px", "dtype": "uint8", "shape": [2]},
    {"name": "h", "dtype": "float16"},
    {"name": "b", "dtype": "bfloat16", "shape": [2]},
    {"name": "traj", "dtype": "int16", "shape": [2]},
]


def good(i):
    """A valid row whose values tell it apart, of varied kinds."""
    return {
        "obs": [np.array([i, i + 1, i + 2], np.float32), [i, i, i], (0.5, 1.5, i)][i % 3],
        "a": [i, np.int32(i), np.int64(i), np.array(i, np.int32)][i % 4],
        "r": [float(i), np.float64(i) / 4, i, np.float32(i)][i % 4],
        "done": [bool(i % 2), np.bool_(i % 2), i % 2][i % 3],
        "px": [np.array([i % 256, 3], np.uint8), [i % 256, 7]][i % 2],
        "h": [0.5 * i, np.float16(i)][i % 2],
        "b": [[1.0, -2.5], np.array([i, 1], np.uint16)][i % 2],
        "traj": np.array([i, -i], np.int16),
    }


def bad_rows():
    """Inputs that must fail, each a change to a valid row, and the keyword
    arguments beside them."""
    base = good(1)
    changes = [
        {"obs": np.zeros(3, np.float64)}, {"obs": np.zeros(4, np.float32)}, {"obs": "abc"}, {"obs": None},
        {"a": 2**40}, {"a": 3.7}, {"a": "1"}, {"a": np.zeros(2, np.int32)},
        {"r": "x"}, {"r": [1.0, 2.0]}, {"done": 2}, {"px": [300, 1]}, {"px": [1, 2, 3]},
        {"h": 1e300}, {"b": [1.0]}, {"traj": np.zeros(2, np.int32)},
    ]
    for c in changes:
        yield {**base, **c}, {}
    row = dict(base)
    del row["r"]
    yield row, {}
    yield {**base, "extra": 1}, {}
    yield base, {"priority": float("nan")}
    yield base, {"priority": "high"}
    yield base, {"priority": -1.0, "key": 3}  # fifo takes any priority but NaN
    yield base, {"key": -1}
    yield base, {"key": 2**64}


def outcome(f, row, kw, segment=None):
    """None, or the exception's type and message (the table's segment name
    replaced: the two tables' differ)."""
    try:
        f(**kw, **row)
    except Exception as e:  # the exception is the outcome compared
        return type(e), str(e).replace(segment or "\0", "<segment>")
    return None


def test_generated_insert_equals_generic(gear, make_table):
    from gear import table as T
    fast = make_table(columns=COLUMNS, capacity=64, sampler="fifo", remover="fifo", max_times_sampled=1)
    slow = make_table(columns=COLUMNS, capacity=64, sampler="fifo", remover="fifo", max_times_sampled=1)
    assert "insert" in vars(fast)

    def generic(**kw):
        return T._Shard.insert(slow, **kw)

    calls = [(good(i), {"priority": 1.0 + (i % 3)}) for i in range(12)] + list(bad_rows())
    calls += [(good(20), {"key": 77}), (good(21), {"priority": 2, "key": 78}), (good(22), {})]
    for n, (row, kw) in enumerate(calls):
        got, want = outcome(fast.insert, row, kw, fast.segment), outcome(generic, row, kw, slow.segment)
        assert got == want, f"call {n} ({kw}, {row}): generated {got}, generic {want}"
    fast.wait_admitted(10)
    slow.wait_admitted(10)
    assert fast.info()["commits"] == slow.info()["commits"] > 12
    while len(slow):
        a, b = fast.sample(1, timeout=5), slow.sample(1, timeout=5)
        assert a.keys.tolist() == b.keys.tolist() and a.priorities.tolist() == b.priorities.tolist()
        for c in COLUMNS:
            assert np.array_equal(a.data[c["name"]], b.data[c["name"]]), c["name"]
    assert len(fast) == 0


def test_generated_insert_takes_tensors(gear, make_table):
    torch = pytest.importorskip("torch")
    from gear import table as T
    cols = [{"name": "obs", "dtype": "float32", "shape": [3]}, {"name": "a", "dtype": "int64"}]
    fast = make_table(columns=cols, sampler="fifo", max_times_sampled=1)
    slow = make_table(columns=cols, sampler="fifo", max_times_sampled=1)
    rows = [{"obs": torch.arange(3, dtype=torch.float32), "a": torch.tensor(5)},
            {"obs": torch.ones(3, requires_grad=True), "a": 6},
            {"obs": torch.zeros(3, dtype=torch.float64), "a": 7}]
    for row in rows:
        assert outcome(fast.insert, row, {}) == outcome(lambda **kw: T._Shard.insert(slow, **kw), row, {})
    fast.wait_admitted(10)
    slow.wait_admitted(10)
    assert len(fast) == len(slow) == 2
    for _ in range(2):
        a, b = fast.sample(1, timeout=5), slow.sample(1, timeout=5)
        assert np.array_equal(a.data["obs"], b.data["obs"]) and np.array_equal(a.data["a"], b.data["a"])
