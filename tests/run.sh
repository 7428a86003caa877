#!/bin/sh
# Runs every cmocka test binary of a build folder and prints one summary line:
#   tests: N passed, N failed
# Usage: sh tests/run.sh BUILD_DIR [NAME_FILTER]
# Each binary gets DDP_TEST_BUILD (to find helper programs) and a time limit,
# and all share a fresh decompressed-data cache (DDP_DATA_CACHE_DIR), removed
# at the end: the fixtures' data sets never reach the user's own cache.
build=${1:-build}
filter=${2:-}
limit=${DDP_TEST_TIMEOUT:-900}
export DDP_TEST_BUILD="$build"
passed=0; failed=0; broken=""
log=$(mktemp)
DDP_DATA_CACHE_DIR=$(mktemp -d)
export DDP_DATA_CACHE_DIR
trap 'rm -rf "$log" "$DDP_DATA_CACHE_DIR"' EXIT
for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d) continue ;; esac
    name=$(basename "$t")
    [ -n "$filter" ] && case "$name" in *"$filter"*) ;; *) continue ;; esac
    start=$(date +%s)
    timeout -k 10 "$limit" "$t" >"$log" 2>&1
    rc=$?
    end=$(date +%s)
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
    p=${p:-0}; f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1   # crashed, timed out, or failed outside a test
    fi
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$f" -ne 0 ]; then
        broken="$broken $name"
        cat "$log"
        echo "$name: FAILED (exit $rc, $((end - start)) s)"
    else
        echo "$name: $p passed ($((end - start)) s)"
    fi
done
[ -n "$broken" ] && echo "failing:$broken"
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
