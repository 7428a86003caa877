#!/bin/sh
# Runs every cmocka test binary of a build folder and prints one summary line:
#   tests: N passed, N failed, N skipped
# Usage: sh tests/run.sh BUILD_DIR [NAME_FILTER]
# Each binary gets DDP_TEST_BUILD (to find helper programs) and a time limit,
# and all share a fresh decompressed-data cache (DDP_DATA_CACHE_DIR), removed
# at the end: the fixtures' data sets never reach the user's own cache.
# Exit status 0 only when no test failed and at least one ran: a missing
# build folder, or a filter that matches nothing, is an error, not "0 passed".
build=${1:-build}
filter=${2:-}
limit=${DDP_TEST_TIMEOUT:-900}
if [ ! -d "$build" ]; then
    echo "tests/run.sh: no build folder '$build' (build it first: make, or make SAN=1 for build-asan)" >&2
    exit 1
fi
export DDP_TEST_BUILD="$build"
passed=0; failed=0; skipped=0; binaries=0; broken=""
log=$(mktemp)
DDP_DATA_CACHE_DIR=$(mktemp -d)
export DDP_DATA_CACHE_DIR
trap 'rm -rf "$log" "$DDP_DATA_CACHE_DIR"' EXIT
# The last "[  WORD  ] N test(s)" count of cmocka's output in $log, 0 without.
count() {
    n=$(sed -n "s/^\[  $1 *\] \([0-9][0-9]*\) test.*/\1/p" "$log" | tail -n 1)
    echo "${n:-0}"
}
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d) continue ;; esac
    name=$(basename "$t")
    [ -n "$filter" ] && case "$name" in *"$filter"*) ;; *) continue ;; esac
    binaries=$((binaries + 1))
    start=$(date +%s)
    timeout -k 10 "$limit" "$t" >"$log" 2>&1
    rc=$?
    end=$(date +%s)
    p=$(count PASSED); f=$(count FAILED); s=$(count SKIPPED)
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1   # crashed, timed out, or failed outside a test
    fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$f" -ne 0 ]; then
        broken="$broken $name"
        cat "$log"
        echo "$name: FAILED (exit $rc, $((end - start)) s)"
    else
        [ "$s" -ne 0 ] && grep -i 'skip' "$log" | grep -v 'SKIPPED'
        echo "$name: $p passed$([ "$s" -ne 0 ] && echo ", $s skipped") ($((end - start)) s)"
    fi
done
if [ "$binaries" -eq 0 ]; then
    if [ -n "$filter" ]; then
        echo "tests/run.sh: no test binary in $build/tests matches '$filter'" >&2
    else
        echo "tests/run.sh: no test binaries in $build/tests (build them first: make)" >&2
    fi
    exit 1
fi
if [ $((passed + failed + skipped)) -eq 0 ]; then
    echo "tests/run.sh: $binaries test binaries ran but no test did" >&2
    exit 1
fi
[ -n "$broken" ] && echo "failing:$broken"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
