"""Reference for bench/cnn_ab.sh: ddp-cnn's program in PyTorch, which is
PyTorch's examples/mnist (main.py) on the Fashion-MNIST IDX files:

  Net = Conv2d(1,32,3) ReLU Conv2d(32,64,3) ReLU MaxPool2d(2) Dropout(0.25)
        Flatten Linear(9216,128) ReLU Dropout(0.5) Linear(128,10) log_softmax
  F.nll_loss, Adadelta(lr=1.0), StepLR(step_size=1, gamma=0.7), batch 64

One thread per rank (torch.set_num_threads(1)); on N ranks (ddprun sets
RANK/WORLD_SIZE/MASTER_ADDR as torchrun does) DistributedDataParallel over
gloo with a DistributedSampler:

  /usr/bin/python3 bench/cnn_torch.py --max-steps 150
  OPENBLAS_NUM_THREADS=1 build/bin/ddprun --standalone --nproc-per-node 2 \\
      /usr/bin/python3 bench/cnn_torch.py --max-steps 150

Inputs normalised as the example does: (x / 255 - 0.1307) / 0.3081.
Rank 0 prints ddp-cnn's lines: "Epoch [e/N], Step [i/total], Loss: x.xxxx"
every 100 steps, "Throughput: N samples/s" (all ranks, training loop from
its start, as ddp-cnn measures it) and "Test accuracy: NN.NN %".
"""
import argparse
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from ddp_torch import read_idx  # the IDX reader of the MLP benchmark beside it


def load(folder, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.reshape(len(x), 1, 28, 28).astype(np.float32) / 255.0)
    x = (x - 0.1307) / 0.3081  # examples/mnist's transforms.Normalize
    return TensorDataset(x, torch.from_numpy(y.astype(np.int64)))


class Net(nn.Module):  # examples/mnist/main.py's
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=0.7)
    p.add_argument("--max-steps", type=int, default=-1)
    args = p.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    if world > 1:
        dist.init_process_group("gloo", init_method="env://")
        rank = dist.get_rank()
    torch.manual_seed(1)
    train = load(args.data, "train")
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=1) \
        if world > 1 else None
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None)
    net = Net()
    model = nn.parallel.DistributedDataParallel(net) if world > 1 else net
    opt = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=args.gamma)
    total, samples, steps = len(loader), 0, 0
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if 0 <= args.max_steps <= steps:
                break
            loss = F.nll_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            samples += len(x)
            if (i + 1) % 100 == 0 and rank == 0:
                print(f"Epoch [{epoch + 1}/{args.epochs}], Step [{i + 1}/{total}], "
                      f"Loss: {loss.item():.4f}", flush=True)
        sched.step()
    elapsed = time.perf_counter() - t0
    counts = torch.tensor([float(samples)])
    if world > 1:
        t = torch.tensor([elapsed])
        dist.all_reduce(counts)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        elapsed = t.item()
    if rank == 0:
        print(f"Throughput: {counts.item() / elapsed:.0f} samples/s", flush=True)
        test = load(args.data, "test")
        net.eval()
        correct = 0
        with torch.no_grad():
            for k in range(0, len(test), 1000):
                x, y = test.tensors[0][k:k + 1000], test.tensors[1][k:k + 1000]
                correct += (net(x).argmax(1) == y).sum().item()
        print(f"Test accuracy: {100.0 * correct / len(test):.2f} %")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
