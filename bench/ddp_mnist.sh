#!/bin/sh
# DDP benchmark of the reference program against PyTorch DDP, side by side:
#   libddp-2  ddprun --nproc-per-node 2 ddp-mnist            (DDP over tcp)
#   torch-2   ddprun --nproc-per-node 2 bench/ddp_torch.py   (torch 1.13 DDP, gloo)
#   libddp-1  ddp-mnist on one process (for the scaling ratio)
#   libddp-1x2  two independent one-process runs at once (no communication:
#             what sharing the machine costs; throughputs summed)
# one epoch of Fashion-MNIST at batch 64 per rank, one thread per rank,
# alternating, REPEATS times.  Reports median global samples/s, the ratios,
# launch to first step (from just before the launcher starts to rank 0's
# first completed step), peak RSS per rank, and test accuracy; then each
# libddp run's per-step profile by rank (DDP_MNIST_PROFILE: wall time per
# phase, and CPU time of the training thread and of the process's other
# threads: loader workers, the process group's thread).
#
# Usage: sh bench/ddp_mnist.sh [REPEATS]   (default 3)
# Env:   BUILD (default build), PYTHON (default /usr/bin/python3)
set -eu
cd "$(dirname "$0")/.."
reps=${1:-3}
build=${BUILD:-build}
py=${PYTHON:-/usr/bin/python3}
export OPENBLAS_NUM_THREADS=1 DDP_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_MNIST_TIMESTAMPS=1
export DDP_MNIST_PROFILE=1
. bench/blas_env.sh
blas_env "$build/bin/ddprun"
[ -x "$build/bin/ddp-mnist" ] || { echo "build first (make)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/profile"

# run NAME CMD...: appends "NAME samples/s first_step_s max_rss_MB acc" to $tmp/rows
run() {
    name=$1
    shift
    t0=$(date +%s.%N)
    "$@" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/out" "$tmp/err" >&2; exit 1; }
    thr=$(sed -n 's/^Throughput: \([0-9.]*\) samples\/s$/\1/p' "$tmp/out")
    first=$(sed -n 's/^First step at: \([0-9.]*\)$/\1/p' "$tmp/out")
    acc=$(sed -n 's/^Test accuracy: \([0-9.]*\) %$/\1/p' "$tmp/out")
    rss=$(sed -n 's/^RSS \([0-9]*\)$/\1/p' "$tmp/err" | sort -n | tail -n 1)
    sed -n "s/^Profile /$name run $((i + 1)): /p" "$tmp/err" >>"$tmp/profile"
    echo "$name $thr $(awk "BEGIN{printf \"%.3f\", $first - $t0}") \
$(awk "BEGIN{printf \"%.1f\", $rss/1024}") $acc" >>"$tmp/rows"
}

# pair_mnist: two independent one-process runs at the same time; prints
# their summed throughput, and the first run's other lines.
pair_mnist() {
    /usr/bin/time -f "RSS %M" "$build/bin/ddp-mnist" --epochs 1 >"$tmp/pa" 2>"$tmp/pa.err" &
    pid=$!
    /usr/bin/time -f "RSS %M" "$build/bin/ddp-mnist" --epochs 1 >"$tmp/pb" 2>"$tmp/pb.err" || return 1
    wait "$pid" || return 1
    sed 's/^Profile rank 0/Profile process b/' "$tmp/pb.err" >&2
    sed 's/^Profile rank 0/Profile process a/' "$tmp/pa.err" >&2
    awk '/^Throughput:/ { s += $2; next } FNR == NR { print } END { printf "Throughput: %.0f samples/s\n", s }' \
        "$tmp/pa" "$tmp/pb"
}

echo "ddp-mnist (libddp) vs PyTorch $("$py" -c 'import torch; print(torch.__version__)') DDP," \
     "1 epoch, batch 64 per rank, lr 0.1, $reps runs each, $(getconf _NPROCESSORS_ONLN) CPUs"
i=0
while [ "$i" -lt "$reps" ]; do
    run libddp-2 "$build/bin/ddprun" --standalone --nproc-per-node 2 \
        /usr/bin/time -f "RSS %M" "$build/bin/ddp-mnist" --epochs 1
    run torch-2 "$build/bin/ddprun" --standalone --nproc-per-node 2 \
        /usr/bin/time -f "RSS %M" "$py" bench/ddp_torch.py --epochs 1
    run libddp-1 /usr/bin/time -f "RSS %M" "$build/bin/ddp-mnist" --epochs 1
    run libddp-1x2 pair_mnist
    i=$((i + 1))
done

awk '
function median(arr, n,   i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && arr[j-1] > arr[j]; j--) {
        t = arr[j]; arr[j] = arr[j-1]; arr[j-1] = t }
    return n % 2 ? arr[(n+1)/2] : (arr[n/2] + arr[n/2+1]) / 2
}
{ n[$1]++; thr[$1, n[$1]] = $2; fs[$1, n[$1]] = $3; runs[$1] = runs[$1] " " int($2)
  if ($4 > rss[$1]) rss[$1] = $4; acc[$1] = $5 }
END {
    printf "%-10s %12s %-24s %14s %12s %9s\n", "run", "samples/s", "(each run)", "first step s",
           "peak RSS MB", "accuracy"
    split("libddp-2 torch-2 libddp-1 libddp-1x2", order, " ")
    for (k = 1; k <= 4; k++) {
        r = order[k]; m = n[r]
        for (i = 1; i <= m; i++) { a[i] = thr[r, i]; b[i] = fs[r, i] }
        med[r] = median(a, m); first[r] = median(b, m)
        printf "%-10s %12.0f %-24s %14.3f %12.1f %9s\n", r, med[r], runs[r], first[r], rss[r], acc[r]
    }
    printf "libddp-2 / torch-2: %.2fx samples/s, %.1fx faster to first step, %.1fx less memory\n",
           med["libddp-2"] / med["torch-2"], first["torch-2"] / first["libddp-2"],
           rss["torch-2"] / rss["libddp-2"]
    printf "libddp-2 / libddp-1: %.2fx samples/s (2 ranks against 1)\n",
           med["libddp-2"] / med["libddp-1"]
    printf "libddp-1x2 / libddp-1: %.2fx (two processes, no communication: the machine)\n",
           med["libddp-1x2"] / med["libddp-1"]
    printf "libddp-2 / libddp-1x2: %.2fx (what DDP costs beyond sharing the machine)\n",
           med["libddp-2"] / med["libddp-1x2"]
}' "$tmp/rows"
echo "per-step profile, us (wall per phase; cpu: training thread, other threads):"
sed 's/^/  /' "$tmp/profile"
