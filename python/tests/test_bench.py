"""python/bench.py runs end to end with tiny windows: every line it promises
comes out with its figures, its writer processes end, and it leaves no
shared memory behind."""

import os
import re
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench.py")


def run_bench(*args):
    """bench.py's output with tiny windows and args; it must end well and
    leave no shared memory behind."""
    p = subprocess.Popen([sys.executable, BENCH, "--seconds", "0.05", "--repeats", "1", "--windows", "2",
                          "--window", "0.05", "--capacity", "4096", "--writer-capacity", "60000", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    # Its tables' segments are named after its process (gear.local-PID.*).
    left = [e for e in os.listdir("/dev/shm") if f"local-{p.pid}." in e]
    assert not left, f"bench left shared memory behind: {left}"
    return out


def check_ratios(out, lines, cpu_lines):
    """Each of lines gives one's and two's rows/s and their ratio, and
    cpu_lines lines give both runs' CPU."""
    assert "2 pairs of 0.05 s windows" in out, out
    for line in lines:
        m = re.search(re.escape(line) + r"\s+one ([\d,]+) rows/s, two ([\d,]+) rows/s: ([\d.]+)x", out)
        assert m, f"no ratio for {line!r} in:\n{out}"
        one, two, ratio = (float(g.replace(",", "")) for g in m.groups())
        assert one > 0 and two > 0 and ratio > 0, m.group(0)
    cpu = re.findall(r"1 writer ([\d.]+) \+ owner ([\d.]+) \(of \d+\), 2 writers ([\d.]+) \+ owner", out)
    assert len(cpu) == cpu_lines, out
    assert all(float(w1) > 0 and float(w2) > 0 for w1, _, w2 in cpu), cpu


def test_bench_runs_every_case(gear):
    out = run_bench()
    assert "table capacity 4096, packed," in out, out  # its tables pack the scalar columns
    for case in ("insert, one row a call, full table", "into a table with room", "insert_batch, 256 rows a call",
                 "sample+collect, batches of 256", "the same, new arrays each call"):
        m = re.search(re.escape(case) + r"\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)", out)
        assert m, f"no figures for {case!r} in:\n{out}"
        assert all(float(g.replace(",", "")) > 0 for g in m.groups()), m.group(0)
    check_ratios(out, ("writer processes, full table", "writer processes, table with room",
                       "writer processes, one row a call", "peer: numpy ring processes"), 3)


def test_bench_only_row_writers(gear):
    out = run_bench("--only", "row-writers")
    check_ratios(out, ("writer processes, one row a call", "peer: numpy ring processes"), 1)
    for other in ("insert_batch", "sample+collect", "full table ", "table with room"):
        assert other not in out, f"--only row-writers measured {other!r}:\n{out}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
