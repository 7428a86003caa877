/* Hierarchical groups beyond the collective matrix (test_hier_coll): the
 * layout rule (auto, DDP_HIERARCHICAL=0|1, DDP_TRANSPORT=tcp, one host),
 * ranks disagreeing, subgroups, asynchronous operations in flight together,
 * destroy releasing every descriptor, rank numbers in sub-transport
 * messages, setup failures, kill -9 of a non-leader and of a leader in the
 * middle of hierarchical all-reduces (every other rank fails within 2 s
 * naming the dead rank; /dev/shm keeps nothing), deadlines, and all-reduces
 * across two network namespaces joined by a veth pair (skipped where `ip
 * netns` is not available).  Ranks are forked processes whose hosts are
 * faked with DDP_HOST_ID. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "coll/coll.h"
#include "coll/hier.h"
#include "coll_ref.h"
#include "netns_fixture.h"
#include "ddp/pg.h"
#include "pg/internal.h"
#include "pg_util.h"
#include "fork_children.h"
#include "transport/transport.h"

static job J;

static int open_fds(void) { return dir_entries("/proc/self/fd", ""); }

static void set_host(const char *layout, int rank)
{
    char id[16];
    snprintf(id, sizeof id, "host%c", layout[rank]);
    setenv("DDP_HOST_ID", id, 1);
}

typedef struct kill_report {
    int started[4];
    int pid[4];
    int rc[4];
    double err_time[4];
    char msg[4][1024];
} kill_report;

/* ---- layout rule ------------------------------------------------------ */

typedef struct sel_arg {
    int n;
    const char *layout;   /* host letter per rank */
    const char *hier[4];  /* DDP_HIERARCHICAL per rank (NULL: unset) */
    const char *mode;     /* DDP_TRANSPORT of every rank (NULL: unset) */
    int want_hier;        /* -1: init must fail with msg */
    const char *want_tp;  /* the group's own transport */
    const char *msg;
} sel_arg;

static int sel_rank(int rank, void *arg)
{
    sel_arg *a = arg;
    set_host(a->layout, rank);
    if (a->hier[rank])
        setenv("DDP_HIERARCHICAL", a->hier[rank], 1);
    else
        unsetenv("DDP_HIERARCHICAL");
    if (a->mode)
        setenv("DDP_TRANSPORT", a->mode, 1);
    else
        unsetenv("DDP_TRANSPORT");
    int fds = open_fds();
    ddp_pg_t *pg = NULL;
    int rc = ddp_init_process_group("tcp", J.url, rank, a->n, 10.0, &pg);
    if (a->want_hier < 0) {
        CHILD_CHECK(rc < 0 && contains(ddp_last_error(), a->msg));
        return 0;
    }
    CHILD_CHECK(rc == 0);
    const ddp__hier *h = ddp__pg_hier(pg);
    CHILD_CHECK((h != NULL) == a->want_hier);
    CHILD_CHECK(strcmp(ddp__pg_transport(pg)->vt->name, a->want_tp) == 0);
    int32_t x[3] = {rank, 1, rank * 10};
    CHILD_CHECK(ddp_pg_all_reduce(pg, x, 3, DDP_INT32, DDP_SUM) == 0);
    int s = a->n * (a->n - 1) / 2;
    CHILD_CHECK(x[0] == s && x[1] == a->n && x[2] == 10 * s);
    int32_t b = rank == a->n - 1 ? 77 : -1;
    CHILD_CHECK(ddp_pg_broadcast(pg, &b, 1, DDP_INT32, a->n - 1) == 0 && b == 77);
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    if (h) {
        int lsize = 0, lrank = 0;
        for (int q = 0; q < a->n; q++) {
            lsize += a->layout[q] == a->layout[rank];
            lrank += q < rank && a->layout[q] == a->layout[rank];
        }
        CHILD_CHECK(h->local.size == lsize && h->local.rank == lrank);
        CHILD_CHECK((h->local.tp != NULL) == (lsize > 1));
        CHILD_CHECK((h->leaders.tp != NULL) == (lrank == 0));
        CHILD_CHECK(h->runs[DDP__ALL_REDUCE] == 1 && h->runs[DDP__BROADCAST] == 1 &&
                    h->runs[DDP__BARRIER] == 1);
    }
    ddp_destroy_process_group(pg);
    CHILD_CHECK(open_fds() == fds); /* sockets, pidfds, epoll, store: all closed */
    return 0;
}

static void run_sel(sel_arg *a)
{
    job_init(&J);
    assert_int_equal(run_children(a->n, sel_rank, a, 30.0), 0);
    job_cleanup(&J);
}

static void test_auto_is_hierarchical_across_hosts(void **state)
{
    (void)state;
    sel_arg a = {.n = 3, .layout = "AAB", .want_hier = 1, .want_tp = "tcp"};
    run_sel(&a);
    sel_arg b = {.n = 4, .layout = "ABBA", .want_hier = 1, .want_tp = "tcp"};
    run_sel(&b);
}

static void test_flat_when_useless_or_off(void **state)
{
    (void)state;
    /* One rank per host: nothing to gain. */
    sel_arg a = {.n = 2, .layout = "AB", .want_hier = 0, .want_tp = "tcp"};
    run_sel(&a);
    /* Turned off by every rank, or by one (the others on auto follow). */
    sel_arg b = {.n = 3, .layout = "AAB", .hier = {"0", "0", "0"}, .want_hier = 0,
                 .want_tp = "tcp"};
    run_sel(&b);
    sel_arg c = {.n = 3, .layout = "AAB", .hier = {NULL, NULL, "0"}, .want_hier = 0,
                 .want_tp = "tcp"};
    run_sel(&c);
    /* DDP_TRANSPORT=tcp: tcp everywhere, no shared memory at all. */
    sel_arg d = {.n = 3, .layout = "AAB", .mode = "tcp", .want_hier = 0, .want_tp = "tcp"};
    run_sel(&d);
    /* One host: plain shm, DDP_HIERARCHICAL=1 or not. */
    sel_arg e = {.n = 2, .layout = "AA", .hier = {"1", "1"}, .want_hier = 0, .want_tp = "shm"};
    run_sel(&e);
}

static void test_forced_with_one_rank_per_host(void **state)
{
    (void)state;
    sel_arg a = {.n = 2, .layout = "AB", .hier = {"1", NULL}, .want_hier = 1, .want_tp = "tcp"};
    run_sel(&a);
}

static void test_ranks_disagree(void **state)
{
    (void)state;
    sel_arg a = {.n = 2, .layout = "AB", .hier = {"0", "1"}, .want_hier = -1,
                 .msg = "ranks disagree on DDP_HIERARCHICAL: rank 0 says 0, rank 1 says 1"};
    run_sel(&a);
}

static void test_bad_environment(void **state)
{
    (void)state;
    job_init(&J);
    setenv("DDP_HIERARCHICAL", "yes", 1);
    ddp_pg_t *pg = NULL;
    assert_true(ddp_init_process_group("tcp", J.url, 0, 1, 5.0, &pg) < 0);
    if (!contains(ddp_last_error(), "DDP_HIERARCHICAL=yes: expected auto, 0 or 1"))
        fail_msg("unexpected: %s", ddp_last_error());
    unsetenv("DDP_HIERARCHICAL");
    job_cleanup(&J);
}

/* ---- setup failures name group ranks ---------------------------------- */

static int setup_fail_rank(int rank, void *arg)
{
    kill_report *rep = arg;
    set_host("AABB", rank);
    if (rank == 3) /* host B's second rank cannot make its shm level */
        setenv("DDP_SHM_RING_BYTES", "12", 1);
    ddp_pg_t *pg = NULL;
    rep->pid[rank] = (int)getpid();
    rep->rc[rank] = ddp_init_process_group("tcp", J.url, rank, 4, 1.5, &pg);
    snprintf(rep->msg[rank], sizeof rep->msg[rank], "%s", ddp_last_error());
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_setup_failure(void **state)
{
    (void)state;
    job_init(&J);
    kill_report *rep = shared_page(sizeof *rep);
    assert_int_equal(run_children(4, setup_fail_rank, rep, 30.0), 0);
    for (int r = 0; r < 4; r++)
        fprintf(stderr, "rank %d: %d %s\n", r, rep->rc[r], rep->rc[r] ? rep->msg[r] : "");
    assert_true(contains(rep->msg[3], "hierarchical group, inside host: "));
    assert_true(contains(rep->msg[3], "DDP_SHM_RING_BYTES=12"));
    /* Its host's leader waited for it (local rank 1), and leader 0 for
     * that leader (leaders' rank 1): both named by group rank. */
    assert_int_equal(rep->rc[2], DDP_ERR_TIMEOUT);
    assert_true(contains(rep->msg[2], "hierarchical group, inside host: "));
    assert_true(contains(rep->msg[2], "rank 3 did not"));
    assert_int_equal(rep->rc[0], DDP_ERR_TIMEOUT);
    assert_true(contains(rep->msg[0], "hierarchical group, among host leaders: "));
    assert_true(contains(rep->msg[0], "rank 2 did not"));
    /* Host B's segment (named by its local rank 0, rank 2) was removed. */
    char prefix[32];
    snprintf(prefix, sizeof prefix, "ddp-%d-", rep->pid[2]);
    assert_int_equal(shm_entries(prefix), 0);
    munmap(rep, sizeof *rep);
    job_cleanup(&J);
}

/* ---- subgroups -------------------------------------------------------- */

static int sub_rank(int rank, void *arg)
{
    (void)arg;
    set_host("ABAB", rank);
    ddp_pg_t *pg = NULL, *g1 = NULL, *g2 = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 4, 10.0, &pg) == 0);
    const int r1[3] = {0, 1, 2}, r2[2] = {0, 2};
    CHILD_CHECK(ddp_pg_new_group(pg, r1, 3, &g1) == 0);
    CHILD_CHECK(ddp_pg_new_group(pg, r2, 2, &g2) == 0);
    if (rank < 3) { /* hosts A (0, 2) and B (1): hierarchical */
        const ddp__hier *h = ddp__pg_hier(g1);
        CHILD_CHECK(h && h->nhosts == 2 && h->local.size == (rank == 1 ? 1 : 2));
        int64_t x = rank + 1;
        CHILD_CHECK(ddp_pg_all_reduce(g1, &x, 1, DDP_INT64, DDP_SUM) == 0 && x == 6);
    }
    if (rank % 2 == 0) { /* both on host A: shm */
        CHILD_CHECK(ddp__pg_hier(g2) == NULL);
        CHILD_CHECK(strcmp(ddp__pg_transport(g2)->vt->name, "shm") == 0);
    }
    ddp_destroy_process_group(g2);
    ddp_destroy_process_group(g1);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_subgroups(void **state)
{
    (void)state;
    job_init(&J);
    unsetenv("DDP_HIERARCHICAL");
    assert_int_equal(run_children(4, sub_rank, NULL, 30.0), 0);
    job_cleanup(&J);
}

/* ---- asynchronous operations ----------------------------------------- */

/* Queued all-reduces, broadcasts and barriers of several sizes run by the
 * communication thread, in issue order, on both levels. */
static int async_rank(int rank, void *arg)
{
    (void)arg;
    set_host("ABBAB", rank);
    const int n = 5, nops = 12;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, n, 20.0, &pg) == 0);
    CHILD_CHECK(ddp__pg_hier(pg) != NULL);
    int64_t *buf[12];
    size_t cnt[12];
    ddp_work_t *w[12];
    for (int k = 0; k < nops; k++) {
        cnt[k] = (size_t)1 << (2 * k % 20);
        buf[k] = malloc(cnt[k] * sizeof *buf[k]);
        CHILD_CHECK(buf[k]);
        for (size_t i = 0; i < cnt[k]; i++)
            buf[k][i] = (int64_t)(i + 1) * (rank + 1) + k;
        if (k % 3 == 1)
            CHILD_CHECK(ddp_pg_broadcast_async(pg, buf[k], cnt[k], DDP_INT64, k % n, &w[k]) == 0);
        else if (k % 3 == 2)
            CHILD_CHECK(ddp_pg_barrier_async(pg, &w[k]) == 0);
        else
            CHILD_CHECK(ddp_pg_all_reduce_async(pg, buf[k], cnt[k], DDP_INT64, DDP_SUM, &w[k]) == 0);
    }
    for (int k = nops - 1; k >= 0; k--) { /* any order: they complete in issue order */
        CHILD_CHECK(ddp_work_wait(w[k], 20.0) == 0);
        ddp_work_destroy(w[k]);
    }
    for (int k = 0; k < nops; k++) {
        for (size_t i = 0; i < cnt[k]; i++) {
            int64_t x = (int64_t)(i + 1), want = x * (k % n + 1) + k; /* broadcast */
            if (k % 3 == 0)
                want = x * n * (n + 1) / 2 + (int64_t)n * k;
            else if (k % 3 == 2)
                want = x * (rank + 1) + k; /* barrier: untouched */
            CHILD_CHECK(buf[k][i] == want);
        }
        free(buf[k]);
    }
    const ddp__hier *h = ddp__pg_hier(pg);
    CHILD_CHECK(h->runs[DDP__ALL_REDUCE] == 4 && h->runs[DDP__BROADCAST] == 4 &&
                h->runs[DDP__BARRIER] == 4);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_async(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(5, async_rank, NULL, 60.0), 0);
    job_cleanup(&J);
}

/* ---- messages in group ranks ------------------------------------------ */

static void expect_translation(const char *in, const int *map, int n, const char *want)
{
    ddp__error_restore(in);
    assert_int_equal(ddp__hier_error(DDP_ERR_PEER, map, n, "inside host (shm)"), DDP_ERR_PEER);
    char full[512];
    snprintf(full, sizeof full, "inside host (shm): %s", want);
    if (strcmp(ddp_last_error(), full) != 0)
        fail_msg("translated '%s' into '%s', expected '%s'", in, ddp_last_error(), full);
}

static void test_messages_use_group_ranks(void **state)
{
    (void)state;
    const int map[3] = {4, 6, 7};
    expect_translation("shm/peers.c:1: rank 1 (pid 99) died", map, 3,
                       "shm/peers.c:1: rank 6 (pid 99) died");
    expect_translation("rendezvous.c:2: ranks 0, 2 did not join within 1.0 s", map, 3,
                       "rendezvous.c:2: ranks 4, 7 did not join within 1.0 s");
    /* A peer's own transport words are in its numbering too... */
    expect_translation("match.c:3: tcp: rank 2 (h:1): gave up: rank 2: rank 0 (h:2) closed", map,
                       3, "match.c:3: tcp: rank 7 (h:1): gave up: rank 7: rank 4 (h:2) closed");
    /* ...a group-level reason is already in group ranks. */
    expect_translation(
        "match.c:4: shm: rank 0 (pid 5) gave up: all_reduce #3 on rank 4: rank 1 died", map, 3,
        "match.c:4: shm: rank 4 (pid 5) gave up: all_reduce #3 on rank 4: rank 1 died");
    /* Out of range or not a rank word: unchanged. */
    expect_translation("rank 9 and frank 1, ranks x", map, 3, "rank 9 and frank 1, ranks x");
    /* A rank word with no room left in the 1 KiB message: it ends there
     * (this looped forever once). */
    const int wide[2] = {1000000, 2000000};
    char longmsg[1100];
    size_t len = 0;
    while (len + 16 < sizeof longmsg - 1)
        len += (size_t)snprintf(longmsg + len, sizeof longmsg - len, "rank 1 ");
    ddp__error_restore(longmsg);
    assert_int_equal(ddp__hier_error(DDP_ERR_PEER, wide, 2, "x"), DDP_ERR_PEER);
    assert_non_null(strstr(ddp_last_error(), "rank 2000000 rank 2000000"));
}

/* ---- kill -9 ---------------------------------------------------------- */

static void kill_during_all_reduce(int victim)
{
    const int n = 4;
    const char *layout = "AABB"; /* leaders 0 and 2 */
    job_init(&J);
    kill_report *rep = shared_page(sizeof *rep);
    pid_t pids[4];
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            set_host(layout, r);
            ddp_pg_t *pg = NULL;
            if (ddp_init_process_group("tcp", J.url, r, n, 30.0, &pg) != 0 || !ddp__pg_hier(pg))
                _exit(2);
            size_t cnt = (size_t)1 << 20;
            float *x = calloc(cnt, sizeof *x);
            int rc = 0;
            for (int it = 0; rc == 0 && it < 1000000; it++) {
                rc = ddp_pg_all_reduce(pg, x, cnt, DDP_FLOAT32, DDP_SUM);
                rep->started[r] = 1;
            }
            rep->err_time[r] = ddp_time_now();
            rep->rc[r] = rc;
            snprintf(rep->msg[r], sizeof rep->msg[r], "%s", ddp_last_error());
            ddp_destroy_process_group(pg);
            free(x);
            _exit(0);
        }
    }
    double until = ddp_time_now() + 20;
    while (!(rep->started[0] && rep->started[1] && rep->started[2] && rep->started[3]) &&
           ddp_time_now() < until)
        sleep_s(0.01);
    sleep_s(0.1);
    double killed = ddp_time_now();
    kill(pids[victim], SIGKILL);
    char want[32];
    snprintf(want, sizeof want, "rank %d (", victim); /* "rank 3 (pid ...", "rank 2 (host:port" */
    int status;
    for (int r = 0; r < n; r++) {
        if (r == victim)
            continue;
        if (!reap_by(pids[r], ddp_time_now() + 10, &status)) {
            kill_children(pids, n);
            fail_msg("rank %d hangs after rank %d was killed", r, victim);
        }
        fprintf(stderr, "victim %d: rank %d failed %.3f s after the kill: %s\n", victim, r,
                rep->err_time[r] - killed, rep->msg[r]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        assert_true(rep->rc[r] < 0);
        if (!contains(rep->msg[r], want))
            fail_msg("rank %d: '%s' does not name the dead rank ('%s')", r, rep->msg[r], want);
        assert_true(rep->err_time[r] - killed < 2.0);
    }
    waitpid(pids[victim], &status, 0);
    for (int r = 0; r < n; r += 2) { /* each host's segment, named by its leader */
        char prefix[32];
        snprintf(prefix, sizeof prefix, "ddp-%d-", (int)pids[r]);
        assert_int_equal(shm_entries(prefix), 0);
    }
    munmap(rep, sizeof *rep);
    job_cleanup(&J);
}

static void test_kill9_non_leader(void **state)
{
    (void)state;
    kill_during_all_reduce(3);
}

static void test_kill9_leader(void **state)
{
    (void)state;
    kill_during_all_reduce(2);
}

/* ---- deadlines -------------------------------------------------------- */

static int late_rank(int rank, void *arg)
{
    kill_report *rep = arg;
    set_host("AABB", rank);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 4, 1.0, &pg) == 0);
    CHILD_CHECK(ddp__pg_hier(pg) != NULL);
    if (rank >= 2) { /* host B never comes to the all-reduce */
        sleep_s(2.5);
        ddp_destroy_process_group(pg);
        return 0;
    }
    float x[4] = {1, 2, 3, 4};
    double t0 = ddp_time_now();
    int rc = ddp_pg_all_reduce(pg, x, 4, DDP_FLOAT32, DDP_SUM);
    rep->err_time[rank] = ddp_time_now() - t0;
    rep->rc[rank] = rc;
    snprintf(rep->msg[rank], sizeof rep->msg[rank], "%s", ddp_last_error());
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_deadline(void **state)
{
    (void)state;
    job_init(&J);
    kill_report *rep = shared_page(sizeof *rep);
    assert_int_equal(run_children(4, late_rank, rep, 30.0), 0);
    for (int r = 0; r < 2; r++) {
        fprintf(stderr, "rank %d failed after %.3f s: %s\n", r, rep->err_time[r], rep->msg[r]);
        assert_true(rep->rc[r] < 0);
        assert_true(rep->err_time[r] > 0.9 && rep->err_time[r] < 2.0);
    }
    /* The leader timed out waiting for host B's leader, by its group rank. */
    assert_int_equal(rep->rc[0], DDP_ERR_TIMEOUT);
    assert_true(contains(rep->msg[0], "timed out"));
    assert_true(contains(rep->msg[0], "among host leaders (tcp)"));
    assert_true(contains(rep->msg[0], "rank 2 ("));
    munmap(rep, sizeof *rep);
    job_cleanup(&J);
}

/* ---- network namespaces ----------------------------------------------- */

static netns_pair NP;

typedef struct ns_report {
    int bad[4];
} ns_report;

static int netns_rank(int rank, void *arg)
{
    ns_report *rep = arg;
    const int n = 4, ns = rank % 2; /* ranks 0, 2 in namespace a; 1, 3 in b */
    CHILD_CHECK(netns_enter(&NP, ns) == 0);
    setenv("DDP_HOST_ID", NP.ns[ns], 1); /* one host per namespace */
    setenv("DDP_TCP_HOST", NP.addr[ns], 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, n, 20.0, &pg) == 0);
    const ddp__hier *h = ddp__pg_hier(pg);
    CHILD_CHECK(h && h->nhosts == 2 && h->local.size == 2);
    const size_t cnt = (1u << 16) + 3;
    float *x = malloc(cnt * sizeof *x), want;
    CHILD_CHECK(x);
    const char *algos[3] = {"direct", "ring", "rd"}; /* ORDER_* */
    for (int algo = 0; algo < 3; algo++) {
        CHILD_CHECK(ddp__pg_set_option(pg, "allreduce_algo", algos[algo]) == 0);
        for (size_t i = 0; i < cnt; i++)
            ref_input(&x[i], DDP_FLOAT32, DDP_SUM, 7 + (uint64_t)algo, rank, i);
        CHILD_CHECK(ddp_pg_all_reduce(pg, x, cnt, DDP_FLOAT32, DDP_SUM) == 0);
        for (size_t i = 0; i < cnt; i++) {
            ref_reduce_hier(&want, DDP_FLOAT32, DDP_SUM, 7 + (uint64_t)algo, n, i, h->host_of, 2,
                            algo, algo == ORDER_RING ? (i >= (cnt + 1) / 2) : 0);
            rep->bad[rank] += memcmp(&want, &x[i], 4) != 0;
        }
    }
    CHILD_CHECK(h->runs[DDP__ALL_REDUCE] == 3);
    free(x);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_network_namespaces(void **state)
{
    (void)state;
    const char *why = netns_pair_setup(&NP, "h", 213);
    if (why) {
        netns_pair_teardown(&NP);
        fprintf(stderr, "skipped: network namespaces unavailable here (%s); the same layouts "
                        "run with DDP_HOST_ID in test_hier_coll\n", why);
        skip();
    }
    job_init(&J);
    ns_report *rep = shared_page(sizeof *rep);
    int failed = run_children(4, netns_rank, rep, 60.0);
    netns_pair_teardown(&NP);
    job_cleanup(&J);
    assert_int_equal(failed, 0);
    for (int r = 0; r < 4; r++)
        assert_int_equal(rep->bad[r], 0);
    munmap(rep, sizeof *rep);
}

int main(void)
{
    unsetenv("DDP_TRANSPORT");
    unsetenv("DDP_HIERARCHICAL");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_is_hierarchical_across_hosts),
        cmocka_unit_test(test_flat_when_useless_or_off),
        cmocka_unit_test(test_forced_with_one_rank_per_host),
        cmocka_unit_test(test_ranks_disagree),
        cmocka_unit_test(test_bad_environment),
        cmocka_unit_test(test_setup_failure),
        cmocka_unit_test(test_subgroups),
        cmocka_unit_test(test_async),
        cmocka_unit_test(test_messages_use_group_ranks),
        cmocka_unit_test(test_kill9_non_leader),
        cmocka_unit_test(test_kill9_leader),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_network_namespaces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
