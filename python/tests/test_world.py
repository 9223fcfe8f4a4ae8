"""gear.init, the collectives on a world of one, and the parameter service."""

import os

import numpy as np
import pytest


@pytest.fixture
def world(gear):
    w = gear.init(timeout=30)
    yield w
    w.close()


def test_world_of_one(world):
    assert (world.rank, world.size, world.local_rank) == (0, 1, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_collectives(world, dtype, op):
    a = np.arange(5, dtype=dtype)
    assert world.allreduce(a, op) is a
    assert a.tolist() == list(range(5))
    world.broadcast(a, root=0)
    g = world.allgather(a)
    assert g.shape == (1, 5) and g[0].tolist() == list(range(5))
    world.barrier()


def test_collective_bad_input(gear, world):
    with pytest.raises(ValueError, match="dtype"):
        world.allreduce(np.zeros(3, np.int8))
    with pytest.raises(ValueError, match="contiguous"):
        world.allreduce(np.zeros((4, 4), np.float32)[:, 1])
    with pytest.raises(ValueError, match="op"):
        world.allreduce(np.zeros(3, np.float32), "prod")


def test_torch_tensor(world):
    torch = pytest.importorskip("torch")
    t = torch.ones(4)
    world.allreduce(t.numpy())
    assert t.tolist() == [1.0] * 4


def test_parameter_service(gear, world):
    pub = gear.Publisher(world, "pytest-theta", 3, timeout=30)
    rd = gear.Reader(world, "pytest-theta", timeout=30)
    assert rd.read() == 0
    pub.publish(1, np.array([1, 2, 3], np.float32))
    assert rd.read(min_version=1, timeout=10) == 1
    assert rd.params.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError):
        pub.publish(2, np.zeros(4, np.float32))
    rd.close()
    pub.close()
    with pytest.raises(gear.Closed):
        world.close()
        world.barrier()


def test_bad_root_leaves_the_world_working(gear, world):
    # A collective that fails fails the communicator: a root out of range is
    # refused before it starts.
    a = np.arange(3, dtype=np.float32)
    for root in (1, -1, 2**32, "0", True):
        with pytest.raises(gear.InvalidArgument, match="root"):
            world.broadcast(a, root=root)
    world.allreduce(a)
    world.barrier()
    assert a.tolist() == [0.0, 1.0, 2.0]


def test_parameter_service_misuse(gear, world):
    import glob
    import gc
    pub = gear.Publisher(world, "pytest-misuse", 2, timeout=30)
    rd = gear.Reader(world, "pytest-misuse", timeout=30)
    for v in (-1, 2**64 + 7, 1.5):
        with pytest.raises(gear.InvalidArgument, match="version"):
            pub.publish(v, np.zeros(2, np.float32))
        with pytest.raises(gear.InvalidArgument, match="min_version"):
            rd.read(min_version=v, timeout=0.1)
    pub.publish(7, np.ones(2, np.float32))
    assert rd.read(min_version=7, timeout=10) == 7
    rd.close()
    with pytest.raises(gear.Closed):
        rd.read()
    segs = glob.glob("/dev/shm/*pytest-misuse*")
    assert segs, "the service has no segment to look for"
    del pub  # dropped without close: its segment goes with it
    gc.collect()
    assert not [s for s in segs if os.path.exists(s)]
    for name, n in (("pytest-misuse-3", 0), ("", 2), ("a/b", 2), ("pytest-misuse-3", 2.5), (5, 2)):
        with pytest.raises(gear.InvalidArgument):
            gear.Publisher(world, name, n, timeout=5)
    with pytest.raises(gear.InvalidArgument):
        gear.Reader(world, "", timeout=5)
    pub = gear.Publisher(world, "pytest-misuse-2", 2, timeout=30)
    pub.close()
    with pytest.raises(gear.Closed):
        pub.publish(1, np.zeros(2, np.float32))


def test_timeouts_checked_before_anything_starts(gear, world, make_table):
    import math
    a = np.arange(4, dtype=np.float32)
    world.allreduce(a, timeout=math.inf)  # no limit
    for bad in (float("nan"), "1", [1]):
        with pytest.raises(gear.InvalidArgument, match="timeout"):
            world.allreduce(a, timeout=bad)
        with pytest.raises(gear.InvalidArgument, match="timeout"):
            world.barrier(timeout=bad)
    world.allreduce(a, timeout=-1)  # a deadline passed already: one try, which a world of one answers
    world.barrier(timeout=5)  # the world still works: nothing was started and left running
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]
    t = make_table()
    t.insert(x=[1, 1], key=1)
    t.wait_admitted(10)
    assert t.sample(1, timeout=math.inf).keys.tolist() == [1]
    with pytest.raises(gear.InvalidArgument, match="timeout"):
        t.sample(1, timeout=float("nan"))


def test_allgather_out_shape(gear, world):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    with pytest.raises(ValueError, match="out"):
        world.allgather(a, out=np.empty(6, np.int32))
    g = world.allgather(a, out=np.empty((1, 2, 3), np.int32))
    assert g.shape == (1, 2, 3) and g[0].tolist() == a.tolist()


def test_init_twice_gives_the_same_world(gear, world):
    assert gear.init(timeout=30) is world
    world.close()
    w2 = gear.init(timeout=30)  # alone: a new world of one
    try:
        assert w2 is not world and w2.size == 1
        a = np.ones(2, np.float32)
        w2.allreduce(a)
        assert a.tolist() == [1.0, 1.0]
    finally:
        w2.close()
