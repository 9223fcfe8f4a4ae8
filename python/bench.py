"""gear's Python benchmark: rows/s of a gear table against a plain numpy ring
buffer in the same process (the floor), and of two writer processes against
one, beside two processes that share nothing, each with its own numpy ring
(the peer of that ratio). Rows are 400 B (obs: 96 float32, action, reward,
discount, flags).

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


def writer_proc(segment, seconds, start_at, mode):
    """A writer process: insert rows into segment until seconds pass, in
    batches of B (mode "batch") or one a call (mode "row", as an actor
    inserts each step); mode "ring" inserts a row a call into a numpy ring
    of its own instead, without gear (the peer: what two processes that
    share nothing reach on this machine)."""
    rng = np.random.default_rng(os.getpid())
    w = Ring(100000) if mode == "ring" else gear.Writer(segment)
    data = rows(B, rng)
    one = {k: v[0] for k, v in data.items()}
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
    if mode != "ring":
        w.close()


# CPU seconds per second of the last writers() run: the writers' (summed) and
# the owner's (this process: the table's admission of their rows).
cpu = {}


def writers(segment, k, seconds, mode="batch"):
    """Rows/s of k writer processes together."""
    start_at = time.time() + 1.5
    ps = [subprocess.Popen([sys.executable, __file__, "--writer", segment, str(seconds), str(start_at), mode],
                           stdout=subprocess.PIPE, text=True) for _ in range(k)]
    while time.time() < start_at:
        time.sleep(0.001)
    c0, t0 = time.process_time(), time.perf_counter()
    out = [p.communicate()[0].strip().splitlines()[-1].split() for p in ps]
    cpu[k] = (sum(float(o[1]) for o in out), (time.process_time() - c0) / (time.perf_counter() - t0))
    return sum(float(o[0]) for o in out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--capacity", type=int, default=100000)
    ap.add_argument("--writer-capacity", type=int, default=1000000,
                    help="rows of the fresh tables the writer processes fill (400 B each)")
    ap.add_argument("--writer", nargs=4)
    a = ap.parse_args()
    if a.writer:
        writer_proc(a.writer[0], float(a.writer[1]), float(a.writer[2]), a.writer[3])
        return
    rng = np.random.default_rng(0)
    one = {k: v[0] for k, v in rows(1, rng).items()}
    batch = rows(B, rng)

    def full_table(name):
        """A uniform, FIFO table of the capacity, filled with batch."""
        f = gear.Table(name=name, capacity=a.capacity, columns=COLUMNS, sampler="uniform", remover="fifo",
                       extra_rows=4096)
        for _ in range(a.capacity // B + 1):
            f.insert_batch(batch)
        f.wait_admitted(30)
        return f

    t = full_table("bench")
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

    room = gear.Table(name="room", capacity=a.writer_capacity, columns=COLUMNS, extra_rows=4096)

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
    print(f"rows of {ROW_BYTES} B, table capacity {a.capacity}, median of {a.repeats} runs of {a.seconds} s")
    print(f"{'case':34} {'gear rows/s':>14} {'numpy ring rows/s':>18} {'gear/numpy':>11}")
    for name, g, r in cases:
        gs, rs = [], []
        for _ in range(a.repeats):  # in alternation, so that both see the same load
            gs.append(timed(g, a.seconds))
            rs.append(timed(r, a.seconds))
        gs, rs = statistics.median(gs), statistics.median(rs)
        print(f"{name:34} {gs:14,.0f} {rs:18,.0f} {gs / rs:11.2f}", flush=True)
    room.close()
    one_w, two_w = pairs(lambda k: writers(t.segment, k, a.seconds), a.repeats)
    print(f"{'writer processes, full table':34} one {one_w:,.0f} rows/s, two {two_w:,.0f} rows/s: {two_w / one_w:.2f}x")
    print_cpu()
    t.close()

    def fresh(k, mode="batch"):
        """k writers into a fresh table with room for every row they write."""
        f = gear.Table(name="fresh", capacity=a.writer_capacity, columns=COLUMNS, extra_rows=4096)
        try:
            return writers(f.segment, k, a.seconds, mode)
        finally:
            f.close()
    one_f, two_f = pairs(fresh, a.repeats)
    print(f"{'writer processes, table with room':34} one {one_f:,.0f} rows/s, two {two_f:,.0f} rows/s: {two_f / one_f:.2f}x")
    print_cpu()
    # Actors insert a row a step: each writer's own Python then costs more
    # than the owner's admission of its rows, which the batches above do not.
    full = full_table("rowwise")
    try:
        one_r, two_r = pairs(lambda k: writers(full.segment, k, a.seconds, "row"), a.repeats)
    finally:
        full.close()
    print(f"{'writer processes, one row a call':34} one {one_r:,.0f} rows/s, two {two_r:,.0f} rows/s: {two_r / one_r:.2f}x")
    print_cpu()
    # The peer: processes that share nothing, each inserting a row a call
    # into its own numpy ring. Where two such reach less than twice one, the
    # machine itself (its cores' shared caches and clocks, a virtual
    # machine's neighbours) sets the ceiling of the writers' ratio above.
    one_p, two_p = pairs(lambda k: writers("-", k, a.seconds, "ring"), a.repeats)
    print(f"{'  peer: numpy ring processes':34} one {one_p:,.0f} rows/s, two {two_p:,.0f} rows/s: {two_p / one_p:.2f}x"
          f" (gear's row writers: {(two_r / one_r) / (two_p / one_p):.2f} of the peer's ratio)")


def print_cpu():
    """The last run's CPU use, in cores: writers and owner, one and two writers."""
    print(f"{'  CPU (cores), last run':34} " + ", ".join(
        f"{k} writer{'s' * (k > 1)} {w:.2f} + owner {o:.2f} (of {os.cpu_count()})" for k, (w, o) in sorted(cpu.items())))


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
