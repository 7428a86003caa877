/* Several TCP connections per pair (DDP_SOCKET_NUM_STREAMS, tcp/stripe.c),
 * driven through the transport and through process groups, with 2, 3 and
 * 4 streams: messages around the striping threshold and larger than the
 * socket buffers, both directions at once (every share read in parallel
 * into its receive); messages that come before their receives, out of tag
 * order (held, then copied share after share into a growing buffer); a
 * length mismatch on a striped message; a peer killed with SIGKILL in the
 * middle of striped all-reduces (named within the timeout); a peer that
 * gives up (ABORT) while a striped receive waits for the other streams,
 * also when its reason comes after the other stream closed (the survivor's
 * error names the reason); a hostile peer's share frame of another tag;
 * ranks that disagree on the stream count (each names both), a bad value,
 * a rendezvous record whose connection count (or another field) does not
 * parse.  Payloads are checked
 * byte for byte against a pattern computed from (sender, tag, index).
 * Ranks are forked processes.  (The whole collective matrix runs over
 * several streams in test_tcp_streams_coll.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp/pg.h"
#include "ddp/store.h"
#include "fork_children.h"
#include "pg/internal.h"
#include "pg_util.h"
#include "transport/tcp.h"
#include "transport/transport.h"

static job J;

static uint8_t pattern(int from, uint64_t tag, size_t i)
{
    uint64_t x = (uint64_t)from * 0x9e3779b97f4a7c15u ^ tag * 0xbf58476d1ce4e5b9u ^ i;
    x ^= x >> 29;
    return (uint8_t)(x * 0x94d049bb133111ebu >> 56);
}

static void fill(uint8_t *b, size_t len, int from, uint64_t tag)
{
    for (size_t i = 0; i < len; i++)
        b[i] = pattern(from, tag, i);
}

/* 0 when b holds from's pattern for tag, else the first bad index + 1. */
static size_t check(const uint8_t *b, size_t len, int from, uint64_t tag)
{
    for (size_t i = 0; i < len; i++)
        if (b[i] != pattern(from, tag, i))
            return i + 1;
    return 0;
}

typedef int (*rank_fn)(int rank, ddp__tp *tp);

typedef struct case_arg {
    const char *streams; /* DDP_SOCKET_NUM_STREAMS per rank: "2" or "2,3" */
    int n;
    rank_fn fn;
} case_arg;

static const char *Streams; /* the case's list, for the checks of its ranks */

/* Rank r's entry of a list "2,3" (the last one for ranks beyond it). */
static int streams_at(const char *list, int rank)
{
    for (int r = 0; r < rank && strchr(list, ','); r++)
        list = strchr(list, ',') + 1;
    return atoi(list);
}

static int run_rank(int rank, void *arg)
{
    case_arg *a = arg;
    char v[8] = "";
    snprintf(v, sizeof v, "%d", streams_at(a->streams, rank));
    setenv("DDP_SOCKET_NUM_STREAMS", v, 1);
    ddp_store_t *st = NULL;
    ddp__tp *tp = NULL;
    CHILD_CHECK(ddp_store_file_create(J.path, a->n, &st) == 0);
    int rc = ddp__tcp_create(st, "s", rank, a->n, 10.0, &tp);
    if (rc == 0)
        rc = a->fn(rank, tp);
    else
        rc = a->fn(rank, NULL); /* the case checks the error */
    ddp__tp_destroy(tp);
    ddp_store_destroy(st);
    return rc;
}

static void run_case(const char *streams, int n, rank_fn fn)
{
    case_arg a = {streams, n, fn};
    Streams = streams;
    job_init(&J);
    int failed = run_children(n, run_rank, &a, 60);
    unsetenv("DDP_TCP_SOCKBUF"); /* a case's socket buffers end with it, failed or not */
    job_cleanup(&J);
    assert_int_equal(failed, 0);
}

/* Streams in use and striped messages received so far. */
static int streams_of(ddp__tp *tp, uint64_t *striped)
{
    int streams = 0;
    if (ddp__tcp_debug_streams(tp, &streams, striped) != 0)
        return -1;
    return streams;
}

/* ---- both directions at once, every size class ------------------------ */

static const size_t sizes[] = {0,           1,           4096,        (256u << 10) - 1,
                               256u << 10,  (256u << 10) + 1, (1u << 20) + 7, 3u << 20,
                               (9u << 20) + 4093};
#define NSIZES (sizeof sizes / sizeof *sizes)

static int exchange_rank(int rank, ddp__tp *tp)
{
    CHILD_CHECK(tp != NULL);
    int peer = 1 - rank;
    uint8_t *out[NSIZES], *in[NSIZES];
    ddp__req s[NSIZES], r[NSIZES];
    ddp__req *all[2 * NSIZES];
    for (size_t k = 0; k < NSIZES; k++) {
        out[k] = malloc(sizes[k] + 1);
        in[k] = calloc(1, sizes[k] + 1);
        CHILD_CHECK(out[k] && in[k]);
        fill(out[k], sizes[k], rank, k);
        CHILD_CHECK(ddp__tp_irecv(tp, &r[k], peer, k, in[k], sizes[k]) == 0);
        all[2 * k] = &r[k];
    }
    for (size_t k = 0; k < NSIZES; k++) {
        CHILD_CHECK(ddp__tp_isend(tp, &s[k], peer, k, out[k], sizes[k]) == 0);
        all[2 * k + 1] = &s[k];
    }
    CHILD_CHECK(ddp__tp_wait(tp, all, 2 * NSIZES, ddp_time_now() + 30, 0) == 0);
    for (size_t k = 0; k < NSIZES; k++) {
        size_t bad = check(in[k], sizes[k], peer, k);
        if (bad)
            fprintf(stderr, "rank %d: message %zu (%zu bytes): byte %zu wrong\n", rank, k,
                    sizes[k], bad - 1);
        CHILD_CHECK(bad == 0);
        free(out[k]);
        free(in[k]);
    }
    uint64_t striped = 0;
    int streams = streams_of(tp, &striped);
    /* Every message from 256 KiB was striped (each rank received 5). */
    CHILD_CHECK(streams == atoi(getenv("DDP_SOCKET_NUM_STREAMS")) && striped == 5);
    return 0;
}

static void test_exchange_2_streams(void **state)
{
    (void)state;
    run_case("2", 2, exchange_rank);
}

static void test_exchange_3_streams(void **state)
{
    (void)state;
    run_case("3", 2, exchange_rank);
}

static void test_exchange_4_streams(void **state)
{
    (void)state;
    run_case("4", 2, exchange_rank);
}

/* ---- messages before their receives, out of tag order ------------------ */

static const size_t late_sizes[] = {(2u << 20) + 3, 300u << 10, 5u << 20, 100};
#define NLATE (sizeof late_sizes / sizeof *late_sizes)

static int late_rank(int rank, ddp__tp *tp)
{
    CHILD_CHECK(tp != NULL);
    uint8_t one = 1;
    ddp__req q[NLATE], w;
    ddp__req *all[NLATE];
    if (rank == 2) { /* keeps rank 1 busy (reading) while no receive from 0 is posted */
        sleep_s(0.3);
        CHILD_CHECK(ddp__tp_isend(tp, &w, 1, 7, &one, 1) == 0);
        CHILD_CHECK(ddp__tp_wait1(tp, &w, ddp_time_now() + 10, 0) == 0);
        return 0;
    }
    uint8_t *buf[NLATE];
    for (size_t k = 0; k < NLATE; k++) {
        buf[k] = malloc(late_sizes[k]);
        CHILD_CHECK(buf[k]);
        if (rank == 0)
            fill(buf[k], late_sizes[k], 0, 10 + k);
    }
    if (rank == 0) {
        for (size_t k = 0; k < NLATE; k++) {
            CHILD_CHECK(ddp__tp_isend(tp, &q[k], 1, 10 + k, buf[k], late_sizes[k]) == 0);
            all[k] = &q[k];
        }
    } else {
        /* Tag 10 comes while nothing from rank 0 is posted: held in the
         * kernel, then matched by its receive; tag 11 comes while 13 and
         * 12 are posted: copied, share after share. */
        CHILD_CHECK(ddp__tp_irecv(tp, &w, 2, 7, &one, 1) == 0);
        CHILD_CHECK(ddp__tp_wait1(tp, &w, ddp_time_now() + 10, 0) == 0);
        static const size_t order[NLATE] = {0, 3, 2, 1};
        for (size_t j = 0; j < NLATE; j++) {
            size_t k = order[j];
            CHILD_CHECK(ddp__tp_irecv(tp, &q[k], 0, 10 + k, buf[k], late_sizes[k]) == 0);
            all[j] = &q[k];
        }
    }
    CHILD_CHECK(ddp__tp_wait(tp, all, NLATE, ddp_time_now() + 30, 0) == 0);
    if (rank == 1) {
        for (size_t k = 0; k < NLATE; k++)
            CHILD_CHECK(check(buf[k], late_sizes[k], 0, 10 + k) == 0);
        ddp__tcp_stats st;
        uint64_t striped = 0;
        CHILD_CHECK(ddp__tcp_debug_stats(tp, &st) == 0);
        int want = atoi(getenv("DDP_SOCKET_NUM_STREAMS"));
        CHILD_CHECK(streams_of(tp, &striped) == want && striped == 3);
        if (!(st.held_frames >= 1 && st.copied_frames >= 1))
            fprintf(stderr, "held %llu copied %llu\n", (unsigned long long)st.held_frames,
                    (unsigned long long)st.copied_frames);
        CHILD_CHECK(st.held_frames >= 1 && st.copied_frames >= 1);
    }
    /* Both ends done before either leaves (a BYE must not race the data). */
    uint8_t z = 0, z2 = 0;
    ddp__req a, b;
    ddp__req *ab[2] = {&a, &b};
    CHILD_CHECK(ddp__tp_irecv(tp, &b, 1 - rank, 99, &z2, 1) == 0);
    CHILD_CHECK(ddp__tp_isend(tp, &a, 1 - rank, 99, &z, 1) == 0);
    CHILD_CHECK(ddp__tp_wait(tp, ab, 2, ddp_time_now() + 10, 0) == 0);
    for (size_t k = 0; k < NLATE; k++)
        free(buf[k]);
    return 0;
}

static void test_late_receives_2_streams(void **state)
{
    (void)state;
    run_case("2", 3, late_rank);
}

static void test_late_receives_4_streams(void **state)
{
    (void)state;
    run_case("4", 3, late_rank);
}

/* ---- a striped message of the wrong length ----------------------------- */

static int mismatch_rank(int rank, ddp__tp *tp)
{
    CHILD_CHECK(tp != NULL);
    size_t len = rank == 0 ? 1u << 20 : (1u << 20) + 4096;
    uint8_t *b = calloc(1, len);
    ddp__req q;
    ddp__req *one = &q;
    int rc = rank == 0 ? ddp__tp_isend(tp, &q, 1, 5, b, len) : ddp__tp_irecv(tp, &q, 0, 5, b, len);
    if (rc == 0)
        rc = ddp__tp_wait(tp, &one, 1, ddp_time_now() + 10, 0);
    free(b);
    if (rank == 1) {
        CHILD_CHECK(rc == DDP_ERR_PROTOCOL);
        CHILD_CHECK(contains(ddp_last_error(), "sent 1048576 bytes for tag 0x5 where 1052672"));
    }
    return 0;
}

static void test_striped_length_mismatch(void **state)
{
    (void)state;
    run_case("3", 2, mismatch_rank);
}

/* ---- ranks that disagree; a bad value ---------------------------------- */

/* Each rank names the first other rank whose record differs, and itself. */
static int disagree_rank(int rank, ddp__tp *tp)
{
    CHILD_CHECK(tp == NULL);
    int mine = streams_at(Streams, rank), other = 0;
    while (other == rank || streams_at(Streams, other) == mine)
        other++;
    char want[200];
    snprintf(want, sizeof want,
             "rank %d has DDP_SOCKET_NUM_STREAMS=%d where rank %d has %d: every rank must set "
             "the same",
             other, streams_at(Streams, other), rank, mine);
    if (!contains(ddp_last_error(), want))
        fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error());
    CHILD_CHECK(contains(ddp_last_error(), want));
    return 0;
}

static void test_streams_must_agree(void **state)
{
    (void)state;
    run_case("2,3", 2, disagree_rank);
    run_case("1,1,4", 3, disagree_rank);
}

static int bad_value_rank(int rank, ddp__tp *tp)
{
    (void)rank;
    CHILD_CHECK(tp == NULL);
    CHILD_CHECK(contains(ddp_last_error(), "DDP_SOCKET_NUM_STREAMS=9"));
    CHILD_CHECK(contains(ddp_last_error(), "1 to 8"));
    return 0;
}

static void test_bad_stream_count(void **state)
{
    (void)state;
    run_case("9", 1, bad_value_rank);
}

/* ---- a peer that gives up while a striped receive waits ---------------- */

/* Rank 1 starts a striped 2 MiB send through small socket buffers (so its
 * shares are still in flight, but what is left of stream 0's share, sent
 * as zeros before the ABORT, is pushed well within ABORT_WAIT_S on a
 * loaded machine) and then gives up with a reason; rank 0 waits
 * on the receive.  The reason travels on stream 0, behind stream 0's share,
 * while rank 0 waits for the other streams: rank 0's error must name it,
 * not just the connection that closed. */
#define REASON "out of patience (test reason 42)"

static int abort_rank(int rank, ddp__tp *tp)
{
    CHILD_CHECK(tp != NULL);
    size_t len = 2u << 20;
    uint8_t *b = calloc(1, len), go = 1;
    ddp__req q, g;
    ddp__req *both[2] = {&q, &g}, *one = &g;
    int rc;
    if (rank == 0) { /* the receive is posted before rank 1 sends */
        CHILD_CHECK(ddp__tp_irecv(tp, &q, 1, 1, b, len) == 0);
        CHILD_CHECK(ddp__tp_isend(tp, &g, 1, 2, &go, 1) == 0);
        rc = ddp__tp_wait(tp, both, 2, ddp_time_now() + 10, 0);
        if (!contains(ddp_last_error(), "gave up: " REASON))
            fprintf(stderr, "rank 0 (%s streams): rc %d: %s\n", getenv("DDP_SOCKET_NUM_STREAMS"),
                    rc, ddp_last_error());
        CHILD_CHECK(rc == DDP_ERR_PEER && contains(ddp_last_error(), "gave up: " REASON));
    } else {
        CHILD_CHECK(ddp__tp_irecv(tp, &g, 0, 2, &go, 1) == 0);
        CHILD_CHECK(ddp__tp_wait(tp, &one, 1, ddp_time_now() + 10, 0) == 0);
        CHILD_CHECK(ddp__tp_isend(tp, &q, 0, 1, b, len) == 0);
        CHILD_CHECK(q.status == 0); /* still in flight */
        ddp__tp_abort(tp, DDP_ERR_STATE, REASON);
    }
    free(b);
    return 0;
}

static void abort_case(const char *streams)
{
    setenv("DDP_TCP_SOCKBUF", "65536", 1);
    run_case(streams, 2, abort_rank);
}

static void test_abort_reason_2_streams(void **state)
{
    (void)state;
    abort_case("2");
}

static void test_abort_reason_4_streams(void **state)
{
    (void)state;
    abort_case("4");
}

/* ---- a hostile rank 1 writing frames by hand --------------------------- */

/* Writes all of buf on the transport's (non-blocking) socket. */
static int raw_send(int fd, const void *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, (const char *)buf + off, len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
        } else if (n < 0 && errno == EAGAIN) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 1000);
        } else {
            return -1;
        }
    }
    return 0;
}

/* A frame header as docs/wire-format.md gives it. */
static void frame_header(uint8_t *h, unsigned op, uint64_t tag, uint64_t len)
{
    uint64_t w[3] = {0x46504444u | (uint64_t)1 << 32 | (uint64_t)op << 40, tag, len};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 8; i++)
            h[8 * k + i] = (uint8_t)(w[k] >> (8 * i));
}

#define HDR_BYTES 24
#define RAW_LEN (1u << 20) /* with 2 streams: shares of 512 KiB */
#define RAW_SHARE (RAW_LEN / 2)

/* Rank 0 waits on a striped receive of RAW_LEN bytes (tag 7) from rank 1;
 * rank 1 runs hostile(stream 0's socket, stream 1's socket). */
typedef int (*hostile_fn)(int fd0, int fd1);
static hostile_fn Hostile;
static const char *Expect;

static int raw_rank(int rank, ddp__tp *tp)
{
    CHILD_CHECK(tp != NULL);
    if (rank == 1)
        return Hostile(ddp__tcp_debug_stream_fd(tp, 0, 0), ddp__tcp_debug_stream_fd(tp, 0, 1));
    uint8_t *b = calloc(1, RAW_LEN);
    ddp__req q;
    ddp__req *one = &q;
    CHILD_CHECK(ddp__tp_irecv(tp, &q, 1, 7, b, RAW_LEN) == 0);
    int rc = ddp__tp_wait(tp, &one, 1, ddp_time_now() + 10, 0);
    if (!contains(ddp_last_error(), Expect))
        fprintf(stderr, "rank 0: rc %d: %s\n", rc, ddp_last_error());
    CHILD_CHECK(rc == DDP_ERR_PEER && contains(ddp_last_error(), Expect));
    free(b);
    return 0;
}

static void raw_case(hostile_fn fn, const char *expect)
{
    Hostile = fn;
    Expect = expect;
    run_case("2", 2, raw_rank);
}

/* Stream 1 closes while stream 0's share is half in; stream 0's rest
 * (zeros, as a giver-up completes it) and the ABORT come 50 ms later, as
 * when the other connection's FIN overtakes them on a network. */
static int late_reason(int fd0, int fd1)
{
    static uint8_t buf[HDR_BYTES + RAW_SHARE];
    const char why[] = "rank 1: disk full (test reason 43)";
    frame_header(buf, 1, 7, RAW_LEN);
    CHILD_CHECK(raw_send(fd0, buf, HDR_BYTES + RAW_SHARE / 2) == 0);
    sleep_s(0.05);
    CHILD_CHECK(shutdown(fd1, SHUT_WR) == 0);
    sleep_s(0.05);
    CHILD_CHECK(raw_send(fd0, buf + HDR_BYTES + RAW_SHARE / 2, RAW_SHARE / 2) == 0);
    frame_header(buf, 3, 0, sizeof why - 1);
    memcpy(buf + HDR_BYTES, why, sizeof why - 1);
    CHILD_CHECK(raw_send(fd0, buf, HDR_BYTES + sizeof why - 1) == 0);
    sleep_s(0.5); /* rank 0 reads it before this rank's streams close */
    return 0;
}

static void test_abort_reason_behind_a_share(void **state)
{
    (void)state;
    raw_case(late_reason, "gave up: rank 1: disk full (test reason 43)");
}

/* Stream 1 brings a share frame of another tag. */
static int bad_share(int fd0, int fd1)
{
    static uint8_t buf[HDR_BYTES + RAW_SHARE];
    frame_header(buf, 1, 7, RAW_LEN);
    CHILD_CHECK(raw_send(fd0, buf, HDR_BYTES + RAW_SHARE) == 0);
    frame_header(buf, 4, 99, RAW_SHARE);
    CHILD_CHECK(raw_send(fd1, buf, HDR_BYTES) == 0);
    sleep_s(0.5);
    return 0;
}

static void test_malformed_share(void **state)
{
    (void)state;
    raw_case(bad_share, "malformed share on connection 2 of 2 (header 0x0000040146504444, tag "
                        "99, length 524288 where a share of 524288 bytes of tag 7 was due); "
                        "connection dropped");
}

/* ---- a rendezvous record that does not parse --------------------------- */

/* Rank 1's record is written into the store by hand; rank 0 (this
 * process) refuses it before it dials anyone. */
static void bad_record(const char *rec)
{
    job_init(&J);
    ddp_store_t *st = NULL;
    ddp__tp *tp = NULL;
    int64_t joins = 0;
    char val[300];
    snprintf(val, sizeof val, "2\n%s", rec);
    assert_int_equal(ddp_store_file_create(J.path, 2, &st), 0);
    assert_int_equal(ddp_store_add(st, "s/join/1", 1, &joins), 0);
    assert_int_equal(ddp_store_set(st, "s/rank/1", val, strlen(val)), 0);
    setenv("DDP_SOCKET_NUM_STREAMS", "2", 1);
    int rc = ddp__tcp_create(st, "s", 0, 2, 5.0, &tp);
    unsetenv("DDP_SOCKET_NUM_STREAMS");
    char want[300];
    snprintf(want, sizeof want,
             "malformed address record of rank 1: '%s' (want \"host port nonce connections\")",
             rec);
    if (rc != DDP_ERR_FORMAT || !contains(ddp_last_error(), want))
        fail_msg("'%s': rc %d: %s", rec, rc, ddp_last_error());
    assert_null(tp);
    ddp_store_destroy(st);
    job_cleanup(&J);
}

static void test_malformed_record(void **state)
{
    (void)state;
#define NONCE "00112233445566778899aabbccddeeff"
    static const char *const recs[] = {
        "127.0.0.1 40000 " NONCE,        /* no connection count (a version before streams) */
        "127.0.0.1 40000 " NONCE " 0",   /* out of range */
        "127.0.0.1 40000 " NONCE " 9",
        "127.0.0.1 40000 " NONCE " 2x",  /* not a number */
        "127.0.0.1 40000 " NONCE " 2 7", /* a field too many */
        "127.0.0.1 70000 " NONCE " 2",   /* port */
        "127.0.0.1 -4 " NONCE " 2",
        "127.0.0.1 40000 0011223344 2",  /* a short nonce */
    };
    for (size_t i = 0; i < sizeof recs / sizeof *recs; i++)
        bad_record(recs[i]);
}

/* ---- a peer killed with SIGKILL mid-run -------------------------------- */

typedef struct kill_report {
    int started[3], rc[3];
    uint64_t striped[3];
    double err_time[3];
    char msg[3][300];
} kill_report;

static void killed_peer_case(const char *streams)
{
    job_init(&J);
    const int n = 3;
    kill_report *rep = shared_page(sizeof *rep);
    pid_t pids[3];
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            setenv("DDP_SOCKET_NUM_STREAMS", streams, 1);
            setenv("DDP_CHUNK_BYTES", "1048576", 1); /* ring messages of 1 MiB: striped */
            setenv("DDP_TRANSPORT", "tcp", 1);
            ddp_pg_t *pg = NULL;
            if (ddp_init_process_group("tcp", J.url, r, n, 30.0, &pg) != 0)
                _exit(2);
            size_t cnt = 3u << 20; /* 12 MiB */
            float *x = calloc(cnt, sizeof *x);
            int rc = 0;
            for (int it = 0; rc == 0 && it < 100000; it++) {
                rc = ddp_pg_all_reduce(pg, x, cnt, DDP_FLOAT32, DDP_SUM);
                int sn = 0;
                ddp__tcp_debug_streams(ddp__pg_transport(pg), &sn, &rep->striped[r]);
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
    double give_up = ddp_time_now() + 30;
    while (!(rep->started[0] && rep->started[1] && rep->started[2]) && ddp_time_now() < give_up)
        sleep_s(0.01);
    sleep_s(0.2);
    double killed = ddp_time_now();
    kill(pids[2], SIGKILL);
    int status;
    waitpid(pids[2], &status, 0);
    for (int r = 0; r < 2; r++) {
        if (!reap_by(pids[r], ddp_time_now() + 10, &status)) {
            kill_children(pids, n);
            fail_msg("rank %d hangs after rank 2 was killed (%s streams)", r, streams);
        }
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        assert_true(rep->striped[r] > 0);
        assert_int_equal(rep->rc[r], DDP_ERR_PEER);
        if (!contains(rep->msg[r], "rank 2"))
            fail_msg("rank %d: %s", r, rep->msg[r]);
        /* Named at once (the sockets close), far within the 30 s timeout. */
        assert_true(rep->err_time[r] - killed < 5.0);
    }
    munmap(rep, sizeof *rep);
    job_cleanup(&J);
}

static void test_killed_peer_2_streams(void **state)
{
    (void)state;
    killed_peer_case("2");
}

static void test_killed_peer_4_streams(void **state)
{
    (void)state;
    killed_peer_case("4");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exchange_2_streams),      cmocka_unit_test(test_exchange_3_streams),
        cmocka_unit_test(test_exchange_4_streams),      cmocka_unit_test(test_late_receives_2_streams),
        cmocka_unit_test(test_late_receives_4_streams), cmocka_unit_test(test_striped_length_mismatch),
        cmocka_unit_test(test_streams_must_agree),      cmocka_unit_test(test_bad_stream_count),
        cmocka_unit_test(test_killed_peer_2_streams),   cmocka_unit_test(test_killed_peer_4_streams),
        cmocka_unit_test(test_abort_reason_2_streams),  cmocka_unit_test(test_abort_reason_4_streams),
        cmocka_unit_test(test_abort_reason_behind_a_share), cmocka_unit_test(test_malformed_share),
        cmocka_unit_test(test_malformed_record),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
