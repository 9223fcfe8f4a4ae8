"""Misuse that must raise, never crash the interpreter, corrupt rows, wrap a
number around or lose a row of the shard: a closed handle, a committed
Pending, NaN and refused priorities, keys and values out of range, dropped
batches and views that outlive their table."""

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def run_alone(code):
    """Runs code in a fresh interpreter (a crash there fails the test, not
    the run) and returns its stdout."""
    src = f"import sys; sys.path.insert(0, {PKG!r})\nimport os, numpy as np, gear, uuid\n" + textwrap.dedent(code)
    p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"exit status {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_insert_after_close_raises_closed():
    # The staging row is libgear's memory, freed at close: an insert must not
    # write it first (a small column corrupted the heap, a large one crashed).
    out = run_alone("""
        for shape in ([2], [1000000]):
            cols = [{"name": "x", "dtype": "float32", "shape": shape}]
            t = gear.Table(name="t", capacity=4, columns=cols, extra_rows=0,
                           segment=f"gear.pytest-{uuid.uuid4().hex[:12]}.t")
            w = gear.Writer(t.segment)
            w.close()
            t.close()
            for h in (t, w):
                for _ in range(3):
                    try:
                        h.insert(x=np.full(shape, 7, np.float32))
                    except gear.Closed:
                        print("closed")
    """)
    assert out.split() == ["closed"] * 12


def test_views_keep_a_dropped_table_open():
    out = run_alone("""
        def rows():
            t = gear.Table(name="t", capacity=4, columns=[{"name": "x", "dtype": "float32", "shape": [2]}],
                           segment=f"gear.pytest-{uuid.uuid4().hex[:12]}.t")
            t.insert(x=[1, 2], key=5)
            t.wait_admitted(10)
            return t.columns["x"].rows, t.segment
        r, seg = rows()
        import gc; gc.collect()
        print(r.sum(), os.path.exists("/dev/shm/" + seg))
        del r
        gc.collect()
        print(os.path.exists("/dev/shm/" + seg))
    """)
    assert out.split() == ["3.0", "True", "False"]


def test_pending_after_commit_refuses(gear, make_table):
    t = make_table()
    for k in range(3):
        t.insert(x=[k, k], key=k)
    p = t.allocate()
    p["x"] = [7, 7]
    p.commit(key=3)
    with pytest.raises(gear.InvalidArgument, match="committed or aborted"):
        p["x"] = [-1, -1]
    with pytest.raises(gear.InvalidArgument):
        p["x"]
    with pytest.raises(gear.InvalidArgument):
        p.commit(key=4)
    with pytest.raises(gear.InvalidArgument):
        p.abort()
    t.wait_admitted(10)
    got = {}
    for _ in range(200):
        s = t.sample(4, timeout=5)
        got |= {int(k): s.data["x"][i].tolist() for i, k in enumerate(s.keys)}
    assert got == {k: [k, k] for k in range(3)} | {3: [7, 7]}


@pytest.mark.parametrize("how", ["insert", "insert_key", "insert_batch", "commit"])
def test_nan_priority_loses_no_row(gear, make_table, how):
    # Two rows and no spare: a NaN that kept its row would wedge the shard.
    t = make_table(capacity=2, extra_rows=0)
    nan = float("nan")
    for i in range(5):
        with pytest.raises(gear.InvalidArgument, match="NaN"):
            if how == "insert":
                t.insert(x=[1, 2], priority=nan, timeout=0.2)
            elif how == "insert_key":
                t.insert(x=[1, 2], priority=nan, key=i, timeout=0.2)
            elif how == "insert_batch":
                t.insert_batch({"x": np.ones((2, 2), np.float32)}, priorities=[1.0, nan], timeout=0.2)
            else:
                p = t.allocate(timeout=0.2)
                try:
                    p.commit(priority=nan)
                finally:
                    p.abort()  # the row stayed pending: it can still go back
    for i in range(4):
        t.insert(x=[i, i], timeout=1)
    t.wait_admitted(10)
    assert t.info()["size"] == 2


def test_refused_priority_raises_at_insert(gear, make_table):
    t = make_table(sampler="prioritized", priority_exponent=1.0)
    for p in (-1.0, float("inf")):
        with pytest.raises(gear.InvalidArgument, match="refused"):
            t.insert(x=[1, 2], priority=p, key=1)
        with pytest.raises(gear.InvalidArgument, match="refused"):
            t.insert(x=[1, 2], priority=p)
    t.insert(x=[1, 2], priority=2.0, key=1)
    t.wait_admitted(10)
    info = t.info()
    assert (info["size"], info["refused"]) == (1, 0)
    with pytest.raises(gear.InvalidArgument, match="negative"):
        t.update_priorities([1], [-3.0])


@pytest.mark.parametrize("key", [-1, 2**64, 2**70, 1.5, "1", True])
def test_keys_out_of_range_refused(gear, make_table, key):
    t = make_table()
    t.insert(x=[0, 0], key=0)
    with pytest.raises(gear.InvalidArgument, match="key"):
        t.insert(x=[1, 1], key=key)
    p = t.allocate()
    with pytest.raises(gear.InvalidArgument, match="key"):
        p.commit(key=key)
    p.abort()
    t.wait_admitted(10)
    assert t.sample(1, timeout=5).keys.tolist() == [0]


def test_key_arrays_out_of_range_refused(gear, make_table):
    t = make_table()
    t.insert(x=[0, 0], key=1)
    t.wait_admitted(10)
    for bad in ([-1, -2], [2**64], [1.7], ["a"]):
        with pytest.raises(gear.InvalidArgument):
            t.insert_batch({"x": np.ones((len(bad), 2), np.float32)}, keys=bad)
        with pytest.raises(gear.InvalidArgument):
            t.update_priorities(bad, [5.0] * len(bad))
        with pytest.raises(gear.InvalidArgument):
            t.delete(bad)
    assert t.info()["size"] == 1
    t.insert_batch({"x": np.ones((2, 2), np.float32)}, keys=[2**64 - 1, 7])
    t.wait_admitted(10)
    seen = set()
    for _ in range(200):
        seen.update(t.sample(3, timeout=5).keys.tolist())
    assert sorted(seen) == [1, 7, 2**64 - 1]


@pytest.mark.parametrize("dtype,bad,good", [
    ("int32", [2**40, np.int64(2**33 + 5), 3.7, np.float64(3.7), -2**31 - 1, float("nan")], [3.0, -2**31, np.int64(9)]),
    ("uint8", [300, -1, [1, 256]], [255, 0]),
    ("float32", [1e300, np.float64(-1e39)], [0.1, 2**40, float("inf")]),
    ("bool", [2, -1], [0, 1, True]),
])
def test_values_that_do_not_fit_are_refused(gear, make_table, dtype, bad, good):
    shape = [2] if isinstance(bad[-1], list) else []
    t = make_table(columns=[{"name": "a", "dtype": dtype, "shape": shape}], capacity=64)

    def row(v):
        return np.broadcast_to(np.asarray(v), shape).tolist() if shape and not isinstance(v, list) else v

    for v in bad:
        with pytest.raises(ValueError, match="'a'"):
            t.insert(a=row(v))
        with pytest.raises(ValueError, match="'a'"):
            t.insert_batch({"a": [row(v)]})
        p = t.allocate()
        with pytest.raises(ValueError, match="'a'"):
            p["a"] = row(v)
        p.abort()
    for v in good:
        if isinstance(v, list):
            continue
        t.insert(a=row(v))
    t.wait_admitted(10)
    assert t.info()["size"] == len([v for v in good if not isinstance(v, list)])


def test_dropped_kept_batch_releases_its_rows(gear, make_table):
    t = make_table(capacity=4, max_times_sampled=1, extra_rows=2)
    for i in range(40):
        t.insert(x=[i, i], key=i, timeout=2)
        t.wait_admitted(2)
        s = t.sample(1, timeout=1, copy=False)
        assert s.keys.tolist() == [i]
        del s
        gc.collect()


def test_out_after_a_kept_batch(gear, make_table):
    t = make_table(capacity=4, extra_rows=2)
    for i in range(3):
        t.insert(x=[i, i], key=i)
    t.wait_admitted(10)
    s = t.sample(1, timeout=1, copy=False)
    with pytest.raises(gear.InvalidArgument, match="release"):
        t.sample(1, out=s)
    s.release()
    for _ in range(20):  # each refill a copy: no batch left pinned
        s2 = t.sample(1, timeout=1, out=s)
        assert list(s2.data) == ["x"] and s2.data["x"][0].tolist() == [s2.keys[0]] * 2
    t.insert(x=[9, 9], key=9, timeout=1)


def test_priority_exponent_zero_is_kept(gear, make_table):
    # Reverb's alpha 0: every item alike, whatever its priority (a written 0
    # once became the default 1, p / sum p).
    t = make_table(sampler="prioritized", priority_exponent=0.0)
    for k, p in enumerate([0.5, 1, 2, 7]):
        t.insert(x=[k, k], key=k, priority=p)
    t.wait_admitted(10)
    s = t.sample(1, timeout=5)
    assert s.probabilities.tolist() == [0.25]


def test_writer_waits_for_its_table():
    # An actor may start before its learner has made the table.
    out = run_alone("""
        import subprocess
        seg = f"gear.pytest-{uuid.uuid4().hex[:12]}.t"
        code = (f"import sys; sys.path.insert(0, {sys.path[0]!r}); import gear, time; time.sleep(0.5); "
                f"t = gear.Table(name='t', capacity=4, columns=[{{'name': 'x', 'dtype': 'float32'}}], segment={seg!r}); "
                "t.wait_admitted(10); print(len(t), flush=True); time.sleep(30)")
        owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            print(os.path.exists("/dev/shm/" + seg))  # not made yet: the owner sleeps first
            w = gear.Writer(seg, timeout=20)
            w.insert(x=1.5)
            w.close()
        finally:
            owner.kill()
            owner.wait()
            if os.path.exists("/dev/shm/" + seg):
                os.unlink("/dev/shm/" + seg)
    """)
    assert out.split() == ["False"]


def test_ctrl_c_during_writer_attach():
    out = run_alone("""
        import signal, threading
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            gear.Writer("gear.pytest-never-made", timeout=None)  # without the interrupt: no end
        except KeyboardInterrupt:
            print("interrupted")
    """)
    assert out.split() == ["interrupted"]


def test_bad_arguments_are_invalid_arguments(gear, make_table):
    cols = [{"name": "x", "dtype": "float32"}]
    for make, match in [(lambda: gear.Table(5), "spec"),
                        (lambda: gear.Table(name="t", capacity="16", columns=cols), "capacity"),
                        (lambda: gear.Table(name="t", capacity=4, bogus=1, columns=cols), "bogus"),
                        (lambda: gear.Table(name="t", capacity=4, seed="a", columns=cols), "seed"),
                        (lambda: gear.Table(name="t", capacity=4, extra_rows=-1, columns=cols), "extra_rows")]:
        with pytest.raises(gear.InvalidArgument, match=match):
            make()


def test_insert_batch_says_how_many_went_in(gear, make_table):
    t = make_table(capacity=2, extra_rows=0, rate_limiter={"kind": "queue"})
    with pytest.raises(gear.InvalidArgument, match="0 of 3 rows") as e:
        t.insert_batch({"x": np.ones((3, 2), np.float32)}, priorities=[1, float("nan"), 1])
    assert e.value.inserted == 0
    # A queue that nobody samples: its rows run out, and a batch waits.
    with pytest.raises(gear.Timeout, match=r"\d+ of 10 rows inserted") as e:
        t.insert_batch({"x": np.ones((10, 2), np.float32)}, timeout=0.3)
    assert 2 <= e.value.inserted < 10


def test_scalar_columns_give_views(gear, make_table):
    t = make_table(columns=[{"name": "a", "dtype": "int32"}])
    p = t.allocate()
    v = p["a"]
    assert v.shape == () and not v.flags.owndata
    v[...] = 5
    p.commit(key=1)
    t.wait_admitted(10)
    with t.sample(1, timeout=5, copy=False) as s:
        w = s.view("a", 0)
        assert w.shape == () and int(w) == 5 and not w.flags.owndata


def test_views_outlive_an_explicit_close():
    # A view kept past close reads the rows it saw (no crash); the shard goes
    # with the last view, or at exit; without views close removes it at once.
    out = run_alone("""
        import gc
        cols = [{"name": "x", "dtype": "float32", "shape": [2]}]
        def table():
            seg = f"gear.pytest-{uuid.uuid4().hex[:12]}.t"
            t = gear.Table(name="t", capacity=4, columns=cols, segment=seg)
            t.insert(x=[1, 2], key=5)
            t.wait_admitted(10)
            return t, "/dev/shm/" + seg
        t, path = table()
        t.close()
        print(os.path.exists(path))
        t, path = table()
        rows = t.columns["x"].rows
        s = t.sample(1, timeout=5, copy=False)
        v = s.view("x", 0)
        p = t.allocate()
        t.close()
        for call in (lambda: t.insert(x=[0, 0]), lambda: p.__setitem__("x", [0, 0]), lambda: s.view("x", 0)):
            try:
                call()
            except gear.Closed:
                print("closed")
        print(os.path.exists(path), rows.sum(), v.tolist())
        del rows, v, s, p
        gc.collect()
        print(os.path.exists(path))
        t, path = table()
        keep = t.columns["x"].rows[:2]
        t.close()
        print(os.path.exists(path), path)
    """)
    lines = out.split("\\n")
    words = out.split()
    assert words[:4] == ["False", "closed", "closed", "closed"], out
    assert words[4:8] == ["True", "3.0", "[1.0,", "2.0]"], out
    assert words[8:10] == ["False", "True"], out
    # At exit the kept view's table was closed: its shard is gone.
    assert not os.path.exists(words[10]), lines


def test_sample_arguments(gear, make_table):
    a = make_table(columns=[{"name": "x", "dtype": "float32", "shape": [1]}], capacity=4, extra_rows=0)
    b = make_table(columns=[{"name": "x", "dtype": "float32", "shape": [4096]}], capacity=4, extra_rows=0)
    for t in (a, b):
        for i in range(4):
            t.insert(x=np.full(t.columns["x"].row_shape, i, np.float32), key=i)
        t.wait_admitted(10)
    s = a.sample(4, timeout=5)
    with pytest.raises(gear.InvalidArgument, match="another table"):
        b.sample(4, out=s)  # b's rows would not fit s's arrays
    with pytest.raises(gear.InvalidArgument, match="twice"):
        b.sample(4, columns=["x", "x"])
    for n in (0, -1, 1.5, True, "2"):
        with pytest.raises(gear.InvalidArgument, match="n"):
            a.sample(n, timeout=1)
    # timeout 0: one try, which a table that can be sampled answers.
    assert len(a.sample(2, timeout=0)) == 2
    assert a.sample(1, timeout=0.0001).keys[0] in range(4)


def test_dropped_pending_gives_its_row_back(gear, make_table):
    t = make_table(capacity=4, extra_rows=0)
    w = gear.Writer(t.segment)
    try:
        for _ in range(12):
            p = w.allocate(timeout=1)
            with pytest.raises(ValueError):
                p["x"] = [1, "bad"]
            del p
            gc.collect()
        with w.allocate(timeout=1) as p:
            p["x"] = [1, 2]
            p.commit(key=1)
        with pytest.raises(ValueError):
            with w.allocate(timeout=1) as p:
                p["x"] = [1, "bad"]
        t.insert(x=[3, 4], key=2, timeout=1)
        t.wait_admitted(10)
        assert t.info()["size"] == 2
    finally:
        w.close()


def test_mutable_priority_objects_are_read_each_call(gear, make_table):
    t = make_table(sampler="prioritized", priority_exponent=1.0, capacity=8)
    p = np.array(1.0)
    t.insert(priority=p, x=[0, 0])
    p[...] = 7.0
    t.insert(priority=p, x=[1, 1])
    t.insert(priority=np.float32(3.0), x=[2, 2])
    t.wait_admitted(10)
    got = {}
    for _ in range(100):
        s = t.sample(3, timeout=5)
        got |= {int(k): float(v) for k, v in zip(s.data["x"][:, 0], s.priorities)}
    assert got == {0: 1.0, 1: 7.0, 2: 3.0}


def test_more_values_that_do_not_fit(gear, make_table):
    torch = pytest.importorskip("torch")
    t = make_table(columns=[{"name": "h", "dtype": "float16"}, {"name": "b", "dtype": "bfloat16", "shape": [2]},
                            {"name": "d", "dtype": "float64"}], capacity=8, extra_rows=0)
    for h in (70000, 2**31, -2**63):
        with pytest.raises(ValueError, match="'h'"):
            t.insert(h=h, b=[0, 0], d=0)
    with pytest.raises(ValueError, match="'b'"):
        t.insert(h=0, b=[1e39, 0], d=0)
    t.insert(h=1, b=[1.0, -2.5], d=2**70, key=1)  # numbers into bfloat16: rounded, stored as bits
    t.insert(h=2, b=torch.tensor([0.5, 3.0], dtype=torch.bfloat16), d=torch.tensor(4.0, dtype=torch.float64,
                                                                                    requires_grad=True), key=2)
    t.insert(h=3, b=np.array([0x3F80, 0x4000], np.uint16), d=0, key=3)  # uint16: bits as they are
    t.wait_admitted(10)
    rows = {}
    for _ in range(100):
        s = t.sample(3, timeout=5)
        rows |= {int(k): (s.data["b"][i].tolist(), float(s.data["d"][i])) for i, k in enumerate(s.keys)}
    bits = {k: torch.tensor(np.array(b, np.uint16).astype(np.int16)).view(torch.bfloat16).tolist() for k, (b, _) in
            rows.items()}
    assert bits == {1: [1.0, -2.5], 2: [0.5, 3.0], 3: [1.0, 2.0]}
    assert (rows[1][1], rows[2][1]) == (2.0**70, 4.0)


def test_zero_d_keys_and_version_bounds(gear, make_table):
    t = make_table()
    t.insert(x=[1, 1], key=np.array(9))
    p = t.allocate()
    p["x"] = [2, 2]
    p.commit(key=np.array(3, np.uint64))
    t.wait_admitted(10)
    assert t.info()["size"] == 2
    w = gear.init(timeout=30)
    try:
        pub = gear.Publisher(w, "pytest-bounds", 1, timeout=30)
        rd = gear.Reader(w, "pytest-bounds", timeout=30)
        with pytest.raises(gear.InvalidArgument, match="above 2\\^63-1"):
            pub.publish(2**63, np.zeros(1, np.float32))
        with pytest.raises(gear.InvalidArgument, match="at most 2\\^63-1"):
            rd.read(min_version=2**64 - 1, timeout=10)  # refused, not waited for
        pub.publish(2**63 - 1, np.ones(1, np.float32))
        assert rd.read(min_version=2**63 - 1, timeout=10) == 2**63 - 1
        rd.close()
        pub.close()
    finally:
        w.close()


def test_bad_names_and_lengths_are_invalid_arguments(gear, make_table):
    for name in ("a/b", "", "x" * 300, "a\0b"):
        with pytest.raises(gear.InvalidArgument, match="segment name"):
            gear.Writer(name, timeout=0.2)
    with pytest.raises(gear.InvalidArgument, match="segment name"):
        gear.Table(name="t", capacity=4, columns=[{"name": "x", "dtype": "float32"}], segment="a/b")
    t = make_table()
    for kw, match in ((dict(priorities=[1, 2, 3]), "3 priorities for 2 rows"), (dict(keys=[]), "0 keys for 2 rows"),
                      (dict(keys=[1, 2, 3]), "3 keys for 2 rows")):
        with pytest.raises(gear.InvalidArgument, match=match):
            t.insert_batch({"x": np.ones((2, 2), np.float32)}, **kw)
    assert t.info()["commits"] == 0


def test_views_survive_the_exit_hook():
    # An atexit function registered before gear's runs after it: a view it
    # reads must still be mapped, and the owner's segment must be gone after.
    out = run_alone("""
        import atexit
        held = {}
        atexit.register(lambda: print("at exit", float(held["v"][0].sum()), flush=True))
        import gear.table
        seg = f"gear.pytest-{uuid.uuid4().hex[:12]}.t"
        t = gear.Table(name="t", capacity=4, columns=[{"name": "x", "dtype": "float32", "shape": [2]}], segment=seg,
                       extra_rows=0)
        t.insert(x=[1, 2], key=1)
        t.wait_admitted(10)
        held["v"] = t.columns["x"].rows
        print(seg)
    """)
    seg, *rest = out.split("\n")
    assert rest[0].startswith("at exit"), out
    assert not os.path.exists("/dev/shm/" + seg)


@pytest.mark.parametrize("bad", [None, "2.5", b"1", True, np.bool_(True)])
def test_priorities_that_are_not_numbers_are_refused(gear, make_table, bad):
    # Each handle's first insert too: it has staged no priority to compare
    # with (None was taken for "the one staged", so a first None went in
    # with whatever the staging row held).
    t = make_table()
    w = gear.Writer(t.segment)
    try:
        for h in (t, w):
            for _ in range(2):
                with pytest.raises(gear.InvalidArgument, match="want a number"):
                    h.insert(x=[1, 2], priority=bad)
                with pytest.raises(gear.InvalidArgument, match="want a number"):
                    h.insert(x=[1, 2], priority=bad, key=7)
            with pytest.raises(gear.InvalidArgument, match="want a number"):
                h.insert_batch({"x": np.ones((2, 2), np.float32)}, priorities=[1.0, bad])
            p = h.allocate()
            with pytest.raises(gear.InvalidArgument):
                p.commit(priority=bad)
            p.abort()
        assert t.info()["commits"] == 0
        # A number after refused ones goes in with its own priority.
        w.insert(x=[1, 2], priority=3.0)
        t.wait_admitted(10)
        assert t.sample(1).priorities.tolist() == [3.0]
    finally:
        w.close()


def test_arguments_of_the_wrong_type_are_invalid_arguments(gear, make_table, tmp_path):
    t = make_table()
    for cols in (None, [np.ones((2, 2), np.float32)], np.ones((2, 2), np.float32)):
        with pytest.raises(gear.InvalidArgument, match="want a mapping"):
            t.insert_batch(cols)
    for path in (None, 5, b"/tmp/x"):
        with pytest.raises(gear.InvalidArgument, match="path"):
            t.checkpoint(path)
        with pytest.raises(gear.InvalidArgument, match="path"):
            gear.Table.restore(path, name="t", capacity=16, columns=[{"name": "x", "dtype": "float32", "shape": [2]}])
    t.checkpoint(tmp_path / "ok.ckpt")  # an os.PathLike is a path
    for world in (None, "world", t):
        with pytest.raises(gear.InvalidArgument, match="World"):
            gear.Publisher(world, "pytest-types", 1)
        with pytest.raises(gear.InvalidArgument, match="World"):
            gear.Reader(world, "pytest-types", timeout=0.1)
    assert t.info()["commits"] == 0


def test_stale_parameter_version_is_an_invalid_argument(gear):
    w = gear.init(timeout=30)
    try:
        pub = gear.Publisher(w, "pytest-stale", 2, timeout=30)
        pub.publish(5, np.ones(2, np.float32))
        for v in (5, 4):
            with pytest.raises(gear.InvalidArgument, match="not newer"):
                pub.publish(v, np.zeros(2, np.float32))
        pub.publish(6, np.zeros(2, np.float32))
        pub.close()
    finally:
        w.close()


def test_null_pointers_are_refused_under_faulthandler():
    # faulthandler enabled after libgear loaded (as pytest's plugin may be)
    # takes SIGSEGV before Go could make a nil dereference a panic: each call
    # must refuse a NULL it would write through, not dereference it.
    out = run_alone("""
        import ctypes, faulthandler
        from gear import _lib
        faulthandler.enable()
        L = _lib.lib
        t = gear.Table(name="t", capacity=4, columns=[{"name": "x", "dtype": "float32", "shape": [2]}],
                       segment=f"gear.pytest-{uuid.uuid4().hex[:12]}.t")
        t.insert(x=[1, 2])
        t.wait_admitted(10)
        h = t._h
        i64, u64 = ctypes.c_int64(), ctypes.c_uint64()
        prio = (ctypes.c_double * 1)(1.0)
        keys = (ctypes.c_uint64 * 1)()
        col = (ctypes.c_int32 * 1)(0)
        nulls = (ctypes.c_void_p * 1)()
        buf = np.zeros(2, np.float32)
        seg, sn = _lib.cstr(t.segment)
        spec, pn = _lib.cstr(gear.table_spec(name="u", capacity=4, columns=[{"name": "x", "dtype": "float32"}]))
        other, on = _lib.cstr(f"gear.pytest-{uuid.uuid4().hex[:12]}.u")
        calls = {
            "sample got": lambda: L.gear_table_sample(h, 1, 0, 0, keys, None, None, None, None, 0, None, None, None, None),
            "sample column buffer": lambda: L.gear_table_sample(h, 1, 0, 0, keys, None, None, None, None, 1, col, nulls,
                                                               ctypes.byref(i64), None),
            "insert done": lambda: L.gear_shard_insert(h, 1, None, prio, 1, nulls, 0, None),
            "insert column buffer": lambda: L.gear_shard_insert(h, 1, None, prio, 1, nulls, 0, ctypes.byref(i64)),
            "allocate row": lambda: L.gear_shard_allocate(h, 0, None),
            "attach out": lambda: L.gear_shard_attach(seg, sn, 0, None),
            "create out": lambda: L.gear_table_create(spec, pn, other, on, 0, 0, None),
            "op result": lambda: L.gear_op_result(h, None),
            "stage addr": lambda: L.gear_shard_stage(h, None),
        }
        for what, call in calls.items():
            st = call()
            print(what, st, _lib.last_error().split(": ")[-1] if st else "")
        print("segment made", os.path.exists("/dev/shm/" + other.decode()))
        print("commits", t.info()["commits"])
        t.close()
    """)
    lines = out.splitlines()
    assert lines[-2:] == ["segment made False", "commits 1"], out
    for line in lines[:-2]:
        assert " 4 " in line and "NULL" in line, f"{line!r} (want GEAR_INVALID, 4, naming the NULL):\n{out}"
    assert len(lines) == 11, out
