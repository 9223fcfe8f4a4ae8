"""The DQN example's actor: steps 16 numpy CartPoles with an epsilon-greedy
policy read from the learner's parameter service, and writes every transition
straight into the learner's gear table (a Writer on its shard)."""

import time

import numpy as np

from common import NPARAMS, PARAMS, STATUS, CartPole, gear, q_numpy

ENVS = 16


def main():
    world = gear.init(timeout=60)
    theta = gear.Reader(world, PARAMS, timeout=60)
    status = gear.Reader(world, STATUS, timeout=60)
    theta.read(min_version=1, timeout=60)
    table = gear.Writer(gear.segment_name("table.replay.0"), timeout=60)
    rng = np.random.default_rng(1000 + world.rank)
    env = CartPole(ENVS, rng)
    # Each actor explores with its own epsilon range (Ape-X style).
    eps_floor = [0.01, 0.05][world.role_rank % 2]
    steps = 0
    t0 = time.time()
    while True:
        eps = max(eps_floor, 1.0 - steps * ENVS / 20000)
        obs = env.s
        a = q_numpy(theta.params, obs).argmax(1).astype(np.int32)
        explore = rng.random(ENVS) < eps
        a[explore] = rng.integers(0, 2, int(explore.sum()), dtype=np.int32)
        nxt, term, done, _ = env.step(a)
        table.insert_batch({"obs": obs, "action": a, "reward": np.ones(ENVS, np.float32),
                            "discount": np.where(term, 0.0, 0.99).astype(np.float32), "next_obs": nxt},
                           priorities=1.0)
        steps += 1
        if steps % 50 == 0:
            theta.read()
            if status.read() and status.params[0] > 0:
                break
    print(f"actor {world.role_rank}: {steps * ENVS} frames in {time.time() - t0:.1f} s", flush=True)
    table.close()
    theta.close()
    status.close()
    world.close()


if __name__ == "__main__":
    main()
