"""python/bench.py runs end to end with tiny windows: every line it promises
comes out with its figures, its writer processes end, and it leaves no
shared memory behind."""

import os
import re
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench.py")


def test_bench_runs_every_case(gear):
    p = subprocess.Popen([sys.executable, BENCH, "--seconds", "0.05", "--repeats", "1", "--windows", "2",
                          "--window", "0.05", "--capacity", "4096", "--writer-capacity", "60000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert "table capacity 4096, packed," in out, out  # its tables pack the scalar columns
    for case in ("insert, one row a call, full table", "into a table with room", "insert_batch, 256 rows a call",
                 "sample+collect, batches of 256", "the same, new arrays each call"):
        m = re.search(re.escape(case) + r"\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)", out)
        assert m, f"no figures for {case!r} in:\n{out}"
        assert all(float(g.replace(",", "")) > 0 for g in m.groups()), m.group(0)
    assert "2 pairs of 0.05 s windows" in out, out
    for line in ("writer processes, full table", "writer processes, table with room",
                 "writer processes, one row a call", "peer: numpy ring processes"):
        m = re.search(re.escape(line) + r"\s+one ([\d,]+) rows/s, two ([\d,]+) rows/s: ([\d.]+)x", out)
        assert m, f"no ratio for {line!r} in:\n{out}"
        one, two, ratio = (float(g.replace(",", "")) for g in m.groups())
        assert one > 0 and two > 0 and ratio > 0, m.group(0)
    cpu = re.findall(r"1 writer ([\d.]+) \+ owner ([\d.]+) \(of \d+\), 2 writers ([\d.]+) \+ owner", out)
    assert len(cpu) == 3, out
    assert all(float(w1) > 0 and float(w2) > 0 for w1, _, w2 in cpu), cpu
    # Its tables' segments are named after its process (gear.local-PID.*).
    left = [e for e in os.listdir("/dev/shm") if f"local-{p.pid}." in e]
    assert not left, f"bench left shared memory behind: {left}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
