"""The DQN example's actor: steps 16 numpy CartPoles with an epsilon-greedy
policy read from the learner's parameter service, and writes every transition
straight into the learner's gear table (a Writer on its shard), as NSTEP-step
transitions: reward the discounted sum of NSTEP rewards, discount
gamma^NSTEP (0 when the pole fell on the way)."""

import time

import numpy as np

from common import NPARAMS, PARAMS, STATUS, CartPole, gear, q_numpy

ENVS = 16
NSTEP = 1
GAMMA = 0.99


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
    steps, frames = 0, 0
    hist = [[] for _ in range(ENVS)]  # per environment: (obs, action) of the steps not yet written
    t0 = time.time()
    while True:
        eps = max(eps_floor, 1.0 - frames / 10000)
        obs = env.s
        a = q_numpy(theta.params, obs).argmax(1).astype(np.int32)
        explore = rng.random(ENVS) < eps
        a[explore] = rng.integers(0, 2, int(explore.sum()), dtype=np.int32)
        nxt, term, done, _ = env.step(a)
        out = []  # (obs, action, steps m, terminal, next_obs): an m-step transition
        for i in range(ENVS):
            hist[i].append((obs[i], a[i]))
            if done[i]:
                h = hist[i]
                out += [(o, act, len(h) - j, bool(term[i]), nxt[i]) for j, (o, act) in enumerate(h)]
                hist[i] = []
            elif len(hist[i]) == NSTEP:
                o, act = hist[i].pop(0)
                out.append((o, act, NSTEP, False, nxt[i]))
        frames += ENVS
        if out:
            m = np.array([t[2] for t in out])
            try:
                table.insert_batch({
                    "obs": np.stack([t[0] for t in out]), "action": np.array([t[1] for t in out], np.int32),
                    "reward": ((1 - GAMMA ** m) / (1 - GAMMA)).astype(np.float32),
                    "discount": np.where([t[3] for t in out], 0.0, GAMMA ** m).astype(np.float32),
                    "next_obs": np.stack([t[4] for t in out])}, priorities=1.0)
            except gear.Closed:
                break  # the learner is done and closed its table
        steps += 1
        if steps % 25 == 0:
            theta.read()
            if status.read() and status.params[0] > 0:
                break
    print(f"actor {world.role_rank}: {frames} frames in {time.time() - t0:.1f} s", flush=True)
    table.close()
    world.barrier(timeout=60)
    theta.close()
    status.close()
    world.close()


if __name__ == "__main__":
    main()
