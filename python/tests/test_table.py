"""The Python tables' semantics: the cases of the Go tables' tests (sample's
selectors, limiters, max_times_sampled and Close), zero-copy, bad input,
Ctrl-C during a blocked sample, checkpoints."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "..")


def fill(t, prios, keys=None):
    for i, p in enumerate(prios):
        t.insert(priority=p, key=None if keys is None else keys[i], x=np.full(2, i, np.float32))
    t.wait_admitted(10)


@pytest.mark.parametrize("sampler,prios,want", [
    ("fifo", [1, 1, 1], [0, 1, 2]),
    ("lifo", [1, 1, 1], [2, 1, 0]),
    ("maxheap", [1, 5, 3], [1, 2, 0]),
    ("minheap", [4, 2, 9], [1, 0, 2]),
])
def test_ordered_selectors(make_table, sampler, prios, want):
    t = make_table(sampler=sampler, max_times_sampled=1)
    fill(t, prios, keys=[0, 1, 2])
    got = [int(t.sample(1, timeout=5).keys[0]) for _ in want]
    assert got == want
    assert len(t) == 0


def test_prioritized_probabilities(make_table):
    t = make_table(sampler="prioritized", priority_exponent=1.0)
    fill(t, [1.0, 3.0], keys=[10, 11])
    s = t.sample(64, timeout=5)
    probs = dict(zip(s.keys.tolist(), s.probabilities.tolist()))
    assert probs[10] == pytest.approx(0.25) and probs[11] == pytest.approx(0.75)
    t.update_priorities([10], [3.0])
    s = t.sample(8, timeout=5)
    assert np.allclose(s.probabilities, 0.5)


def test_uniform_collects_columns(make_table):
    cols = [{"name": "obs", "dtype": "float32", "shape": [3]}, {"name": "a", "dtype": "int64"}]
    t = make_table(columns=cols)
    for k in range(5):
        t.insert(key=k, obs=np.full(3, k, np.float32), a=k * 10)
    t.wait_admitted(10)
    s = t.sample(32, timeout=5)
    assert s.data["obs"].shape == (32, 3) and s.data["a"].dtype == np.int64
    assert np.array_equal(s.data["obs"][:, 0], s.keys.astype(np.float32))
    assert np.array_equal(s.data["a"], s.keys.astype(np.int64) * 10)
    assert np.allclose(s.probabilities, 0.2)


def test_insert_batch_and_remover(make_table):
    t = make_table(capacity=4, remover="fifo")
    t.insert_batch({"x": np.arange(20, dtype=np.float32).reshape(10, 2)}, keys=np.arange(10))
    t.wait_admitted(10)
    info = t.info()
    assert info["size"] == 4 and info["inserts"] == 10
    s = t.sample(64, timeout=5)
    assert set(s.keys.tolist()) <= {6, 7, 8, 9}


def test_max_times_sampled(make_table):
    t = make_table(max_times_sampled=2)
    fill(t, [1], keys=[7])
    a = t.sample(1, timeout=5)
    b = t.sample(1, timeout=5)
    assert a.times_sampled.tolist() == [1] and b.times_sampled.tolist() == [2]
    assert len(t) == 0
    with pytest.raises(Exception) as e:
        t.sample(1, timeout=0.1)
    assert type(e.value).__name__ == "Timeout"


def test_min_size_limiter(gear, make_table):
    t = make_table(rate_limiter={"kind": "min_size", "min_size_to_sample": 3})
    fill(t, [1, 1])
    with pytest.raises(gear.Timeout):
        t.sample(1, timeout=0.1)
    fill(t, [1])
    assert len(t.sample(1, timeout=5)) == 1


def test_queue(gear, make_table):
    t = make_table(rate_limiter={"kind": "queue"}, capacity=3)
    fill(t, [1, 1, 1], keys=[1, 2, 3])
    assert [int(t.sample(1, timeout=5).keys[0]) for _ in range(3)] == [1, 2, 3]
    with pytest.raises(gear.Timeout):
        t.sample(1, timeout=0.1)


def test_delete_and_reset(make_table):
    t = make_table()
    fill(t, [1, 1, 1], keys=[1, 2, 3])
    t.delete([2])
    assert sorted(set(t.sample(64, timeout=5).keys.tolist())) == [1, 3]
    t.reset()
    assert len(t) == 0


def test_close_wakes_blocked_sample(gear, make_table):
    t = make_table()
    got = []

    def run():
        try:
            t.sample(1)
        except Exception as e:  # noqa: BLE001
            got.append(e)
    th = threading.Thread(target=run)
    th.start()
    t.info()
    t.close()
    th.join(30)
    assert not th.is_alive()
    assert len(got) == 1 and isinstance(got[0], gear.Closed), got
    with pytest.raises(gear.Closed):
        t.sample(1, timeout=0)
    with pytest.raises(gear.Closed):
        t.insert(x=np.zeros(2, np.float32))


def test_bad_input_commits_nothing(gear, make_table):
    cols = [{"name": "obs", "dtype": "float32", "shape": [3]}, {"name": "a", "dtype": "int32"}]
    t = make_table(columns=cols)
    with pytest.raises(ValueError, match="'obs'.*dtype"):
        t.insert(obs=np.zeros(3, np.float64), a=1)
    with pytest.raises(ValueError, match="'obs'.*shape"):
        t.insert(obs=np.zeros(4, np.float32), a=1)
    with pytest.raises(ValueError, match="'a'"):
        t.insert(obs=np.zeros(3, np.float32), a="not a number")
    with pytest.raises(ValueError, match="missing"):
        t.insert(obs=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="'a'.*shape"):
        t.insert_batch({"obs": np.zeros((4, 3), np.float32), "a": np.zeros(3, np.int32)})
    t.wait_admitted(10)
    assert t.info()["commits"] == 0 and len(t) == 0


def test_bad_specs(gear, make_table):
    with pytest.raises(gear.InvalidArgument, match="sampler"):
        make_table(sampler="nope")
    with pytest.raises(gear.InvalidArgument, match="dtype"):
        make_table(columns=[{"name": "x", "dtype": "complex64"}])
    with pytest.raises(gear.InvalidArgument, match="samples_per_insert"):
        make_table(rate_limiter={"kind": "sample_to_insert_ratio", "samples_per_insert": -1.0})
    with pytest.raises(gear.Error):
        gear.Writer("gear.pytest-no-such-segment", timeout=1)


def test_bad_handles_do_not_crash(gear):
    from gear._lib import lib
    import ctypes
    assert lib.gear_close(123456789) == 2
    st = lib.gear_table_sample(123456789, 1, 0, 0, None, None, None, None, None, 0, None, None,
                               ctypes.byref(ctypes.c_int64()), None)
    assert st == 2
    assert "handle" in gear._lib.last_error()


def test_zero_copy_between_processes(gear, make_table):
    cols = [{"name": "obs", "dtype": "float32", "shape": [4]}]
    t = make_table(columns=cols)
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {PKG!r})
        import numpy as np, gear
        w = gear.Writer({t.segment!r})
        p = w.allocate(timeout=10)
        p["obs"][:] = [1.5, 2.5, 3.5, 4.5]
        p.commit(priority=1.0, key=42)
        w.close()
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    t.wait_admitted(10)
    with t.sample(1, timeout=5, copy=False) as s:
        v = s.view("obs", 0)
        assert s.keys.tolist() == [42]
        assert v.tolist() == [1.5, 2.5, 3.5, 4.5]
        addr = v.__array_interface__["data"][0]
        assert t.mapping_address <= addr < t.mapping_address + t.mapping_size
        assert not v.flags.owndata


def test_packed_columns(gear, make_table):
    """packed=True: the 4-byte columns of consecutive rows lie 4 bytes apart
    in the shard (64 without it); a writer in another process fills them,
    and samples collect and view them as from an unpacked table."""
    cols = [{"name": "obs", "dtype": "float32", "shape": [3]}, {"name": "a", "dtype": "int32"},
            {"name": "r", "dtype": "float32"}]
    for packed, stride in ((False, 64), (True, 4)):
        t = make_table(columns=cols, capacity=64, packed=packed)
        assert t.columns["a"].rows.strides[0] == stride
        assert t.columns["obs"].rows.strides[0] == (16 if packed else 64)
        code = textwrap.dedent(f"""
            import sys; sys.path.insert(0, {PKG!r})
            import numpy as np, gear
            w = gear.Writer({t.segment!r})
            for k in range(40):
                w.insert(1.0, key=k, obs=np.full(3, k, np.float32), a=np.int32(-k), r=np.float32(k / 2))
            w.close()
        """)
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        t.wait_admitted(10)
        s = t.sample(32, timeout=5)
        keys = s.keys.astype(np.int64)
        assert (s.data["a"] == -keys).all() and (s.data["r"] == keys / 2).all()
        assert (s.data["obs"] == keys[:, None]).all()
        with t.sample(1, timeout=5, copy=False) as z:
            k = int(z.keys[0])
            assert z.view("a", 0) == -k and z.view("obs", 0).tolist() == [k] * 3


def test_ctrl_c_during_blocked_sample(gear, make_table):
    t = make_table()
    segment = t.segment + ".c"
    # Python's own Ctrl-C handling in the child, whatever this process got:
    # a process started in the background by a non-interactive shell (a CI
    # runner's, nohup ... &) inherits SIGINT ignored, and Python then keeps
    # it ignored.
    code = textwrap.dedent(f"""
        import signal, sys; sys.path.insert(0, {PKG!r})
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import gear
        t = gear.Table(name="t", capacity=4, columns=[{{"name": "x", "dtype": "float32"}}],
                       segment={segment!r})
        try:
            print("blocked", flush=True)  # inside the try: the signal may come at once
            t.sample(1)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        t.close()
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "blocked"
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
        assert out.strip() == "interrupted" and p.returncode == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if os.path.exists("/dev/shm/" + segment):  # a child that failed left it
            os.unlink("/dev/shm/" + segment)


def test_checkpoint_and_restore(gear, make_table, tmp_path):
    t = make_table()
    fill(t, [1, 2, 3], keys=[5, 6, 7])
    path = tmp_path / "t.ckpt"
    t.checkpoint(path)
    cols = [{"name": "x", "dtype": "float32", "shape": [2]}]
    r = gear.Table.restore(path, name="t", columns=cols, capacity=16, segment=t.segment + ".r")
    try:
        r.wait_admitted(10)
        assert len(r) == 3
        s = r.sample(64, timeout=5)
        assert set(s.keys.tolist()) == {5, 6, 7}
        assert np.array_equal(s.data["x"][:, 0], (s.keys - 5).astype(np.float32))
    finally:
        r.close()
    # Another capacity: the error names the table's capacity and extra rows,
    # not only the shard's rows they add up to.
    with pytest.raises(gear.InvalidArgument, match="capacity 3 with extra_rows 1024"):
        gear.Table.restore(path, name="t", columns=cols, capacity=3, segment=t.segment + ".r2")


def test_default_extra_rows(gear, make_table):
    """extra_rows left out: the capacity or 8 MiB of rows, whichever is
    fewer, from 1024 to 16384; given, as given. The shard has one row more
    than the table's capacity and the extra rows."""
    rows400 = [{"name": "obs", "dtype": "float32", "shape": [96]}, {"name": "a", "dtype": "int32"},
               {"name": "r", "dtype": "float32"}, {"name": "d", "dtype": "float32"}, {"name": "f", "dtype": "int32"}]
    for kw, want in [(dict(columns=rows400, capacity=20000), 20001 + 16384),
                     (dict(columns=[{"name": "x", "dtype": "float32", "shape": [256]}], capacity=20000), 20001 + 8192),
                     (dict(columns=rows400, capacity=3000), 3001 + 3000),
                     (dict(capacity=16), 17 + 1024),
                     (dict(capacity=16, extra_rows=0), 17),
                     (dict(capacity=16, extra_rows=5), 22)]:
        t = make_table(**kw)
        assert t.info()["capacity"] == want, kw
        t.close()


def test_insert_one_row_kinds_and_full_shard(gear, make_table):
    """insert's staged row: arrays, numpy scalars and Python numbers land in
    their columns; a wrong dtype raises ValueError and commits nothing; an
    insert into a shard with no free row waits (gear_shard_insert's path)
    until one is freed, and inserts the row it was given."""
    cols = [{"name": "obs", "dtype": "float32", "shape": [3]}, {"name": "a", "dtype": "int32"},
            {"name": "r", "dtype": "float64"}]
    t = make_table(columns=cols, capacity=3, rate_limiter={"kind": "queue"}, extra_rows=0)
    t.insert(key=1, obs=np.array([1, 2, 3], np.float32), a=np.int32(7), r=0.5)
    t.insert(key=2, obs=[4, 5, 6], a=np.int64(8), r=np.float64(1.5))
    with pytest.raises(ValueError, match="'obs'"):
        t.insert(key=9, a=9, r=0.0, obs=np.zeros(3, np.float64))  # a and r are staged first
    t.wait_admitted(10)
    assert len(t) == 2
    s = t.sample(2, timeout=5)
    assert s.keys.tolist() == [1, 2]
    assert s.data["obs"].tolist() == [[1, 2, 3], [4, 5, 6]] and s.data["a"].tolist() == [7, 8]
    assert s.data["r"].tolist() == [0.5, 1.5]
    # The queue holds three; the fourth waits for admission in the shard's
    # spare row (jobs gives the shard one row beyond the capacity).
    for k in (3, 4, 5, 6):
        t.insert(key=k, obs=np.full(3, k, np.float32), a=k, r=float(k))
    with pytest.raises(gear.Timeout):
        t.insert(key=7, obs=np.full(3, 7, np.float32), a=7, r=7.0, timeout=0.2)
    freed = threading.Timer(0.3, lambda: t.sample(1, timeout=5))  # frees key 3's row
    freed.start()
    t.insert(key=8, obs=np.full(3, 8, np.float32), a=8, r=8.0, timeout=10)
    freed.join()
    got = [t.sample(1, timeout=5) for _ in range(4)]
    assert [int(g.keys[0]) for g in got] == [4, 5, 6, 8]
    assert got[3].data["obs"][0].tolist() == [8, 8, 8] and got[3].data["a"][0] == 8 and got[3].data["r"][0] == 8.0


def test_keyless_insert_priorities(gear, make_table):
    """insert without a key passes its priority through the staging row,
    rewritten only when it changes: every row keeps its own priority,
    repeated or not, and a refused priority commits nothing and leaves the
    next insert's priority right."""
    t = make_table(sampler="maxheap", max_times_sampled=1)
    prios = [1.0, 1.0, 2.5, 2.5, 0.5, 1.0, np.float32(4.0), 3]
    for i, p in enumerate(prios):
        t.insert(priority=p, x=np.full(2, i, np.float32))
    with pytest.raises(gear.Error, match="(?i)nan"):
        t.insert(priority=float("nan"), x=np.zeros(2, np.float32))
    with pytest.raises((TypeError, ValueError)):
        t.insert(priority="high", x=np.zeros(2, np.float32))
    t.insert(priority=2.0, x=np.full(2, 8, np.float32))  # after a refused NaN
    t.wait_admitted(10)
    prios.append(2.0)
    assert len(t) == len(prios)
    got = []
    for _ in prios:  # the max-heap gives them back highest first, each once
        s = t.sample(1, timeout=5)
        got.append((float(s.priorities[0]), int(s.data["x"][0][0])))
    want = sorted(((float(p), i) for i, p in enumerate(prios)), key=lambda pi: (-pi[0], pi[1]))
    assert [p for p, _ in got] == [p for p, _ in want]
    assert {i for _, i in got} == set(range(len(prios)))
    for p, i in got:
        assert float(prios[i]) == p, f"row {i}: priority {p}, inserted with {prios[i]}"


def test_restore_keeps_times_sampled_and_queues(gear, make_table, tmp_path):
    """A restored table goes on toward max_times_sampled where the
    checkpointed one was, and a restored queue gives one sample per row."""
    cols = [{"name": "x", "dtype": "float32", "shape": [2]}]
    t = make_table(sampler="fifo", remover="fifo", max_times_sampled=3)
    fill(t, [1, 1], keys=[0, 1])
    for _ in range(2):
        assert t.sample(1, timeout=5).keys.tolist() == [0]
    t.checkpoint(tmp_path / "t.ckpt")
    r = gear.Table.restore(tmp_path / "t.ckpt", name="t", columns=cols, capacity=16, sampler="fifo",
                           remover="fifo", max_times_sampled=3, segment=t.segment + ".r")
    try:
        r.wait_admitted(10)
        s = r.sample(1, timeout=5)
        assert (s.keys.tolist(), s.times_sampled.tolist()) == ([0], [3])
        assert r.sample(1, timeout=5).keys.tolist() == [1]
    finally:
        r.close()

    q = make_table(rate_limiter={"kind": "queue"}, capacity=8)
    fill(q, [1, 1, 1, 1], keys=[10, 11, 12, 13])
    assert q.sample(1, timeout=5).keys.tolist() == [10]
    q.checkpoint(tmp_path / "q.ckpt")
    rq = gear.Table.restore(tmp_path / "q.ckpt", name="t", columns=cols, capacity=8, rate_limiter={"kind": "queue"},
                            segment=q.segment + ".r")
    try:
        rq.wait_admitted(10)
        assert [rq.sample(1, timeout=5).keys[0] for _ in range(3)] == [11, 12, 13]
        with pytest.raises(gear.Timeout):
            rq.sample(1, timeout=0.2)
    finally:
        rq.close()


def test_waiting_rows_of_a_queue(gear, make_table):
    """A writer's inserts do not wait for the rate limiter (admission does):
    info()["waiting"] counts the rows it holds back."""
    q = make_table(capacity=3, rate_limiter={"kind": "queue"})
    for i in range(8):
        q.insert(x=[i, i], key=i, timeout=5)
    deadline = time.monotonic() + 10
    while q.info()["size"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    info = q.info()
    assert (info["size"], info["waiting"], info["commits"]) == (3, 5, 8)
    assert q.sample(1, timeout=5).keys.tolist() == [0]
    assert [q.sample(1, timeout=5).keys[0] for _ in range(7)] == list(range(1, 8))
    assert q.info()["waiting"] == 0


def test_generated_insert_behaves_as_insert(gear, make_table):
    """A table's or writer's insert is written out for its columns (keyword
    parameters, no loop over **columns) and must do what _Shard.insert does:
    every kind of value lands in its column, a key, a missing or unknown
    column and a closed table take the generic way with its errors, a bad
    column commits nothing, and a dropped table still closes at once."""
    import gc
    from gear import table as T
    cols = [{"name": "obs", "dtype": "float32", "shape": [3]}, {"name": "a", "dtype": "int32"},
            {"name": "r", "dtype": "float64"}]
    t = make_table(columns=cols, sampler="fifo", max_times_sampled=1)
    assert "insert" in vars(t) and t.insert.__doc__ == T._Shard.insert.__doc__
    t.insert(obs=np.array([1, 2, 3], np.float32), a=np.int32(1), r=0.5)
    t.insert(2.0, obs=[4, 5, 6], a=2, r=np.float64(1.5))  # the priority by position
    T._Shard.insert(t, obs=np.full(3, 7, np.float32), a=3, r=2.5)  # the generic insert, beside it
    for bad, match in [(dict(a=5, r="x"), "'r'"), (dict(a=5.5, r=1.0), "'a'"), (dict(a=5, r=1.0, obs=np.zeros(3)), "'obs'.*dtype"),
                       (dict(a=5), r"missing \['r'\]"), (dict(a=5, r=1.0, b=1), r"unknown \['b'\]")]:
        kw = {"obs": np.zeros(3, np.float32), **bad}
        with pytest.raises(ValueError, match=match):
            t.insert(**kw)
    t.insert(key=42, obs=np.full(3, 42, np.float32), a=42, r=42.0)  # a key: the generic way
    w = gear.Writer(t.segment)
    assert "insert" in vars(w)
    w.insert(3.0, obs=np.full(3, 8, np.float32), a=np.int16(8), r=8)
    w.close()
    with pytest.raises(gear.Closed):
        w.insert(obs=np.zeros(3, np.float32), a=0, r=0.0)
    t.wait_admitted(10)
    assert t.info()["commits"] == 5
    got = [t.sample(1, timeout=5) for _ in range(5)]
    assert [g.data["obs"][0].tolist() for g in got] == [[1, 2, 3], [4, 5, 6], [7, 7, 7], [42, 42, 42], [8, 8, 8]]
    assert [int(g.data["a"][0]) for g in got] == [1, 2, 3, 42, 8]
    assert [float(g.data["r"][0]) for g in got] == [0.5, 1.5, 2.5, 42.0, 8.0]
    assert [float(g.priorities[0]) for g in got] == [1.0, 2.0, 1.0, 1.0, 3.0]
    assert int(got[3].keys[0]) == 42
    t.close()
    with pytest.raises(gear.Closed):
        t.insert(obs=np.zeros(3, np.float32), a=0, r=0.0)

    # Names that cannot be parameters keep the generic insert.
    k = make_table(columns=[{"name": "class", "dtype": "int32"}, {"name": "__x", "dtype": "int32"}])
    assert "insert" not in vars(k)
    k.insert(**{"class": 1, "__x": 2})
    k.wait_admitted(10)
    assert len(k) == 1

    # No reference cycle: a dropped table closes (and removes its segment)
    # when its last reference goes, without the garbage collector.
    seg = t.segment + ".drop"
    gc.disable()
    try:
        d = gear.Table(name="d", columns=cols, capacity=4, segment=seg)
        d.insert(obs=np.zeros(3, np.float32), a=0, r=0.0)
        assert os.path.exists("/dev/shm/" + seg)
        del d
        assert not os.path.exists("/dev/shm/" + seg)
    finally:
        gc.enable()
