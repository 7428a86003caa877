#!/bin/sh
# Rendezvous store latency, libddp against torch.distributed (python3-torch
# 1.13), side by side: ROUNDS alternating runs of bench/store.c and
# bench/store_torch.py, each doing N set / get / add on a TCPStore (server
# thread in the same process, client over loopback), a HashStore (memory)
# and a FileStore.
# Then store barriers among 2, 4 and 8 forked processes over a TCPStore
# (BARRIERS rounds each).  Prints the median of the rounds per store and
# operation, and the ratio torch / libddp (> 1: libddp is faster).
#   usage: sh bench/store.sh [BUILD=build] [N=5000] [ROUNDS=5] [VALUE_BYTES=64] [BARRIERS=300]
set -eu
build=${1:-build}
n=${2:-5000}
rounds=${3:-5}
vbytes=${4:-64}
barriers=${5:-300}
py=${PYTHON:-/usr/bin/python3}
here=$(dirname "$0")
[ -x "$build/bench/store" ] || { echo "build $build/bench/store first (make all)"; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
i=0
while [ "$i" -lt "$rounds" ]; do
    "$build/bench/store" "$n" "$vbytes" >>"$out"
    "$py" "$here/store_torch.py" "$n" "$vbytes" >>"$out"
    for ranks in 2 4 8; do
        "$build/bench/store" barrier "$ranks" "$barriers" >>"$out"
        "$py" "$here/store_torch.py" barrier "$ranks" "$barriers" >>"$out"
    done
    i=$((i + 1))
done
echo "store latency, mean us per call over $n calls, median of $rounds rounds, $vbytes-byte values;"
echo "barrier: us per store barrier (add, last one sets, all wait) over $barriers rounds"
awk '
function median(key,   m, i, j, t, a) {
    m = cnt[key]
    for (i = 1; i <= m; i++) a[i] = val[key, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
$2 == "barrier" {
    key = $1 SUBSEP $2 SUBSEP $3
    split($4, kv, "=")
    cnt[key]++
    val[key, cnt[key]] = kv[2]
    next
}
{
    for (f = 3; f <= NF; f++) {
        split($f, kv, "=")
        op = kv[1]; sub(/_us$/, "", op)
        key = $1 SUBSEP $2 SUBSEP op
        cnt[key]++
        val[key, cnt[key]] = kv[2]
    }
}
END {
    printf "%-8s %-8s %10s %10s %8s\n", "store", "op", "libddp", "torch", "ratio"
    split("tcp hash file barrier", stores, " ")
    split("set get add check ranks=2 ranks=4 ranks=8", ops, " ")
    for (s = 1; s <= 4; s++) for (o = 1; o <= 7; o++) {
        d = "libddp" SUBSEP stores[s] SUBSEP ops[o]
        t = "torch" SUBSEP stores[s] SUBSEP ops[o]
        if (!(d in cnt)) continue
        dm = median(d)
        if (t in cnt) { tm = median(t); printf "%-8s %-8s %10.2f %10.2f %8.2f\n", stores[s], ops[o], dm, tm, tm / dm }
        else printf "%-8s %-8s %10.2f %10s %8s\n", stores[s], ops[o], dm, "-", "-"
    }
}' "$out"
