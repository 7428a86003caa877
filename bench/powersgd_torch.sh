#!/bin/sh
# PowerSGD's cost per step in libddp and in PyTorch 1.13, side by side: the
# wide MLP (784-2048-2048-10) on 2 ranks over loopback with PowerSGD of
# rank PSGD_RANK (start 2, so that the timed steps are PowerSGD's), against
# the same 2 processes computing alone at the same time (no communication,
# each on half the samples), alternated ROUNDS times: ddp-mnist and
# bench/ddp_torch.py (torch's DDP over gloo, powerSGD_hook), one thread per
# rank.  On loopback the link costs nothing: what is left over computing
# alone is the compression's own work and the ranks' waits (the figure the
# 1 Gbit/s namespace benchmark, bench/netns_cluster.sh powersgd, measures
# with the link as well).
#
# Usage: sh bench/powersgd_torch.sh [ROUNDS]  (default 5)
# Env:   BUILD (build), BATCH (256, per rank), SAMPLES (25600), PSGD_RANK (4),
#        DATA (/usr/share/datasets/fashion-mnist), PYTHON (/usr/bin/python3)
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-5}
build=${BUILD:-build}
batch=${BATCH:-256}
k=${SAMPLES:-25600}
r=${PSGD_RANK:-4}
data=${DATA:-/usr/share/datasets/fashion-mnist}
py=${PYTHON:-/usr/bin/python3}
ddprun="$build/bin/ddprun" mnist="$build/bin/ddp-mnist"
[ -x "$mnist" ] || { echo "build first (make)" >&2; exit 1; }
[ -d "$data" ] || { echo "powersgd_torch: no data set in $data (DATA=)" >&2; exit 1; }
"$py" -c 'import torch' 2>/dev/null || { echo "powersgd_torch: skipped: no torch in $py"; exit 0; }
export OPENBLAS_NUM_THREADS=1 DDP_NUM_THREADS=1 OMP_NUM_THREADS=1 DDP_MNIST_PROFILE=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. bench/mnist_subset.sh
subset "$k" "$tmp/full"
subset $((k / 2)) "$tmp/half"

# fig OUT: rank 0's us/step in OUT, or the end of OUT and a failure
fig() {
    v=$(sed -n 's/^Profile rank 0: [0-9]* steps, \([0-9.]*\) us\/step.*/\1/p' "$1" | head -n 1)
    [ -n "$v" ] || {
        echo "powersgd_torch: no step time in this run's output:" >&2
        tail -n 5 "$1" >&2
        exit 1
    }
    echo "$v"
}
# job CMD...: CMD on 2 ranks; rank 0's us/step
job() {
    "$ddprun" --standalone --nproc-per-node 2 "$@" --data "$tmp/full" >"$tmp/out" 2>&1 || true
    fig "$tmp/out"
}
# alone CMD...: CMD twice at once, each on half the samples, as one
# process each (no launcher's variables); the first's us/step
alone() {
    env -u WORLD_SIZE -u RANK -u LOCAL_RANK "$@" --data "$tmp/half" >"$tmp/out" 2>&1 &
    env -u WORLD_SIZE -u RANK -u LOCAL_RANK "$@" --data "$tmp/half" >/dev/null 2>&1 || true
    wait || true
    fig "$tmp/out"
}
flags="--hidden 2048,2048 --epochs 1 --batch-size $batch"
psgd="--powersgd $r --powersgd-start 2"
: >"$tmp/rows"
for i in $(seq "$rounds"); do
    l=$(job "$mnist" --no-progress $flags $psgd)
    la=$(alone "$mnist" --no-progress $flags)
    t=$(job "$py" bench/ddp_torch.py $flags $psgd)
    ta=$(alone "$py" bench/ddp_torch.py $flags)
    echo "$l $la $t $ta" | tee -a "$tmp/rows" | awk -v i="$i" '{
        printf "round %d: libddp %.1f / %.1f ms = %.2f   torch %.1f / %.1f ms = %.2f\n",
            i, $1 / 1e3, $2 / 1e3, $1 / $2, $3 / 1e3, $4 / 1e3, $3 / $4 }'
done
echo "wide MLP, 2 ranks on loopback, batch $batch per rank, PowerSGD rank $r;"
echo "step and alone: medians of $rounds rounds; ratio: the median (min-max) of the per-round"
echo "ratios of step time over computing alone"
awk '{ for (c = 1; c <= 4; c++) v[c, NR] = $c; lr[NR] = $1 / $2; tr[NR] = $3 / $4 }
function med(a, n,   i, j, t, b) { for (i = 1; i <= n; i++) b[i] = a[i]
    for (i = 1; i <= n; i++)
        for (j = i + 1; j <= n; j++)
            if (b[j] < b[i]) { t = b[i]; b[i] = b[j]; b[j] = t }
    lo = b[1]; hi = b[n]; return b[int((n + 1) / 2)] }
function col(c, n,   i, a) { for (i = 1; i <= n; i++) a[i] = v[c, i]; return med(a, n) }
END { n = NR
    printf "%-8s %12s %12s %22s\n", "", "step ms", "alone ms", "ratio (min-max)"
    row("libddp", lr, 1, n); row("torch", tr, 3, n) }
function row(name, ratios, c, n,   m, l, h) { m = med(ratios, n); l = lo; h = hi
    printf "%-8s %12.1f %12.1f %12.2f (%.2f-%.2f)\n", name, col(c, n) / 1e3,
        col(c + 1, n) / 1e3, m, l, h }' "$tmp/rows"
