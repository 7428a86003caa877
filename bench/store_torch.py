"""Reference for bench/store.c: the same loop over torch.distributed's
TCPStore (master, server thread in this process) and FileStore.
usage: store_torch.py [N=5000] [VALUE_BYTES=64]
       store_torch.py barrier RANKS ROUNDS"""
import datetime
import os
import sys
import time

import torch.distributed as dist


def run(name, s, n, vbytes):
    value = b"x" * vbytes
    for _ in range(200):
        s.set("k", value)
    t0 = time.perf_counter()
    for _ in range(n):
        s.set("k", value)
    t1 = time.perf_counter()
    for _ in range(n):
        s.get("k")
    t2 = time.perf_counter()
    for _ in range(n):
        s.add("counter", 1)
    t3 = time.perf_counter()
    # torch 1.13's TCPStore has no check(): that column is libddp's alone.
    print("torch %s set_us=%.2f get_us=%.2f add_us=%.2f" % (
        name, (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6, (t3 - t2) / n * 1e6))


def barrier_rank(ranks, rounds, port):
    s = dist.TCPStore("127.0.0.1", port, ranks, False,
                      timeout=datetime.timedelta(seconds=60))
    t0 = 0
    for i in range(-1, rounds):  # round -1: everyone connected
        if i == 0:
            t0 = time.perf_counter()
        if s.add("count/%d" % i, 1) == ranks:
            s.set("go/%d" % i, "")
        s.wait(["go/%d" % i])
    return (time.perf_counter() - t0) / rounds * 1e6


def barrier_bench(ranks, rounds):
    master = dist.TCPStore("127.0.0.1", 0, ranks, True,
                           timeout=datetime.timedelta(seconds=60),
                           wait_for_workers=False)
    pids = []
    for _ in range(1, ranks):
        pid = os.fork()
        if pid == 0:
            try:
                barrier_rank(ranks, rounds, master.port)
                os._exit(0)
            except BaseException:
                os._exit(1)
        pids.append(pid)
    us = barrier_rank(ranks, rounds, master.port)
    ok = all(os.waitpid(p, 0)[1] == 0 for p in pids)
    if ok:
        print("torch barrier ranks=%d us=%.1f" % (ranks, us))
    return 0 if ok else 1


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "barrier":
        sys.exit(barrier_bench(int(sys.argv[2]), int(sys.argv[3])))
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    vbytes = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    timeout = datetime.timedelta(seconds=30)
    s = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timeout)
    run("tcp", s, n, vbytes)
    del s
    s = dist.HashStore()
    run("hash", s, n, vbytes)
    del s
    path = "/tmp/ddp-bench-torch-filestore-%d" % os.getpid()
    if os.path.exists(path):
        os.unlink(path)
    s = dist.FileStore(path, 1)
    run("file", s, n, vbytes)
    del s
    if os.path.exists(path):
        os.unlink(path)


if __name__ == "__main__":
    main()
