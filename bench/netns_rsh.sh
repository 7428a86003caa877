#!/bin/sh
# Open MPI's remote-shell agent for the namespace cluster of
# bench/netns_common.sh (mpirun --mca plm_rsh_agent bench/netns_rsh.sh):
# mpirun calls it as `netns_rsh.sh HOST COMMAND...` to start orted on HOST;
# HOST is a namespace, and the command runs there as ssh would run it, in a
# UTS namespace of its own named after HOST (Open MPI tells nodes apart by
# host name, so ranks of two namespaces use tcp, not shared memory).
ns=$1
shift
exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns; $*"
