#!/bin/sh
# All-reduce over loopback TCP, 2 ranks: libddp (DDP_TRANSPORT=tcp
# ddp-bench-collectives) against Open MPI's tcp BTL (bench/mpi_allreduce.c
# under mpirun --mca btl tcp,self), alternated round by round in this one
# command so that load from other processes hits both alike.  Per size it
# prints the median and the spread (min-max) of the rounds' medians for each,
# and the per-round ratios ddp/mpi (sorted; the middle one is the median).
#
#   sh bench/tcp_vs_mpi.sh [MIN MAX FACTOR ITERS ROUNDS]
#
# Defaults: 4 B to 64 MiB, factor 4, 50 iterations (20 from 16 MiB), 7 rounds.
# Extra environment (DDP_SOCKET_NUM_STREAMS, DDP_TCP_SPIN_US, ...) reaches
# the libddp runs only.  BIND=core binds libddp's rank r to CPU r (taskset),
# as mpirun binds Open MPI's 2 ranks to cores by default.  Needs
# mpicc/mpirun (openmpi-bin, libopenmpi-dev).
set -e
cd "$(dirname "$0")/.."
MIN=${1:-4}
MAX=${2:-67108864}
FACTOR=${3:-4}
ITERS=${4:-50}
ROUNDS=${5:-7}
BUILD=${BUILD:-build}
case ${BIND:-} in "" | none | core) ;; *) echo "tcp_vs_mpi.sh: BIND=$BIND: want none or core" >&2; exit 2 ;; esac
command -v mpicc >/dev/null || { echo "skipped: no mpicc (Open MPI is installed by scripts/install-deps.sh)"; exit 0; }
make -s -j2 "$BUILD/bin/ddp-bench-collectives" >/dev/null
D=$(mktemp -d /tmp/ddp_tcpmpi.XXXXXX)
trap 'rm -rf "$D"' EXIT
mpicc -O2 -DDDP_WITH_MPI -o "$D/mpi_allreduce" bench/mpi_allreduce.c
i=0
while [ "$i" -lt "$ROUNDS" ]; do
    i=$((i + 1))
    for r in 1 0; do
        pin= # BIND=core: rank r on CPU r, as mpirun binds its 2 ranks
        [ "${BIND:-}" = core ] && pin="taskset -c $r"
        DDP_TRANSPORT=tcp $pin "$BUILD/bin/ddp-bench-collectives" --rank "$r" --world-size 2 \
            --init-method "file://$D/store.$i" --min-bytes "$MIN" --max-bytes "$MAX" \
            --step-factor "$FACTOR" --iters "$ITERS" >"$D/ddp.$r" &
    done
    wait
    grep -v '^#' "$D/ddp.0" | sed "s/^/ddp $i /" >>"$D/all"
    mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self -np 2 "$D/mpi_allreduce" \
        --min-bytes "$MIN" --max-bytes "$MAX" --step-factor "$FACTOR" --iters "$ITERS" \
        2>/dev/null | grep -v '^#' | sed "s/^/mpi $i /" >>"$D/all"
done
echo "# all_reduce float32 sum, 2 ranks, loopback TCP: libddp vs Open MPI btl tcp,self;"
echo "# $ROUNDS alternated rounds of $ITERS iterations (20 from 16 MiB); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# env: DDP_SOCKET_NUM_STREAMS=${DDP_SOCKET_NUM_STREAMS:-} DDP_TCP_SPIN_US=${DDP_TCP_SPIN_US:-} BIND=${BIND:-}"
printf '%10s | %24s | %24s | %s\n' bytes "ddp us: median (min-max)" "mpi us: median (min-max)" \
    "ddp/mpi per round, sorted"
for s in $(awk '{print $3}' "$D/all" | sort -nu); do
    stat() { awk -v s="$s" -v v="$1" '$1 == v && $3 == s { print $4 }' "$D/all" | sort -n |
        awk '{ a[NR] = $1 } END { if (NR) printf "%9.2f (%.2f-%.2f)", a[int((NR + 1) / 2)], a[1], a[NR] }'; }
    printf '%10s | %24s | %24s | ' "$s" "$(stat ddp)" "$(stat mpi)"
    awk -v s="$s" '$3 == s { t[$1, $2] = $4; r[$2] = 1 }
        END { for (i in r) if (t["mpi", i] > 0) printf "%.2f\n", t["ddp", i] / t["mpi", i] }' \
        "$D/all" | sort -n | tr '\n' ' '
    echo
done
