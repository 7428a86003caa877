#!/bin/sh
# Runs the libFuzzer harnesses of a fuzz build (make fuzz-build: build-fuzz/):
# for each, first every regression input in tests/fuzz/regress/<harness>/
# (inputs that once crashed, hung or blew memory) and the seed corpus
# tests/fuzz/corpus/<harness>/, then SECONDS of fuzzing from that corpus.
# New corpus entries go to a scratch folder, not the committed corpus;
# a crash leaves its input in BUILD/fuzz/artifacts/<harness>/ (copy it
# into regress/ when it is fixed, or before, to keep it failing).
# Open findings in tests/fuzz/known/<harness>/ are replayed and reported
# but do not fail the run (their harness keeps fuzzing around them).
# FUZZ_SEED=N (N > 0) fuzzes from that libFuzzer seed, as CI does so that
# a failure there can be rerun; unset, each run draws a new seed (the line
# of a failed harness names it).  An input that runs over 30 s counts as a
# hang (a tcp_frames input sets up a transport and may wait 8 s, longer
# under ASan on a loaded machine).
# Prints one line per harness and "fuzz: N harnesses, N failed"; exit
# status 0 only when none failed.
# Usage: sh tests/fuzz/run.sh [BUILD [SECONDS [NAME_FILTER]]]   (SECONDS 0: replay only)
build=${1:-build-fuzz}
secs=${2:-60}
filter=${3:-}
here=$(dirname "$0")
limits="-rss_limit_mb=2048 -timeout=30 -malloc_limit_mb=2048"
seed=${FUZZ_SEED:-}
case "$seed" in
    '') ;;
    *[!0-9]* | 0) echo "tests/fuzz/run.sh: FUZZ_SEED=$seed: not a number > 0" >&2; exit 1 ;;
esac
ran=0; failed=0
log=$(mktemp)
scratch=$(mktemp -d)
trap 'rm -rf "$log" "$scratch"' EXIT
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}:abort_on_error=1"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}:halt_on_error=1"
for bin in "$build"/fuzz/fuzz_*; do
    [ -x "$bin" ] || continue
    h=$(basename "$bin" | sed 's/^fuzz_//')
    [ -n "$filter" ] && case "$h" in *"$filter"*) ;; *) continue ;; esac
    ran=$((ran + 1))
    corpus="$here/corpus/$h"
    regress="$here/regress/$h"
    art="$build/fuzz/artifacts/$h/"
    mkdir -p "$art" "$scratch/$h"
    ok=1; what=""
    # Replay: each file run once (no mutation).
    files=$(find "$regress" "$corpus" -type f 2>/dev/null | sort)
    if [ -n "$files" ]; then
        # shellcheck disable=SC2086
        if ! timeout -k 5 300 "$bin" $limits -runs=1 -artifact_prefix="$art" $files >"$log" 2>&1; then
            ok=0; what="replay"
        fi
    fi
    n=$(printf '%s\n' "$files" | grep -c .)
    if [ "$ok" -eq 1 ] && [ "$secs" -gt 0 ]; then
        # shellcheck disable=SC2086
        if ! timeout -k 5 $((secs + 60)) "$bin" $limits -max_total_time="$secs" \
            ${seed:+-seed=$seed} -artifact_prefix="$art" -print_final_stats=1 \
            "$scratch/$h" "$corpus" >"$log" 2>&1; then
            ok=0
            used=$(sed -n 's/^INFO: Seed: \([0-9]*\).*/\1/p' "$log" | head -n 1)
            what="fuzzing, seed ${used:-?}: FUZZ_SEED=${used:-?} sh tests/fuzz/run.sh $build $secs $h"
        fi
    fi
    # Open findings (known/<harness>/): replayed one by one with FUZZ_STRICT=1;
    # reported, not failed, until their fix lands and they move to regress/.
    for k in $(find "$here/known/$h" -type f 2>/dev/null | sort); do
        if FUZZ_STRICT=1 timeout -k 5 120 "$bin" $limits -runs=1 "$k" >/dev/null 2>&1; then
            echo "fuzz_$h: known finding $(basename "$k") NO LONGER FAILS: move it to $regress/"
        else
            echo "fuzz_$h: known finding $(basename "$k") still fails (open; tests/fuzz/README.md)"
        fi
    done
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    if [ "$ok" -eq 1 ]; then
        echo "fuzz_$h: ok ($n inputs replayed$([ "$secs" -gt 0 ] && echo ", ${execs:-?} runs in $secs s"))"
    else
        failed=$((failed + 1))
        tail -n 60 "$log"
        echo "fuzz_$h: FAILED in $what (inputs in $art)"
    fi
done
if [ "$ran" -eq 0 ]; then
    echo "tests/fuzz/run.sh: no fuzz harness in $build/fuzz${filter:+ matches '$filter'} (build them: make fuzz-build)" >&2
    exit 1
fi
echo "fuzz: $ran harnesses, $failed failed"
[ "$failed" -eq 0 ]
