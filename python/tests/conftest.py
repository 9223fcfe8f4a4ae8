"""Fixtures for gear's Python tests. With GEAR_REQUIRE_PYTHON=1 (set by
.ci/run) a skipped test is a failure."""

import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and os.environ.get("GEAR_REQUIRE_PYTHON") == "1":
        rep.outcome = "failed"
        rep.longrepr = f"GEAR_REQUIRE_PYTHON=1 but the test was skipped: {rep.longrepr}"


@pytest.fixture
def gear():
    np = pytest.importorskip("numpy")  # noqa: F841
    import gear as g
    return g


@pytest.fixture
def make_table(gear):
    """make_table(**table) builds a table on a fresh segment; all are closed
    at the end of the test."""
    made = []

    def make(columns=None, capacity=16, **kw):
        cols = columns or [{"name": "x", "dtype": "float32", "shape": [2]}]
        seg = f"gear.pytest-{uuid.uuid4().hex[:12]}.table"
        t = gear.Table(name="t", columns=cols, capacity=capacity, segment=seg, seed=kw.pop("seed", 1), **kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()
