#!/bin/sh
# One collective, two builds of libddp (say a base commit built in another
# folder, and this tree), alternated round by round on loopback so that noise
# from other processes on the machine hits both alike.  Prints per size each
# build's medians (one per round, sorted) and the per-round ratios B/A,
# sorted: the middle one is the median ratio.
#
#   sh bench/collective_ab.sh A_BIN B_BIN [N TRANSPORT COLLECTIVE MIN MAX ROUNDS ITERS]
#
# A_BIN, B_BIN: folders holding ddp-bench-collectives (e.g. build/bin).
# Defaults: 3 ranks, tcp, reduce_scatter, 16 MiB to 64 MiB (step 4), 8
# rounds of 10 iterations.  A base build:
#   git archive COMMIT | tar -x -C /tmp/base && make -C /tmp/base build/bin/ddp-bench-collectives
set -e
A=$1
B=$2
N=${3:-3}
T=${4:-tcp}
C=${5:-reduce_scatter}
MIN=${6:-16777216}
MAX=${7:-67108864}
ROUNDS=${8:-8}
ITERS=${9:-10}
[ -x "$A/ddp-bench-collectives" ] && [ -x "$B/ddp-bench-collectives" ] || {
    echo "usage: $0 A_BIN B_BIN [N TRANSPORT COLLECTIVE MIN MAX ROUNDS ITERS]" >&2
    exit 2
}
D=$(mktemp -d /tmp/ddp_ab.XXXXXX)
trap 'rm -rf "$D"' EXIT
i=0
while [ "$i" -lt "$ROUNDS" ]; do
    i=$((i + 1))
    for v in A B; do
        eval bin=\$$v
        r=$((N - 1))
        while [ "$r" -ge 0 ]; do
            DDP_TRANSPORT=$T "$bin/ddp-bench-collectives" --rank "$r" --world-size "$N" \
                --init-method "file://$D/store.$v.$i" --collective "$C" --min-bytes "$MIN" \
                --max-bytes "$MAX" --step-factor 4 --iters "$ITERS" >"$D/out.$r" &
            r=$((r - 1))
        done
        wait
        grep -v '^#' "$D/out.0" | sed "s/^/$v $i /" >>"$D/all"
    done
done
echo "# $C, $N ranks, $T; $ROUNDS alternated rounds of $ITERS iterations (median each)"
echo "# A=$A B=$B; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for s in $(awk '{print $3}' "$D/all" | sort -nu); do
    for v in A B; do
        printf '%s %10s us: ' "$v" "$s"
        awk -v s="$s" -v v="$v" '$1 == v && $3 == s { print $4 }' "$D/all" | sort -n | tr '\n' ' '
        echo
    done
    printf 'B/A %10s   : ' "$s"
    awk -v s="$s" '$3 == s { t[$1, $2] = $4; r[$2] = 1 }
        END { for (i in r) printf "%.2f\n", t["B", i] / t["A", i] }' "$D/all" | sort -n |
        tr '\n' ' '
    echo
done
