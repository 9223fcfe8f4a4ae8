"""gear's Python benchmark: rows/s of a gear table against a plain numpy ring
buffer in the same process (the floor), and of two writer processes against
one, beside two processes that share nothing, each with its own numpy ring
(the peer of that ratio). Rows are 400 B (obs: 96 float32, action, reward,
discount, flags), in tables with packed columns (PACKED: the four scalars
take 4 bytes a row each, not 64).

    make python && /usr/bin/python3 python/bench.py [--seconds 2]

Each figure is the median of --repeats timed runs; ratios are gear / numpy.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gear  # noqa: E402

COLUMNS = [
    {"name": "obs", "dtype": "float32", "shape": [96]},
    {"name": "action", "dtype": "int32"},
    {"name": "reward", "dtype": "float32"},
    {"name": "discount", "dtype": "float32"},
    {"name": "flags", "dtype": "int32"},
]
ROW_BYTES = 400
B = 256
PACKED = True  # what a table of scalar columns should ask for: docs/python.md


def rows(n, rng):
    return {"obs": rng.standard_normal((n, 96), dtype=np.float32), "action": rng.integers(0, 4, n, dtype=np.int32),
            "reward": rng.standard_normal(n, dtype=np.float32), "discount": np.full(n, 0.99, np.float32),
            "flags": np.zeros(n, np.int32)}


class Ring:
    """The floor: a numpy ring buffer of the same columns."""

    def __init__(self, cap):
        self.cap, self.n, self.i = cap, 0, 0
        self.cols = {"obs": np.zeros((cap, 96), np.float32), "action": np.zeros(cap, np.int32),
                     "reward": np.zeros(cap, np.float32), "discount": np.zeros(cap, np.float32),
                     "flags": np.zeros(cap, np.int32)}
        self.prio = np.zeros(cap)

    def insert(self, priority=1.0, **row):
        i = self.i
        for k, v in row.items():
            self.cols[k][i] = v
        self.prio[i] = priority
        self.i = (i + 1) % self.cap
        self.n = min(self.n + 1, self.cap)

    def insert_batch(self, cols, priority=1.0):
        n = len(cols["obs"])
        idx = (self.i + np.arange(n)) % self.cap
        for k, v in cols.items():
            self.cols[k][idx] = v
        self.prio[idx] = priority
        self.i = (self.i + n) % self.cap
        self.n = min(self.n + n, self.cap)

    def sample(self, n, rng):
        idx = rng.integers(0, self.n, n)
        return idx, {k: v[idx] for k, v in self.cols.items()}


def timed(f, seconds):
    """Calls f (which returns rows done) for about seconds; returns rows/s."""
    done, t0 = 0, time.perf_counter()
    while True:
        done += f()
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return done / dt


def writer_proc(segment, mode, seconds=None, start_at=None):
    """A writer process: insert rows into segment in batches of B (mode
    "batch") or one a call (mode "row", as an actor inserts each step); mode
    "ring" inserts a row a call into a numpy ring of its own instead, without
    gear (the peer: what two processes that share nothing reach on this
    machine). With seconds and start_at it writes one window from start_at
    on; without, it serves windows: it prints "ready", then reads
    "start_at seconds" lines from stdin, one window each, until stdin ends.
    Each window prints its rows/s and the CPU (cores) the process used."""
    rng = np.random.default_rng(os.getpid())
    w = Ring(100000) if mode == "ring" else gear.Writer(segment)
    data = rows(B, rng)
    one = {k: v[0] for k, v in data.items()}

    def window(start_at, seconds):
        while time.time() < start_at:
            time.sleep(0.001)
        done, t0, c0 = 0, time.perf_counter(), time.process_time()
        if mode in ("row", "ring"):
            while time.perf_counter() - t0 < seconds:
                for _ in range(100):
                    w.insert(1.0, **one)
                done += 100
        else:
            while time.perf_counter() - t0 < seconds:
                done += w.insert_batch(data, 1.0)
        dt = time.perf_counter() - t0
        print(done / dt, (time.process_time() - c0) / dt, flush=True)

    if seconds is not None:
        window(start_at, seconds)
    else:
        print("ready", flush=True)
        for line in sys.stdin:
            window(*map(float, line.split()))
    if mode != "ring":
        w.close()


# CPU seconds per second of the last writers() run or Pool window: the
# writers' (summed) and the owner's (this process: the table's admission of
# their rows).
cpu = {}


def writers(segment, k, seconds, mode="batch"):
    """Rows/s of k writer processes together, started for one window."""
    start_at = time.time() + 1.5
    ps = [subprocess.Popen([sys.executable, __file__, "--writer", segment, mode, str(seconds), str(start_at)],
                           stdout=subprocess.PIPE, text=True) for _ in range(k)]
    while time.time() < start_at:
        time.sleep(0.001)
    c0, t0 = time.process_time(), time.perf_counter()
    return tally(k, [p.communicate()[0].strip().splitlines()[-1].split() for p in ps], c0, t0)


def tally(k, out, c0, t0):
    """The rows/s of k writers' window from their lines out ("rows/s cores"),
    recording in cpu[k] their cores and this process's since c0, t0."""
    cpu[k] = (sum(float(o[1]) for o in out), (time.process_time() - c0) / (time.perf_counter() - t0))
    return sum(float(o[0]) for o in out)


class Pool:
    """Two writer processes kept for many short windows, so that windows of
    one writer and of two can alternate a fraction of a second apart: this
    machine's speed moves by tens of percent over seconds (the numpy ring's
    own insert rate, from one run to the next), and a pair of windows a few
    seconds apart measures that drift as much as the writers' ratio."""

    def __init__(self, segment, mode):
        self.ps = [subprocess.Popen([sys.executable, __file__, "--writer", segment, mode], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True) for _ in range(2)]
        for p in self.ps:
            self._line(p, "ready")

    def _line(self, p, want=None):
        """The next line of writer process p; a writer that ends (its error
        is on stderr) or answers otherwise ends the bench."""
        line = p.stdout.readline()
        if not line or (want and line.strip() != want):
            self.close()
            raise RuntimeError(f"bench: writer process {p.pid} ended (exit status {p.poll()}) or answered {line!r}")
        return line

    def window(self, k, seconds):
        """Rows/s of the first k writers together in one window."""
        start_at = time.time() + 0.02
        for p in self.ps[:k]:
            p.stdin.write(f"{start_at} {seconds}\n")
            p.stdin.flush()
        while time.time() < start_at:
            time.sleep(0.001)
        c0, t0 = time.process_time(), time.perf_counter()
        return tally(k, [self._line(p).split() for p in self.ps[:k]], c0, t0)

    def close(self):
        for p in self.ps:
            if not p.stdin.closed:
                p.stdin.close()
        for p in self.ps:
            p.wait()


def interleaved(pools, windows, seconds):
    """For each pool: the medians of its one- and two-writer windows, the
    median of the ratios of its adjacent pairs, the CPU of its last pair
    (print_cpu), and each pair's ratio with the line times (line_ns) probed
    just before and just after it. The windows run one, two, one, two, ...,
    pool after pool within each round."""
    res = [([], [], {}, []) for _ in pools]
    for _ in range(windows):
        for pool, (ones, twos, c, lines) in zip(pools, res):
            before = line_ns()
            ones.append(pool.window(1, seconds))
            twos.append(pool.window(2, seconds))
            lines.append((twos[-1] / ones[-1], before, line_ns()))
            c.update(cpu)
    return [(statistics.median(o), statistics.median(t), statistics.median(b / a for a, b in zip(o, t)), c, lines)
            for o, t, c, lines in res]


def line_ns():
    """How long one cache line takes between this process's first two CPUs,
    in ns (None where it may run on one only). The writers and the owner meet
    on a few such lines per row, so the writers' ratio follows it; on a
    virtual machine it changes with where the host puts the virtual CPUs,
    sometimes from one minute to the next (docs/benchmarks.md)."""
    try:
        return gear._lib.line_latency_ns(20000)
    except gear.InvalidArgument:
        return None


def by_line(lines):
    """The pairs' ratios grouped by the line time around them: the probes
    (ns) sorted and split where one exceeds the one before by half; a pair
    whose two probes fall in different groups straddled a change and is left
    out. Returns [(lo ns, hi ns, median ratio, pairs)], and the pairs left out."""
    groups = []
    for v in sorted(v for _, b, a in lines for v in (b, a) if v is not None):
        if groups and v <= groups[-1][1] * 1.5:
            groups[-1][1] = v
        else:
            groups.append([v, v])

    def group(v):
        return next((i for i, (lo, hi) in enumerate(groups) if v is not None and lo <= v <= hi), None)

    ratios = [[] for _ in groups]
    straddled = 0
    for r, b, a in lines:
        g = group(b)
        if g is None or g != group(a):
            straddled += 1
        else:
            ratios[g].append(r)
    return [(lo, hi, statistics.median(rs), len(rs)) for (lo, hi), rs in zip(groups, ratios) if rs], straddled


def print_by_line(lines):
    """The line of by_line's groups, under a writers' ratio."""
    groups, straddled = by_line(lines)
    parts = [f"{lo:.0f}-{hi:.0f} ns: {r:.2f}x ({n} pair{'s' * (n > 1)})" for lo, hi, r, n in groups]
    if straddled:
        parts.append(f"{straddled} pair{'s' * (straddled > 1)} across a change")
    print(f"{'    by line time between CPUs':34} " + ("; ".join(parts) or "not measured (one CPU)"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--capacity", type=int, default=100000)
    ap.add_argument("--extra-rows", type=int, default=None,
                    help="each table's extra_rows: the rows writers take while the owner's next look is due"
                         " (default: the library's)")
    ap.add_argument("--writer-capacity", type=int, default=1000000,
                    help="rows of the fresh tables the writer processes fill (400 B each)")
    ap.add_argument("--windows", type=int, default=12,
                    help="pairs of windows (one writer process, two) for each writers' ratio on the full table")
    ap.add_argument("--window", type=float, default=0.3, help="seconds of one such window")
    ap.add_argument("--only", choices=["row-writers"],
                    help="measure one thing only: row-writers, the ratio of two writer processes inserting a row a"
                         " call into the full table to one, beside the peer's (the quick check of a build)")
    ap.add_argument("--writer", nargs="+", help=argparse.SUPPRESS)  # a writer process: segment mode [seconds start_at]
    a = ap.parse_args()
    if a.writer:
        writer_proc(a.writer[0], a.writer[1], *map(float, a.writer[2:]))
        return
    rng = np.random.default_rng(0)
    one = {k: v[0] for k, v in rows(1, rng).items()}
    batch = rows(B, rng)

    def full_table(name):
        """A uniform, FIFO table of the capacity, filled with batch."""
        f = gear.Table(name=name, capacity=a.capacity, columns=COLUMNS, sampler="uniform", remover="fifo",
                       extra_rows=a.extra_rows, packed=PACKED)
        for _ in range(a.capacity // B + 1):
            f.insert_batch(batch)
        f.wait_admitted(30)
        return f

    t = full_table("bench")
    if a.only == "row-writers":
        try:
            row_writers(t, a)
        finally:
            t.close()
        return
    ring = Ring(a.capacity)
    for _ in range(a.capacity // B + 1):
        ring.insert_batch(batch)
    srng = np.random.default_rng(1)

    buf = [None]

    def gear_sample():
        buf[0] = t.sample(B, out=buf[0])  # the training loop's path: the same arrays refilled
        return len(buf[0].keys)

    def gear_sample_new():
        return len(t.sample(B).keys)

    def ring_sample():
        return len(ring.sample(B, srng)[0])

    room = gear.Table(name="room", capacity=a.writer_capacity, columns=COLUMNS, extra_rows=a.extra_rows, packed=PACKED)

    def room_insert():
        if room.info()["size"] > a.writer_capacity - 400000:
            room.reset()
        for _ in range(1000):
            room.insert(1.0, **one)
        return 1000

    cases = [
        ("insert, one row a call, full table", lambda: (t.insert(1.0, **one), 1)[1],
         lambda: (ring.insert(1.0, **one), 1)[1]),
        ("  into a table with room", room_insert, lambda: (ring.insert(1.0, **one), 1)[1]),
        (f"insert_batch, {B} rows a call", lambda: t.insert_batch(batch), lambda: (ring.insert_batch(batch), B)[1]),
        (f"sample+collect, batches of {B}", gear_sample, ring_sample),
        ("  the same, new arrays each call", gear_sample_new, ring_sample),
    ]
    print(f"rows of {ROW_BYTES} B, table capacity {a.capacity}{', packed' if PACKED else ''},"
          f" median of {a.repeats} runs of {a.seconds} s")
    print(f"{'case':34} {'gear rows/s':>14} {'numpy ring rows/s':>18} {'gear/numpy':>11}")
    for name, g, r in cases:
        gs, rs = [], []
        for _ in range(a.repeats):  # in alternation, so that both see the same load
            gs.append(timed(g, a.seconds))
            rs.append(timed(r, a.seconds))
        gs, rs = statistics.median(gs), statistics.median(rs)
        print(f"{name:34} {gs:14,.0f} {rs:18,.0f} {gs / rs:11.2f}", flush=True)
    room.close()
    # Two writers against one on the full table, in batches and a row a call
    # (as an actor inserts each step: each writer's own Python then costs
    # more than the owner's admission of its rows, which the batches do not),
    # and the peer: processes that share nothing, each inserting a row a call
    # into its own numpy ring. Where two such reach less than twice one, the
    # machine itself (its cores' shared caches and clocks, a virtual
    # machine's neighbours) sets the ceiling of the writers' ratio.
    (one_w, two_w, rw, cpu_w, lines_w), row, peer = pooled(a, ((t.segment, "batch"), (t.segment, "row"), ("-", "ring")))
    print(f"{'writer processes, full table':34} one {one_w:,.0f} rows/s, two {two_w:,.0f} rows/s: {rw:.2f}x")
    print_by_line(lines_w)
    print_cpu(cpu_w)

    def fresh(k, mode="batch"):
        """k writers into a fresh table with room for every row they write."""
        f = gear.Table(name="fresh", capacity=a.writer_capacity, columns=COLUMNS, extra_rows=a.extra_rows, packed=PACKED)
        try:
            return writers(f.segment, k, a.seconds, mode)
        finally:
            f.close()
    one_f, two_f = pairs(fresh, a.repeats)
    print(f"{'writer processes, table with room':34} one {one_f:,.0f} rows/s, two {two_f:,.0f} rows/s: {two_f / one_f:.2f}x")
    print_cpu()
    print_row_writers(row, peer)


def pooled(a, kinds):
    """interleaved() over a Pool of each (segment, mode) of kinds, closed
    after, under the line that says how the windows ran."""
    pools = []
    try:
        for segment, mode in kinds:
            pools.append(Pool(segment, mode))
        res = interleaved(pools, a.windows, a.window)
    finally:
        for pool in pools:
            pool.close()
    print(f"{a.windows} pairs of {a.window} s windows alternating one writer process and two, medians;"
          " ratio: median of the pairs' ratios; line time: one cache line passed between two CPUs, probed"
          " before and after each pair")
    return res


def print_row_writers(row, peer):
    """The lines of the row writers and of their peer (interleaved()'s
    results for each)."""
    (one_r, two_r, rr, cpu_r, lines_r), (one_p, two_p, rp, _, lines_p) = row, peer
    print(f"{'writer processes, one row a call':34} one {one_r:,.0f} rows/s, two {two_r:,.0f} rows/s: {rr:.2f}x")
    print_by_line(lines_r)
    print_cpu(cpu_r)
    print(f"{'  peer: numpy ring processes':34} one {one_p:,.0f} rows/s, two {two_p:,.0f} rows/s: {rp:.2f}x"
          f" (gear's row writers: {rr / rp:.2f} of the peer's ratio)")
    print_by_line(lines_p)


def row_writers(t, a):
    """The row writers' ratio and the peer's alone (--only row-writers)."""
    print_row_writers(*pooled(a, ((t.segment, "row"), ("-", "ring"))))


def print_cpu(c=None):
    """CPU use in cores, writers and owner, of one writer and of two: c, or
    the last run's."""
    print(f"{'  CPU (cores), last run':34} " + ", ".join(
        f"{k} writer{'s' * (k > 1)} {w:.2f} + owner {o:.2f} (of {os.cpu_count()})"
        for k, (w, o) in sorted((c or cpu).items())))


def pairs(run, repeats):
    """Medians of run(1) and run(2) (rows/s of one and two writer
    processes), measured in alternation so that both see the same load."""
    ones, twos = [], []
    for _ in range(repeats):
        ones.append(run(1))
        twos.append(run(2))
    return statistics.median(ones), statistics.median(twos)


if __name__ == "__main__":
    main()
