"""An allreduce and a barrier with torch.distributed, under gearrun.

    gearrun -np 3 examples/torch/python examples/torch/allreduce.py
    gearrun -np 1 --bind gpu examples/torch/python examples/torch/allreduce.py --backend nccl

gearrun gives every rank torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT, ...), so init_process_group() runs with its default
env:// init, exactly as under torchrun. Each rank contributes
arange(n) + rank; every rank checks that it holds the sum
world * arange(n) + world * (world - 1) / 2 and prints one line. The exit
status is 0 only when the result is right.
"""

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                   help="gloo on CPU (default), nccl on the GPU")
    p.add_argument("-n", type=int, default=8, help="elements per rank")
    args = p.parse_args()

    device = torch.device("cpu")
    if args.backend == "nccl":
        if not torch.cuda.is_available():
            sys.exit("allreduce.py: --backend nccl needs a GPU (torch.cuda.is_available() is False)")
        # gearrun --bind gpu shows each rank its own GPU as device 0; without
        # binding, each local rank takes the GPU of its index.
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)

    dist.init_process_group(backend=args.backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    t = torch.arange(args.n, dtype=torch.float64, device=device) + rank
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    want = world * torch.arange(args.n, dtype=torch.float64) + world * (world - 1) / 2
    ok = torch.equal(t.cpu(), want)
    dist.barrier()

    where = f"{args.backend} on {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    print(f"allreduce: rank {rank} of {world}: sum {t.cpu().tolist()}: {'ok' if ok else 'WRONG, want ' + str(want.tolist())}"
          f" [{where}, torch {torch.__version__}, MASTER_ADDR={os.environ.get('MASTER_ADDR')}"
          f" MASTER_PORT={os.environ.get('MASTER_PORT')}]", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
