#!/bin/sh
# The reference program, two builds of libddp (say a base commit built in
# another folder, and this tree), alternated run by run so that noise from
# the machine hits both alike: ddp-mnist on 2 ranks (ddprun) and on 1, one
# epoch of Fashion-MNIST at batch 64 per rank.  Prints per build and
# configuration the median samples/s with every run, the median launch to
# first step and the peak RSS per rank, then the median of the per-pair
# ratios B/A (above 1: B is faster).
#
#   sh bench/ddp_mnist_ab.sh A_BIN B_BIN [ROUNDS]     (default 5 rounds)
#
# A_BIN, B_BIN: folders holding ddprun and ddp-mnist (e.g. build/bin).  A
# base build:
#   git archive COMMIT | tar -x -C /tmp/base && make -C /tmp/base build/bin/ddp-mnist build/bin/ddprun
set -eu
A=$1
B=$2
ROUNDS=${3:-5}
for d in "$A" "$B"; do
    [ -x "$d/ddp-mnist" ] && [ -x "$d/ddprun" ] || {
        echo "usage: $0 A_BIN B_BIN [ROUNDS]" >&2
        exit 2
    }
done
export OPENBLAS_NUM_THREADS=1 DDP_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_MNIST_TIMESTAMPS=1
. "$(dirname "$0")/blas_env.sh"
blas_env "$B/ddprun" # both builds' runs, whichever ddprun would set it
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/rows"

# one NAME RANKS BIN: appends "NAME samples/s first_step_s max_rss_MB"
one() {
    t0=$(date +%s.%N)
    if [ "$2" -gt 1 ]; then
        "$3/ddprun" --standalone --nproc-per-node "$2" /usr/bin/time -f "RSS %M" \
            "$3/ddp-mnist" --epochs 1 >"$tmp/out" 2>"$tmp/err"
    else
        /usr/bin/time -f "RSS %M" "$3/ddp-mnist" --epochs 1 >"$tmp/out" 2>"$tmp/err"
    fi || { cat "$tmp/out" "$tmp/err" >&2; exit 1; }
    thr=$(sed -n 's/^Throughput: \([0-9.]*\) samples\/s$/\1/p' "$tmp/out")
    first=$(sed -n 's/^First step at: \([0-9.]*\)$/\1/p' "$tmp/out")
    rss=$(sed -n 's/^RSS \([0-9]*\)$/\1/p' "$tmp/err" | sort -n | tail -n 1)
    echo "$1 $thr $(awk "BEGIN{printf \"%.3f\", $first - $t0}") $(awk "BEGIN{printf \"%.1f\", $rss/1024}")" \
        >>"$tmp/rows"
}

i=0
while [ "$i" -lt "$ROUNDS" ]; do
    i=$((i + 1))
    one A-2 2 "$A"
    one B-2 2 "$B"
    one A-1 1 "$A"
    one B-1 1 "$B"
done

echo "ddp-mnist, 1 epoch, batch 64 per rank; A=$A B=$B; $ROUNDS alternated rounds"
awk '
function median(arr, n,   i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && arr[j-1] > arr[j]; j--) {
        t = arr[j]; arr[j] = arr[j-1]; arr[j-1] = t }
    return n % 2 ? arr[(n+1)/2] : (arr[n/2] + arr[n/2+1]) / 2
}
{ n[$1]++; thr[$1, n[$1]] = $2; fs[$1, n[$1]] = $3; runs[$1] = runs[$1] " " int($2)
  if ($4 > rss[$1]) rss[$1] = $4 }
END {
    printf "%-5s %10s %-44s %13s %12s\n", "run", "samples/s", "(each run)", "first step s", "peak RSS MB"
    split("A-2 B-2 A-1 B-1", order, " ")
    for (k = 1; k <= 4; k++) {
        r = order[k]; m = n[r]
        for (i = 1; i <= m; i++) { a[i] = thr[r, i]; b[i] = fs[r, i] }
        printf "%-5s %10.0f %-44s %13.3f %12.1f\n", r, median(a, m), runs[r], median(b, m), rss[r]
    }
    split("2 1", ranks, " ")
    for (k = 1; k <= 2; k++) {
        m = n["A-" ranks[k]]
        for (i = 1; i <= m; i++) q[i] = thr["B-" ranks[k], i] / thr["A-" ranks[k], i]
        printf "B/A, %s rank(s): median of %d pair ratios %.3f (", ranks[k], m, median(q, m)
        for (i = 1; i <= m; i++) printf "%s%.3f", (i > 1 ? " " : ""), thr["B-" ranks[k], i] / thr["A-" ranks[k], i]
        printf ")\n"
    }
}' "$tmp/rows"
