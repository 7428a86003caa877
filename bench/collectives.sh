#!/bin/sh
# All-reduce over loopback TCP, 2 ranks: libddp against OpenMPI's
# MPI_Allreduce (btl tcp) and torch.distributed's gloo, run one after the
# other in this one command so that machine noise hits all three alike.
# Prints one table: bytes, then median_us and busbw_GBps for each.
#
#   sh bench/collectives.sh [MIN_BYTES MAX_BYTES FACTOR ITERS]
#
# Needs: make (libddp), mpicc/mpirun (openmpi-bin, libopenmpi-dev),
# python3 with torch (python3-torch; $PYTHON overrides).  A missing reference is skipped.
set -e
cd "$(dirname "$0")/.."
MIN=${1:-4}
MAX=${2:-67108864}
FACTOR=${3:-4}
ITERS=${4:-50}
BUILD=${BUILD:-build}
OUT=bench/out
mkdir -p "$OUT"
make -s -j2 "$BUILD/bin/ddp-bench-collectives" >/dev/null
port() { echo $((20000 + ($$ + $1) % 30000)); }

# libddp: one process per rank, env:// rendezvous.
P=$(port 1)
for r in 1 0; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$P RANK=$r WORLD_SIZE=2 \
        "$BUILD/bin/ddp-bench-collectives" --min-bytes "$MIN" --max-bytes "$MAX" \
        --step-factor "$FACTOR" --iters "$ITERS" >"$OUT/ddp.$r.txt" &
done
wait
grep -v '^#' "$OUT/ddp.0.txt" >"$OUT/ddp.txt"

# OpenMPI over its TCP transport (no shared memory), 2 ranks.
if command -v mpicc >/dev/null 2>&1; then
    mpicc -O2 -o "$OUT/mpi_allreduce" bench/mpi_allreduce.c
    mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp -np 2 \
        "$OUT/mpi_allreduce" --min-bytes "$MIN" --max-bytes "$MAX" --step-factor "$FACTOR" \
        --iters "$ITERS" 2>/dev/null | grep -v '^#' >"$OUT/mpi.txt" || : >"$OUT/mpi.txt"
else
    : >"$OUT/mpi.txt"
fi

# torch.distributed gloo (Debian's python3-torch lives in /usr/bin/python3).
PY=${PYTHON:-python3}
[ -x /usr/bin/python3 ] && [ -z "$PYTHON" ] && PY=/usr/bin/python3
if "$PY" -c 'import torch' 2>/dev/null; then
    P=$(port 2)
    "$PY" bench/gloo_allreduce.py 1 2 "$P" "$MIN" "$MAX" "$FACTOR" "$ITERS" >/dev/null &
    "$PY" bench/gloo_allreduce.py 0 2 "$P" "$MIN" "$MAX" "$FACTOR" "$ITERS" |
        grep -v '^#' >"$OUT/gloo.txt"
    wait
else
    : >"$OUT/gloo.txt"
fi

echo "# all_reduce float32 sum, 2 ranks, loopback TCP; median of $ITERS iterations (20 from 16 MiB)"
echo "# busbw = 2(n-1)/n * bytes / time (nccl-tests)"
printf '%10s | %10s %8s | %10s %8s | %10s %8s | %s\n' bytes ddp_us ddp_GBps mpi_us mpi_GBps \
    gloo_us gloo_GBps "ddp/mpi time"
awk 'FILENAME ~ /ddp.txt$/ { dus[$1] = $2; dbw[$1] = $3; order[++n] = $1 }
     FILENAME ~ /mpi.txt$/ { mus[$1] = $2; mbw[$1] = $3 }
     FILENAME ~ /gloo.txt$/ { gus[$1] = $2; gbw[$1] = $3 }
     END { for (i = 1; i <= n; i++) { b = order[i];
             ratio = (b in mus) && mus[b] > 0 ? sprintf("%.2f", dus[b] / mus[b]) : "-";
             printf "%10s | %10s %8s | %10s %8s | %10s %8s | %s\n", b, dus[b], dbw[b],
                    (b in mus) ? mus[b] : "-", (b in mbw) ? mbw[b] : "-",
                    (b in gus) ? gus[b] : "-", (b in gbw) ? gbw[b] : "-", ratio } }' \
    "$OUT/ddp.txt" "$OUT/mpi.txt" "$OUT/gloo.txt"
