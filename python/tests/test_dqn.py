"""The PyTorch DQN example (examples/jobs/dqn-torch.toml) solves CartPole
under gearrun. It takes minutes, so it runs when GEAR_DQN=1 or under
GEAR_REQUIRE_PYTHON=1 (CI), and skips otherwise."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def test_dqn_example_solves(tmp_path):
    if os.environ.get("GEAR_DQN") != "1" and os.environ.get("GEAR_REQUIRE_PYTHON") != "1":
        pytest.skip("the DQN example runs with GEAR_DQN=1 (or GEAR_REQUIRE_PYTHON=1)")
    pytest.importorskip("torch")
    go = shutil.which("go")
    if go is None:
        pytest.skip("no go on PATH to build gearrun")
    gearrun = tmp_path / "gearrun"
    subprocess.run([go, "build", "-o", str(gearrun), "./cmd/gearrun"], cwd=ROOT, check=True, timeout=900)
    env = dict(os.environ, GEAR_PYTHON=sys.executable)
    p = subprocess.run([str(gearrun), "run", "examples/jobs/dqn-torch.toml"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    solved = [ln for ln in p.stdout.splitlines() if "solved: mean return" in ln]
    assert solved, p.stdout[-4000:]
    score = float(solved[-1].split("mean return ")[1].split()[0])
    assert score >= 475


def test_blas_warning(tmp_path):
    """The learner warns when numpy and torch multiply with Debian's reference
    BLAS (about 20 times slower than OpenBLAS at the example's sizes), and only
    then."""
    sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
    try:
        from common import blas_warning
    finally:
        sys.path.pop(0)
    line = "7f0000000000-7f0000001000 r-xp 00000000 08:01 123 {}\n"
    ref = tmp_path / "ref"
    ref.write_text(line.format("/usr/lib/x86_64-linux-gnu/libc.so.6") +
                   line.format("/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0") + "7f0000002000-7f0000003000 rw-p 0 0 0\n")
    warn = blas_warning(str(ref))
    assert warn is not None and "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0" in warn and "libopenblas0" in warn
    fast = tmp_path / "openblas"
    fast.write_text(line.format("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3") +
                    line.format("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so"))
    assert blas_warning(str(fast)) is None
    assert blas_warning(str(tmp_path / "missing")) is None
