# PyTorch twin of bench/train_mlp.c: the same model, loss, optimizer and
# step, on synthetic data, one thread.  Usage: train_mlp_torch.py [batch ...]
# Env: DDP_BENCH_SECONDS (default 2).  Prints one line per batch size:
#   torch batch=64 steps=N seconds=S samples_per_s=X ms_per_step=Y loss=L
import os
import sys
import time

import torch

torch.set_num_threads(1)
IN, HIDDEN, CLASSES, NBATCHES = 784, 256, 10, 16


def run(batch, seconds):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, CLASSES))
    crit = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    images = torch.rand(NBATCHES, batch, IN)
    labels = torch.randint(0, CLASSES, (NBATCHES, batch))
    warm, steps, it, t0 = 20, 0, 0, 0.0
    while True:
        if it == warm:
            t0 = time.perf_counter()
        b = it % NBATCHES
        out = model(images[b])
        loss = crit(out, labels[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it >= warm:
            steps += 1
            if steps % 16 == 0 and time.perf_counter() - t0 >= seconds:
                break
        it += 1
    dt = time.perf_counter() - t0
    print("torch batch=%d steps=%d seconds=%.3f samples_per_s=%.0f ms_per_step=%.4f loss=%.4f"
          % (batch, steps, dt, steps * batch / dt, dt * 1e3 / steps, loss.item()), flush=True)


if __name__ == "__main__":
    secs = float(os.environ.get("DDP_BENCH_SECONDS", "2"))
    for b in [int(a) for a in sys.argv[1:]] or [64, 256]:
        run(b, secs)
