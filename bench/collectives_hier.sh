#!/bin/sh
# Hierarchical against flat all-reduce on the same fake-host layout, side by
# side: 4 ranks as 2 hosts x 2 (DDP_HOST_ID: ranks 0, 1 on hostA, 2, 3 on
# hostB), all on this machine.
#   hier  ddp-bench-collectives, backend tcp, default selection: shm inside
#         each "host", tcp between the two leaders (docs/hierarchical.md)
#   flat  the same with DDP_HIERARCHICAL=0: the flat algorithms over tcp
#         among all 4 ranks (ring / recursive doubling by size)
# float32 sum, 4 B to 16 MiB (x4 steps), median of back-to-back iterations
# per size; each sweep alternates between the two REPEATS times and the
# table keeps, per size, the median of the runs' medians.  On one machine
# the "network" is loopback TCP, so this measures what the hierarchy saves
# in messages and copies, not what it saves on a real network.
#
# Usage: sh bench/collectives_hier.sh [REPEATS] [ITERS]   (default 3, 50)
# Env:   BUILD (default build), MAX_BYTES (default 16M), STEP (default 4),
#        LAYOUT (default AABB: host letter per rank)
set -eu
cd "$(dirname "$0")/.."
reps=${1:-3}
iters=${2:-50}
build=${BUILD:-build}
max=${MAX_BYTES:-16M}
step=${STEP:-4}
layout=${LAYOUT:-AABB}
n=${#layout}
bench="$build/bin/ddp-bench-collectives"
[ -x "$bench" ] || { echo "build first (make)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# sweep HIER OUT: one sweep on n ranks through a file store; rank 0 prints.
sweep() {
    rm -f "$tmp/store"
    r=$((n - 1))
    while [ "$r" -ge 1 ]; do
        host=$(echo "$layout" | cut -c$((r + 1)))
        DDP_HIERARCHICAL=$1 DDP_HOST_ID="host$host" "$bench" --rank "$r" --world-size "$n" \
            --init-method "file://$tmp/store" --min-bytes 4 --max-bytes "$max" \
            --step-factor "$step" --iters "$iters" >/dev/null &
        r=$((r - 1))
    done
    host=$(echo "$layout" | cut -c1)
    DDP_HIERARCHICAL=$1 DDP_HOST_ID="host$host" "$bench" --rank 0 --world-size "$n" \
        --init-method "file://$tmp/store" --min-bytes 4 --max-bytes "$max" \
        --step-factor "$step" --iters "$iters" | grep -v '^#' >"$2"
    wait
}

. bench/hier_common.sh
hier_compare "all_reduce float32 sum, $n ranks, hosts $layout (DDP_HOST_ID); median of $reps runs x $iters iterations"
