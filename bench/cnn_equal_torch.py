"""How far PyTorch 1.13's own DDP parts from one process with twice the
batch on ddp-cnn's network (issue 15's "2 ranks equal 1 rank" check), and
the float32 noise floor that comparison sits on.  Dropout off, data in
order, the same initial weights (torch.manual_seed(SEED)), Adadelta lr 1.0,
one thread per rank.  Three runs, each saving the parameters after every
step:

  /usr/bin/python3 bench/cnn_equal_torch.py --mode one --out /tmp/one.pt
      1 process, batch 64
  /usr/bin/python3 bench/cnn_equal_torch.py --mode accum --out /tmp/accum.pt
      1 process, batch 64 as two accumulated micro-batches of 32 (rows
      0-31, 32-63): the same gradient summed in another order
  build/bin/ddprun --standalone --nproc-per-node 2 /usr/bin/python3 \\
      bench/cnn_equal_torch.py --mode ddp --out /tmp/ddp.pt
      DDP over gloo on 2 ranks, batch 32 each (DistributedSampler, no shuffle)

then  /usr/bin/python3 bench/cnn_equal_torch.py --compare /tmp/one.pt /tmp/ddp.pt
prints the largest parameter difference after each step.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from cnn_torch import Net, load


def run(args):
    torch.set_num_threads(1)
    rank, world = 0, 1
    if args.mode == "ddp":
        dist.init_process_group("gloo", init_method="env://")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    net = Net()
    net.dropout1.p = net.dropout2.p = 0.0
    model = torch.nn.parallel.DistributedDataParallel(net) if world > 1 else net
    train = Subset(load(args.data, "train"), range(args.steps * 64))
    sampler = DistributedSampler(train, world, rank, shuffle=False) if world > 1 else None
    loader = DataLoader(train, batch_size=64 // world, sampler=sampler, shuffle=False)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    history = []
    for x, y in loader:
        opt.zero_grad()
        if args.mode == "accum":  # torch's gradient accumulation: loss / 2 per half
            for h in (slice(0, 32), slice(32, 64)):
                (F.nll_loss(model(x[h]), y[h]) / 2).backward()
        else:
            F.nll_loss(model(x), y).backward()
        opt.step()
        history.append(torch.cat([p.detach().flatten().clone() for p in net.parameters()]))
    if rank == 0:
        torch.save(history, args.out)
    if world > 1:
        dist.destroy_process_group()


def compare(a, b):
    ha, hb = torch.load(a), torch.load(b)
    for k, (x, y) in enumerate(zip(ha, hb)):
        d = (x.double() - y.double()).abs()
        print(f"step {k + 1:2d}: max |diff| {d.max().item():.3g}, {int((d > 0).sum())} differ")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["one", "accum", "ddp"], default="one")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="/tmp/cnn_equal.pt")
    p.add_argument("--compare", nargs=2, metavar="FILE")
    args = p.parse_args()
    if args.compare:
        compare(*args.compare)
    else:
        run(args)


if __name__ == "__main__":
    main()
