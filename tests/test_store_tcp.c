/* Tests of the TCPStore (src/store/tcp_*.c): every store operation with
 * real processes on loopback (store_cases.h), hostile clients, the shared
 * secret handshake, server shutdown under a waiting client, connect
 * timeouts, and binding to the given address only. */
#include "free_port.h"
#include "store_cases.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include "base/rng.h"
#include "store/tcp_proto.h"

static ddp_store_t *server;
static int server_port;

static int open_store(int rank, int world_size, ddp_store_t **out)
{
    (void)rank;
    return ddp_store_tcp_create("127.0.0.1", server_port, 0, world_size, 30, out);
}

static void stop_server(void)
{
    ddp_store_destroy(server);
    server = NULL;
}

static void fresh_store(void)
{
    stop_server();
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", 0, 1, 1, 30, &server), 0);
    server_port = ddp_store_tcp_port(server);
    assert_true(server_port > 0);
}

/* ---- log capture (the server thread logs why it drops a client) --------- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[16384];

static void capture(int level, const char *msg, void *user)
{
    (void)level;
    (void)user;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof log_text - n, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

static int logged(const char *what)
{
    pthread_mutex_lock(&log_mu);
    int found = strstr(log_text, what) != NULL;
    pthread_mutex_unlock(&log_mu);
    return found;
}

/* Waits (up to 2 s) for the server thread to log what. */
static int logged_soon(const char *what)
{
    for (int i = 0; i < 400 && !logged(what); i++)
        sleep_s(0.005);
    return logged(what);
}

/* ---- raw sockets for hostile clients ------------------------------------ */

static int raw_connect(int port)
{
    int fd = loopback_connect(port);
    assert_true(fd >= 0);
    return fd;
}

/* Reads until the server closes the connection (1) or 2 s pass (0). */
static int closed_by_server(int fd)
{
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return 1;
        if (n < 0)
            return 0;
    }
}

static void send_bytes(int fd, const void *p, size_t n)
{
    assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void assert_store_works(void)
{
    ddp_store_t *c = NULL;
    assert_int_equal(open_store(0, 1, &c), 0);
    int64_t r = 0;
    assert_int_equal(ddp_store_add(c, "alive", 1, &r), 0);
    assert_value(c, "alive", "1", 1);
    assert_int_equal(ddp_store_delete_key(c, "alive", NULL), 0);
    ddp_store_destroy(c);
}

static void test_hostile_clients(void **state)
{
    (void)state;
    fresh_store();
    log_text[0] = 0;
    ddp_log_set_callback(capture, NULL);
    ddp_log_set_level(DDP_LOG_WARN);
    /* A client that connects and says nothing must not block others. */
    int idle = raw_connect(server_port);

    /* Random bytes. */
    ddp__rng rng;
    ddp__rng_seed(&rng, 7);
    uint8_t junk[4096];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)ddp__rng_next(&rng);
    junk[0] = 'G'; /* never the magic by chance */
    int fd = raw_connect(server_port);
    send_bytes(fd, junk, sizeof junk);
    assert_true(closed_by_server(fd));
    close(fd);
    assert_true(logged_soon("bad magic"));
    assert_store_works();

    /* A valid header claiming 4 GiB of payload. */
    uint8_t h[DDP__TS_HEADER];
    ddp__ts_header_encode(h, DDP__TS_SET, 0xffffffffu, 0);
    fd = raw_connect(server_port);
    send_bytes(fd, h, sizeof h);
    assert_true(closed_by_server(fd));
    close(fd);
    assert_true(logged_soon("message length over the limit (opcode 3, length 4294967295)"));

    /* Unknown opcode, and a malformed payload. */
    ddp__ts_header_encode(h, 200, 0, 0);
    fd = raw_connect(server_port);
    send_bytes(fd, h, sizeof h);
    assert_true(closed_by_server(fd));
    close(fd);
    assert_true(logged_soon("unknown opcode"));
    uint8_t msg[DDP__TS_HEADER + 8] = {0};
    ddp__ts_header_encode(msg, DDP__TS_SET, 8, 0);
    msg[DDP__TS_HEADER] = 200; /* key length 200 with 4 bytes left */
    fd = raw_connect(server_port);
    send_bytes(fd, msg, sizeof msg);
    assert_true(closed_by_server(fd));
    close(fd);
    assert_true(logged_soon("malformed request payload"));

    /* A big claimed length (under the limit) then silence, then hang-up:
     * the server buffers only what arrives and keeps serving. */
    ddp__ts_header_encode(h, DDP__TS_SET, 100u << 20, 0);
    fd = raw_connect(server_port);
    send_bytes(fd, h, sizeof h);
    send_bytes(fd, junk, 100);
    assert_store_works();
    close(fd);

    /* Half a header then hang-up. */
    fd = raw_connect(server_port);
    send_bytes(fd, h, 7);
    close(fd);
    assert_store_works();
    close(idle);
    ddp_log_set_callback(NULL, NULL);
    ddp_log_set_level(DDP_LOG_OFF);
    stop_server();
}

/* Well-formed headers over random payloads, each on its own connection:
 * every one is answered or dropped, none crashes or stalls the server
 * (run under ASan, this checks the payload parsers' bounds). */
static void test_random_payloads(void **state)
{
    (void)state;
    fresh_store();
    ddp__rng rng;
    ddp__rng_seed(&rng, 11);
    int iters = getenv("DDP_TEST_SANITIZER") ? 150 : 300;
    for (int i = 0; i < iters; i++) {
        uint8_t msg[DDP__TS_HEADER + 96];
        uint32_t len = (uint32_t)ddp__rng_below(&rng, 97);
        int op = DDP__TS_SET + (int)ddp__rng_below(&rng, DDP__TS_OP_END - DDP__TS_SET);
        ddp__ts_header_encode(msg, op, len, 0);
        for (uint32_t j = 0; j < len; j++) {
            /* Small numbers often, so length fields sometimes fit. */
            uint64_t r = ddp__rng_next(&rng);
            msg[DDP__TS_HEADER + j] = (uint8_t)(r & 1 ? r >> 8 & 7 : r >> 8);
        }
        int fd = raw_connect(server_port);
        struct timeval tv = {2, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        uint8_t hello[DDP__TS_HEADER + 1 + DDP__TS_NONCE];
        assert_int_equal(recv(fd, hello, sizeof hello, MSG_WAITALL), (ssize_t)sizeof hello);
        send_bytes(fd, msg, DDP__TS_HEADER + len);
        /* An answer, or the connection closed: not silence (a GET/WAIT
         * with a random timeout may be parked: it gets closed below). */
        uint8_t ans[DDP__TS_HEADER];
        ssize_t n = recv(fd, ans, sizeof ans, MSG_WAITALL);
        if (n > 0) {
            assert_int_equal(n, (ssize_t)sizeof ans);
        } else if (n < 0) {
            assert_true(op == DDP__TS_GET || op == DDP__TS_WAIT);
        }
        close(fd);
    }
    assert_store_works();
    stop_server();
}

/* ---- shared secret ------------------------------------------------------ */

static void test_secret(void **state)
{
    (void)state;
    stop_server();
    setenv("DDP_SECRET", "right horse battery", 1);
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", 0, 1, 2, 10, &server), 0);
    server_port = ddp_store_tcp_port(server);
    assert_int_equal(ddp_store_set(server, "k", "v", 1), 0); /* the server's own handle proves it */

    ddp_store_t *c = (ddp_store_t *)&c;
    setenv("DDP_SECRET", "wrong horse battery", 1);
    assert_int_equal(open_store(1, 2, &c), DDP_ERR_AUTH);
    assert_null(c);
    assert_non_null(strstr(ddp_last_error(), "the server rejected our shared secret (wrong secret)"));

    unsetenv("DDP_SECRET");
    assert_int_equal(open_store(1, 2, &c), DDP_ERR_AUTH);
    assert_non_null(strstr(ddp_last_error(),
                           "the server requires a shared secret: set DDP_SECRET or DDP_SECRET_FILE"));

    /* A client that skips authentication and just asks is dropped. */
    log_text[0] = 0;
    ddp_log_set_callback(capture, NULL);
    ddp_log_set_level(DDP_LOG_WARN);
    int fd = raw_connect(server_port);
    uint8_t req[DDP__TS_HEADER + 4 + 8] = {0};
    ddp__ts_header_encode(req, DDP__TS_NUM_KEYS, 0, 0);
    send_bytes(fd, req, DDP__TS_HEADER);
    assert_true(closed_by_server(fd));
    close(fd);
    assert_true(logged_soon("request before authentication"));
    ddp_log_set_callback(NULL, NULL);
    ddp_log_set_level(DDP_LOG_OFF);

    /* The right secret from a file (trailing newline ignored). */
    char path[64];
    snprintf(path, sizeof path, "/tmp/ddp-test-secret-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs("right horse battery\n", f);
    fclose(f);
    setenv("DDP_SECRET_FILE", path, 1);
    assert_int_equal(open_store(1, 2, &c), 0);
    assert_value(c, "k", "v", 1);
    ddp_store_destroy(c);
    unlink(path);
    assert_int_equal(open_store(1, 2, &c), DDP_ERR_IO);
    assert_non_null(strstr(ddp_last_error(), "DDP_SECRET_FILE="));
    assert_non_null(strstr(ddp_last_error(), "No such file or directory"));
    /* Too large: refused (the transports refuse it too), never cut. */
    f = fopen(path, "w");
    for (int i = 0; i < 5000; i++)
        fputc('x', f);
    fclose(f);
    assert_int_equal(open_store(1, 2, &c), DDP_ERR_INVALID_ARG);
    assert_non_null(
        strstr(ddp_last_error(), "the file is larger than 4096 bytes, the limit for a secret"));
    unlink(path);
    unsetenv("DDP_SECRET_FILE");
    stop_server();

    /* A client with a secret refuses a server without one. */
    fresh_store();
    setenv("DDP_SECRET", "right horse battery", 1);
    assert_int_equal(open_store(1, 2, &c), DDP_ERR_AUTH);
    assert_non_null(strstr(ddp_last_error(), "refusing an unauthenticated server"));
    unsetenv("DDP_SECRET");
    stop_server();
}

/* ---- shutdown, connect errors, addresses --------------------------------- */

static int wait_through_shutdown(int rank, void *arg)
{
    (void)rank;
    (void)arg;
    ddp_store_t *c = NULL;
    CHILD_CHECK(open_store(1, 2, &c) == 0);
    CHILD_CHECK(ddp_store_set(c, "child_ready", "", 0) == 0);
    void *v = NULL;
    size_t len;
    double t0 = ddp_time_now();
    ddp_store_set_timeout(c, 30);
    int rc = ddp_store_get(c, "never", &v, &len);
    double dt = ddp_time_now() - t0;
    CHILD_CHECK(rc == DDP_ERR_CONNECTION);
    CHILD_CHECK(strstr(ddp_last_error(), "get 'never': connection closed by the peer") != NULL);
    CHILD_CHECK(dt < 3.0); /* the parent destroys the server ~0.2 s in */
    /* Later calls fail at once and say why. */
    CHILD_CHECK(ddp_store_set(c, "x", "", 0) == DDP_ERR_CONNECTION);
    CHILD_CHECK(strstr(ddp_last_error(), "connection closed after an earlier error") != NULL);
    ddp_store_destroy(c);
    return 0;
}

static void test_server_shutdown_fails_waiters(void **state)
{
    (void)state;
    fresh_store();
    pid_t pid = fork();
    if (pid == 0)
        _exit(wait_through_shutdown(0, NULL));
    const char *ready = "child_ready";
    assert_int_equal(ddp_store_wait(server, &ready, 1, 10), 0);
    sleep_s(0.2);
    stop_server();
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_connect_errors(void **state)
{
    (void)state;
    /* A port where nothing listens: retries until the timeout. */
    fresh_store();
    int port = server_port;
    stop_server();
    ddp_store_t *c = NULL;
    double t0 = ddp_time_now();
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", port, 0, 2, 0.4, &c), DDP_ERR_TIMEOUT);
    double dt = ddp_time_now() - t0;
    assert_true(dt >= 0.39 && dt < 1.0);
    assert_non_null(strstr(ddp_last_error(), "could not connect within 0.4 s"));
    assert_non_null(strstr(ddp_last_error(), "Connection refused"));

    assert_int_equal(ddp_store_tcp_create("127.0.0.1", 70000, 0, 2, 1, &c), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "port 70000 out of range"));
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", 0, 0, 2, 1, &c), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "port 0 out of range (1-65535)"));
    assert_int_equal(ddp_store_tcp_create("", 1234, 0, 2, 1, &c), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "empty host"));
    assert_int_equal(ddp_store_tcp_create("no-such-host.invalid", 1234, 0, 2, 0.2, &c),
                     DDP_ERR_TIMEOUT);
    assert_non_null(strstr(ddp_last_error(), "cannot resolve 'no-such-host.invalid'"));
    /* Listening on an address this host does not have. */
    assert_int_equal(ddp_store_tcp_create("192.0.2.1", 0, 1, 2, 1, &c), DDP_ERR_CONNECTION);
    assert_non_null(strstr(ddp_last_error(), "listen on 192.0.2.1:0"));
    assert_int_equal(ddp_store_tcp_port(NULL), DDP_ERR_INVALID_ARG);

    /* Something that is not a store answers on the port. */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 4), 0);
    socklen_t sl = sizeof a;
    getsockname(lfd, (struct sockaddr *)&a, &sl);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = accept(lfd, NULL, NULL);
        const char *banner = "SSH-2.0-OpenSSH_9.2\r\n";
        if (send(fd, banner, strlen(banner), MSG_NOSIGNAL) < 0)
            _exit(1);
        sleep_s(1.0);
        _exit(0);
    }
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", ntohs(a.sin_port), 0, 2, 2, &c),
                     DDP_ERR_PROTOCOL);
    assert_non_null(strstr(ddp_last_error(), "bad magic (not a libddp store peer)"));
    close(lfd);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* A peer that says HELLO, answers the handshake, and then never answers: calls fail at their
 * deadline (the store timeout; get's timeout plus a grace period) and the
 * handle stops using the connection. */
static void test_silent_server(void **state)
{
    (void)state;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 4), 0);
    socklen_t sl = sizeof a;
    getsockname(lfd, (struct sockaddr *)&a, &sl);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = accept(lfd, NULL, NULL);
        uint8_t hello[DDP__TS_HEADER + 1 + DDP__TS_NONCE] = {0};
        ddp__ts_header_encode(hello, DDP__TS_HELLO, 1 + DDP__TS_NONCE, 0);
        if (send(fd, hello, sizeof hello, MSG_NOSIGNAL) < 0)
            _exit(1);
        /* The handshake's num_keys (without a secret) is answered; then silence. */
        uint8_t req[DDP__TS_HEADER], ans[DDP__TS_HEADER + 8] = {0};
        if (recv(fd, req, sizeof req, MSG_WAITALL) != (ssize_t)sizeof req)
            _exit(1);
        ddp__ts_header_encode(ans, DDP__TS_NUM_KEYS, 8, 0);
        if (send(fd, ans, sizeof ans, MSG_NOSIGNAL) < 0)
            _exit(1);
        sleep_s(10);
        _exit(0);
    }
    ddp_store_t *c = NULL;
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", ntohs(a.sin_port), 0, 2, 5, &c), 0);
    ddp_store_set_timeout(c, 0.3);
    double t0 = ddp_time_now();
    assert_int_equal(ddp_store_set(c, "k", "v", 1), DDP_ERR_TIMEOUT);
    double dt = ddp_time_now() - t0;
    assert_true(dt >= 0.29 && dt < 1.0);
    assert_non_null(strstr(ddp_last_error(), "set 'k': no answer in time"));
    assert_int_equal(ddp_store_num_keys(c, &(int64_t){0}), DDP_ERR_CONNECTION);
    assert_non_null(strstr(ddp_last_error(), "connection closed after an earlier error (" ));
    assert_non_null(strstr(ddp_last_error(), "set 'k': no answer in time"));
    ddp_store_destroy(c);
    close(lfd);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void test_listens_on_given_address_only(void **state)
{
    (void)state;
    stop_server();
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", 0, 1, 1, 5, &server), 0);
    int port = ddp_store_tcp_port(server);
    ddp_store_t *c = NULL;
    /* 127.0.0.2 is this host too, but not the address the server bound. */
    assert_int_equal(ddp_store_tcp_create("127.0.0.2", port, 0, 1, 0.2, &c), DDP_ERR_TIMEOUT);
    assert_non_null(strstr(ddp_last_error(), "Connection refused"));
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", port, 0, 1, 5, &c), 0);
    ddp_store_destroy(c);
    stop_server();

    /* "0.0.0.0" listens everywhere when asked. */
    assert_int_equal(ddp_store_tcp_create("0.0.0.0", 0, 1, 1, 5, &server), 0);
    port = ddp_store_tcp_port(server);
    assert_int_equal(ddp_store_tcp_create("127.0.0.2", port, 0, 1, 5, &c), 0);
    assert_int_equal(ddp_store_set(c, "k", "v", 1), 0);
    assert_value(server, "k", "v", 1);
    ddp_store_destroy(c);
    stop_server();

    /* IPv6 loopback, when the host has it. */
    if (ddp_store_tcp_create("::1", 0, 1, 1, 5, &server) == 0) {
        port = ddp_store_tcp_port(server);
        assert_int_equal(ddp_store_tcp_create("::1", port, 0, 1, 5, &c), 0);
        assert_int_equal(ddp_store_set(c, "k6", "v", 1), 0);
        assert_value(server, "k6", "v", 1);
        ddp_store_destroy(c);
        stop_server();
    }
}

static int destroy_inherited_server(int rank, void *arg)
{
    (void)rank;
    (void)arg;
    ddp_store_destroy(server); /* the child's copy: the parent's server runs on */
    return 0;
}

static void test_child_destroying_inherited_server(void **state)
{
    (void)state;
    fresh_store();
    assert_int_equal(run_children(1, destroy_inherited_server, NULL, 20), 0);
    assert_int_equal(ddp_store_set(server, "still", "here", 4), 0);
    assert_store_works();
    stop_server();
}

static void test_unauthenticated_client_dropped_in_time(void **state)
{
    (void)state;
    stop_server();
    setenv("DDP_SECRET", "s3cret", 1);
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", 0, 1, 1, 0.3, &server), 0);
    unsetenv("DDP_SECRET");
    log_text[0] = 0;
    ddp_log_set_callback(capture, NULL);
    ddp_log_set_level(DDP_LOG_WARN);
    int fd = raw_connect(ddp_store_tcp_port(server));
    double t0 = ddp_time_now();
    assert_true(closed_by_server(fd));
    double dt = ddp_time_now() - t0;
    close(fd);
    assert_true(dt > 0.25 && dt < 1.5);
    assert_true(logged_soon("did not authenticate in time"));
    ddp_log_set_callback(NULL, NULL);
    ddp_log_set_level(DDP_LOG_OFF);
    stop_server();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        STORE_CASES,
        cmocka_unit_test(test_hostile_clients),
        cmocka_unit_test(test_random_payloads),
        cmocka_unit_test(test_secret),
        cmocka_unit_test(test_server_shutdown_fails_waiters),
        cmocka_unit_test(test_connect_errors),
        cmocka_unit_test(test_silent_server),
        cmocka_unit_test(test_listens_on_given_address_only),
        cmocka_unit_test(test_child_destroying_inherited_server),
        cmocka_unit_test(test_unauthenticated_client_dropped_in_time),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    stop_server();
    return rc;
}
