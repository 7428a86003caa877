#!/bin/sh
# End-to-end benchmark of the reference program against PyTorch: ddp-mnist
# (examples/mnist/) and bench/mnist_torch.py (torch 1.13, one thread) train
# one epoch of Fashion-MNIST with the same model, batch, lr and data files,
# alternately, REPEATS times per batch size, so that noise from other
# processes falls on both.  Reports per batch size the median training
# throughput of each and their ratio, the peak RSS (/usr/bin/time -v), the
# data set load time and the test accuracy.
#
# Usage: sh bench/mnist_e2e.sh [REPEATS] [BATCH ...]   (default: 3 64 256)
# Env:   BUILD (default build), DATA (default /usr/share/datasets/fashion-mnist),
#        PYTHON (default /usr/bin/python3, the one with python3-torch),
#        WORKERS (ddp-mnist --workers, default 1)
set -eu
cd "$(dirname "$0")/.."
reps=${1:-3}
[ $# -gt 0 ] && shift
batches=${*:-64 256}
build=${BUILD:-build}
data=${DATA:-/usr/share/datasets/fashion-mnist}
py=${PYTHON:-/usr/bin/python3}
workers=${WORKERS:-1}
export OPENBLAS_NUM_THREADS=1 DDP_NUM_THREADS=1 OMP_NUM_THREADS=1

[ -x "$build/bin/ddp-mnist" ] || { echo "build $build/bin/ddp-mnist first (make)" >&2; exit 1; }
. bench/blas_env.sh
blas_env "$build/bin/ddprun"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run NAME BATCH CMD...: appends "NAME BATCH samples/s load_s rss_MB acc" to $tmp/rows
run() {
    name=$1 batch=$2
    shift 2
    /usr/bin/time -v "$@" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
    thr=$(sed -n 's/^Throughput: \([0-9.]*\) samples\/s$/\1/p' "$tmp/out")
    load=$(sed -n 's/^Loaded .* in \([0-9.]*\) s$/\1/p' "$tmp/out")
    acc=$(sed -n 's/^Test accuracy: \([0-9.]*\) %$/\1/p' "$tmp/out")
    rss=$(sed -n 's/^.*Maximum resident set size (kbytes): \([0-9]*\)$/\1/p' "$tmp/err")
    echo "$name $batch $thr $load $(awk "BEGIN{printf \"%.1f\", $rss/1024}") $acc" >>"$tmp/rows"
}

echo "ddp-mnist vs PyTorch $("$py" -c 'import torch; print(torch.__version__)'), $reps runs each," \
     "1 epoch, lr 0.1, ddp-mnist --workers $workers, $(getconf _NPROCESSORS_ONLN) CPUs"
for b in $batches; do
    i=0
    while [ "$i" -lt "$reps" ]; do
        run libddp "$b" "$build/bin/ddp-mnist" --data "$data" --epochs 1 --batch-size "$b" \
            --lr 0.1 --workers "$workers"
        run torch "$b" "$py" bench/mnist_torch.py --data "$data" --epochs 1 --batch-size "$b" \
            --lr 0.1
        i=$((i + 1))
    done
done

# Per (program, batch): median samples/s and each run's, ratio of medians,
# max peak RSS, min and median load time, test accuracy (deterministic).
awk '
function median(arr, n,   i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && arr[j-1] > arr[j]; j--) {
        t = arr[j]; arr[j] = arr[j-1]; arr[j-1] = t }
    return n % 2 ? arr[(n+1)/2] : (arr[n/2] + arr[n/2+1]) / 2
}
{
    k = $1 " " $2; n[k]++; thr[k, n[k]] = $3; ld[k, n[k]] = $4
    if (!(k in rss) || $5 > rss[k]) rss[k] = $5
    runs[k] = runs[k] (runs[k] == "" ? "" : " ") $3
    acc[k] = $6
    if (!($2 in seen)) { seen[$2] = 1; order[++nb] = $2 }
}
function row(k, b, ref,   t, a, m, lmin, lmed) {
    for (t = 1; t <= n[k]; t++) a[t] = thr[k, t]
    m = median(a, n[k])
    for (t = 1; t <= n[k]; t++) a[t] = ld[k, t]
    lmed = median(a, n[k]); lmin = a[1]
    printf "%-5s %-7s %10.0f %6.2f %9.1f %6.3f %6.3f %8s  %s\n", b, substr(k, 1, index(k, " ") - 1),
           m, ref ? m / ref : 1.0, rss[k], lmin, lmed, acc[k], runs[k]
    return m
}
END {
    printf "%-5s %-7s %10s %6s %9s %6s %6s %8s  %s\n", "batch", "program", "samples/s", "ratio",
           "RSS MB", "load", "load", "test", "samples/s of each run"
    printf "%-5s %-7s %10s %6s %9s %6s %6s %8s\n", "", "", "(median)", "", "(peak)", "(min)",
           "(med)", "acc %"
    for (i = 1; i <= nb; i++) {
        b = order[i]
        for (t = 1; t <= n["torch " b]; t++) a[t] = thr["torch " b, t]
        mt = median(a, n["torch " b])
        row("libddp " b, b, mt)
        row("torch " b, b, 0)
    }
}' "$tmp/rows"
