/* The matching engine (src/transport/match.h) through both transports,
 * driven directly (no process group), in the corners where the two copies
 * it replaced went wrong: a copied message that completes into a receive
 * of another length posted while it arrived (a double free), a held
 * message's length mismatch (shm said DDP_ERR_PEER, tcp DDP_ERR_PROTOCOL),
 * and an RTS pull from a sender that died (shm left the receive pending
 * until the deadline), and tcp's copy of a large message growing with its
 * bytes.  Ranks are forked processes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp/store.h"
#include "fork_children.h"
#include "pg_util.h"
#include "transport/shm.h"
#include "transport/tcp.h"
#include "transport/transport.h"

static job J;

typedef int (*rank_fn)(int rank, ddp_store_t *st, ddp__tp *tp);

typedef struct case_arg {
    const char *transport; /* "tcp" or "shm" */
    int n;
    rank_fn fn;
} case_arg;

static int run_rank(int rank, void *arg)
{
    case_arg *a = arg;
    ddp_store_t *st = NULL;
    ddp__tp *tp = NULL;
    CHILD_CHECK(ddp_store_file_create(J.path, a->n, &st) == 0);
    int rc = strcmp(a->transport, "tcp") == 0 ? ddp__tcp_create(st, "m", rank, a->n, 10.0, &tp)
                                              : ddp__shm_create(st, "m", rank, a->n, 10.0, &tp);
    if (rc != 0)
        fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error());
    CHILD_CHECK(rc == 0);
    rc = a->fn(rank, st, tp);
    ddp__tp_destroy(tp);
    ddp_store_destroy(st);
    return rc;
}

/* Runs fn as n ranks over transport, with env=value set (env may be NULL). */
static void run_case(const char *transport, int n, rank_fn fn, const char *env,
                     const char *value)
{
    case_arg a = {transport, n, fn};
    if (env)
        setenv(env, value, 1);
    job_init(&J);
    assert_int_equal(run_children(n, run_rank, &a, 60.0), 0);
    job_cleanup(&J);
    if (env)
        unsetenv(env);
}

static void signal_key(ddp_store_t *st, const char *key)
{
    (void)ddp_store_set(st, key, "1", 1);
}

static int wait_key(ddp_store_t *st, const char *key)
{
    const char *keys[1] = {key};
    return ddp_store_wait(st, keys, 1, 10.0);
}

/* ---- a copied message completes into a receive posted meanwhile ------- */

#define BIG ((size_t)32 << 20) /* more than the socket buffers or the ring hold */

/* Rank 1's BIG message arrives behind a receive rank 0 posted for another
 * tag, so it is copied; while it is only partly there (rank 1 stops
 * sending), rank 0 posts a receive for it of another length.  When the
 * rest comes (or at once, when the copy was already whole): a protocol
 * error naming rank 1, not a double free. */
static int late_mismatch_rank(int rank, ddp_store_t *st, ddp__tp *tp)
{
    double deadline = ddp_time_now() + 10.0;
    uint8_t small[8] = {0};
    if (rank == 1) {
        uint8_t *big = calloc(BIG, 1);
        CHILD_CHECK(big != NULL);
        ddp__req a, u;
        CHILD_CHECK(ddp__tp_isend(tp, &a, 0, 0x51, big, BIG) == 0); /* goes part way */
        CHILD_CHECK(wait_key(st, "posted") == 0);
        if (ddp__tp_isend(tp, &u, 0, 0x52, small, sizeof small) == 0) {
            ddp__req *reqs[2] = {&a, &u};
            (void)ddp__tp_wait(tp, reqs, 2, deadline, 0); /* rank 0 gives up meanwhile */
        }
        free(big);
        return 0;
    }
    if (rank == 2) {
        sleep_s(0.3);
        ddp__req b;
        CHILD_CHECK(ddp__tp_isend(tp, &b, 0, 0x53, small, sizeof small) == 0);
        CHILD_CHECK(ddp__tp_wait1(tp, &b, deadline, 0) == 0);
        return 0;
    }
    uint8_t *got = malloc(BIG / 2);
    CHILD_CHECK(got != NULL);
    ddp__req ru, rb, ra;
    CHILD_CHECK(ddp__tp_irecv(tp, &ru, 1, 0x52, small, sizeof small) == 0);
    CHILD_CHECK(ddp__tp_irecv(tp, &rb, 2, 0x53, small, sizeof small) == 0);
    /* Meanwhile rank 1's message starts to arrive, into a copy. */
    CHILD_CHECK(ddp__tp_wait1(tp, &rb, deadline, 0) == 0);
    /* Under load the whole message may be in the copy already: then the
     * receive itself fails, with the same message (either is right; what
     * must not happen is a crash or a silent truncation). */
    int rc = ddp__tp_irecv(tp, &ra, 1, 0x51, got, BIG / 2);
    signal_key(st, "posted");
    if (rc == 0)
        rc = ddp__tp_wait1(tp, &ra, deadline, 0);
    if (!(rc < 0 && contains(ddp_last_error(), "sent 33554432 bytes for tag 0x51 where "
                                               "16777216 were expected")))
        fprintf(stderr, "rank 0: rc %d: %s\n", rc, ddp_last_error());
    CHILD_CHECK(rc < 0);
    CHILD_CHECK(contains(ddp_last_error(), "rank 1 ("));
    CHILD_CHECK(contains(ddp_last_error(),
                         "sent 33554432 bytes for tag 0x51 where 16777216 were expected"));
    free(got);
    return 0;
}

static void test_late_length_mismatch_tcp(void **state)
{
    (void)state;
    /* The kernel's buffers hold little of the message. */
    run_case("tcp", 3, late_mismatch_rank, "DDP_TCP_SOCKBUF", "65536");
}

static void test_late_length_mismatch_shm(void **state)
{
    (void)state;
    run_case("shm", 3, late_mismatch_rank, NULL, NULL);
}

/* ---- a held message's length mismatch --------------------------------- */

#define HELD ((size_t)256 << 10) /* over the eager limit: held, not copied */

/* Rank 1's HELD-byte message reaches rank 0 while rank 0 waits for rank
 * 2's (sent once rank 1's is on its way) with no receive posted for rank
 * 1: it is held.  A receive for it of another length then fails at once,
 * a protocol error. */
static int held_mismatch_rank(int rank, ddp_store_t *st, ddp__tp *tp)
{
    double deadline = ddp_time_now() + 10.0;
    uint8_t small[8] = {0};
    uint8_t *held = calloc(HELD, 1);
    CHILD_CHECK(held != NULL);
    if (rank == 1) {
        ddp__req a;
        CHILD_CHECK(ddp__tp_isend(tp, &a, 0, 0x62, held, HELD) == 0);
        signal_key(st, "sent");
        (void)ddp__tp_wait1(tp, &a, deadline, 0); /* rank 0 gives up meanwhile */
        CHILD_CHECK(wait_key(st, "checked") == 0); /* no goodbye before */
    } else if (rank == 2) {
        ddp__req b;
        CHILD_CHECK(wait_key(st, "sent") == 0);
        CHILD_CHECK(ddp__tp_isend(tp, &b, 0, 0x63, small, sizeof small) == 0);
        CHILD_CHECK(ddp__tp_wait1(tp, &b, deadline, 0) == 0);
        CHILD_CHECK(wait_key(st, "checked") == 0);
    } else {
        ddp__req b, a;
        CHILD_CHECK(ddp__tp_irecv(tp, &b, 2, 0x63, small, sizeof small) == 0);
        /* Rank 1's header came first: read (and held) by the same wait. */
        CHILD_CHECK(ddp__tp_wait1(tp, &b, deadline, 0) == 0);
        int rc = ddp__tp_irecv(tp, &a, 1, 0x62, held, HELD - 8);
        if (rc != DDP_ERR_PROTOCOL)
            fprintf(stderr, "rank 0: rc %d: %s\n", rc, ddp_last_error());
        signal_key(st, "checked");
        CHILD_CHECK(rc == DDP_ERR_PROTOCOL);
        CHILD_CHECK(contains(ddp_last_error(),
                             "sent 262144 bytes for tag 0x62 where 262136 were expected"));
    }
    free(held);
    return 0;
}

static void test_held_length_mismatch_tcp(void **state)
{
    (void)state;
    run_case("tcp", 3, held_mismatch_rank, NULL, NULL);
}

static void test_held_length_mismatch_shm(void **state)
{
    (void)state;
    /* No copying a held message out of the way while rank 0 waits: only
     * a stuck wait does that, after DDP_SHM_YIELD_US (10 s, the most it takes). */
    run_case("shm", 3, held_mismatch_rank, "DDP_SHM_YIELD_US", "10000000");
}

/* ---- a large copied message grows with its bytes ---------------------- */

#define GROWN (((size_t)5 << 20) + 123) /* several doublings past DDP__MATCH_CHUNK */

/* Rank 1's GROWN-byte message arrives while rank 0 waits for a later one,
 * so it is copied; tcp's copy starts at 1 MiB and doubles as the bytes
 * come (never the header's length at once).  It must arrive whole. */
static int grown_rank(int rank, ddp_store_t *st, ddp__tp *tp)
{
    (void)st;
    double deadline = ddp_time_now() + 10.0;
    uint8_t *buf = malloc(GROWN);
    uint8_t small[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHILD_CHECK(buf != NULL);
    if (rank == 1) {
        for (size_t i = 0; i < GROWN; i++)
            buf[i] = (uint8_t)(i * 7 + 1);
        ddp__req a, b;
        CHILD_CHECK(ddp__tp_isend(tp, &a, 0, 0x81, buf, GROWN) == 0);
        CHILD_CHECK(ddp__tp_isend(tp, &b, 0, 0x82, small, sizeof small) == 0);
        ddp__req *reqs[2] = {&a, &b};
        CHILD_CHECK(ddp__tp_wait(tp, reqs, 2, deadline, 0) == 0);
    } else {
        ddp__req a, b;
        uint8_t got[8] = {0};
        CHILD_CHECK(ddp__tp_irecv(tp, &b, 1, 0x82, got, sizeof got) == 0);
        CHILD_CHECK(ddp__tp_wait1(tp, &b, deadline, 0) == 0);
        CHILD_CHECK(memcmp(got, small, sizeof got) == 0);
        ddp__tcp_stats stats;
        CHILD_CHECK(ddp__tcp_debug_stats(tp, &stats) == 0);
        CHILD_CHECK(stats.copied_frames == 1 && stats.copied_bytes == GROWN);
        memset(buf, 0, GROWN);
        CHILD_CHECK(ddp__tp_irecv(tp, &a, 1, 0x81, buf, GROWN) == 0);
        CHILD_CHECK(ddp__tp_wait1(tp, &a, deadline, 0) == 0);
        size_t bad = 0;
        for (size_t i = 0; i < GROWN; i++)
            bad += buf[i] != (uint8_t)(i * 7 + 1);
        CHILD_CHECK(bad == 0);
    }
    free(buf);
    return 0;
}

static void test_copied_message_grows_tcp(void **state)
{
    (void)state;
    run_case("tcp", 2, grown_rank, NULL, NULL);
}

/* ---- a pull from a sender that died ----------------------------------- */

#define PULLED ((size_t)1 << 20)

/* Rank 1 announces a message by RTS and exits before rank 0 pulls it:
 * rank 0's receive fails at once, naming the death. */
static int pull_dead_rank(int rank, ddp_store_t *st, ddp__tp *tp)
{
    uint8_t *buf = calloc(PULLED, 1);
    CHILD_CHECK(buf != NULL);
    if (rank == 1) {
        ddp__req a;
        CHILD_CHECK(ddp__tp_isend(tp, &a, 0, 0x71, buf, PULLED) == 0);
        signal_key(st, "sent");
        _exit(0); /* a crash: no goodbye */
    }
    CHILD_CHECK(wait_key(st, "sent") == 0);
    sleep_s(0.3); /* rank 1 is gone */
    ddp__req r;
    CHILD_CHECK(ddp__tp_irecv(tp, &r, 1, 0x71, buf, PULLED) == 0);
    double t0 = ddp_time_now();
    int rc = ddp__tp_wait1(tp, &r, t0 + 5.0, 0);
    double took = ddp_time_now() - t0;
    if (!(rc == DDP_ERR_PEER && took < 2.0))
        fprintf(stderr, "rank 0: rc %d after %.3f s: %s\n", rc, took, ddp_last_error());
    CHILD_CHECK(rc == DDP_ERR_PEER);
    CHILD_CHECK(contains(ddp_last_error(), "rank 1 (pid ") && contains(ddp_last_error(), "died"));
    CHILD_CHECK(took < 2.0);
    free(buf);
    return 0;
}

/* Whether this process may read a child's memory (process_vm_readv). */
static int cma_allowed(void)
{
    static volatile uint64_t word = 0x1234;
    int pfd[2];
    if (pipe(pfd) != 0)
        return 0;
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        close(pfd[1]);
        (void)read(pfd[0], &c, 1);
        _exit(0);
    }
    close(pfd[0]);
    uint64_t got = 0;
    struct iovec l = {&got, sizeof got}, r = {(void *)&word, sizeof got};
    ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
    close(pfd[1]);
    waitpid(pid, NULL, 0);
    return n == (ssize_t)sizeof got && got == 0x1234;
}

static void test_pull_from_dead_sender_shm(void **state)
{
    (void)state;
    if (!cma_allowed())
        skip();
    run_case("shm", 2, pull_dead_rank, "DDP_SHM_CMA", "1");
}

int main(void)
{
    unsetenv("DDP_SHM_CMA");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_late_length_mismatch_tcp),
        cmocka_unit_test(test_late_length_mismatch_shm),
        cmocka_unit_test(test_held_length_mismatch_tcp),
        cmocka_unit_test(test_held_length_mismatch_shm),
        cmocka_unit_test(test_pull_from_dead_sender_shm),
        cmocka_unit_test(test_copied_message_grows_tcp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
