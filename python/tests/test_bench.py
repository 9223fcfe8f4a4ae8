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


def check_ratios(out, lines, cpu_lines, by_line=()):
    """Each of lines gives one's and two's rows/s and their ratio, and
    cpu_lines lines give both runs' CPU. Each of by_line (of lines: those
    measured in windows) is followed by its ratio for each line time between
    the CPUs, its two pairs counted there or as across a change."""
    assert "2 pairs of 0.05 s windows" in out, out
    for line in lines:
        m = re.search(re.escape(line) + r"\s+one ([\d,]+) rows/s, two ([\d,]+) rows/s: ([\d.]+)x.*\n(.*)", out)
        assert m, f"no ratio for {line!r} in:\n{out}"
        one, two, ratio = (float(g.replace(",", "")) for g in m.groups()[:3])
        assert one > 0 and two > 0 and ratio > 0, m.group(0)
        if line in by_line:
            nxt = m.group(4)
            assert nxt.strip().startswith("by line time between CPUs"), f"after {line!r}: {nxt!r}"
            groups = re.findall(r"(\d+)-(\d+) ns: ([\d.]+)x \((\d+) pairs?\)", nxt)
            across = re.search(r"(\d+) pairs? across a change", nxt)
            counted = sum(int(n) for *_, n in groups) + (int(across.group(1)) if across else 0)
            assert counted == 2, f"after {line!r}: {nxt!r} counts {counted} pairs, want 2"
            assert all(0 < int(lo) <= int(hi) and float(r) > 0 for lo, hi, r, _ in groups), nxt
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
    windows = ("writer processes, full table", "writer processes, one row a call", "peer: numpy ring processes")
    check_ratios(out, ("writer processes, table with room",) + windows, 3, windows)


def test_bench_only_row_writers(gear):
    out = run_bench("--only", "row-writers")
    windows = ("writer processes, one row a call", "peer: numpy ring processes")
    check_ratios(out, windows, 1, windows)
    for other in ("insert_batch", "sample+collect", "full table ", "table with room"):
        assert other not in out, f"--only row-writers measured {other!r}:\n{out}"


def test_by_line_groups_pairs_by_line_time(gear):
    sys.path.insert(0, os.path.dirname(BENCH))
    import bench
    # (ratio, probe before, probe after), ns: two speeds, a pair across a
    # change, and one whose probe found one CPU only.
    lines = [(1.6, 40, 45), (1.3, 190, 200), (1.7, 44, 41), (1.5, 45, 195), (1.62, 44, None)]
    groups, across = bench.by_line(lines)
    assert groups == [(40, 45, 1.65, 2), (190, 200, 1.3, 1)], groups
    assert across == 2
    assert bench.by_line([(1.9, None, None)]) == ([], 1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
