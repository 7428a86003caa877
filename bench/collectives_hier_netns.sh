#!/bin/sh
# Hierarchical against flat all-reduce across two "hosts" that are network
# namespaces joined by a veth pair whose two ends are rate-limited with tbf
# (default 1 Gbit/s each way), so that crossing hosts costs what a network
# link costs while ranks of one namespace share memory and loopback.  Needs
# root (ip netns, tc).  4 ranks, LAYOUT letters map ranks to namespaces A, B
# (default AABB; ABAB interleaves them).
#   hier  default selection: shm inside each namespace, tcp between leaders
#   flat  DDP_HIERARCHICAL=0: the flat algorithms over tcp among all ranks
# float32 sum, 4 B to 16 MiB (x4 steps), median of back-to-back iterations
# per size; the two alternate REPEATS times, per size the median of medians.
#
# Usage: sh bench/collectives_hier_netns.sh [REPEATS] [ITERS]   (default 3, 10)
# Env:   BUILD (default build), RATE (tbf rate, default 1gbit), MAX_BYTES
#        (default 16M), STEP (default 4), LAYOUT (default AABB)
set -eu
cd "$(dirname "$0")/.."
reps=${1:-3}
iters=${2:-10}
build=${BUILD:-build}
rate=${RATE:-1gbit}
max=${MAX_BYTES:-16M}
step=${STEP:-4}
layout=${LAYOUT:-AABB}
n=${#layout}
bench="$(pwd)/$build/bin/ddp-bench-collectives"
[ -x "$bench" ] || { echo "build first (make)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "needs root (ip netns, tc)" >&2; exit 1; }
tmp=$(mktemp -d)
id=$(($$ % 200 + 20))
nsA=ddpb$$A nsB=ddpb$$B
addrA=10.214.$id.1 addrB=10.214.$id.2
cleanup() {
    ip netns del "$nsA" 2>/dev/null || true
    ip netns del "$nsB" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$nsA"
ip netns add "$nsB"
ip link add "vb$$a" type veth peer name "vb$$b"
ip link set "vb$$a" netns "$nsA"
ip link set "vb$$b" netns "$nsB"
ip -n "$nsA" addr add "$addrA/24" dev "vb$$a"
ip -n "$nsB" addr add "$addrB/24" dev "vb$$b"
for x in "$nsA vb$$a" "$nsB vb$$b"; do
    set -- $x
    ip -n "$1" link set "$2" up
    ip -n "$1" link set lo up
    tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst 256kb latency 50ms
done

# sweep HIER OUT: one sweep; rank r runs in the namespace of its layout letter.
sweep() {
    rm -f "$tmp/store"
    r=$((n - 1))
    while [ "$r" -ge 0 ]; do
        h=$(echo "$layout" | cut -c$((r + 1)))
        if [ "$h" = A ]; then ns=$nsA addr=$addrA; else ns=$nsB addr=$addrB; fi
        cmd="ip netns exec $ns env DDP_HIERARCHICAL=$1 DDP_HOST_ID=$ns DDP_TCP_HOST=$addr $bench
             --rank $r --world-size $n --init-method file://$tmp/store --min-bytes 4
             --max-bytes $max --step-factor $step --iters $iters --warmup 2"
        if [ "$r" -eq 0 ]; then $cmd | grep -v '^#' >"$2"; else $cmd >/dev/null & fi
        r=$((r - 1))
    done
    wait
}

. bench/hier_common.sh
hier_compare "all_reduce float32 sum, $n ranks, namespaces $layout, veth $rate each way; median of $reps runs x $iters iterations"
