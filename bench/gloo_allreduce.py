"""Reference for bench/collectives.sh: torch.distributed all_reduce on the
gloo backend, timed like ddp-bench-collectives (same sizes, warm-up, median
of back-to-back iterations, same output columns).

    python3 bench/gloo_allreduce.py RANK WORLD_SIZE PORT [MIN MAX FACTOR ITERS]
"""
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    lo = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    hi = int(sys.argv[5]) if len(sys.argv) > 5 else 64 << 20
    factor = float(sys.argv[6]) if len(sys.argv) > 6 else 2
    iters = int(sys.argv[7]) if len(sys.argv) > 7 else 50
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    if rank == 0:
        print(f"# torch {torch.__version__} gloo all_reduce float32 sum, {world} ranks")
        print("# bytes median_us busbw_GBps")
    size = float(lo)
    while size <= hi:
        count = max(1, int(size) // 4)
        t = torch.zeros(count, dtype=torch.float32)
        n_it = 20 if count * 4 >= (16 << 20) and iters > 20 else iters
        times = []
        for i in range(5 + n_it):
            t0 = time.perf_counter()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            if i >= 5:
                times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        if rank == 0:
            busbw = count * 4 * 2 * (world - 1) / world / med / 1e9
            print(f"{count * 4} {med * 1e6:.2f} {busbw:.3f}", flush=True)
        size *= factor
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
