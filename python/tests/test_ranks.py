"""The collectives across ranks: a job of three Python ranks under gearrun
(built from this checkout into the test's temporary directory) checks
allreduce, broadcast, allgather and barrier on every rank."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PKG = os.path.join(ROOT, "python")

# Each rank checks the collectives' results itself (an assertion fails the
# rank, and gearrun the job) and prints one line when all hold.
RANK = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {pkg!r})
    import numpy as np
    import gear

    w = gear.init(timeout=120)
    r, n = w.rank, w.size
    assert n == {n}, n
    assert gear.init(timeout=5) is w  # a rank joins its job once
    ar = np.arange(5)
    for dt in (np.float32, np.float64, np.int32, np.int64):
        a = (ar + r).astype(dt)
        assert w.allreduce(a, "sum", timeout=60) is a
        assert a.tolist() == (n * ar + n * (n - 1) // 2).tolist(), (dt, a)
        a = (ar * (r + 1)).astype(dt)
        w.allreduce(a, "max", timeout=60)
        assert a.tolist() == (ar * n).tolist(), (dt, a)
        a = (ar - r).astype(dt)
        w.allreduce(a, "min", timeout=60)
        assert a.tolist() == (ar - (n - 1)).tolist(), (dt, a)
        b = np.full(3, 10 * r + 1, dt)
        w.broadcast(b, root=n - 1, timeout=60)
        assert b.tolist() == [10 * (n - 1) + 1] * 3, (dt, b)
        g = w.allgather(np.full(2, r, dt), timeout=60)
        assert g.shape == (n, 2) and g.dtype == dt and g.tolist() == [[i, i] for i in range(n)], (dt, g)
    # barrier: every rank's file exists once any rank has passed it.
    mark = os.path.join({tmp!r}, "rank%d" % r)
    open(mark, "w").close()
    w.barrier(timeout=60)
    missing = [i for i in range(n) if not os.path.exists(os.path.join({tmp!r}, "rank%d" % i))]
    assert not missing, missing
    w.barrier(timeout=60)  # no rank leaves (and the test removes the files) before all looked
    print("rank %d of %d: collectives hold" % (r, n), flush=True)
    w.close()
""")


@pytest.fixture(scope="module")
def gearrun(tmp_path_factory):
    """gearrun, built from this checkout into a temporary directory."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("no go on PATH to build gearrun")
    path = tmp_path_factory.mktemp("bin") / "gearrun"
    subprocess.run([go, "build", "-o", str(path), "./cmd/gearrun"], cwd=ROOT, check=True, timeout=900)
    return path


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_across_ranks(gear, gearrun, tmp_path, n):
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK.format(pkg=PKG, n=n, tmp=str(marks)))
    spec = tmp_path / "job.toml"
    spec.write_text(textwrap.dedent(f"""
        name = "pytest-collectives"
        [launch]
        timeout = "5m"
        grace = "5s"
        [[group]]
        role = "worker"
        np = {n}
        command = ["{sys.executable}", "{script}"]
    """))
    p = subprocess.run([str(gearrun), "run", str(spec)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    for r in range(n):
        assert f"rank {r} of {n}: collectives hold" in p.stdout, p.stdout[-4000:] + p.stderr[-4000:]
