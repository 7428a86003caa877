#!/bin/sh
# All-reduce over shared memory, 2 ranks on this host, side by side:
#   libddp   ddp-bench-collectives, backend tcp (auto-selects the shm
#            transport on one host; DDP_TRANSPORT=shm forces it here)
#   openmpi  MPI_Allreduce (bench/mpi_allreduce.c built with mpicc), OpenMPI's
#            default transport on one host (vader shared memory; no --mca btl)
#   tcp      ddp-bench-collectives over the TCP transport (DDP_TRANSPORT=tcp)
# float32 sum, 4 B to 64 MiB (x4 steps), median of back-to-back iterations
# per size; each sweep alternates between the three REPEATS times and the
# table keeps, per size, the median of the runs' medians.
#
# Usage: sh bench/collectives_shm.sh [REPEATS] [ITERS]   (default 3, 200)
# Env:   BUILD (default build), MAX_BYTES (default 64M), STEP (default 4)
set -eu
cd "$(dirname "$0")/.."
reps=${1:-3}
iters=${2:-200}
build=${BUILD:-build}
max=${MAX_BYTES:-64M}
step=${STEP:-4}
bench="$build/bin/ddp-bench-collectives"
[ -x "$bench" ] || { echo "build first (make)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi="$tmp/mpi_allreduce"
mpicc -O2 -DDDP_WITH_MPI -o "$mpi" bench/mpi_allreduce.c

# ddp TRANSPORT OUT: one sweep of libddp on 2 ranks through a file store.
ddp() {
    rm -f "$tmp/store"
    DDP_TRANSPORT=$1 "$bench" --rank 1 --world-size 2 --init-method "file://$tmp/store" \
        --min-bytes 4 --max-bytes "$max" --step-factor "$step" --iters "$iters" >/dev/null &
    DDP_TRANSPORT=$1 "$bench" --rank 0 --world-size 2 --init-method "file://$tmp/store" \
        --min-bytes 4 --max-bytes "$max" --step-factor "$step" --iters "$iters" | grep -v '^#' >"$2"
    wait
}

for i in $(seq "$reps"); do
    ddp shm "$tmp/shm.$i"
    mpirun --allow-run-as-root --oversubscribe -np 2 "$mpi" --min-bytes 4 --max-bytes \
        "$(echo "$max" | sed 's/M$/*1048576/' | bc)" --step-factor "$step" --iters "$iters" \
        2>/dev/null | grep -v '^#' >"$tmp/mpi.$i"
    ddp tcp "$tmp/tcp.$i"
done

# med NAME: "bytes median_us" per size over the runs of NAME.
med() {
    cat "$tmp/$1".* | sort -n -k1,1 -k2,2 | awk -v reps="$reps" '
        { v[$1] = v[$1] " " $2; n[$1]++ }
        END { for (b in v) { split(substr(v[b], 2), a, " "); print b, a[int((n[b] + 1) / 2)] } }' |
        sort -n
}
med shm >"$tmp/m.shm"
med mpi >"$tmp/m.mpi"
med tcp >"$tmp/m.tcp"

echo "all_reduce float32 sum, 2 ranks, one host; median of $reps runs x $iters iterations"
printf '%10s %12s %9s %12s %9s %12s %9s %9s\n' bytes libddp_us GB/s openmpi_us GB/s tcp_us GB/s \
    mpi/ddp
awk '
    function bw(b, us) { return us > 0 ? b / us / 1e3 : 0 }
    FILENAME ~ /m.mpi$/ { mpi[$1] = $2; next }
    FILENAME ~ /m.tcp$/ { tcp[$1] = $2; next }
    { b[++n] = $1; shm[$1] = $2 }
    END { for (i = 1; i <= n; i++) { k = b[i]
        printf "%10d %12.2f %9.2f %12.2f %9.2f %12.2f %9.2f %8.2fx\n", k, shm[k], bw(k, shm[k]),
               mpi[k], bw(k, mpi[k]), tcp[k], bw(k, tcp[k]), (shm[k] > 0 ? mpi[k] / shm[k] : 0) } }
' "$tmp/m.mpi" "$tmp/m.tcp" "$tmp/m.shm"
echo "(GB/s: bus bandwidth, bytes x 2(n-1)/n / time = bytes / time for 2 ranks)"
