/* Strangers on the listening ports during setup (transport/accept.c): a
 * process opens 200 silent connections, and some that send garbage or a
 * HELLO of another job, to the ports the accepting ranks published in the
 * store, before the last rank starts.  Setup must succeed, the collective
 * must be right, and setup must take about as long as without strangers:
 * both are measured here, alternated, with and without DDP_SECRET.  Also:
 * a rank in mid-handshake keeps its slot when strangers fill them all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/sock.h"
#include "ddp/pg.h"
#include "ddp/store.h"
#include "fork_children.h"
#include "pg_util.h"
#include "transport/accept.h"
#include "transport/handshake.h"

#define NRANKS 3
#define SILENT 200  /* silent connections, spread over ranks 1..NRANKS-1 */
#define GARBAGE 10  /* connections sending random bytes */
#define FOREIGN 6   /* connections sending a HELLO of another job */
#define ROUNDS 3
#define MANY 400    /* more than the 256 handshakes a rank keeps pending */

typedef struct shared {
    volatile int go;   /* the strangers are connected: rank 0 may start */
    volatile int done; /* every rank finished: the strangers may leave */
    volatile int opened;
    double start;            /* when rank 0 started setting up */
    double end[NRANKS];      /* when each rank's setup returned */
    int ok[NRANKS];          /* setup and the collective were right */
    int warned[NRANKS];      /* warn lines naming a stranger's address */
    int lines[NRANKS];       /* warn lines about rejected connections */
    int summary[NRANKS];     /* "... more connections rejected" lines */
    int dropped[NRANKS];     /* lines about connections dropped for newcomers */
} shared;

static job J;
static shared *S;
static const char *Secret; /* NULL: no DDP_SECRET */
static int Strangers; /* silent connections (0: none, nor any other stranger) */
static int OnePort;   /* all of them to rank 1's port */

static void count_warnings(int level, const char *msg, void *user)
{
    int r = *(int *)user;
    (void)level;
    if (!strstr(msg, "rejected"))
        return;
    S->lines[r]++;
    S->warned[r] += strstr(msg, "connection from 127.0.0.1:") != NULL;
    S->summary[r] += strstr(msg, "more connections rejected during setup") != NULL;
    S->dropped[r] += strstr(msg, "dropped, 256 handshakes pending") != NULL;
}

static int wait_flag(volatile int *flag, double limit_s)
{
    double deadline = ddp_time_now() + limit_s;
    while (!*flag)
        if (ddp_time_now() > deadline)
            return -1;
        else
            sleep_s(0.001);
    return 0;
}

static int rank_main(int rank, void *arg)
{
    (void)arg;
    if (Secret)
        setenv("DDP_SECRET", Secret, 1);
    else
        unsetenv("DDP_SECRET");
    ddp_log_set_level(DDP_LOG_WARN);
    ddp_log_set_callback(count_warnings, &rank);
    if (rank == 0) {
        CHILD_CHECK(wait_flag(&S->go, 30) == 0);
        S->start = ddp_time_now();
    }
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, NRANKS, 30.0, &pg) == 0);
    S->end[rank] = ddp_time_now();
    double v[2] = {rank + 1.0, 0.5 * rank};
    CHILD_CHECK(ddp_pg_all_reduce(pg, v, 2, DDP_FLOAT64, DDP_SUM) == 0);
    double want0 = NRANKS * (NRANKS + 1) / 2.0, want1 = 0.5 * NRANKS * (NRANKS - 1) / 2.0;
    CHILD_CHECK(v[0] == want0 && v[1] == want1);
    ddp_destroy_process_group(pg);
    S->ok[rank] = 1;
    return 0;
}

/* The port rank r published: its record "<size>\n<host> <port> <nonce>". */
static int published_port(ddp_store_t *st, int r)
{
    char key[64], rec[300];
    snprintf(key, sizeof key, "ddp/world/rank/%d", r);
    void *val = NULL;
    size_t len = 0;
    if (ddp_store_get(st, key, &val, &len) != 0)
        return -1;
    snprintf(rec, sizeof rec, "%.*s", (int)len, (char *)val);
    free(val);
    const char *sp = strchr(rec, ' ');
    return sp ? atoi(sp + 1) : -1;
}

/* A connection that is not waited for: the kernel completes it in the
 * listener's backlog whether or not the rank is accepting yet. */
static int open_silent(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_now(int fd, const void *buf, size_t len)
{
    return ddp__sock_send_all(fd, buf, len, ddp_time_now() + 5, "rank") == 0 ? 0 : -1;
}

/* The strangers: connect to the accepting ranks' ports, let rank 0 start,
 * hold the connections until the ranks are done. */
static int stranger_main(void)
{
    static int fds[MANY + GARBAGE + FOREIGN];
    int n = 0, ports[NRANKS];
    ddp_store_t *st = NULL;
    CHILD_CHECK(ddp_store_file_create(J.path, 0, &st) == 0);
    for (int r = 1; r < NRANKS; r++) {
        ports[r] = published_port(st, r);
        CHILD_CHECK(ports[r] > 0);
    }
    ddp_store_destroy(st);
    int silent = Strangers, total = Strangers ? Strangers + GARBAGE + FOREIGN : 0;
    ddp__rng rng;
    ddp__rng_seed(&rng, 11);
    for (int i = 0; i < total; i++) {
        int port = ports[OnePort ? 1 : 1 + i % (NRANKS - 1)];
        int fd = open_silent(port);
        CHILD_CHECK(fd >= 0);
        fds[n++] = fd;
        if (i < silent)
            continue;
        uint8_t msg[92] = {0x44, 0x44, 0x50, 0x48, 1, 0, 1, 0}; /* "DDPH", v1, HELLO */
        if (i < silent + GARBAGE) /* random bytes instead */
            for (size_t k = 0; k < sizeof msg; k++)
                msg[k] = (uint8_t)ddp__rng_next(&rng);
        else
            msg[12] = NRANKS, msg[20] = 1; /* world size, calling rank 1; group: zeros */
        CHILD_CHECK(send_now(fd, msg, sizeof msg) == 0);
    }
    S->opened = n;
    S->go = 1;
    int rc = wait_flag(&S->done, 60);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return rc == 0 ? 0 : 1;
}

/* One setup of NRANKS ranks; returns its duration (rank 0's start to the
 * last rank's return), or a negative figure when it failed. */
static double one_setup(int strangers)
{
    job_init(&J);
    memset(S, 0, sizeof *S);
    Strangers = strangers;
    rank_group g;
    start_ranks(&g, 0, NRANKS, rank_main, NULL);
    fflush(NULL);
    pid_t sp = fork();
    if (sp == 0)
        _exit(stranger_main());
    int failed = join_ranks(&g, 60);
    S->done = 1;
    int status = 0;
    waitpid(sp, &status, 0);
    job_cleanup(&J);
    if (failed || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    double last = 0;
    for (int r = 0; r < NRANKS; r++)
        last = S->end[r] > last ? S->end[r] : last;
    return last - S->start;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void strangers_cost_nothing(const char *secret)
{
    Secret = secret;
    double base[ROUNDS], with[ROUNDS];
    for (int i = 0; i < ROUNDS; i++) {
        base[i] = one_setup(0);
        assert_true(base[i] >= 0);
        with[i] = one_setup(SILENT);
        assert_true(with[i] >= 0);
        assert_int_equal(S->opened, SILENT + GARBAGE + FOREIGN);
        /* Every accepting rank named strangers' addresses, within its
         * budget of lines, and summed up the rest in one line. */
        for (int r = 1; r < NRANKS; r++) {
            assert_true(S->warned[r] >= 1);
            assert_true(S->lines[r] <= 9);
            assert_int_equal(S->summary[r], 1);
        }
        assert_int_equal(S->lines[0], 0);
    }
    qsort(base, ROUNDS, sizeof *base, cmp_double);
    qsort(with, ROUNDS, sizeof *with, cmp_double);
    double mb = base[ROUNDS / 2], mw = with[ROUNDS / 2];
    print_message("%s: setup of %d ranks %.3f s without strangers, %.3f s with %d "
                  "(median of %d; difference %+.3f s)\n",
                  secret ? "DDP_SECRET set" : "no secret", NRANKS, mb, mw,
                  SILENT + GARBAGE + FOREIGN, ROUNDS, mw - mb);
    /* The aim is 0.2 s; the bound is generous for a loaded machine.  (The
     * serial handshakes this replaces took 2 s per silent stranger.) */
    assert_true(mw - mb < 1.5);
}

/* More strangers on one port than a rank keeps pending: the oldest are
 * dropped for newcomers, and rank 0, which comes last, still gets in. */
static void test_more_strangers_than_slots(void **state)
{
    (void)state;
    Secret = NULL;
    OnePort = 1;
    double took = one_setup(MANY);
    OnePort = 0;
    assert_true(took >= 0);
    assert_int_equal(S->opened, MANY + GARBAGE + FOREIGN);
    assert_int_equal(S->summary[1], 1);
    assert_true(S->dropped[1] >= 1);
    print_message("setup with %d strangers on one port: %.3f s\n", MANY + GARBAGE + FOREIGN,
                  took);
}

/* ---- a rank in mid-handshake when the slots fill ---------------------- */

#define SLOTS 256              /* PENDING_MAX of transport/accept.c */
#define FLOOD (SLOTS + 44)     /* silent strangers after the rank: 45 drops */
#define HELLO_B 92
#define CHALLENGE_B 76
#define AUTH_B 44
#define WELCOME_B 12

static const char MidSecret[] = "mid-handshake secret";

static ddp__hs_ctx mid_ctx(int rank)
{
    ddp__hs_ctx c = {.rank = rank, .size = 2, .secret = (const uint8_t *)MidSecret,
                     .secret_len = sizeof MidSecret - 1};
    memset(c.group_id, 9, sizeof c.group_id);
    return c;
}

/* How many of fds[0..n) the server closed (readable: EOF). */
static int closed_count(const int *fds, int n)
{
    static struct pollfd p[FLOOD + 1];
    for (int i = 0; i < n; i++)
        p[i] = (struct pollfd){fds[i], POLLIN, 0};
    if (poll(p, (nfds_t)n, 0) < 0)
        return -1;
    int k = 0;
    for (int i = 0; i < n; i++)
        k += (p[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    return k;
}

static int relay(int from, int to, uint8_t *buf, size_t len)
{
    double dl = ddp_time_now() + 5;
    if (ddp__sock_recv_all(from, buf, len, dl, "relay") != 0)
        return -1;
    return ddp__sock_send_all(to, buf, len, dl, "relay");
}

/* The genuine rank 0 (ddp__hs_client, in a child) reaches the server
 * through this relay, which holds its AUTH back until FLOOD silent
 * strangers have connected after it and the server has dropped the 45 it
 * had no slot for; then lets the handshake finish.  The rank sits in AUTH
 * the whole time, past the HELLO check, so it must keep its slot.  Exit
 * status 0 when the rank got in. */
static int mid_client_main(int port)
{
    int sv[2];
    CHILD_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    fflush(NULL);
    pid_t c = fork();
    if (c == 0) {
        close(sv[0]);
        ddp__hs_ctx ctx = mid_ctx(0);
        int rc = ddp__hs_client(sv[1], &ctx, 1, 0, ddp_time_now() + 10, "rank 1");
        if (rc != 0)
            fprintf(stderr, "rank 0: %s\n", ddp_last_error());
        _exit(rc == 0 ? 0 : 1);
    }
    close(sv[1]);
    static int fds[FLOOD + 1];
    uint8_t buf[HELLO_B];
    CHILD_CHECK(ddp__sock_connect("127.0.0.1", port, ddp_time_now() + 5, "rank 1", &fds[0]) ==
                0);
    CHILD_CHECK(relay(sv[0], fds[0], buf, HELLO_B) == 0);
    CHILD_CHECK(relay(fds[0], sv[0], buf, CHALLENGE_B) == 0);
    CHILD_CHECK(ddp__sock_recv_all(sv[0], buf, AUTH_B, ddp_time_now() + 5, "rank 0") == 0);
    for (int i = 1; i <= FLOOD; i++)
        CHILD_CHECK((fds[i] = open_silent(port)) >= 0);
    /* The server's 2 s limit per connection runs for the rank too: the
     * flood must be through well before it (milliseconds, usually). */
    double until = ddp_time_now() + 1.0;
    int closed = 0;
    while ((closed = closed_count(fds, FLOOD + 1)) < FLOOD + 1 - SLOTS && ddp_time_now() < until)
        sleep_s(0.002);
    if (closed < FLOOD + 1 - SLOTS)
        fprintf(stderr, "relay: only %d connections dropped within 1 s\n", closed);
    /* Dropping the oldest whatever its state dropped the rank here. */
    int ok = ddp__sock_send_all(fds[0], buf, AUTH_B, ddp_time_now() + 5, "rank 1") == 0 &&
             relay(fds[0], sv[0], buf, WELCOME_B) == 0;
    close(sv[0]);
    int status = 0;
    waitpid(c, &status, 0);
    for (int i = 0; i <= FLOOD; i++)
        close(fds[i]);
    return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

static int Dropped;
static void count_drops(int level, const char *msg, void *user)
{
    (void)level;
    (void)user;
    Dropped += strstr(msg, "dropped, 256 handshakes pending") != NULL;
}

static void test_rank_in_handshake_keeps_its_slot(void **state)
{
    (void)state;
    int lfd = -1, port = 0;
    assert_int_equal(ddp__sock_listen("127.0.0.1", 0, 1024, &lfd, &port), 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(mid_client_main(port));
    ddp__hs_ctx ctx = mid_ctx(1);
    int fds[1] = {-1};
    char addrs[1][DDP__ACCEPT_ADDR];
    Dropped = 0;
    ddp_log_set_level(DDP_LOG_WARN);
    ddp_log_set_callback(count_drops, NULL);
    int rc = ddp__hs_accept(lfd, &ctx, ddp_time_now() + 5, 5, fds, addrs);
    ddp_log_set_callback(NULL, NULL);
    int status = 0;
    waitpid(pid, &status, 0);
    close(lfd);
    if (rc != 0)
        fail_msg("rank 1: %s", ddp_last_error());
    assert_true(fds[0] >= 0);
    close(fds[0]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(Dropped >= 1); /* the slots did fill */
}

static void test_strangers_without_secret(void **state)
{
    (void)state;
    strangers_cost_nothing(NULL);
}

static void test_strangers_with_secret(void **state)
{
    (void)state;
    strangers_cost_nothing("correct horse battery staple");
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setenv("DDP_TRANSPORT", "tcp", 1); /* one host would pick shm */
    setenv("DDP_RENDEZVOUS_REPORT_S", "0", 1);
    S = shared_page(sizeof *S);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strangers_without_secret),
        cmocka_unit_test(test_strangers_with_secret),
        cmocka_unit_test(test_more_strangers_than_slots),
        cmocka_unit_test(test_rank_in_handshake_keeps_its_slot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
