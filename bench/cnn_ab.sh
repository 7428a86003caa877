#!/bin/sh
# ddp-cnn against PyTorch 1.13 doing the same (bench/cnn_torch.py: PyTorch's
# examples/mnist network, Adadelta, batch 64 per rank, one thread per rank),
# alternated run by run so that the shared machine's noise hits both alike:
# 1 rank, and DDP on 2 ranks (ddprun; PyTorch over gloo).  Prints per
# program and configuration the median samples/s with every run and their
# spread, the GFLOP/s that makes (FLOP_PER_SAMPLE: forward + backward,
# docs/cnn.md) against the one-core sgemm roof, the peak RSS per rank, and
# the median of the per-pair ratios ddp-cnn / PyTorch; `uptime` before and
# after (other work on the machine shows there).
#
#   sh bench/cnn_ab.sh [BIN] [ROUNDS] [STEPS]   (build/bin, 3 rounds, 150 steps per run)
set -eu
BIN=${1:-build/bin}
ROUNDS=${2:-3}
STEPS=${3:-150}
FLOP_PER_SAMPLE=71.6e6 # docs/cnn.md: 23.9 MFLOP forward, 47.7 backward
# The roof, GFLOP/s: OpenBLAS sgemm on one core for conv2's per-sample
# shapes (forward, dW, dcols), as bench/matmul_shapes measures them before
# and after the runs of this command: the median of those six figures.  It
# is this machine's, now (session 8's AVX-512 host gave 125-155, session
# 9's AVX2 host 56-60); a constant from another run misleads (DESIGN.md's
# 87 was a loaded median).  ROOF=N skips the measurement.
SHAPES=$(dirname "$BIN")/bench/matmul_shapes
roof_now() { "$SHAPES" 20 5 | awk '/^conv2 (fwd  W|dW   dy|dcol)/ {printf "%s ", $7}'; }
PY=/usr/bin/python3
TORCH=$(dirname "$0")/cnn_torch.py
[ -x "$BIN/ddp-cnn" ] && [ -x "$BIN/ddprun" ] || { echo "usage: $0 [BIN] [ROUNDS] [STEPS]" >&2; exit 2; }
export OPENBLAS_NUM_THREADS=1 DDP_NUM_THREADS=1 OMP_NUM_THREADS=1
. "$(dirname "$0")/blas_env.sh"
blas_env "$BIN/ddprun"
if [ -z "${ROOF:-}" ]; then
    [ -x "$SHAPES" ] || { echo "cnn_ab.sh: no $SHAPES (make) and no ROOF" >&2; exit 2; }
    ROOF_RUNS=$(OPENBLAS_NUM_THREADS=1 roof_now)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/rows"

# one NAME RANKS CMD...: appends "NAME samples/s max_rss_MB"
one() {
    name=$1 ranks=$2
    shift 2
    if [ "$ranks" -gt 1 ]; then
        "$BIN/ddprun" --standalone --nproc-per-node "$ranks" /usr/bin/time -f "RSS %M" "$@" \
            >"$tmp/out" 2>"$tmp/err"
    else
        /usr/bin/time -f "RSS %M" "$@" >"$tmp/out" 2>"$tmp/err"
    fi || { cat "$tmp/out" "$tmp/err" >&2; exit 1; }
    thr=$(sed -n 's/^Throughput: \([0-9.]*\) samples\/s$/\1/p' "$tmp/out")
    rss=$(sed -n 's/^RSS \([0-9]*\)$/\1/p' "$tmp/err" | sort -n | tail -n 1)
    echo "$name $thr $(awk "BEGIN{printf \"%.1f\", $rss/1024}")" | tee -a "$tmp/rows"
}

echo "before: $(uptime)"
i=0
while [ "$i" -lt "$ROUNDS" ]; do
    i=$((i + 1))
    one C-1 1 "$BIN/ddp-cnn" --max-steps "$STEPS"
    one T-1 1 $PY "$TORCH" --max-steps "$STEPS"
    one C-2 2 "$BIN/ddp-cnn" --max-steps "$STEPS"
    one T-2 2 $PY "$TORCH" --max-steps "$STEPS"
done
if [ -z "${ROOF:-}" ]; then
    ROOF_RUNS="$ROOF_RUNS $(OPENBLAS_NUM_THREADS=1 roof_now)"
    ROOF=$(echo $ROOF_RUNS | tr ' ' '\n' | sort -n | awk '{v[NR] = $1} END {print (v[int((NR + 1) / 2)] + v[int(NR / 2) + 1]) / 2}')
    echo "roof: conv2's sgemm shapes (bench/matmul_shapes 20 5, before and after): $ROOF_RUNS GFLOP/s, median $ROOF"
fi
echo "after:  $(uptime)"
echo "ddp-cnn (C) and PyTorch (T): $STEPS steps of batch 64 per rank, $ROUNDS alternated rounds"
awk -v fps="$FLOP_PER_SAMPLE" -v roof="$ROOF" '
function median(arr, n,   i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && arr[j-1] > arr[j]; j--) {
        t = arr[j]; arr[j] = arr[j-1]; arr[j-1] = t }
    return n % 2 ? arr[(n+1)/2] : (arr[n/2] + arr[n/2+1]) / 2
}
{ n[$1]++; thr[$1, n[$1]] = $2; runs[$1] = runs[$1] " " int($2)
  if ($3 > rss[$1]) rss[$1] = $3 }
END {
    printf "%-4s %9s %-26s %9s %8s %8s %8s\n", "run", "samples/s", "(each run)", "spread", "GFLOP/s", "of roof", "RSS MB"
    split("C-1 T-1 C-2 T-2", order, " ")
    for (k = 1; k <= 4; k++) {
        r = order[k]; m = n[r]; lo = 1e30; hi = 0
        for (i = 1; i <= m; i++) { a[i] = thr[r, i]; lo = a[i] < lo ? a[i] : lo; hi = a[i] > hi ? a[i] : hi }
        med = median(a, m); g = med * fps / 1e9; nr = substr(r, 3)
        printf "%-4s %9.0f %-26s %8.0f%% %8.1f %7.0f%% %8.1f\n", r, med, runs[r],
               med ? 100 * (hi - lo) / med : 0, g, 100 * g / (roof * nr), rss[r]
    }
    split("1 2", ranks, " ")
    for (k = 1; k <= 2; k++) {
        m = n["C-" ranks[k]]
        for (i = 1; i <= m; i++) q[i] = thr["C-" ranks[k], i] / thr["T-" ranks[k], i]
        printf "ddp-cnn / PyTorch, %s rank(s): median of %d pair ratios %.2f (", ranks[k], m, median(q, m)
        for (i = 1; i <= m; i++) printf "%s%.2f", (i > 1 ? " " : ""), q[i]
        printf ")\n"
    }
}' "$tmp/rows"
