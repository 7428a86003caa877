# A cluster of "hosts" in network namespaces, shared by bench/netns_*.sh
# (sourced).  cluster_up N RATE makes namespaces $pfx1..$pfxN, each with
# one veth to a bridge in the root namespace (10.215.$id.0/24; the bridge is
# .254, host i is .i), both ends of every veth shaped with tbf at RATE: a
# host's traffic is limited each way as by its network card, and one host
# reaches another through two shaped links as through a switch.  Needs
# root, `ip` and `tc`; cluster_check says why not, cluster_down undoes it.
# ns_run I CMD...: CMD on host I in its own UTS namespace whose host name is
# the namespace's (Open MPI tells nodes apart by host name), with
# DDP_HOST_ID and DDP_SOCKET_IFNAME naming host I (libddp's host identity
# and the address it listens on).

id=$(($$ % 200 + 20))
pfx=ddpc$$h
br=ddpc$$br
hosts_up=0

# cluster_check: empty when namespaces can be made here, else why not.
cluster_check() {
    [ "$(id -u)" = 0 ] || { echo "not root"; return; }
    command -v ip >/dev/null && command -v tc >/dev/null || { echo "no ip or tc"; return; }
    ip netns add "ddpc$$probe" 2>/dev/null || { echo "'ip netns add' failed"; return; }
    ip netns del "ddpc$$probe"
}

cluster_addr() { echo "10.215.$id.$1"; }

# cluster_up N RATE: 1 (with the command's own message) when a step fails
cluster_up() {
    ip link add "$br" type bridge || return 1
    ip addr add "10.215.$id.254/24" dev "$br" || return 1
    ip link set "$br" up || return 1
    i=1
    while [ "$i" -le "$1" ]; do
        ip netns add "$pfx$i" || return 1
        hosts_up=$i # cluster_down removes it even when a later step fails
        ip link add "c$$v$i" type veth peer name "c$$p$i" || return 1
        ip link set "c$$v$i" netns "$pfx$i" || return 1
        ip link set "c$$p$i" master "$br" up || return 1
        ip -n "$pfx$i" addr add "$(cluster_addr "$i")/24" dev "c$$v$i" || return 1
        ip -n "$pfx$i" link set "c$$v$i" up || return 1
        ip -n "$pfx$i" link set lo up || return 1
        ip -n "$pfx$i" route add default via "10.215.$id.254" || return 1
        i=$((i + 1))
    done
    cluster_shape "$2" || return 1
}

# burst_of RATE (100mbit, 1gbit, 10gbit): tbf's bucket, 2 ms at RATE
# (at least 64 KB): a bucket below rate/HZ cannot reach the rate, a large
# one lets messages under it through at memory speed.
burst_of() {
    echo "$1" | awk '{ r = $1 + 0; u = tolower($1); m = u ~ /gbit/ ? 1e9 : u ~ /mbit/ ? 1e6 : u ~ /kbit/ ? 1e3 : 1
        b = r * m / 8 * 0.002; if (b < 65536) b = 65536; printf "%d\n", b }'
}

# cluster_shape RATE: (re)shapes every link; "none" takes tbf away.
cluster_shape() {
    i=1
    while [ "$i" -le "$hosts_up" ]; do
        tc -n "$pfx$i" qdisc del dev "c$$v$i" root 2>/dev/null || true
        tc qdisc del dev "c$$p$i" root 2>/dev/null || true
        if [ "$1" != none ]; then
            b=$(burst_of "$1")
            tc -n "$pfx$i" qdisc add dev "c$$v$i" root tbf rate "$1" burst "$b" latency 20ms || return 1
            tc qdisc add dev "c$$p$i" root tbf rate "$1" burst "$b" latency 20ms || return 1
        fi
        i=$((i + 1))
    done
}

cluster_down() {
    i=1
    while [ "$i" -le "$hosts_up" ]; do
        ip netns del "$pfx$i" 2>/dev/null || true
        i=$((i + 1))
    done
    ip link del "$br" 2>/dev/null || true
    hosts_up=0
}

# ns_run I CMD...
ns_run() {
    h=$1
    shift
    ip netns exec "$pfx$h" unshare --uts env DDP_HOST_ID="$pfx$h" DDP_SOCKET_IFNAME="c$$v$h" \
        sh -c 'hostname "$0"; exec "$@"' "$pfx$h" "$@"
}
