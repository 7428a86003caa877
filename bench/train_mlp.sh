#!/bin/sh
# Single-process training-step throughput, libddp against PyTorch, side by
# side (alternating runs, so that noise from other processes hits both):
# Sequential(Linear(784,256), ReLU, Linear(256,10)), CrossEntropyLoss,
# SGD(lr=0.01), synthetic data, one BLAS thread each.
# Usage: sh bench/train_mlp.sh [BUILD_DIR] [ROUNDS]   (default: build 3)
# Env:   DDP_BENCH_SECONDS per measurement (default 2); PYTHON (default
#        /usr/bin/python3, the Debian python with python3-torch).
set -eu
build=${1:-build}
rounds=${2:-3}
py=${PYTHON:-/usr/bin/python3}
here=$(dirname "$0")
bin="$build/bench/train_mlp"
[ -x "$bin" ] || { echo "train_mlp.sh: $bin not built (make all)" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 DDP_NUM_THREADS=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! "$py" -c "import torch" 2>/dev/null; then
    echo "train_mlp.sh: $py cannot import torch; running libddp only" >&2
    py=""
fi
for r in $(seq "$rounds"); do
    for batch in 64 256; do
        "$bin" "$batch" | tee -a "$out"
        [ -n "$py" ] && "$py" "$here/train_mlp_torch.py" "$batch" | tee -a "$out"
    done
done
# Median samples/s per (impl, batch) and the ratio.
awk '
{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  k = $1 " " v["batch"]; n[k]++; s[k, n[k]] = v["samples_per_s"] }
END {
  for (k in n) {  # median by insertion sort
    m = n[k]; for (i = 2; i <= m; i++) { x = s[k, i]; j = i - 1
      while (j >= 1 && s[k, j] + 0 > x + 0) { s[k, j + 1] = s[k, j]; j-- } s[k, j + 1] = x }
    med[k] = (m % 2) ? s[k, (m + 1) / 2] : (s[k, m / 2] + s[k, m / 2 + 1]) / 2 }
  for (b = 64; b <= 256; b *= 4) {
    l = med["libddp " b]; t = med["torch " b]; r = med["roof " b]
    printf("batch %d: libddp %.0f samples/s (%.0f%% of its GEMM roof %.0f)", b, l, 100 * l / r, r)
    if (t) printf(", torch %.0f samples/s, ratio %.2fx", t, l / t)
    printf("\n") }
}' "$out"
