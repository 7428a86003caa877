#!/bin/sh
# What ddprun's own work costs, in alternated rounds, medians (and range):
#   launch:  a job of N workers that exit at once (ddprun --nproc-per-node N
#            WORKER env DIR), against starting the same N processes from sh
#   lines:   a worker writing L lines to stderr, forwarded by ddprun plainly,
#            with --log-dir (every line also to a file), and with --log-dir
#            --tee 3 (prefixed on the console too); ratios over plain
#   base:    with BASE=path/to/another/ddprun (an older build), its launch and
#            plain lines too, alternated with these: new/base
# Usage: [BASE=...] sh bench/ddprun_overhead.sh [BUILD] [ROUNDS] [N] [L]
# A base build of main's single-file ddprun, for instance:
#   git show main:tools/ddprun.c >/tmp/ddprun-base.c && cc -O2 -D_GNU_SOURCE -o /tmp/ddprun-base /tmp/ddprun-base.c
build=${1:-build}
rounds=${2:-9}
n=${3:-4}
lines=${4:-200000}
ddprun="$build/bin/ddprun"
worker="$build/tests/helpers/ddprun_worker"
[ -x "$ddprun" ] && [ -x "$worker" ] || { echo "build first: make" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

t() { date +%s.%N; }
# Runs "$@" quietly and appends its wall time in ms to file $1's list.
timed() {
    out=$1; shift
    a=$(t); "$@" >/dev/null 2>&1; b=$(t)
    echo "$a $b" | awk '{printf "%.3f\n", ($2 - $1) * 1000}' >>"$tmp/$out"
}
direct() { # the same N processes from sh, waited for
    i=0
    while [ "$i" -lt "$n" ]; do RANK=$i "$worker" env "$tmp/d" & i=$((i + 1)); done
    wait
}
mkdir -p "$tmp/d"
for r in $(seq "$rounds"); do
    timed launch_sh direct
    timed launch_ddprun "$ddprun" --nproc-per-node "$n" "$worker" env "$tmp/d"
    timed lines_plain "$ddprun" "$worker" spam "$lines" 0
    timed lines_logs "$ddprun" --log-dir "$tmp/logs" "$worker" spam "$lines" 0
    timed lines_tee "$ddprun" --log-dir "$tmp/logs" --tee 3 "$worker" spam "$lines" 0
    if [ -n "$BASE" ]; then
        timed launch_base "$BASE" --nproc-per-node "$n" "$worker" env "$tmp/d"
        timed lines_base "$BASE" "$worker" spam "$lines" 0
    fi
done
med() { sort -n "$tmp/$1" | awk '{v[NR]=$1} END {printf "%.1f ms (%.1f-%.1f)", v[int((NR+1)/2)], v[1], v[NR]}'; }
medv() { sort -n "$tmp/$1" | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
ratio() { echo "$(medv "$1") $(medv "$2")" | awk '{printf "%.2f", $1 / $2}'; }
echo "rounds $rounds, $n workers, $lines lines; median (min-max) wall time"
echo "launch  sh:     $(med launch_sh)"
echo "launch  ddprun: $(med launch_ddprun)   ddprun/sh $(ratio launch_ddprun launch_sh)"
echo "lines   plain:  $(med lines_plain)"
echo "lines   logs:   $(med lines_logs)   logs/plain $(ratio lines_logs lines_plain)"
echo "lines   tee:    $(med lines_tee)   tee/plain $(ratio lines_tee lines_plain)"
if [ -n "$BASE" ]; then
    echo "launch  base:   $(med launch_base)   new/base $(ratio launch_ddprun launch_base)"
    echo "lines   base:   $(med lines_base)   new/base $(ratio lines_plain lines_base)"
fi
