"""Reference for the DDP benchmark: the seed's program in PyTorch.

Sequential(Linear(784,256), ReLU, Linear(256,10)) + CrossEntropyLoss + SGD,
DistributedDataParallel over gloo, DataLoader over DistributedSampler, on the
Fashion-MNIST IDX files.  Run with one thread per rank:

  OPENBLAS_NUM_THREADS=1 build/bin/ddprun --standalone --nproc-per-node 2 \
      /usr/bin/python3 bench/ddp_torch.py --epochs 1

(ddprun sets the same variables as torchrun; Debian's torch 1.13 torchrun
crashes under Python 3.11 in its error-handling path.)

--hidden 2048,2048 trains the wide MLP 784-2048-2048-10; --powersgd R
registers PyTorch's powerSGD_hook of matrix rank R (PowerSGDState's
defaults otherwise, start_powersgd_iter from --powersgd-start); on one
process (--nproc-per-node 1, or no launcher) the model runs without DDP,
as ddp-mnist alone does.

Rank 0 prints the same final lines as ddp-mnist:
  First step at: <unix time>      (for launch-to-first-step)
  Profile rank 0: N steps, X us/step   (the training loop's wall time over
                                  its steps, every one, as ddp-mnist's)
  Throughput: N samples/s         (global, training loop only)
  Test accuracy: NN.NN %
  Peak RSS: N MB                  (rank 0's)
"""
import argparse
import gzip
import os
import resource
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(folder, split):
    prefix = "train" if split == "train" else "t10k"
    def path(name):  # name.gz, or name as ddp-mnist also reads it
        p = os.path.join(folder, name)
        return p + ".gz" if os.path.exists(p + ".gz") else p
    x = read_idx(path(f"{prefix}-images-idx3-ubyte"))
    y = read_idx(path(f"{prefix}-labels-idx1-ubyte"))
    x = torch.from_numpy(x.reshape(len(x), -1).astype(np.float32) / 255.0)
    return TensorDataset(x, torch.from_numpy(y.astype(np.int64)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--hidden", default="256", help="widths, comma-separated")
    p.add_argument("--powersgd", type=int, default=0, help="PowerSGD matrix rank (0: off)")
    p.add_argument("--powersgd-start", type=int, default=1000)
    args = p.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    train = load(args.data, "train")
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    layers, width = [], 784
    for h in (int(w) for w in args.hidden.split(",")):
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    if world > 1:
        if args.powersgd:
            # One bucket: with DDP's two, torch 1.13 aborts in gloo on this
            # model ("op.preamble.length <= op.nbytes"), likely because
            # powerSGD_hook's callbacks, on gloo's threads, issue the two
            # buckets' all-reduces in whichever order they finish, and gloo
            # needs one order on every rank.
            dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 40
            model = DDP(model, bucket_cap_mb=1 << 20)
        else:
            model = DDP(model)
        if args.powersgd:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
            state = psgd.PowerSGDState(process_group=None,
                                       matrix_approximation_rank=args.powersgd,
                                       start_powerSGD_iter=args.powersgd_start)
            model.register_comm_hook(state, psgd.powerSGD_hook)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    total = len(loader)
    samples = steps = 0
    t0 = None
    t_loop = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if t0 is None:
                t0 = time.perf_counter()
                if rank == 0:
                    print(f"First step at: {time.time():.6f}", flush=True)
            else:
                samples += len(x)
            steps += 1
            if (i + 1) % 100 == 0 and rank == 0:
                print(f"Epoch [{epoch + 1}/{args.epochs}], Step [{i + 1}/{total}], "
                      f"Loss: {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - t0
    loop = time.perf_counter() - t_loop
    counts = torch.tensor([float(samples)])
    if world > 1:
        dist.all_reduce(counts)
    if rank == 0:
        print(f"Profile rank 0: {steps} steps, {loop / max(steps, 1) * 1e6:.1f} us/step")
        test = load(args.data, "test")
        with torch.no_grad():
            pred = (model.module if world > 1 else model)(test.tensors[0]).argmax(1)
            acc = (pred == test.tensors[1]).float().mean().item() * 100
        print(f"Throughput: {counts.item() / elapsed:.0f} samples/s")
        print(f"Test accuracy: {acc:.2f} %")
        print(f"Peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
