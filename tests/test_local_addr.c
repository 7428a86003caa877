/* The address a rank listens on: DDP_TCP_HOST, DDP_SOCKET_IFNAME (a name,
 * a prefix, =exact, ^excluded, comma lists), DDP_SOCKET_FAMILY; and a real
 * 2-process job whose transport connections are IPv6 when asked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/sock.h"
#include "ddp/pg.h"
#include "fork_children.h"
#include "pg_util.h"

static int clear(void **state)
{
    (void)state;
    unsetenv("DDP_TCP_HOST");
    unsetenv("DDP_SOCKET_IFNAME");
    unsetenv("DDP_SOCKET_FAMILY");
    return 0;
}

static const char *local(const char *ifname, const char *family, int *rc)
{
    static char out[256];
    clear(NULL);
    if (ifname)
        setenv("DDP_SOCKET_IFNAME", ifname, 1);
    if (family)
        setenv("DDP_SOCKET_FAMILY", family, 1);
    out[0] = '\0';
    *rc = ddp__sock_local_host(out, sizeof out);
    return out;
}

static void test_ifname_selects(void **state)
{
    (void)state;
    int rc;
    assert_string_equal(local("lo", NULL, &rc), "127.0.0.1");
    assert_int_equal(rc, 0);
    assert_string_equal(local("lo", "ipv4", &rc), "127.0.0.1");
    assert_string_equal(local("lo", "ipv6", &rc), "::1");
    assert_int_equal(rc, 0);
    assert_string_equal(local("=lo", NULL, &rc), "127.0.0.1"); /* exact */
    assert_string_equal(local("l", NULL, &rc), "127.0.0.1");   /* a prefix */
    assert_string_equal(local("nosuch0,lo", NULL, &rc), "127.0.0.1"); /* a list */
    assert_string_equal(local("^=lx,=lo", NULL, &rc), "127.0.0.1"); /* ^= excludes exactly */
    local("^=lo,=lo", "ipv4", &rc); /* ... and wins over an inclusion */
    assert_int_equal(rc, DDP_ERR_NOT_FOUND);
    /* an exclusion of everything else keeps only lo */
    const char *other = local("^lo", "ipv4", &rc);
    assert_true(rc < 0 || strcmp(other, "127.0.0.1") != 0);
    /* DDP_TCP_HOST wins over the interface name */
    clear(NULL);
    setenv("DDP_SOCKET_IFNAME", "nosuch0", 1);
    setenv("DDP_TCP_HOST", "10.1.2.3", 1);
    char out[64];
    assert_int_equal(ddp__sock_local_host(out, sizeof out), 0);
    assert_string_equal(out, "10.1.2.3");
    clear(NULL);
}

static void test_ifname_errors(void **state)
{
    (void)state;
    int rc;
    local("nosuch0", NULL, &rc);
    assert_int_equal(rc, DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(ddp_last_error(), "DDP_SOCKET_IFNAME=nosuch0: no interface that is up "
                                             "matches it with an IPv4 or IPv6 address"));
    assert_non_null(strstr(ddp_last_error(), "lo (127.0.0.1"));
    local("=l", NULL, &rc); /* exact: "l" is not "lo" */
    assert_int_equal(rc, DDP_ERR_NOT_FOUND);
    local("lo", "ipv5", &rc);
    assert_int_equal(rc, DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "DDP_SOCKET_FAMILY"));
    clear(NULL);
}

/* Is one of this process's sockets a connected IPv6 TCP socket? */
static int has_ipv6_connection(void)
{
    for (int fd = 3; fd < 1024; fd++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int type = 0;
        socklen_t tl = sizeof type;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM)
            continue;
        if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family == AF_INET6)
            return 1;
    }
    return 0;
}

static job J;

static int ipv6_rank(int rank, void *arg)
{
    const char *ifname = arg;
    setenv("DDP_TRANSPORT", "tcp", 1);
    setenv("DDP_SOCKET_IFNAME", ifname, 1);
    setenv("DDP_SOCKET_FAMILY", "ipv6", 1);
    ddp_pg_t *pg = NULL;
    int rc = ddp_init_process_group("tcp", J.url, rank, 2, 20.0, &pg);
    if (strcmp(ifname, "lo") != 0) /* no such interface: init must say so */
        return !(rc == DDP_ERR_NOT_FOUND && strstr(ddp_last_error(), "DDP_SOCKET_IFNAME"));
    CHILD_CHECK(rc == 0);
    int64_t v[2] = {rank + 1, 10};
    CHILD_CHECK(ddp_pg_all_reduce(pg, v, 2, DDP_INT64, DDP_SUM) == 0);
    CHILD_CHECK(v[0] == 3 && v[1] == 20);
    /* a file:// store: any IPv6 socket is the transport's.  Both ranks look
     * before either leaves (a peer's goodbye would end the connection). */
    int64_t ok = has_ipv6_connection();
    CHILD_CHECK(ddp_pg_all_reduce(pg, &ok, 1, DDP_INT64, DDP_SUM) == 0);
    CHILD_CHECK(ok == 2);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_job_over_ipv6(void **state)
{
    (void)state;
    job_init(&J);
    rank_group g;
    start_ranks(&g, 0, 2, ipv6_rank, "lo");
    assert_int_equal(join_ranks(&g, 60.0), 0);
    job_cleanup(&J);
    job_init(&J);
    start_ranks(&g, 0, 2, ipv6_rank, "nosuch0");
    assert_int_equal(join_ranks(&g, 60.0), 0);
    job_cleanup(&J);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_ifname_selects, clear),
        cmocka_unit_test_teardown(test_ifname_errors, clear),
        cmocka_unit_test(test_job_over_ipv6),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
