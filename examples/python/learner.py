"""The DQN example's learner (PyTorch): Double DQN with prioritized replay on
CartPole-v1. It owns the gear table of the job spec's [table], which the
actors (other processes) fill; it samples batches, learns, updates the
priorities, publishes its network through the parameter service, and every
so often plays 100 greedy episodes: it stops when their mean return reaches
475."""

import os
import sys
import time

import numpy as np
import torch
from torch import nn

from common import HIDDEN, NPARAMS, PARAMS, STATUS, CartPole, blas_warning, gear

BATCH = 128
TAU = 0.01


def net():
    return nn.Sequential(nn.Linear(4, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def evaluate(model, episodes=100):
    """Mean return of episodes greedy episodes, played together."""
    env = CartPole(episodes, np.random.default_rng(12345))
    returns, alive = np.zeros(episodes), np.ones(episodes, bool)
    with torch.no_grad():
        for _ in range(500):
            a = model(torch.from_numpy(env.s)).argmax(1).numpy()
            _, _, done, _ = env.step(a)
            returns += alive
            alive &= ~done
            if not alive.any():
                break
    return returns.mean()


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    world = gear.init(timeout=60)
    warn = blas_warning()
    if warn:
        print(f"learner: {warn}", file=sys.stderr, flush=True)
    spec = os.environ.get("GEAR_JOB_SPEC") or os.path.join(os.path.dirname(__file__), "..", "jobs", "dqn-torch.toml")
    table = gear.Table(spec, segment=gear.segment_name("table.replay.0"), seed=1)
    online, target = net(), net()
    target.load_state_dict(online.state_dict())
    opt = torch.optim.Adam(online.parameters(), lr=1e-3)
    theta = gear.Publisher(world, PARAMS, NPARAMS)
    status = gear.Publisher(world, STATUS, 1)
    version = 1
    theta.publish(version, flat(online))
    status.publish(1, np.zeros(1, np.float32))
    t0 = time.time()
    buf, updates, score = None, 0, 0.0
    while True:
        buf = table.sample(BATCH, timeout=60, out=buf)
        d = buf.data
        obs, nxt = torch.from_numpy(d["obs"]), torch.from_numpy(d["next_obs"])
        act = torch.from_numpy(d["action"].astype(np.int64))
        rew, disc = torch.from_numpy(d["reward"]), torch.from_numpy(d["discount"])
        beta = min(1.0, 0.4 + updates / 20000)
        w = torch.from_numpy(buf.probabilities ** -beta).float()
        w = w / w.max()
        with torch.no_grad():
            a2 = online(nxt).argmax(1, keepdim=True)
            y = rew + disc * target(nxt).gather(1, a2).squeeze(1)
        q = online(obs).gather(1, act.unsqueeze(1)).squeeze(1)
        td = y - q
        loss = (w * nn.functional.smooth_l1_loss(q, y, reduction="none")).mean()
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(online.parameters(), 10.0)
        opt.step()
        table.update_priorities(buf.keys, td.detach().abs().numpy() + 1e-3)
        updates += 1
        with torch.no_grad():  # a soft target update (Polyak averaging)
            for p, tp in zip(online.parameters(), target.parameters()):
                tp.mul_(1 - TAU).add_(p, alpha=TAU)
        if updates % 20 == 0:
            version += 1
            theta.publish(version, flat(online))
        # Greedy evaluation is cheap (tens of ms): look often, more often once
        # near the target, and stop at the first policy that solves.
        if updates % (20 if score >= 400 else 100) == 0:
            score = evaluate(online)
            info = table.info()
            print(f"updates {updates} frames {info['inserts']} table {info['size']} "
                  f"greedy mean return over 100 episodes {score:.1f} ({time.time() - t0:.0f} s)", flush=True)
            if score >= 475:
                break
    status.publish(2, np.ones(1, np.float32))
    print(f"solved: mean return {score:.1f} over 100 episodes after {updates} updates, "
          f"{table.info()['inserts']} frames, {time.time() - t0:.1f} s", flush=True)
    table.close()  # the actors' inserts now fail with gear.Closed: their cue to stop
    world.barrier(timeout=60)
    theta.close()
    status.close()
    world.close()


if __name__ == "__main__":
    main()
