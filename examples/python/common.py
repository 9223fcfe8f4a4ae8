"""What the DQN example's learner and actors share: a vectorized numpy
CartPole-v1, the Q-network's layout as one flat float32 vector, finding
the gear package (installed, or this checkout's python/), and a check of the
BLAS that numpy and torch multiply with."""

import os
import sys

import numpy as np

try:
    import gear  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import gear  # noqa: F401

HIDDEN = 64
SIZES = [(HIDDEN, 4), (HIDDEN,), (HIDDEN, HIDDEN), (HIDDEN,), (2, HIDDEN), (2,)]
NPARAMS = sum(int(np.prod(s)) for s in SIZES)
PARAMS = "dqn-theta"   # parameter service: the online network
STATUS = "dqn-status"  # parameter service: [stop]

# Debian's reference BLAS (libblas3, what python3-numpy and python3-torch pull
# in alone): a 128x64 by 64x64 product took 429 us through torch and 222 us
# through numpy, against 19 us with OpenBLAS (docs/python.md).
REFERENCE_BLAS = "/blas/libblas.so.3"  # its file, libblas.so.3.x.y, in a directory named blas


def blas_warning(maps="/proc/self/maps"):
    """A line to print when this process multiplies matrices with the
    reference BLAS (maps: the process's memory map), else None. numpy and
    torch (Debian's builds) call whatever libblas.so.3 the system's
    alternatives name; the reference one is about 20 times slower than an
    optimized one at the example's sizes."""
    try:
        with open(maps) as f:
            ref = sorted({ln.split()[-1] for ln in f if REFERENCE_BLAS in ln})
    except OSError:
        return None
    if ref:
        return (f"warning: numpy and torch multiply with the reference BLAS ({ref[0]}), "
                "about 20 times slower than OpenBLAS at these sizes: apt-get install libopenblas0")
    return None


class CartPole:
    """n CartPole-v1 environments stepped together (gym's dynamics; an
    episode ends when the pole falls or the cart leaves, or is truncated at
    500 steps)."""

    def __init__(self, n, rng):
        self.n, self.rng = n, rng
        self.s = rng.uniform(-0.05, 0.05, (n, 4)).astype(np.float32)
        self.t = np.zeros(n, np.int64)
        self.ret = np.zeros(n, np.float64)

    def step(self, a):
        x, xd, th, thd = self.s.T.astype(np.float64)
        force = np.where(a == 1, 10.0, -10.0)
        c, s = np.cos(th), np.sin(th)
        temp = (force + 0.05 * thd * thd * s) / 1.1
        tha = (9.8 * s - c * temp) / (0.5 * (4.0 / 3.0 - 0.1 * c * c / 1.1))
        xa = temp - 0.05 * tha * c / 1.1
        x, xd = x + 0.02 * xd, xd + 0.02 * xa
        th, thd = th + 0.02 * thd, thd + 0.02 * tha
        nxt = np.stack([x, xd, th, thd], 1).astype(np.float32)
        self.t += 1
        self.ret += 1.0
        term = (np.abs(x) > 2.4) | (np.abs(th) > 12 * 2 * np.pi / 360)
        done = term | (self.t >= 500)
        finished = self.ret[done].copy()
        self.s = nxt.copy()
        k = int(done.sum())
        if k:
            self.s[done] = self.rng.uniform(-0.05, 0.05, (k, 4)).astype(np.float32)
            self.t[done] = 0
            self.ret[done] = 0.0
        return nxt, term, done, finished


def unflatten(theta):
    out, i = [], 0
    for s in SIZES:
        n = int(np.prod(s))
        out.append(theta[i:i + n].reshape(s))
        i += n
    return out


def q_numpy(theta, obs):
    w1, b1, w2, b2, w3, b3 = unflatten(theta)
    h = np.maximum(obs @ w1.T + b1, 0)
    h = np.maximum(h @ w2.T + b2, 0)
    return h @ w3.T + b3
