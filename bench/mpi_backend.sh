#!/bin/sh
# The mpi backend's overhead over raw MPI calls (issue 4: <= 5 % at >= 64 KiB).
# ddp-bench-collectives --backend mpi and bench/mpi_allreduce.c (MPI_Allreduce
# on MPI_COMM_WORLD), all_reduce float32 sum, both started by the same mpirun
# command line (NP ranks, Open MPI's defaults: shared memory between the
# ranks), alternating for REPEAT rounds so that noise from other processes
# hits both alike.  Per size and program: the best of the rounds' medians.
#
#   sh bench/mpi_backend.sh [NP MIN_BYTES MAX_BYTES FACTOR ITERS REPEAT]
#
# Needs: make with MPI found (libopenmpi-dev), mpicc and mpirun.  MPIRUN
# overrides the launcher (default: mpirun --allow-run-as-root --oversubscribe).
set -e
cd "$(dirname "$0")/.."
NP=${1:-2}
MIN=${2:-4}
MAX=${3:-67108864}
FACTOR=${4:-4}
ITERS=${5:-50}
REPEAT=${6:-3}
BUILD=${BUILD:-build}
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
OUT=bench/out
mkdir -p "$OUT"
make -s -j2 "$BUILD/bin/ddp-bench-collectives" >/dev/null
mpicc -O2 -DDDP_WITH_MPI -o "$OUT/mpi_allreduce" bench/mpi_allreduce.c
ARGS="--min-bytes $MIN --max-bytes $MAX --step-factor $FACTOR --iters $ITERS"
: >"$OUT/mpib_ddp.txt"
: >"$OUT/mpib_raw.txt"
round=0
while [ "$round" -lt "$REPEAT" ]; do
    round=$((round + 1))
    # shellcheck disable=SC2086
    $MPIRUN -np "$NP" "$BUILD/bin/ddp-bench-collectives" --backend mpi $ARGS |
        grep -v '^#' >>"$OUT/mpib_ddp.txt"
    # shellcheck disable=SC2086
    $MPIRUN -np "$NP" "$OUT/mpi_allreduce" $ARGS | grep -v '^#' >>"$OUT/mpib_raw.txt"
done

echo "# all_reduce float32 sum, $NP ranks, one host; $MPIRUN -np $NP"
echo "# median of $ITERS iterations (20 from 16 MiB), best of $REPEAT rounds; overhead = ddp/mpi - 1"
printf '%10s | %10s %8s | %10s %8s | %s\n' bytes ddp_mpi_us GBps MPI_us GBps overhead
awk 'FILENAME ~ /ddp/ { if (!($1 in d)) { ord[++n] = $1; d[$1] = $2; dbw[$1] = $3 }
                        else if ($2 < d[$1]) { d[$1] = $2; dbw[$1] = $3 } }
     FILENAME ~ /raw/ { if (!($1 in m) || $2 < m[$1]) { m[$1] = $2; mbw[$1] = $3 } }
     END { for (i = 1; i <= n; i++) { b = ord[i];
             ov = (b in m) && m[b] > 0 ? sprintf("%+.1f %%", 100 * (d[b] / m[b] - 1)) : "-";
             printf "%10s | %10s %8s | %10s %8s | %s\n", b, d[b], dbw[b], m[b], mbw[b], ov } }' \
    "$OUT/mpib_ddp.txt" "$OUT/mpib_raw.txt"
