#!/usr/bin/env python3
"""PyTorch twin of ddp-mnist (examples/mnist/), for bench/mnist_e2e.sh.

Same model (Sequential(Linear(784,256), ReLU, Linear(256,10))), loss
(CrossEntropyLoss), optimizer (SGD), batch size, learning rate and output
lines; the data are read from the same .gz IDX files with gzip + numpy (no
torchvision, no download) and batched by torch's DataLoader over a
TensorDataset of uint8 images turned into floats per batch (/255, as
ToTensor) so that both programs do the same work per step.

Usage: mnist_torch.py [--data DIR] [--epochs N] [--batch-size N] [--lr X]
                      [--momentum X] [--seed N] [--workers N]
Runs with one thread (torch.set_num_threads(1)); set OPENBLAS_NUM_THREADS=1
too, as bench/mnist_e2e.sh does.
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
from torch import nn


def read_idx(path, magic):
    with gzip.open(path, "rb") if open(path, "rb").read(2) == b"\x1f\x8b" else open(path, "rb") as f:
        data = f.read()
    got = int.from_bytes(data[:4], "big")
    if got != magic:
        raise SystemExit(f"{path}: bad magic 0x{got:08x}")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(dirname, name):
    p = os.path.join(dirname, name)
    return p if os.path.exists(p) else p + ".gz"


def load_split(dirname, split):
    images = read_idx(find(dirname, f"{split}-images-idx3-ubyte"), 0x803)
    labels = read_idx(find(dirname, f"{split}-labels-idx1-ubyte"), 0x801)
    return torch.from_numpy(images.reshape(len(images), -1).copy()), \
        torch.from_numpy(labels.astype(np.int64))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)

    t0 = time.perf_counter()
    x_train, y_train = load_split(a.data, "train")
    print(f"Loaded {len(x_train)} training samples from {a.data} in "
          f"{time.perf_counter() - t0:.3f} s", flush=True)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train),
                                         batch_size=a.batch_size, shuffle=True,
                                         num_workers=a.workers)
    total = len(loader)
    samples = 0
    t0 = time.perf_counter()
    for epoch in range(a.epochs):
        for i, (images, labels) in enumerate(loader):
            images = images.float().div(255)  # ToTensor's scaling, per batch
            loss = criterion(model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            samples += len(labels)
            if (i + 1) % 100 == 0:
                print(f"Epoch [{epoch + 1}/{a.epochs}], Step [{i + 1}/{total}], "
                      f"Loss: {loss.item():.4f}", flush=True)
    dt = time.perf_counter() - t0
    print(f"Throughput: {samples / dt:.0f} samples/s")
    del loader, x_train, y_train

    x_test, y_test = load_split(a.data, "t10k")
    with torch.no_grad():
        pred = model(x_test.float().div(255)).argmax(1)
    print(f"Test accuracy: {100.0 * (pred == y_test).float().mean().item():.2f} %")


if __name__ == "__main__":
    main()
