#!/bin/sh
# The mpi backend's overhead over raw MPI calls (issue 4: <= 5 % at >= 64 KiB).
# ddp-bench-collectives --backend mpi and bench/mpi_allreduce.c (MPI_Allreduce
# on MPI_COMM_WORLD after plain MPI_Init), all_reduce float32 sum, both started
# by the same mpirun command line (NP ranks, Open MPI's defaults: shared
# memory between the ranks), alternating for REPEAT rounds so that noise from
# other processes hits both alike.  Per size and program: the best of the
# rounds' medians.  Two more columns show what the thread level costs inside
# MPI itself: raw MPI_Allreduce after MPI_Init_thread(MPI_THREAD_MULTIPLE),
# and libddp with DDP_MPI_THREAD=multiple.
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
for f in ddp raw ddpmt rawmt; do : >"$OUT/mpib_$f.txt"; done
round=0
while [ "$round" -lt "$REPEAT" ]; do
    round=$((round + 1))
    # shellcheck disable=SC2086
    $MPIRUN -np "$NP" "$BUILD/bin/ddp-bench-collectives" --backend mpi $ARGS |
        grep -v '^#' >>"$OUT/mpib_ddp.txt"
    # shellcheck disable=SC2086
    $MPIRUN -np "$NP" "$OUT/mpi_allreduce" $ARGS | grep -v '^#' >>"$OUT/mpib_raw.txt"
    # shellcheck disable=SC2086
    $MPIRUN -np "$NP" -x DDP_MPI_THREAD=multiple "$BUILD/bin/ddp-bench-collectives" \
        --backend mpi $ARGS | grep -v '^#' >>"$OUT/mpib_ddpmt.txt"
    # shellcheck disable=SC2086
    $MPIRUN -np "$NP" "$OUT/mpi_allreduce" --thread multiple $ARGS | grep -v '^#' \
        >>"$OUT/mpib_rawmt.txt"
done

echo "# all_reduce float32 sum, $NP ranks, one host; $MPIRUN -np $NP"
echo "# median of $ITERS iterations (20 from 16 MiB), best of $REPEAT rounds; overhead = ddp/mpi - 1"
echo "# ddp: libddp's default (MPI_THREAD_SERIALIZED); mpi: raw, plain MPI_Init;"
echo "# *_mt: both at MPI_THREAD_MULTIPLE (DDP_MPI_THREAD=multiple, --thread multiple)"
printf '%10s | %10s %8s | %10s %8s | %9s | %9s %9s %9s\n' bytes ddp_us GBps mpi_us GBps overhead \
    ddp_mt_us mpi_mt_us mt/mpi
# best[file, size]: the lowest median over the rounds
awk '{ f = FILENAME; sub(/.*mpib_/, "", f); sub(/\.txt$/, "", f)
       if (f == "ddp" && !($1 in seen)) { seen[$1] = 1; ord[++n] = $1 }
       k = f SUBSEP $1
       if (!(k in t) || $2 < t[k]) { t[k] = $2; bw[k] = $3 } }
     END { for (i = 1; i <= n; i++) { b = ord[i]
             d = t["ddp", b]; m = t["raw", b]; dm = t["ddpmt", b]; mm = t["rawmt", b]
             ov = m > 0 ? sprintf("%+.1f %%", 100 * (d / m - 1)) : "-"
             mt = m > 0 ? sprintf("%+.1f %%", 100 * (mm / m - 1)) : "-"
             printf "%10s | %10s %8s | %10s %8s | %9s | %9s %9s %9s\n", b, d, bw["ddp", b], m,
                    bw["raw", b], ov, dm, mm, mt } }' \
    "$OUT/mpib_ddp.txt" "$OUT/mpib_raw.txt" "$OUT/mpib_ddpmt.txt" "$OUT/mpib_rawmt.txt"
