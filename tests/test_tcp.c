/* The TCP transport under hostile or broken input: strangers connecting
 * during setup (random bytes, a bogus handshake, a silent connection), a
 * rank with the wrong shared secret, a malformed frame after setup, and the
 * DDP_SECRET_FILE path.  The job must complete (or fail with a clear
 * error), never crash or hang. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
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
#include "pg/internal.h"
#include "pg_util.h"
#include "fork_children.h"
#include "free_port.h"
#include "transport/handshake.h"
#include "transport/tcp.h"

static job J;

typedef struct log_count {
    int rejected;
} log_count;

static void count_rejections(int level, const char *msg, void *user)
{
    (void)level;
    if (strstr(msg, "rejected"))
        ((log_count *)user)->rejected++;
}

static int allreduce_ok(ddp_pg_t *pg, int rank, int n)
{
    int64_t v[3] = {rank, 1, 100};
    if (ddp_pg_all_reduce(pg, v, 3, DDP_INT64, DDP_SUM) != 0)
        return 1;
    return !(v[0] == (int64_t)n * (n - 1) / 2 && v[1] == n && v[2] == 100 * n);
}

/* ---- strangers during setup ------------------------------------------ */

static int hostile_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_SECRET", "right horse battery staple", 1);
    log_count lc = {0};
    ddp_log_set_level(DDP_LOG_WARN);
    ddp_log_set_callback(count_rejections, &lc);
    if (rank == 0)
        sleep_s(1.0); /* rank 1 listens meanwhile: the strangers come first */
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 20.0, &pg) == 0);
    CHILD_CHECK(allreduce_ok(pg, rank, 2) == 0);
    if (rank == 1)
        CHILD_CHECK(lc.rejected >= 3);
    ddp_destroy_process_group(pg);
    return 0;
}

static int connect_to(int port)
{
    int fd = -1;
    if (ddp__sock_connect("127.0.0.1", port, ddp_time_now() + 5, "rank 1", &fd) != 0)
        return -1;
    return fd;
}

static void test_strangers_are_rejected(void **state)
{
    (void)state;
    job_init(&J);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(hostile_rank(r, NULL));
    }
    /* Find rank 1's listening port where every process can: the store. */
    ddp_store_t *st = NULL;
    assert_int_equal(ddp_store_file_create(J.path, 0, &st), 0);
    void *val = NULL;
    size_t len = 0;
    assert_int_equal(ddp_store_get(st, "ddp/world/rank/1", &val, &len), 0);
    char rec[256];
    snprintf(rec, sizeof rec, "%.*s", (int)len, (char *)val);
    free(val);
    int port = 0;
    assert_int_equal(sscanf(strchr(rec, ' ') + 1, "%d", &port), 1);

    /* 1: random bytes */
    int fd = connect_to(port);
    assert_true(fd >= 0);
    uint8_t junk[4096];
    ddp__rng rng;
    ddp__rng_seed(&rng, 7);
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)ddp__rng_next(&rng);
    assert_int_equal(ddp__sock_send_all(fd, junk, sizeof junk, ddp_time_now() + 2, "rank 1"), 0);
    /* 2: a connection that says nothing (bounded by the 2 s handshake limit) */
    int fd3 = connect_to(port);
    assert_true(fd3 >= 0);
    /* 3: a well-formed handshake from another job */
    int fd2 = connect_to(port);
    assert_true(fd2 >= 0);
    ddp__hs_ctx hs = {.rank = 0, .size = 2};
    memset(hs.group_id, 0x5a, sizeof hs.group_id);
    assert_true(ddp__hs_client(fd2, &hs, 1, 0, ddp_time_now() + 8, "rank 1") < 0);
    assert_true(contains(ddp_last_error(), "refused the connection"));
    for (int r = 0; r < 2; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    close(fd);
    close(fd2);
    close(fd3);
    ddp_store_destroy(st);
    job_cleanup(&J);
}

/* ---- a rank with the wrong secret ------------------------------------ */

static int secret_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_SECRET", rank == 0 ? "wrong" : "right", 1);
    ddp_pg_t *pg = NULL;
    int rc = ddp_init_process_group("tcp", J.url, rank, 2, 2.0, &pg);
    CHILD_CHECK(rc < 0 && pg == NULL);
    if (rank == 0) /* the connecting side learns the server does not know its secret */
        CHILD_CHECK(rc == DDP_ERR_AUTH && contains(ddp_last_error(), "shared secret"));
    else
        CHILD_CHECK(rc == DDP_ERR_TIMEOUT &&
                    contains(ddp_last_error(), "rank 0 did not connect to rank 1") &&
                    contains(ddp_last_error(), "1 other connection was refused meanwhile") &&
                    contains(ddp_last_error(), "(claiming rank 0): closed after our CHALLENGE") &&
                    contains(ddp_last_error(), "is DDP_SECRET the same everywhere?"));
    return 0;
}

static void test_wrong_secret_cannot_join(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, secret_rank, NULL, 30), 0);
    job_cleanup(&J);
}

/* ---- secret from a file ---------------------------------------------- */

static int secret_file_rank(int rank, void *arg)
{
    const char *path = arg;
    unsetenv("DDP_SECRET");
    setenv("DDP_SECRET_FILE", "/nonexistent/ddp-secret", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 5.0, &pg) == DDP_ERR_IO);
    CHILD_CHECK(contains(ddp_last_error(),
                         "DDP_SECRET_FILE=/nonexistent/ddp-secret: No such file or directory"));
    /* Too large: refused as the store refuses it, never cut to a prefix. */
    char big[256];
    snprintf(big, sizeof big, "%s-big", path);
    setenv("DDP_SECRET_FILE", big, 1);
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 5.0, &pg) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(
        contains(ddp_last_error(), "the file is larger than 4096 bytes, the limit for a secret"));
    CHILD_CHECK(contains(ddp_last_error(), big));
    setenv("DDP_SECRET_FILE", path, 1);
    ddp_store_t *st = NULL;
    CHILD_CHECK(ddp_store_file_create(J.path, 2, &st) == 0);
    CHILD_CHECK(ddp_init_process_group_store("tcp", st, rank, 2, 5.0, &pg) == 0);
    CHILD_CHECK(allreduce_ok(pg, rank, 2) == 0);
    ddp_destroy_process_group(pg);
    ddp_store_destroy(st);
    return 0;
}

static void test_secret_file(void **state)
{
    (void)state;
    job_init(&J);
    char path[200];
    snprintf(path, sizeof path, "%s/secret", J.dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("file secret\n", f);
    fclose(f);
    char big[256];
    snprintf(big, sizeof big, "%s-big", path);
    f = fopen(big, "w");
    assert_non_null(f);
    for (int i = 0; i < 5000; i++)
        fputc('x', f);
    fclose(f);
    assert_int_equal(run_children(2, secret_file_rank, path, 30), 0);
    unlink(big);
    unlink(path);
    job_cleanup(&J);
}

/* ---- a malformed frame after setup ----------------------------------- */

static int garbage_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 5.0, &pg) == 0);
    CHILD_CHECK(allreduce_ok(pg, rank, 2) == 0);
    if (rank == 1) { /* write junk where a frame header belongs */
        int fd = ddp__tcp_debug_fd(ddp__pg_transport(pg), 0);
        const char junk[24] = "this is not a frame....";
        CHILD_CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
    }
    float x = 1;
    int rc = ddp_pg_all_reduce(pg, &x, 1, DDP_FLOAT32, DDP_SUM);
    if (rank == 1 && rc == 0) /* rank 0 may have sent its part before it read the junk */
        rc = ddp_pg_all_reduce(pg, &x, 1, DDP_FLOAT32, DDP_SUM);
    CHILD_CHECK(rc < 0);
    if (rank == 1)
        CHILD_CHECK(contains(ddp_last_error(), "rank 0"));
    if (rank == 0)
        CHILD_CHECK(contains(ddp_last_error(), "rank 1") &&
                    contains(ddp_last_error(), "malformed frame"));
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_malformed_frame_drops_peer(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, garbage_rank, NULL, 30), 0);
    job_cleanup(&J);
}

/* ---- a frame header that claims gigabytes ---------------------------- */

#define CLAIMED ((uint64_t)8 << 30)

/* kB of "VmHWM:" (peak resident) or "VmPeak:" (peak mapped) of this process. */
static long vm_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, strlen(field)) == 0)
            kb = atol(line + strlen(field));
    if (f)
        fclose(f);
    return kb;
}

/* Rank 0 passed the real handshake (same secret), then writes a data frame
 * header claiming CLAIMED bytes, 64 KiB of them, and dies.  Rank 1, in a
 * collective, must fail naming rank 0 and the claimed length, without
 * having allocated (or even mapped) anything like it. */
static int huge_frame_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_SECRET", "same secret on both", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 10.0, &pg) == 0);
    CHILD_CHECK(allreduce_ok(pg, rank, 2) == 0);
    if (rank == 0) {
        int fd = ddp__tcp_debug_fd(ddp__pg_transport(pg), 1);
        static uint8_t frame[24 + (64 << 10)];
        uint64_t words[3] = {0x46504444u | (uint64_t)1 << 32 | (uint64_t)1 << 40,
                             0xfeedface12345678u, CLAIMED}; /* "DDPF" v1 DATA, tag, length */
        for (int w = 0; w < 3; w++)
            for (int i = 0; i < 8; i++)
                frame[8 * w + i] = (uint8_t)(words[w] >> (8 * i));
        CHILD_CHECK(ddp__sock_send_all(fd, frame, sizeof frame, ddp_time_now() + 5, "rank 1") ==
                    0);
        sleep_s(0.5);
        _exit(0); /* a crash: no goodbye */
    }
    long hwm = vm_kb("VmHWM:"), peak = vm_kb("VmPeak:");
    float x = 1;
    int rc = ddp_pg_all_reduce(pg, &x, 1, DDP_FLOAT32, DDP_SUM);
    long hwm_up = vm_kb("VmHWM:") - hwm, peak_up = vm_kb("VmPeak:") - peak;
    if (rc == 0 || hwm_up > 32 << 10 || peak_up > 256 << 10)
        fprintf(stderr, "rank 1: rc %d, VmHWM +%ld kB, VmPeak +%ld kB: %s\n", rc, hwm_up,
                peak_up, ddp_last_error());
    CHILD_CHECK(rc < 0);
    CHILD_CHECK(contains(ddp_last_error(), "rank 0 (") &&
                contains(ddp_last_error(), "65536 bytes into a 8589934592-byte message"));
    CHILD_CHECK(hwm_up < 32 << 10);   /* resident: the 1 MiB first piece, not 8 GiB */
    CHILD_CHECK(peak_up < 256 << 10); /* mapped: nothing like the claimed length either */
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_huge_frame_header_costs_nothing(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, huge_frame_rank, NULL, 30), 0);
    job_cleanup(&J);
}

/* ---- a rank that never starts, tcp:// init ---------------------------- */

static char Url[64];

/* Ranks 0 and 2 of 3 over tcp:// (rank 0 hosts the store); rank 1 never
 * comes.  Both must fail and name rank 1: rank 0 at its timeout, rank 2
 * (whose own timeout is far longer, so that it cannot time out first) as
 * soon as its store goes away with rank 0. */
#define MISSING_T0 2.0  /* rank 0's timeout */
#define MISSING_T2 10.0 /* rank 2's */
static int missing_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    double t0 = ddp_time_now();
    if (rank == 2)
        sleep_s(0.2); /* rank 0's store is up first */
    int rc = ddp_init_process_group("tcp", Url, rank, 3, rank == 0 ? MISSING_T0 : MISSING_T2,
                                    &pg);
    double took = ddp_time_now() - t0;
    fprintf(stderr, "rank %d: rc %d after %.2f s: %s\n", rank, rc, took, ddp_last_error());
    CHILD_CHECK(rc < 0 && pg == NULL);
    /* Rank 0's timeout, rank 2's head start, slack; well below MISSING_T2. */
    CHILD_CHECK(took < MISSING_T0 + 0.2 + 3.0);
    CHILD_CHECK(contains(ddp_last_error(), "rank 1 "));
    if (rank == 2)
        CHILD_CHECK(contains(ddp_last_error(), "waiting for rank 1") &&
                    contains(ddp_last_error(), "2 of 3 joined"));
    return 0;
}

static int missing_main(int i, void *arg)
{
    (void)arg;
    return missing_rank(i == 0 ? 0 : 2, NULL);
}

static void test_missing_rank_is_named_everywhere(void **state)
{
    (void)state;
    snprintf(Url, sizeof Url, "tcp://127.0.0.1:%d", free_port());
    assert_int_equal(run_children(2, missing_main, NULL, 30), 0);
}

/* ---- poll timeouts of long waits -------------------------------------- */

/* Every poll() of the transport and its handshakes takes its timeout from
 * ddp__sock_poll_ms: ddp_init_process_group accepts any positive timeout,
 * and (int)(left * 1000) + 1 overflowed past 24.8 days into a negative
 * timeout, which poll() takes as "wait forever". */
static void test_poll_timeout_of_long_waits(void **state)
{
    (void)state;
    assert_int_equal(ddp__sock_poll_ms(0), 0);
    assert_int_equal(ddp__sock_poll_ms(-5), 0);
    assert_int_equal(ddp__sock_poll_ms(0.0001), 1); /* rounded up: never before the deadline */
    assert_int_equal(ddp__sock_poll_ms(2.5), 2501);
    double days[] = {24.0, 24.9, 30.0, 365.0, 1e6, 1e300};
    for (size_t i = 0; i < sizeof days / sizeof *days; i++) {
        int ms = ddp__sock_poll_ms(days[i] * 86400);
        if (ms <= 0 || ms > 2000000000)
            fail_msg("%g days: poll timeout %d ms", days[i], ms);
    }
    assert_int_equal(ddp__sock_poll_ms(NAN), 0); /* no wait: the caller's deadline check decides */
}

/* ---- the handshake alone, over a socket pair ------------------------- */

/* Runs the server side (taking `streams` connections per pair) in a child
 * and the client (as connection `stream`) here; returns the client's result
 * and puts the server's (0, or the negative code) in *server_rc. */
static int handshake_streams(int streams, int stream, const char *server_secret,
                             const char *client_secret, int *server_rc, char *server_msg,
                             size_t msg_len)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return -100;
    int pipefd[2];
    if (pipe(pipefd) != 0)
        return -100;
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        close(pipefd[0]);
        ddp__hs_ctx hs = {.rank = 1, .size = 2, .streams = streams};
        memset(hs.group_id, 7, sizeof hs.group_id);
        hs.secret = (const uint8_t *)server_secret;
        hs.secret_len = server_secret ? strlen(server_secret) : 0;
        unsigned char connected[2 * 8] = {0};
        int peer = -1, got = -1;
        int rc = ddp__hs_server(sv[1], &hs, connected, ddp_time_now() + 5, "client", &peer, &got);
        char out[300];
        snprintf(out, sizeof out, "%d %d %s", rc, peer, rc ? ddp_last_error() : "");
        (void)!write(pipefd[1], out, strlen(out) + 1);
        _exit(0);
    }
    close(sv[1]);
    close(pipefd[1]);
    ddp__hs_ctx hs = {.rank = 0, .size = 2, .streams = stream + 1};
    memset(hs.group_id, 7, sizeof hs.group_id);
    hs.secret = (const uint8_t *)client_secret;
    hs.secret_len = client_secret ? strlen(client_secret) : 0;
    int rc = ddp__hs_client(sv[0], &hs, 1, stream, ddp_time_now() + 5, "server");
    close(sv[0]); /* a client that gave up hangs up: the server sees it at once */
    char in[300] = "";
    ssize_t n = read(pipefd[0], in, sizeof in - 1);
    in[n > 0 ? n : 0] = '\0';
    int peer = -1, off = 0;
    sscanf(in, "%d %d %n", server_rc, &peer, &off);
    snprintf(server_msg, msg_len, "%s", in + off);
    waitpid(pid, NULL, 0);
    close(pipefd[0]);
    return rc;
}

static int handshake_pair(const char *server_secret, const char *client_secret, int *server_rc,
                          char *server_msg, size_t msg_len)
{
    return handshake_streams(1, 0, server_secret, client_secret, server_rc, server_msg, msg_len);
}

/* A client opening more connections per pair than the server takes
 * (DDP_SOCKET_NUM_STREAMS differs) is refused, and both ends say why. */
static void test_handshake_refuses_extra_connections(void **state)
{
    (void)state;
    int src = 1;
    char smsg[300];
    assert_int_equal(handshake_streams(2, 1, NULL, NULL, &src, smsg, sizeof smsg), 0);
    assert_int_equal(src, 0);
    assert_int_equal(handshake_streams(2, 2, NULL, NULL, &src, smsg, sizeof smsg),
                     DDP_ERR_PROTOCOL);
    if (!contains(ddp_last_error(), "server refused the connection: more connections per pair "
                                    "than it takes (is DDP_SOCKET_NUM_STREAMS the same "
                                    "everywhere?)"))
        fail_msg("client: %s", ddp_last_error());
    assert_int_equal(src, DDP_ERR_PROTOCOL);
    if (!contains(smsg, "client: rank 0 opened connection 3 of the pair where this rank takes 2"))
        fail_msg("server: %s", smsg);
    /* One stream (0 reads as 1): a second connection is refused the same way. */
    assert_int_equal(handshake_streams(0, 1, NULL, NULL, &src, smsg, sizeof smsg),
                     DDP_ERR_PROTOCOL);
    assert_true(contains(smsg, "opened connection 2 of the pair where this rank takes 1"));
}

static void test_handshake_secret_check(void **state)
{
    (void)state;
    int src = 1;
    char smsg[300];
    /* Same secret, and no secret at all: accepted. */
    assert_int_equal(handshake_pair("k1", "k1", &src, smsg, sizeof smsg), 0);
    assert_int_equal(src, 0);
    assert_int_equal(handshake_pair(NULL, NULL, &src, smsg, sizeof smsg), 0);
    assert_int_equal(src, 0);
    /* The client holds another secret: it sees the server's proof fail. */
    assert_int_equal(handshake_pair("k1", "k2", &src, smsg, sizeof smsg), DDP_ERR_AUTH);
    assert_true(contains(ddp_last_error(), "failed to prove the shared secret"));
    assert_true(src < 0);
    /* A client without the secret against a server with one: same. */
    assert_int_equal(handshake_pair("k1", NULL, &src, smsg, sizeof smsg), DDP_ERR_AUTH);
    assert_true(src < 0);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A client that ignores the server's proof and answers with a made-up MAC
 * (what an attacker without the secret can do): the server refuses it.
 * The bytes follow docs/wire-format.md. */
static void test_server_refuses_a_forged_proof(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    uint8_t hello[92] = {0}, chal[76], auth[44] = {0}, welcome[12];
    put_u32(hello, 0x48504444u);
    hello[4] = 1; /* version */
    hello[6] = 1; /* HELLO */
    put_u32(hello + 12, 2); /* world size */
    put_u32(hello + 16, 0); /* client rank */
    put_u32(hello + 20, 1); /* server rank */
    memset(hello + 28, 7, 32); /* the right group identity */
    assert_int_equal(write(sv[0], hello, sizeof hello), (ssize_t)sizeof hello);
    put_u32(auth, 0x48504444u);
    auth[4] = 1;
    auth[6] = 3; /* AUTH with a zero MAC */
    assert_int_equal(write(sv[0], auth, sizeof auth), (ssize_t)sizeof auth);
    ddp__hs_ctx hs = {.rank = 1, .size = 2, .secret = (const uint8_t *)"k1", .secret_len = 2};
    memset(hs.group_id, 7, sizeof hs.group_id);
    unsigned char connected[2] = {0, 0};
    int peer = -1, stream = -1;
    int rc = ddp__hs_server(sv[1], &hs, connected, ddp_time_now() + 5, "forger", &peer, &stream);
    if (rc != DDP_ERR_AUTH)
        fail_msg("%d: %s", rc, ddp_last_error());
    assert_true(contains(ddp_last_error(), "forger (claiming rank 0): wrong shared secret"));
    assert_int_equal(read(sv[0], chal, sizeof chal), (ssize_t)sizeof chal);
    assert_int_equal(chal[6], 2);
    assert_int_equal(read(sv[0], welcome, sizeof welcome), (ssize_t)sizeof welcome);
    assert_int_equal(welcome[6], 4);
    assert_int_equal(welcome[8], 4); /* status: authentication failed */
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setenv("DDP_TRANSPORT", "tcp", 1); /* one host would pick shm */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handshake_secret_check),
        cmocka_unit_test(test_handshake_refuses_extra_connections),
        cmocka_unit_test(test_server_refuses_a_forged_proof),
        cmocka_unit_test(test_strangers_are_rejected),
        cmocka_unit_test(test_wrong_secret_cannot_join),
        cmocka_unit_test(test_secret_file),
        cmocka_unit_test(test_malformed_frame_drops_peer),
        cmocka_unit_test(test_huge_frame_header_costs_nothing),
        cmocka_unit_test(test_missing_rank_is_named_everywhere),
        cmocka_unit_test(test_poll_timeout_of_long_waits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
