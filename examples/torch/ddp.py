"""A few steps of DistributedDataParallel training, under gearrun.

    gearrun -np 3 examples/torch/python examples/torch/ddp.py
    gearrun run examples/jobs/torch-ddp.toml

Every rank builds the same small regression model from a different seed, so
that only DDP (which broadcasts rank 0's parameters when it wraps the model,
then averages the gradients of every step) can make them agree. Each rank
trains on its own batches, then the ranks gather each other's parameters and
check that they are equal to the last bit. Each rank prints its loss before and
after, and a digest of its parameters; the exit status is 0 only when every
rank ends with the same parameters.
"""

import argparse
import datetime
import hashlib
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()

    dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(1000 + rank)  # a different initial model on every rank
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    # The task: y = x . w for a fixed w; each rank draws its own batches.
    w = torch.linspace(-1, 1, 8)
    gen = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(args.steps):
        x = torch.randn(args.batch, 8, generator=gen)
        y = (x @ w).unsqueeze(1)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())

    flat = torch.cat([q.detach().reshape(-1) for q in model.module.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    agree = all(torch.equal(flat, other) for other in everyone)
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
    print(f"ddp: rank {rank} of {world}: {args.steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f},"
          f" {flat.numel()} parameters, digest {digest}: {'agree' if agree else 'DIFFER'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0 if agree else 1)


if __name__ == "__main__":
    main()
