#!/bin/sh
# The test command: installs dependencies, builds with warnings as errors
# (gcc, and clang for the library), runs every test, then rebuilds with
# address+undefined sanitizers and runs every test again.  The last line is
# the combined summary: "tests: N passed, N failed".
set -u
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh || exit 1
jobs=$(nproc 2>/dev/null || echo 2)
status=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

make -j"$jobs" WERROR=1 all >/dev/null || { echo "build failed (gcc)"; exit 1; }
make -j"$jobs" WERROR=1 CC=clang BUILD=build-clang all >/dev/null || { echo "build failed (clang)"; exit 1; }
echo "== tests (gcc -O2)"
sh tests/run.sh build | tee -a "$out" || status=1
make -j"$jobs" WERROR=1 SAN=1 all >/dev/null || { echo "build failed (sanitizers)"; exit 1; }
echo "== tests (address+undefined sanitizers)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    DDP_TEST_SANITIZER=1 sh tests/run.sh build-asan | tee -a "$out" || status=1

p=$(sed -n 's/^tests: \([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$out" | awk '{s+=$1} END {print s+0}')
f=$(sed -n 's/^tests: \([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$out" | awk '{s+=$1} END {print s+0}')
[ "$f" -eq 0 ] || status=1
echo "tests: $p passed, $f failed"
exit $status
