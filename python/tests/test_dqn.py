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
