#!/bin/sh
# Single-process training-step throughput, libddp against PyTorch, side by
# side: Sequential(Linear(784,256), ReLU, Linear(256,10)), CrossEntropyLoss,
# SGD(lr=0.01), synthetic data, one BLAS thread each.  Each round runs
# libddp (step, then its GEMM roof) and then PyTorch for every batch size;
# rounds alternate so that load from other processes hits both sides.
# Usage: sh bench/train_mlp.sh [BUILD_DIR] [ROUNDS]   (default: build 5)
# Env:   DDP_BENCH_SECONDS per measurement (default 2); PYTHON (default
#        /usr/bin/python3, the Debian python with python3-torch);
#        OPENBLAS_CORETYPE passes through to both sides (unset: the kernels
#        ddprun would give its workers, bench/blas_env.sh).
# Summary per batch size: best and median samples/s of each side over the
# rounds, the libddp/torch ratio of the bests and the median of the
# per-round ratios, and libddp's step as a share of its own GEMM roof.
set -eu
build=${1:-build}
rounds=${2:-5}
py=${PYTHON:-/usr/bin/python3}
here=$(dirname "$0")
bin="$build/bench/train_mlp"
[ -x "$bin" ] || { echo "train_mlp.sh: $bin not built (make all)" >&2; exit 1; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 DDP_NUM_THREADS=1
. "$here/blas_env.sh"
[ ! -x "$build/bin/ddprun" ] || blas_env "$build/bin/ddprun"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! "$py" -c "import torch" 2>/dev/null; then
    echo "train_mlp.sh: $py cannot import torch; running libddp only" >&2
    py=""
fi
for r in $(seq "$rounds"); do
    "$bin" 64 256 | sed "s/^/round=$r /" | tee -a "$out"
    [ -n "$py" ] && "$py" "$here/train_mlp_torch.py" 64 256 | sed "s/^/round=$r /" | tee -a "$out"
done
awk '
function med(a, m,   i, j, x) {  # median of a[1..m], by insertion sort
  for (i = 2; i <= m; i++) { x = a[i]; j = i - 1
    while (j >= 1 && a[j] + 0 > x + 0) { a[j + 1] = a[j]; j-- } a[j + 1] = x }
  return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
{ delete v; for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  split($1, rr, "="); r = rr[2]; who = $2
  val[who, v["batch"], r] = v["samples_per_s"]; seen[v["batch"]] = 1
  if (r > nr) nr = r }
END {
  for (b in seen) {
    split("", L); split("", T); split("", R); split("", Q); nl = nt = nq = 0; bl = bt = br = 0
    for (r = 1; r <= nr; r++) {
      l = val["libddp", b, r]; t = val["torch", b, r]; f = val["roof", b, r]
      if (l) { L[++nl] = l; if (l > bl) bl = l }
      if (f) { if (f > br) br = f; if (l) Q[++nq] = l / f }
      if (t) { T[++nt] = t; if (t > bt) bt = t; if (l) R[nt] = l / t }
    }
    printf("batch %d: libddp best %.0f, median %.0f samples/s (median %.0f%% of its GEMM roof, best roof %.0f)",
           b, bl, med(L, nl), 100 * med(Q, nq), br)
    if (nt) printf("; torch best %.0f, median %.0f samples/s; ratio of bests %.2fx, median ratio %.2fx",
                   bt, med(T, nt), bl / bt, med(R, nt))
    printf("\n") }
}' "$out" | sort -t' ' -k2 -n
