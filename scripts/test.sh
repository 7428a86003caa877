#!/bin/sh
# The test command: installs dependencies, builds with warnings as errors
# (gcc, and clang for the library), runs every test, then rebuilds with
# address+undefined sanitizers and runs every test again, then a short
# smoke run of the fuzz harnesses (tests/fuzz/run.sh), each harness counted
# as one test.  The last line is always the combined summary:
# "tests: N passed, N failed, N skipped" (a build that fails counts as one
# failed test; exit status 0 only when both runs ran tests and none failed,
# and every fuzz harness passed).
set -u
cd "$(dirname "$0")/.." || exit 1
sh scripts/install-deps.sh || exit 1
jobs=$(nproc 2>/dev/null || echo 2)
status=0
extra_p=0; extra_f=0 # the fuzz harnesses and failed builds, beyond run.sh's counts
out=$(mktemp)
rcs=$(mktemp)
fuzz=$(mktemp)
trap 'rm -f "$out" "$rcs" "$fuzz"' EXIT
summary='^tests: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped$'
total() { sed -n "s/$summary/\\$1/p" "$out" | awk '{s+=$1} END {print s+0}'; }
# The summary of what ran so far; exits with the status.
finish() {
    p=$(($(total 1) + extra_p)); f=$(($(total 2) + extra_f)); s=$(total 3)
    [ "$f" -eq 0 ] || status=1
    echo "tests: $p passed, $f failed, $s skipped"
    exit $status
}
# A build that failed: no test can run after it.
build_failed() {
    echo "build failed ($1)"
    extra_f=$((extra_f + 1)); status=1
    finish
}

make -j"$jobs" WERROR=1 all >/dev/null || build_failed gcc
make -j"$jobs" WERROR=1 CC=clang BUILD=build-clang all >/dev/null || build_failed clang
echo "== tests (gcc -O2)"
{ sh tests/run.sh build; echo $? >>"$rcs"; } | tee -a "$out"
make -j"$jobs" WERROR=1 SAN=1 all >/dev/null || build_failed sanitizers
echo "== tests (address+undefined sanitizers)"
{ ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    DDP_TEST_SANITIZER=1 sh tests/run.sh build-asan; echo $? >>"$rcs"; } | tee -a "$out"

# run.sh's exit status (the pipe to tee would lose it) and its summary line,
# one per run: a run that printed none (no tests ran) fails the command.
grep -qv '^0$' "$rcs" && status=1
if [ "$(sed -n "s/$summary/x/p" "$out" | wc -l)" -ne 2 ]; then
    echo "scripts/test.sh: a test run printed no summary line (see above)"
    status=1
fi

# Fuzz smoke (tests/fuzz/README.md): each libFuzzer harness replays its
# regression inputs and seed corpus, then fuzzes FUZZ_SMOKE_S seconds from
# a fixed seed (FUZZ_SEED, default 1), so that a failure here reruns the
# same way; new findings come from longer runs (make fuzz), not from CI.
echo "== fuzz smoke"
if ! make -j"$jobs" fuzz-build >/dev/null 2>&1; then
    echo "build failed (fuzz harnesses: make fuzz-build)"
    extra_f=$((extra_f + 1)); status=1
else
    FUZZ_SEED=${FUZZ_SEED:-1} sh tests/fuzz/run.sh build-fuzz "${FUZZ_SMOKE_S:-8}" | tee "$fuzz"
    h=$(sed -n 's/^fuzz: \([0-9]*\) harnesses, [0-9]* failed$/\1/p' "$fuzz")
    hf=$(sed -n 's/^fuzz: [0-9]* harnesses, \([0-9]*\) failed$/\1/p' "$fuzz")
    if [ -z "$h" ] || [ -z "$hf" ]; then
        echo "scripts/test.sh: the fuzz smoke printed no summary line (see above)"
        extra_f=$((extra_f + 1))
    else
        extra_p=$((extra_p + h - hf)); extra_f=$((extra_f + hf))
    fi
fi
finish
