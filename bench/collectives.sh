#!/bin/sh
# All-reduce over loopback TCP, 2 ranks: libddp against OpenMPI's
# MPI_Allreduce (btl tcp) and torch.distributed's gloo, run in turn in this
# one command, REPEAT rounds (default 3) so that noise from other processes
# on the machine hits all three alike.  Each run reports, per size, the
# median of back-to-back iterations; the table keeps, per size and library,
# the best of the rounds' medians.
#
#   sh bench/collectives.sh [MIN_BYTES MAX_BYTES FACTOR ITERS REPEAT]
#
# Needs: make (libddp), mpicc/mpirun (openmpi-bin, libopenmpi-dev),
# python3 with torch (python3-torch; $PYTHON overrides).  A missing reference is skipped.
set -e
cd "$(dirname "$0")/.."
MIN=${1:-4}
MAX=${2:-67108864}
FACTOR=${3:-4}
ITERS=${4:-50}
REPEAT=${5:-3}
BUILD=${BUILD:-build}
# TCP even on one host, where libddp would pick shared memory (collectives_shm.sh).
export DDP_TRANSPORT=${DDP_TRANSPORT:-tcp}
OUT=bench/out
mkdir -p "$OUT"
make -s -j2 "$BUILD/bin/ddp-bench-collectives" "$BUILD/bench/tcp_loopback" >/dev/null
RAW_BEFORE=$("$BUILD/bench/tcp_loopback")
port() { echo $((20000 + ($$ + $1) % 30000)); }

if command -v mpicc >/dev/null 2>&1; then
    mpicc -O2 -DDDP_WITH_MPI -o "$OUT/mpi_allreduce" bench/mpi_allreduce.c
fi
# torch.distributed gloo (Debian's python3-torch lives in /usr/bin/python3).
PY=${PYTHON:-python3}
[ -x /usr/bin/python3 ] && [ -z "$PYTHON" ] && PY=/usr/bin/python3
"$PY" -c 'import torch' 2>/dev/null && HAVE_TORCH=1 || HAVE_TORCH=0
: >"$OUT/ddp.txt"
: >"$OUT/mpi.txt"
: >"$OUT/gloo.txt"
round=0
while [ "$round" -lt "$REPEAT" ]; do
    round=$((round + 1))
    # libddp: one process per rank, env:// rendezvous.
    P=$(port $((3 * round)))
    for r in 1 0; do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$P RANK=$r WORLD_SIZE=2 \
            "$BUILD/bin/ddp-bench-collectives" --min-bytes "$MIN" --max-bytes "$MAX" \
            --step-factor "$FACTOR" --iters "$ITERS" >"$OUT/ddp.$r.txt" &
    done
    wait
    grep -v '^#' "$OUT/ddp.0.txt" >>"$OUT/ddp.txt"
    # OpenMPI over its TCP transport (no shared memory), 2 ranks.
    if [ -x "$OUT/mpi_allreduce" ]; then
        mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp -np 2 \
            "$OUT/mpi_allreduce" --min-bytes "$MIN" --max-bytes "$MAX" \
            --step-factor "$FACTOR" --iters "$ITERS" 2>/dev/null | grep -v '^#' >>"$OUT/mpi.txt" || :
    fi
    if [ "$HAVE_TORCH" = 1 ]; then
        P=$(port $((3 * round + 1)))
        "$PY" bench/gloo_allreduce.py 1 2 "$P" "$MIN" "$MAX" "$FACTOR" "$ITERS" >/dev/null &
        "$PY" bench/gloo_allreduce.py 0 2 "$P" "$MIN" "$MAX" "$FACTOR" "$ITERS" |
            grep -v '^#' >>"$OUT/gloo.txt"
        wait
    fi
done

RAW_AFTER=$("$BUILD/bench/tcp_loopback")
echo "# raw loopback TCP, one way, 64 MiB in 1 MiB writes: before $RAW_BEFORE; after $RAW_AFTER"
echo "# all_reduce float32 sum, 2 ranks, loopback TCP; median of $ITERS iterations (20 from 16 MiB), best of $REPEAT rounds"
echo "# busbw = 2(n-1)/n * bytes / time (nccl-tests)"
printf '%10s | %10s %8s | %10s %8s | %10s %8s | %s\n' bytes ddp_us ddp_GBps mpi_us mpi_GBps \
    gloo_us gloo_GBps "ddp/mpi time"
awk 'function keep(us, bw, b) { if (!(b in us) || $2 < us[b]) { us[b] = $2; bw[b] = $3 } }
     FILENAME ~ /ddp.txt$/ { if (!($1 in dus)) order[++n] = $1; keep(dus, dbw, $1) }
     FILENAME ~ /mpi.txt$/ { keep(mus, mbw, $1) }
     FILENAME ~ /gloo.txt$/ { keep(gus, gbw, $1) }
     END { for (i = 1; i <= n; i++) { b = order[i];
             ratio = (b in mus) && mus[b] > 0 ? sprintf("%.2f", dus[b] / mus[b]) : "-";
             printf "%10s | %10s %8s | %10s %8s | %10s %8s | %s\n", b, dus[b], dbw[b],
                    (b in mus) ? mus[b] : "-", (b in mbw) ? mbw[b] : "-",
                    (b in gus) ? gus[b] : "-", (b in gbw) ? gbw[b] : "-", ratio } }' \
    "$OUT/ddp.txt" "$OUT/mpi.txt" "$OUT/gloo.txt"
