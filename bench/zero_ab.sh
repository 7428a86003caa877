#!/bin/sh
# A change to ZeRO against a base build, both against DDP, in alternated
# rounds: each round runs DDP (the new build), the base build's MODE and the
# new build's MODE on WORLD ranks (bench/zero_mem: 784-4096x3-10 with Adam,
# batch 32 per rank, 2 warm-up steps), and prints per round the median
# step's samples/s of each MODE over DDP's of the same round, then the
# medians over the rounds.  The machine's noise falls on all three alike.
#   sh bench/zero_ab.sh BASE_BUILD NEW_BUILD [ROUNDS] [STEPS] [MODE] [WORLD]
# e.g. git worktree add /tmp/base REV && make -C /tmp/base all, then
#   sh bench/zero_ab.sh /tmp/base/build build 6 15 zero2 2
base=${1:?usage: zero_ab.sh BASE_BUILD NEW_BUILD [ROUNDS] [STEPS] [MODE] [WORLD]}
new=${2:?usage: zero_ab.sh BASE_BUILD NEW_BUILD [ROUNDS] [STEPS] [MODE] [WORLD]}
rounds=${3:-6}
steps=${4:-15}
mode=${5:-zero2}
world=${6:-2}
. "$(dirname "$0")/blas_env.sh"
blas_env "$new/bin/ddprun" # the base build's ranks too, whatever its ddprun does
run() { # BUILD MODE: the median step's samples/s
    "$1"/bin/ddprun --standalone --nproc-per-node "$world" "$1"/bench/zero_mem --mode "$2" \
        --steps "$steps" --warmup 2 --batch 32 | sed -n 's/.*samples_per_s_med=\([0-9.]*\).*/\1/p'
}
for r in $(seq "$rounds"); do
    d=$(run "$new" ddp) b=$(run "$base" "$mode") n=$(run "$new" "$mode")
    [ -n "$d" ] && [ -n "$b" ] && [ -n "$n" ] || { echo "zero_ab.sh: a run failed" >&2; exit 1; }
    echo "$r $d $b $n"
done | awk -v mode="$mode" -v world="$world" '
function med(a, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ n++; bs[n] = $3 / $2; ns[n] = $4 / $2
  printf "round %d: ddp %.1f samples/s, base %s/ddp %.3f, new %s/ddp %.3f\n", $1, $2, mode, bs[n], mode, ns[n] }
END { b = med(bs, n); m = med(ns, n)
  printf "%s on %d ranks, median over %d rounds: base %.3f, new %.3f of DDP (new/base %.3f)\n", mode, world, n, b, m, m / b }'
