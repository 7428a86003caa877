#!/bin/sh
# A cluster of N "hosts" (network namespaces on a bridge, every link shaped
# with tbf: bench/netns_common.sh) and what libddp does across it:
#   allreduce  all_reduce scaling over HOSTS hosts (one rank each):
#              ddp-bench-collectives (tcp) against Open MPI's MPI_Allreduce
#              (bench/mpi_allreduce.c under mpirun, orted started in each
#              namespace by bench/netns_rsh.sh; btl self,tcp), alternated
#              REPEATS times, per size the median of the runs' medians
#   link       2 hosts at each of RATES: libddp's and Open MPI's bus
#              bandwidth from 4 MiB, as a share of the link rate
#   train      ddp-mnist (MODELS: 256 = the reference MLP, 2048,2048 = the
#              wide MLP) on 1..HOSTS hosts, one ddprun node per host
#              (--nnodes N --node-rank I), on TRAIN_SAMPLES training
#              samples: step time of DDP against the same ranks computing
#              alone at the same time (no communication: what the hosts'
#              shared 2 vCPUs leave), their difference the communication
#              cost per step, and samples/s
#   powersgd   2 hosts, the wide MLP: step time of fp32 DDP and of PowerSGD
#              rank PSGD_RANK against computing alone; then 3 epochs
#              (EPOCHS) of each on 2 ranks for the test accuracy
#              (unshaped: the same arithmetic, faster)
# Skips (exit 0, saying why) where namespaces cannot be made.
#
# Usage: sh bench/netns_cluster.sh allreduce|link|train|powersgd [REPEATS]  (default 3)
# Env:   BUILD (build), RATE (1gbit), RATES ("1gbit 10gbit"), HOSTS ("2 4 8";
#        train: "1 2 4 8"), MIN_BYTES (4), MAX_BYTES (16M), STEP (4), ITERS
#        (10), MODELS ("256 2048,2048"), TRAIN_SAMPLES (7680), PSGD_RANK (4),
#        PSGD_START (2: one plain step, so that the step time is PowerSGD's),
#        EPOCHS (3), DATA (/usr/share/datasets/fashion-mnist), BATCH (64: samples
#        per rank and step in the step-time runs of train and powersgd; the
#        accuracy runs keep ddp-mnist's 64), BATCHES (powersgd: the step-time
#        runs at each of these batch sizes, on 200 x batch samples, at most
#        60000, unless TRAIN_SAMPLES says; "64 128 256 512": session 19's table)
set -eu
cd "$(dirname "$0")/.."
mode=${1:-}
reps=${2:-3}
build=${BUILD:-build}
rate=${RATE:-1gbit}
batch=${BATCH:-64}
data=${DATA:-/usr/share/datasets/fashion-mnist}
bench="$(pwd)/$build/bin/ddp-bench-collectives"
mnist="$(pwd)/$build/bin/ddp-mnist"
ddprun="$(pwd)/$build/bin/ddprun"
export OPENBLAS_NUM_THREADS=1 DDP_NUM_THREADS=1 OMP_NUM_THREADS=1
case $mode in allreduce | link | train | powersgd) ;; *)
    sed -n '2,/^set -eu/p' "$0" | sed 's/^# \{0,1\}//;$d' >&2; exit 2 ;; esac
[ -x "$mnist" ] && [ -x "$bench" ] || { echo "build first (make)" >&2; exit 1; }
. bench/netns_common.sh
why=$(cluster_check)
if [ -n "$why" ]; then
    echo "netns_cluster: skipped: network namespaces unavailable here ($why)"
    exit 0
fi
tmp=$(mktemp -d)
trap 'cluster_down; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM

# ---- all-reduce: libddp and Open MPI ------------------------------------

have_mpi=0
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    mpicc -O2 -DDDP_WITH_MPI -o "$tmp/mpi_allreduce" bench/mpi_allreduce.c && have_mpi=1
fi

# ddp_sweep N OUT: libddp's all_reduce over hosts 1..N.
ddp_sweep() {
    rm -f "$tmp/store"
    r=$(($1 - 1))
    while [ "$r" -ge 0 ]; do
        cmd="$bench --rank $r --world-size $1 --init-method file://$tmp/store
             --min-bytes ${MIN_BYTES:-4} --max-bytes ${MAX_BYTES:-16M} --step-factor ${STEP:-4}
             --iters ${ITERS:-10} --warmup 2"
        if [ "$r" -eq 0 ]; then ns_run 1 $cmd | grep -v '^#' >"$2"; else ns_run $((r + 1)) $cmd >/dev/null & fi
        r=$((r - 1))
    done
    wait
}

# mpi_sweep N OUT: Open MPI's, one rank per host; its tcp BTL and its
# out-of-band channel on the cluster's network only.
mpi_sweep() {
    hl=$(seq -s, -f "$pfx%g" 1 "$1")
    net=10.215.$id.0/24
    timeout 600 mpirun --allow-run-as-root --mca plm_rsh_agent "$(pwd)/bench/netns_rsh.sh" \
        --host "$hl" -np "$1" --map-by node --mca btl self,tcp --mca btl_tcp_if_include "$net" \
        --mca oob_tcp_if_include "$net" "$tmp/mpi_allreduce" \
        --min-bytes "$(numfmt --from=iec "${MIN_BYTES:-4}")" \
        --max-bytes "$(numfmt --from=iec "${MAX_BYTES:-16M}")" --step-factor "${STEP:-4}" \
        --iters "${ITERS:-10}" | grep -v '^#' >"$2"
}

# med FILES...: "bytes median_us" per size over the runs.
med() {
    cat "$@" | awk '{ v[$1] = v[$1] " " $2; n[$1]++ }
        END { for (b in v) { k = split(substr(v[b], 2), a, " ");
              for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
              print b, a[int((k + 1) / 2)], a[1], a[k] } }' | sort -n
}

# compare N LINKRATE_GBPS TITLE: alternated sweeps, the table.
compare() {
    rm -f "$tmp"/ddp.* "$tmp"/mpi.*
    for i in $(seq "$reps"); do
        ddp_sweep "$1" "$tmp/ddp.$i"
        [ "$have_mpi" = 0 ] || mpi_sweep "$1" "$tmp/mpi.$i"
    done
    med "$tmp"/ddp.* >"$tmp/m.ddp"
    if [ "$have_mpi" = 1 ]; then med "$tmp"/mpi.* >"$tmp/m.mpi"; else : >"$tmp/m.mpi"; fi
    echo "$3"
    printf '%10s %11s %17s %7s %5s %11s %17s %7s %5s %8s\n' bytes libddp_us "(min-max)" GB/s %link \
        ompi_us "(min-max)" GB/s %link ompi/ddp
    awk -v n="$1" -v link="$2" '
        function bw(b, us) { return us > 0 ? b * 2 * (n - 1) / n / us / 1e3 : 0 }
        FILENAME ~ /m.mpi$/ { m[$1] = $2; mlo[$1] = $3; mhi[$1] = $4; next }
        { b[++k] = $1; d[$1] = $2; dlo[$1] = $3; dhi[$1] = $4 }
        END { for (i = 1; i <= k; i++) { s = b[i]
            printf "%10d %11.1f %8.1f-%-8.1f %7.3f %4.0f%% %11.1f %8.1f-%-8.1f %7.3f %4.0f%% %7.2fx\n", s,
                   d[s], dlo[s], dhi[s], bw(s, d[s]), 100 * bw(s, d[s]) / link, m[s], mlo[s], mhi[s],
                   bw(s, m[s]), 100 * bw(s, m[s]) / link, (d[s] > 0 ? m[s] / d[s] : 0) } }
    ' "$tmp/m.mpi" "$tmp/m.ddp"
}

gbps() { echo "$1" | awk '{ u = tolower($1); m = u ~ /gbit/ ? 1 : u ~ /mbit/ ? 1e-3 : 1e-6; print $1 * m / 8 }'; }

if [ "$have_mpi" = 0 ] && [ "$mode" = allreduce -o "$mode" = link ]; then
    echo "(no mpicc/mpirun: libddp alone)"
fi

# ---- training -------------------------------------------------------------

. bench/mnist_subset.sh # subset K DIR: the first K training samples

# us_step FILE: rank 0's wall time per step from DDP_MNIST_PROFILE.
us_step() { sed -n 's/^Profile rank 0: [0-9]* steps, \([0-9.]*\) us\/step.*/\1/p' "$1" | head -n 1; }
thr() { sed -n 's/^Throughput: \([0-9.]*\) samples\/s$/\1/p' "$1"; }
acc() { sed -n 's/^Test accuracy: \([0-9.]*\) %$/\1/p' "$1"; }

# ddp_job N DIR OUT FLAGS...: ddp-mnist across hosts 1..N, one ddprun node
# each (static rendezvous at host 1); rank 0's output in OUT.
ddp_job() {
    n=$1 d=$2 out=$3
    shift 3
    port=$((20000 + ($$ + $(date +%N | cut -c1-4)) % 20000))
    i=$n
    while [ "$i" -ge 1 ]; do
        cmd="$ddprun --nnodes $n --node-rank $((i - 1)) --master-addr $(cluster_addr 1)
             --master-port $port $mnist --data $d --no-progress $*"
        if [ "$i" -eq 1 ]; then DDP_MNIST_PROFILE=1 ns_run 1 $cmd >"$out" 2>&1
        else DDP_MNIST_PROFILE=1 ns_run "$i" $cmd >/dev/null 2>&1 & fi
        i=$((i - 1))
    done
    wait
}

# alone_job N DIR OUT FLAGS...: the same N ranks' computation without
# communication: N lone ddp-mnist at once, one per host, each on a 1/N
# share of the samples (its own subset); host 1's output in OUT.
alone_job() {
    n=$1 d=$2 out=$3
    shift 3
    i=$n
    while [ "$i" -ge 1 ]; do
        if [ "$i" -eq 1 ]; then DDP_MNIST_PROFILE=1 ns_run 1 $mnist --data "$d" --no-progress "$@" >"$out" 2>&1
        else DDP_MNIST_PROFILE=1 ns_run "$i" $mnist --data "$d" --no-progress "$@" >/dev/null 2>&1 & fi
        i=$((i - 1))
    done
    wait
}

# train_table MODEL FLAGS...: rows over HOSTS for one model.
train_row() {
    n=$1 model=$2
    shift 2
    k=${samples:-${TRAIN_SAMPLES:-7680}}
    [ -d "$tmp/data-$k" ] || subset "$k" "$tmp/data-$k"
    [ -d "$tmp/data-$((k / n))" ] || subset $((k / n)) "$tmp/data-$((k / n))"
    : >"$tmp/ddp_us" >"$tmp/alone_us" >"$tmp/thr"
    for i in $(seq "$reps"); do
        if [ "$n" -gt 1 ]; then
            ddp_job "$n" "$tmp/data-$k" "$tmp/o.ddp" --hidden "$model" --epochs 1 --batch-size "$batch" "$@"
            us_step "$tmp/o.ddp" >>"$tmp/ddp_us"
            thr "$tmp/o.ddp" >>"$tmp/thr"
        fi
        alone_job "$n" "$tmp/data-$((k / n))" "$tmp/o.alone" --hidden "$model" --epochs 1 --batch-size "$batch" "$@"
        us_step "$tmp/o.alone" >>"$tmp/alone_us"
        [ "$n" -gt 1 ] || thr "$tmp/o.alone" >>"$tmp/thr"
    done
    m() { sort -n "$1" | awk '{ a[NR] = $1 } END { if (NR) printf "%.0f (%.0f-%.0f)", a[int((NR + 1) / 2)], a[1], a[NR]; else printf "-" }'; }
    d=$(m "$tmp/ddp_us") a=$(m "$tmp/alone_us") t=$(m "$tmp/thr")
    printf '%-10s %5d %24s %24s %9s %8s %20s\n' "$model" "$n" "$d" "$a" \
        "$(echo "$d $a" | awk '$1 != "-" { printf "%.0f", $1 - $3 }')" \
        "$(echo "$d $a" | awk '$1 != "-" { printf "%.2f", $1 / $3 }')" "$t"
}

train_head() {
    printf '%-10s %5s %24s %24s %9s %8s %20s\n' hidden hosts "ddp_us/step (min-max)" \
        "alone_us/step (min-max)" comm_us ratio "samples/s (min-max)"
}

case $mode in
allreduce)
    hosts=${HOSTS:-2 4 8}
    cluster_up "$(echo "$hosts" | tr ' ' '\n' | sort -n | tail -n 1)" "$rate"
    for n in $hosts; do
        compare "$n" "$(gbps "$rate")" "all_reduce float32 sum, $n hosts x 1 rank, every link tbf $rate; median of $reps runs x ${ITERS:-10} iterations"
        echo
    done
    ;;
link)
    cluster_up 2 "$rate"
    for r in ${RATES:-1gbit 10gbit}; do
        cluster_shape "$r"
        MIN_BYTES=${MIN_BYTES:-4M} MAX_BYTES=${MAX_BYTES:-64M} STEP=${STEP:-2} \
            compare 2 "$(gbps "$r")" "all_reduce float32 sum, 2 hosts, links tbf $r; median of $reps runs x ${ITERS:-10} iterations"
        echo
    done
    ;;
train)
    hosts=${HOSTS:-1 2 4 8}
    cluster_up "$(echo "$hosts" | tr ' ' '\n' | sort -n | tail -n 1)" "$rate"
    echo "ddp-mnist, ${TRAIN_SAMPLES:-7680} training samples, batch $batch per rank, every link tbf $rate;"
    echo "alone: the same ranks at once without communication; comm = ddp - alone; median of $reps runs"
    train_head
    for model in ${MODELS:-256 2048,2048}; do
        for n in $hosts; do train_row "$n" "$model"; done
    done
    ;;
powersgd)
    cluster_up 2 "$rate"
    r=${PSGD_RANK:-4} s=${PSGD_START:-2}
    for batch in ${BATCHES:-$batch}; do
        # a sweep: 200 steps' samples per batch size (at most the 60000)
        [ -z "${BATCHES:-}" ] || samples=${TRAIN_SAMPLES:-$((batch > 300 ? 60000 : batch * 200))}
        echo "wide MLP 784-2048-2048-10 on 2 hosts, links tbf $rate, ${samples:-${TRAIN_SAMPLES:-7680}}" \
            "samples, batch $batch per rank; median of $reps runs"
        train_head
        train_row 2 2048,2048
        echo "with --powersgd $r --powersgd-start $s:"
        train_row 2 2048,2048 --powersgd "$r" --powersgd-start "$s"
    done
    e=${EPOCHS:-3}
    for f in "" "--powersgd $r --powersgd-start $s"; do
        "$ddprun" --standalone --nproc-per-node 2 "$mnist" --data "$data" --no-progress \
            --hidden 2048,2048 --epochs "$e" $f >"$tmp/o.acc" 2>&1
        echo "$e epochs, 2 ranks, ${f:-fp32}: test accuracy $(acc "$tmp/o.acc") %"
    done
    ;;
esac
