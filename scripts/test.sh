#!/bin/sh
# The test command: installs dependencies, builds with warnings as errors
# (gcc, and clang for the library), runs every test, then rebuilds with
# address+undefined sanitizers and runs every test again, then a short
# smoke run of the fuzz harnesses (tests/fuzz/run.sh).  The last line is
# the combined summary: "tests: N passed, N failed, N skipped" (exit status
# 0 only when both runs ran tests and none failed, and the fuzz smoke passed).
set -u
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh || exit 1
jobs=$(nproc 2>/dev/null || echo 2)
status=0
out=$(mktemp)
rcs=$(mktemp)
trap 'rm -f "$out" "$rcs"' EXIT

make -j"$jobs" WERROR=1 all >/dev/null || { echo "build failed (gcc)"; exit 1; }
make -j"$jobs" WERROR=1 CC=clang BUILD=build-clang all >/dev/null || { echo "build failed (clang)"; exit 1; }
echo "== tests (gcc -O2)"
{ sh tests/run.sh build; echo $? >>"$rcs"; } | tee -a "$out"
make -j"$jobs" WERROR=1 SAN=1 all >/dev/null || { echo "build failed (sanitizers)"; exit 1; }
echo "== tests (address+undefined sanitizers)"
{ ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    DDP_TEST_SANITIZER=1 sh tests/run.sh build-asan; echo $? >>"$rcs"; } | tee -a "$out"

# Fuzz smoke (tests/fuzz/README.md): each libFuzzer harness replays its
# regression inputs and seed corpus, then fuzzes FUZZ_SMOKE_S seconds.
echo "== fuzz smoke"
make -j"$jobs" fuzz-build >/dev/null 2>&1 || { echo "build failed (fuzz harnesses: make fuzz-build)"; exit 1; }
sh tests/fuzz/run.sh build-fuzz "${FUZZ_SMOKE_S:-8}" || status=1

# run.sh's exit status (the pipe to tee would lose it) and its summary line,
# one per run: a run that printed none (no tests ran) fails the command.
grep -qv '^0$' "$rcs" && status=1
summary='^tests: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped$'
if [ "$(sed -n "s/$summary/x/p" "$out" | wc -l)" -ne 2 ]; then
    echo "scripts/test.sh: a test run printed no summary line (see above)"
    status=1
fi
total() { sed -n "s/$summary/\\$1/p" "$out" | awk '{s+=$1} END {print s+0}'; }
p=$(total 1); f=$(total 2); s=$(total 3)
[ "$f" -eq 0 ] || status=1
echo "tests: $p passed, $f failed, $s skipped"
exit $status
