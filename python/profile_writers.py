"""Where two row writers' time goes beside one: a window of one writer
process and a window of two, each under `perf record` (the cpu-clock
software event, which a virtual machine without hardware counters has too),
then the CPU time each function took a row in the writers' own threads (the
top frame of each sample), for one writer and for two, and the difference,
largest first; and the owner's cores. The windows are python/bench.py's
(--only row-writers): a full table of 400 B rows, one row a call.

    make python && /usr/bin/python3 python/profile_writers.py [--seconds 4] [--top 20]

Needs perf (Debian's linux-perf) and leave to profile other processes
(root, or kernel.perf_event_paranoid at most 1). Samples skid to the
instruction after the one that waited, so a cost shows in the function that
holds that instruction: a commit's fenced store, for instance, waits for the
row's data stores before it.
"""

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import gear  # noqa: E402

FREQ = 4999  # samples a second of CPU: each stands for 1/FREQ s


def record(out, pids, run):
    """Runs run() under perf record of pids, samples in out."""
    p = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQ), "-g", "-o", out,
                          "-p", ",".join(map(str, pids))], stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)  # perf attaches
    if p.poll() is not None:
        raise SystemExit(f"profile_writers: perf record failed: {p.stderr.read().strip()}")
    try:
        return run()
    finally:
        p.send_signal(signal.SIGINT)
        p.wait()


HEADER = re.compile(r"\s*(\d+)/(\d+)\s*$")


def top_frames(data, pids):
    """Samples by top frame ("function (object)") of the main threads of
    pids, and the samples of every thread of each pid."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "pid,tid,ip,sym,dso"], capture_output=True, text=True,
                         check=True).stdout
    frames, threads = collections.Counter(), collections.Counter()
    want = None
    for line in out.splitlines():
        m = HEADER.match(line)
        if m:
            pid, tid = int(m.group(1)), int(m.group(2))
            threads[pid] += 1
            want = pid in pids and pid == tid
            continue
        if want and line.strip():
            parts = line.split(None, 1)
            name = parts[1] if len(parts) > 1 else parts[0]
            frames[re.sub(r"\(\S*/", "(", name.strip())] += 1
            want = False
    return frames, threads


def line(before, after):
    """The line times probed around a window, as printed."""
    return "one CPU" if before is None or after is None else f"{before:.0f}-{after:.0f} ns"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds of each window")
    ap.add_argument("--top", type=int, default=20, help="functions to print")
    ap.add_argument("--capacity", type=int, default=100000)
    a = ap.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("profile_writers: no perf on PATH (Debian: apt-get install linux-perf)")
    rng = bench.np.random.default_rng(0)
    batch = bench.rows(bench.B, rng)
    t = gear.Table(name="profile", capacity=a.capacity, columns=bench.COLUMNS, sampler="uniform", remover="fifo",
                   packed=bench.PACKED)
    pool = None
    try:
        for _ in range(a.capacity // bench.B + 1):
            t.insert_batch(batch)
        t.wait_admitted(30)
        pool = bench.Pool(t.segment, "row")
        res = {}
        with tempfile.TemporaryDirectory() as d:
            for k in (1, 2):
                writers = [p.pid for p in pool.ps[:k]]
                data = os.path.join(d, f"w{k}.data")
                before = bench.line_ns()
                rate = record(data, writers + [os.getpid()], lambda: pool.window(k, a.seconds))
                frames, threads = top_frames(data, set(writers))
                rows = rate * a.seconds
                ns = {f: n * 1e9 / FREQ / rows for f, n in frames.items()}
                res[k] = (rate, ns, threads[os.getpid()] / FREQ / a.seconds, before, bench.line_ns())
    finally:
        if pool:
            pool.close()
        t.close()
    (r1, ns1, own1, b1, a1), (r2, ns2, own2, b2, a2) = res[1], res[2]
    print(f"one writer {r1:,.0f} rows/s (line {line(b1, a1)}), two {r2:,.0f} rows/s (line {line(b2, a2)}):"
          f" {r2 / r1:.2f}x; owner {own1:.2f} and {own2:.2f} cores")
    print(f"writers' main threads, ns of CPU a row: one {sum(ns1.values()):,.0f}, two {sum(ns2.values()):,.0f}")
    print(f"{'one':>8} {'two':>8} {'more':>8}  function (object)")
    for f in sorted(set(ns1) | set(ns2), key=lambda f: ns1.get(f, 0) - ns2.get(f, 0))[:a.top]:
        print(f"{ns1.get(f, 0):8.1f} {ns2.get(f, 0):8.1f} {ns2.get(f, 0) - ns1.get(f, 0):+8.1f}  {f[:100]}")


if __name__ == "__main__":
    main()
