#!/bin/sh
# All-reduce over shared memory, 2 ranks on this host, side by side:
#   libddp   ddp-bench-collectives, backend tcp (auto-selects the shm
#            transport on one host; DDP_TRANSPORT=shm forces it here)
#   openmpi  MPI_Allreduce (bench/mpi_allreduce.c built with mpicc), OpenMPI's
#            default transport on one host (vader shared memory; no --mca btl)
#   tcp      ddp-bench-collectives over the TCP transport (DDP_TRANSPORT=tcp)
#   ring     (RING=1 only) libddp over shm with DDP_ALLREDUCE_ALGO=ring: the
#            message-based algorithm that auto used before the shared window
#   bound    (BIND=core only) libddp over shm, its 2 ranks started by
#            ddprun --bind-to core (each on a CPU of its own, as mpirun binds
#            Open MPI's ranks; the libddp column's ranks are not bound)
# float32 sum, 4 B to 64 MiB (x4 steps), median of back-to-back iterations
# per size; each sweep alternates between the configurations REPEATS times
# and the table keeps, per size, the median of the runs' medians, and the
# spread (lowest-highest of the runs' medians) of libddp's bandwidth; a
# second table gives each configuration's spread in microseconds.
#
# Usage: sh bench/collectives_shm.sh [REPEATS] [ITERS]   (default 3, 200)
# Env:   BUILD (default build), MIN_BYTES (default 4), MAX_BYTES (default 64M),
#        STEP (default 4), RING (default 0), BIND (none or core; default none)
set -eu
cd "$(dirname "$0")/.."
reps=${1:-3}
iters=${2:-200}
build=${BUILD:-build}
min=${MIN_BYTES:-4}
max=${MAX_BYTES:-64M}
step=${STEP:-4}
ring=${RING:-0}
bind=${BIND:-none}
case "$bind" in none | core) ;; *) echo "BIND must be none or core, not '$bind'" >&2; exit 2 ;; esac
bench="$build/bin/ddp-bench-collectives"
[ -x "$bench" ] || { echo "build first (make)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi="$tmp/mpi_allreduce"
mpicc -O2 -DDDP_WITH_MPI -o "$mpi" bench/mpi_allreduce.c

# ddp TRANSPORT OUT [ALGO]: one sweep of libddp on 2 ranks through a file store.
ddp() {
    rm -f "$tmp/store"
    DDP_TRANSPORT=$1 DDP_ALLREDUCE_ALGO=${3:-auto} "$bench" --rank 1 --world-size 2 \
        --init-method "file://$tmp/store" --min-bytes "$min" --max-bytes "$max" \
        --step-factor "$step" --iters "$iters" >/dev/null &
    DDP_TRANSPORT=$1 DDP_ALLREDUCE_ALGO=${3:-auto} "$bench" --rank 0 --world-size 2 \
        --init-method "file://$tmp/store" --min-bytes "$min" --max-bytes "$max" \
        --step-factor "$step" --iters "$iters" | grep -v '^#' >"$2"
    wait
}

# ddp_bound OUT: the same sweep over shm, both ranks started by ddprun
# --bind-to core (env:// rendezvous; rank 0's lines only).
ddp_bound() {
    DDP_TRANSPORT=shm "$build/bin/ddprun" --standalone --nproc-per-node 2 --bind-to core \
        --local-ranks-filter 0 "$bench" --min-bytes "$min" --max-bytes "$max" \
        --step-factor "$step" --iters "$iters" | grep -v '^#' >"$1"
}

bytes() { echo "$1" | sed 's/[kK]$/*1024/; s/M$/*1048576/' | bc; }
for i in $(seq "$reps"); do
    ddp shm "$tmp/shm.$i"
    mpirun --allow-run-as-root --oversubscribe -np 2 "$mpi" --min-bytes "$(bytes "$min")" \
        --max-bytes "$(bytes "$max")" --step-factor "$step" --iters "$iters" \
        2>/dev/null | grep -v '^#' >"$tmp/mpi.$i"
    ddp tcp "$tmp/tcp.$i"
    if [ "$ring" = 1 ]; then ddp shm "$tmp/ring.$i" ring; fi
    if [ "$bind" = core ]; then ddp_bound "$tmp/bound.$i"; fi
done

# spread NAME: "bytes median lowest highest" (us) per size over the runs of NAME.
spread() {
    cat "$tmp/$1".* | sort -n -k1,1 -k2,2 | awk '
        { v[$1] = v[$1] " " $2; n[$1]++ }
        END { for (b in v) { split(substr(v[b], 2), a, " ")
            print b, a[int((n[b] + 1) / 2)], a[1], a[n[b]] } }' | sort -n
}
# med NAME: "bytes median_us" per size over the runs of NAME.
med() { spread "$1" | awk '{ print $1, $2 }'; }
med shm >"$tmp/m.shm"
med mpi >"$tmp/m.mpi"
med tcp >"$tmp/m.tcp"
if [ "$ring" = 1 ]; then med ring >"$tmp/m.ring"; else : >"$tmp/m.ring"; fi
# libddp's spread: lowest and highest median of the runs, per size (us).
spread shm | awk '{ print $1, $3, $4 }' >"$tmp/m.spread"

echo "all_reduce float32 sum, 2 ranks, one host; median of $reps runs x $iters iterations"
printf '%10s %12s %9s %13s %12s %9s %12s %9s %9s' bytes libddp_us GB/s spread_GB/s openmpi_us \
    GB/s tcp_us GB/s mpi/ddp
if [ "$ring" = 1 ]; then printf ' %9s' ring_GB/s; fi
echo
awk -v ring="$ring" '
    function bw(b, us) { return us > 0 ? b / us / 1e3 : 0 }
    FILENAME ~ /m.mpi$/ { mpi[$1] = $2; next }
    FILENAME ~ /m.tcp$/ { tcp[$1] = $2; next }
    FILENAME ~ /m.ring$/ { rg[$1] = $2; next }
    FILENAME ~ /m.spread$/ { lo[$1] = $2; hi[$1] = $3; next }
    { b[++n] = $1; shm[$1] = $2 }
    END { for (i = 1; i <= n; i++) { k = b[i]
        printf "%10d %12.2f %9.2f %6.2f-%-6.2f %12.2f %9.2f %12.2f %9.2f %8.2fx", k, shm[k],
               bw(k, shm[k]), bw(k, hi[k]), bw(k, lo[k]), mpi[k], bw(k, mpi[k]), tcp[k],
               bw(k, tcp[k]), (shm[k] > 0 ? mpi[k] / shm[k] : 0)
        if (ring == 1) printf " %9.2f", bw(k, rg[k])
        printf "\n" } }
' "$tmp/m.mpi" "$tmp/m.tcp" "$tmp/m.ring" "$tmp/m.spread" "$tmp/m.shm"
echo "(GB/s: bus bandwidth, bytes x 2(n-1)/n / time = bytes / time for 2 ranks)"

names="shm mpi"
if [ "$bind" = core ]; then names="shm bound mpi"; fi
echo
echo "median (lowest-highest) of the $reps runs' medians, us"
printf '%10s' bytes
for n in $names; do
    case $n in shm) h=libddp ;; bound) h=libddp_bound ;; *) h=openmpi ;; esac
    printf ' %24s' "$h"
done
echo
for n in $names; do spread "$n" >"$tmp/s.$n"; done
# one row per size: the columns joined on bytes, in the order of $names
awk 'FNR == 1 { f++ } { v[$1] = v[$1] sprintf(" %24s", sprintf("%.2f (%.2f-%.2f)", $2, $3, $4)); if (f == 1) b[++n] = $1 }
    END { for (i = 1; i <= n; i++) printf "%10d%s\n", b[i], v[b[i]] }' \
    $(for n in $names; do echo "$tmp/s.$n"; done)
