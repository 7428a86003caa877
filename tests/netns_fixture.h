/* Two network namespaces joined by a veth pair: two "hosts" on one machine
 * (tests/test_hier.c, tests/test_netns_faults.c; bench/collectives_hier_netns.sh
 * makes the same in shell).  Needs root and `ip`.  Header-only (static). */
#ifndef DDP_TESTS_NETNS_FIXTURE_H
#define DDP_TESTS_NETNS_FIXTURE_H

#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct netns_pair {
    char ns[2][32];   /* namespace names ("" until made) */
    char veth[2][16]; /* the veth's end in each */
    char addr[2][32]; /* its IPv4 address (a /24 of 10.<net>.x) */
} netns_pair;

/* Runs a shell command; 0 when it exited 0. */
static int netns_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int netns_sh(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd) == 0 ? 0 : -1;
}

static void netns_pair_teardown(netns_pair *p)
{
    for (int i = 0; i < 2; i++)
        if (p->ns[i][0])
            netns_sh("ip netns del %s 2>/dev/null", p->ns[i]);
}

/* Makes the pair, named after tag (a few letters) and this process, on
 * 10.<net>.<pid-derived>.{1,2}/24.  NULL, or why it cannot be done (the
 * caller skips, and tears down what was made). */
static const char *netns_pair_setup(netns_pair *p, const char *tag, int net)
{
    if (geteuid() != 0)
        return "not root";
    int id = (int)(getpid() % 200) + 20;
    for (int i = 0; i < 2; i++) {
        snprintf(p->ns[i], sizeof p->ns[i], "ddp%s%d%c", tag, (int)getpid(), 'a' + i);
        snprintf(p->veth[i], sizeof p->veth[i], "%.2s%d%c", tag, (int)getpid() % 100000, 'a' + i);
        snprintf(p->addr[i], sizeof p->addr[i], "10.%d.%d.%d", net, id, i + 1);
    }
    if (netns_sh("ip netns add %s 2>/dev/null", p->ns[0]) < 0) {
        p->ns[0][0] = '\0';
        return "'ip netns add' failed";
    }
    if (netns_sh("ip netns add %s", p->ns[1]) < 0 ||
        netns_sh("ip link add %s type veth peer name %s", p->veth[0], p->veth[1]) < 0)
        return "cannot create a veth pair";
    for (int i = 0; i < 2; i++)
        if (netns_sh("ip link set %s netns %s", p->veth[i], p->ns[i]) < 0 ||
            netns_sh("ip -n %s addr add %s/24 dev %s", p->ns[i], p->addr[i], p->veth[i]) < 0 ||
            netns_sh("ip -n %s link set %s up", p->ns[i], p->veth[i]) < 0 ||
            netns_sh("ip -n %s link set lo up", p->ns[i]) < 0)
            return "cannot configure the veth pair";
    return NULL;
}

/* Moves the calling process (a forked child) into namespace i: 0 or -1. */
__attribute__((unused)) static int netns_enter(const netns_pair *p, int i)
{
    char path[64];
    snprintf(path, sizeof path, "/run/netns/%s", p->ns[i]);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int rc = fd >= 0 && setns(fd, CLONE_NEWNET) == 0 ? 0 : -1;
    if (fd >= 0)
        close(fd);
    return rc;
}

#endif
