# Shared by bench/collectives_hier.sh and collectives_hier_netns.sh (sourced):
# runs the caller's `sweep MODE OUT` REPS times for the hierarchical (auto)
# and the flat (0) mode, alternately, and prints the side-by-side table of
# the per-size medians.  Needs $tmp, $reps, $n and sweep().

# med NAME: "bytes median_us" per size over the runs of NAME.
med() {
    cat "$tmp/$1".* | sort -n -k1,1 -k2,2 | awk '
        { v[$1] = v[$1] " " $2; n[$1]++ }
        END { for (b in v) { split(substr(v[b], 2), a, " "); print b, a[int((n[b] + 1) / 2)] } }' |
        sort -n
}

# hier_compare TITLE
hier_compare() {
    for i in $(seq "$reps"); do
        sweep auto "$tmp/hier.$i"
        sweep 0 "$tmp/flat.$i"
    done
    med hier >"$tmp/m.hier"
    med flat >"$tmp/m.flat"
    echo "$1"
    printf '%10s %12s %9s %12s %9s %10s\n' bytes hier_us GB/s flat_tcp_us GB/s flat/hier
    awk -v n="$n" '
        function bw(b, us) { return us > 0 ? b * 2 * (n - 1) / n / us / 1e3 : 0 }
        FILENAME ~ /m.flat$/ { flat[$1] = $2; next }
        { b[++k] = $1; hier[$1] = $2 }
        END { for (i = 1; i <= k; i++) { s = b[i]
            printf "%10d %12.2f %9.2f %12.2f %9.2f %9.2fx\n", s, hier[s], bw(s, hier[s]), flat[s],
                   bw(s, flat[s]), (hier[s] > 0 ? flat[s] / hier[s] : 0) } }
    ' "$tmp/m.flat" "$tmp/m.hier"
    echo "(GB/s: bus bandwidth, bytes x 2(n-1)/n / time)"
}
