#!/bin/sh
# ZeRO memory and throughput benchmark: DDP, ZeRO-1, ZeRO-2 and ZeRO-2 with
# a one-buffer gradient pool (zero2p1) with Adam on an MLP
# 784-4096-4096-4096-10 (about 37 M parameters), 2 and 4 ranks on this
# host, in alternated rounds (ddp, zero1, zero2, zero2p1, ddp, ...) so that
# the machine's noise falls on all modes alike.  Per world size and mode:
# the medians over the rounds of the optimizer state per rank, the peak RSS
# per rank (VmHWM, the largest rank's), samples/s over the timed steps and
# from the median step, and the CPU time per step of all ranks together,
# each against DDP's of the same round (median of the per-round ratios,
# with their range for the throughput), plus the load average before each
# round (the machine is shared).  The decisive throughput column is "med x
# DDP": per round, the median step's samples/s over DDP's, so that a burst
# of load on a few steps moves it little; the whole-run ratio beside it.
# Peak RSS is the whole run's (the model's construction included, where
# every parameter is alive twice for a moment: the largest layer's
# parameter and gradient), train RSS the training steps' own high-water mark.
#   sh bench/zero_mem.sh [BUILD] [ROUNDS] [STEPS] [BATCH]
# Defaults 5 rounds of 15 timed steps (after 2 warm-up steps) at batch 32
# per rank: about 9-10 minutes on a quiet 2-vCPU host.  MODES="ddp zero2"
# picks the modes (ddp first: the ratios are against it); WORLDS="2" the
# world sizes (default "2 4").
build=${1:-build}
rounds=${2:-5}
steps=${3:-15}
batch=${4:-32}
modes=${MODES:-ddp zero1 zero2 zero2p1}
case " $modes " in
*" ddp "*) ;;
*) echo "zero_mem.sh: MODES must include ddp (every ratio is against it)" >&2; exit 2 ;;
esac
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for world in ${WORLDS:-2 4}; do
    for r in $(seq "$rounds"); do
        load=$(cut -d' ' -f1 /proc/loadavg)
        for mode in $modes; do
            line=$("$build"/bin/ddprun --standalone --nproc-per-node "$world" \
                "$build"/bench/zero_mem --mode "$mode" --steps "$steps" --warmup 2 \
                --batch "$batch") || { echo "zero_mem.sh: $mode on $world ranks failed" >&2; exit 1; }
            echo "$line round=$r load=$load" >>"$out"
        done
    done
done
echo "zero_mem.sh: MLP 784-4096x3-10 with Adam, batch $batch per rank, $steps timed steps, $rounds rounds, load $(cut -d' ' -f1-3 /proc/loadavg) at the end ($(date -u +%Y-%m-%dT%H:%MZ))"
awk -v modes="$modes" '
function val(k,   i, a) { for (i = 1; i <= NF; i++) { split($i, a, "="); if (a[1] == k) return a[2] } }
function med(s,   n, v, i, j, t) {
    n = split(s, v, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
function lo(s,   n, v, i, m) { n = split(s, v, " "); m = v[1]; for (i = 2; i <= n; i++) if (v[i] + 0 < m + 0) m = v[i]; return m }
function hi(s,   n, v, i, m) { n = split(s, v, " "); m = v[1]; for (i = 2; i <= n; i++) if (v[i] + 0 > m + 0) m = v[i]; return m }
function q(a, b) { return b > 0 ? a / b : 0 }
{
    w = val("world"); m = val("mode"); r = val("round"); k = w SUBSEP m
    st[k] = st[k] " " val("state_bytes"); rss[k] = rss[k] " " val("peak_rss"); sps[k] = sps[k] " " val("samples_per_s")
    trs[k] = trs[k] " " val("train_rss"); smed[k] = smed[k] " " val("samples_per_s_med"); cpu[k] = cpu[k] " " val("cpu_ms_per_step")
    v_trs[k, r] = val("train_rss"); v_st[k, r] = val("state_bytes"); v_rss[k, r] = val("peak_rss")
    v_sps[k, r] = val("samples_per_s"); v_med[k, r] = val("samples_per_s_med"); v_cpu[k, r] = val("cpu_ms_per_step")
    if (m == "ddp") loads[w] = loads[w] " " val("load"); worlds[w] = 1; if (r > nr) nr = r
}
END {
    printf "%-5s %-7s %8s %6s %8s %6s %8s %6s %9s %6s %9s %18s %7s %6s\n", "ranks", "mode", "state MB", "x DDP", "peak MB", "x DDP", "train MB", "x DDP", "samples/s", "x DDP", "med smp/s", "med x DDP [range]", "CPU ms", "x DDP"
    nm = split(modes, ms, " ")
    for (w = 2; w <= 4; w += 2) {
        if (!(w in worlds)) continue
        for (i = 1; i <= nm; i++) {
            m = ms[i]; k = w SUBSEP m; d = w SUBSEP "ddp"; rs = ""; rr = ""; rp = ""; rt = ""; rm = ""; rc = ""
            for (r = 1; r <= nr; r++) {
                rs = rs " " q(v_st[k, r], v_st[d, r]); rr = rr " " q(v_rss[k, r], v_rss[d, r]); rp = rp " " q(v_sps[k, r], v_sps[d, r])
                rt = rt " " q(v_trs[k, r], v_trs[d, r]); rm = rm " " q(v_med[k, r], v_med[d, r]); rc = rc " " q(v_cpu[k, r], v_cpu[d, r])
            }
            printf "%-5d %-7s %8.1f %6.3f %8.1f %6.3f %8.1f %6.3f %9.1f %6.3f %9.1f %7.3f [%.2f-%.2f] %7.0f %6.3f\n", w, m, med(st[k]) / 1e6, med(rs),
                   med(rss[k]) / 1e6, med(rr), med(trs[k]) / 1e6, med(rt), med(sps[k]), med(rp), med(smed[k]), med(rm), lo(rm), hi(rm), med(cpu[k]), med(rc)
        }
        printf "      load average (1 min) before each round on %d ranks:%s\n", w, loads[w] ? substr(loads[w], 1) : ""
    }
}' "$out"
