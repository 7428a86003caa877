/* The job's secret under ddprun (tests/helpers/ddprun_worker.c "secret"):
 * a fresh one per single-node job in a 0600 DDP_SECRET_FILE, the user's
 * own passed on, a warning on several nodes, and a stranger refused on a
 * running job's store, through the library's client and raw sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp.h"
#include "ddprun_util.h"
#include "free_port.h"
#include "store/tcp_proto.h"

/* The value of "name=" in a worker's report. */
static void field(const char *report, const char *name, char *out, size_t len)
{
    char key[64];
    snprintf(key, sizeof key, "%s=", name);
    const char *p = strstr(report, key);
    assert_non_null(p);
    p += strlen(key);
    size_t n = strcspn(p, "\n");
    assert_true(n < len);
    memcpy(out, p, n);
    out[n] = '\0';
}

/* Without DDP_SECRET/DDP_SECRET_FILE, a single-node job's workers share a
 * fresh secret: 64 hex digits in a 0600 file, another per job, removed
 * when the job ends; the user's own secret is passed on untouched. */
static void test_secret_per_job(void **state)
{
    (void)state;
    char dir[64], rep[2][2048], err[4096], file[2][1024], secret[2][256], v[256];
    unsetenv("DDP_SECRET");
    unsetenv("DDP_SECRET_FILE");
    make_dir(dir);
    for (int job = 0; job < 2; job++) {
        char *argv[] = {ddprun, "--nproc-per-node", "2", worker, "secret", dir, NULL};
        int st = finish(start(argv), err, sizeof err, 10);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        assert_int_equal(read_file(dir, "secret", 0, rep[0], sizeof rep[0]), 0);
        assert_int_equal(read_file(dir, "secret", 1, rep[1], sizeof rep[1]), 0);
        assert_string_equal(rep[0], rep[1]);
        field(rep[0], "file", file[job], sizeof file[job]);
        field(rep[0], "secret", secret[job], sizeof secret[job]);
        field(rep[0], "mode", v, sizeof v);
        assert_string_equal(v, "600");
        field(rep[0], "env", v, sizeof v);
        assert_string_equal(v, "unset");
        assert_int_equal(strlen(secret[job]), 64);
        assert_int_equal(strspn(secret[job], "0123456789abcdef"), 64);
        struct stat st_file;
        assert_int_equal(stat(file[job], &st_file), -1); /* gone with the job */
        assert_null(strstr(err, "warning"));
    }
    assert_string_not_equal(secret[0], secret[1]);
    assert_string_not_equal(file[0], file[1]);

    setenv("DDP_SECRET", "users-own", 1);
    char *argv[] = {ddprun, worker, "secret", dir, NULL};
    int st = finish(start(argv), err, sizeof err, 10);
    unsetenv("DDP_SECRET");
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(read_file(dir, "secret", 0, rep[0], sizeof rep[0]), 0);
    assert_string_equal(rep[0], "file=\nmode=0\nsecret=\nenv=set\n");
    remove_dir(dir);
}

/* Several nodes cannot get a secret from ddprun: one clear warning, once
 * (not once per restart), and the job runs open. */
static void test_secret_multi_node_warns(void **state)
{
    (void)state;
    char dir[64], rep[2048], err[8192];
    unsetenv("DDP_SECRET");
    unsetenv("DDP_SECRET_FILE");
    make_dir(dir);
    char *argv[] = {ddprun, "--nnodes", "2", "--nproc-per-node", "2", "--master-port", "29999",
                    "--max-restarts", "1", worker, "flaky", dir, NULL};
    int st = finish(start(argv), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_non_null(strstr(err, "restarting the group (1 of 1)"));
    const char *want = "ddprun: warning: neither DDP_SECRET nor DDP_SECRET_FILE is set: this "
                       "job's store (127.0.0.1:29999) and its workers' connections serve anyone "
                       "who can reach them; give every node the same DDP_SECRET_FILE\n";
    const char *at = strstr(err, want);
    if (!at)
        fail_msg("stderr: %s", err);
    assert_null(strstr(at + strlen(want), "warning"));
    char *report[] = {ddprun, "--nnodes", "2", worker, "secret", dir, NULL};
    st = finish(start(report), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(read_file(dir, "secret", 0, rep, sizeof rep), 0);
    assert_string_equal(rep, "file=\nmode=0\nsecret=\nenv=unset\n");
    remove_dir(dir);
}

/* Reads exactly n bytes (at most 5 s); the count read, short at EOF or an error. */
static size_t read_n(int fd, uint8_t *buf, size_t n)
{
    size_t got = 0;
    double deadline = now() + 5;
    while (got < n && now() < deadline) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

/* On a raw connection to the store: takes its HELLO, then sends opcode
 * (SET or GET of a rendezvous key) without authenticating; the server must
 * close the connection without an answer. */
static void raw_request_refused(int port, int opcode)
{
    int fd = loopback_connect(port);
    assert_true(fd >= 0);
    uint8_t head[DDP__TS_HEADER], payload[512];
    ddp__ts_header h;
    const char *why = NULL;
    assert_int_equal(read_n(fd, head, sizeof head), sizeof head);
    assert_int_equal(ddp__ts_header_decode(head, sizeof payload, &h, &why), 0);
    assert_int_equal(h.opcode, DDP__TS_HELLO);
    assert_int_equal(read_n(fd, payload, h.length), h.length);
    assert_int_equal(payload[0], 1); /* auth_required */
    ddp__ts_writer w = {0};
    ddp__ts_begin(&w);
    if (opcode == DDP__TS_GET)
        ddp__ts_u64(&w, 1000);
    ddp__ts_bytes(&w, "rdzv/rank/1", 11);
    if (opcode == DDP__TS_SET)
        ddp__ts_bytes(&w, "stranger", 8);
    int n = ddp__ts_finish(&w, opcode, 0);
    assert_true(n > 0);
    assert_int_equal(write(fd, w.buf, (size_t)n), n);
    free(w.buf);
    assert_int_equal(read_n(fd, head, sizeof head), 0); /* closed, nothing answered */
    close(fd);
}

/* A stranger (no secret, or a guessed one) connecting to the port of a
 * running job's store is refused: the library's client at the handshake,
 * a raw SET or GET of a rendezvous key by the server, which drops the
 * connection; the job is not disturbed. */
static void test_stranger_cannot_use_store(void **state)
{
    (void)state;
    char dir[64], port[16];
    unsetenv("DDP_SECRET");
    unsetenv("DDP_SECRET_FILE");
    make_dir(dir);
    int p = free_port();
    snprintf(port, sizeof port, "%d", p);
    char *argv[] = {ddprun, "--nproc-per-node", "2", "--master-port", port, worker,
                    "allreduce", dir, "go", NULL};
    launch l = start(argv);
    wait_files(dir, "joined", 2, NULL);
    ddp_store_t *store = NULL;
    int rc = ddp_store_tcp_create("127.0.0.1", p, 0, 0, 5.0, &store);
    assert_int_equal(rc, DDP_ERR_AUTH);
    assert_null(store);
    if (!strstr(ddp_last_error(), "the server requires a shared secret"))
        fail_msg("no secret: %s", ddp_last_error());
    setenv("DDP_SECRET", "a-guess", 1);
    rc = ddp_store_tcp_create("127.0.0.1", p, 0, 0, 5.0, &store);
    unsetenv("DDP_SECRET");
    assert_int_equal(rc, DDP_ERR_AUTH);
    assert_null(store);
    if (!strstr(ddp_last_error(), "the server rejected our shared secret"))
        fail_msg("a guessed secret: %s", ddp_last_error());
    raw_request_refused(p, DDP__TS_SET);
    raw_request_refused(p, DDP__TS_GET);
    char go[128];
    snprintf(go, sizeof go, "%s/go", dir);
    FILE *f = fopen(go, "w");
    assert_non_null(f);
    fclose(f);
    expect_sums(l, dir, "the job");
    remove_dir(dir);
}

int main(void)
{
    ddprun_paths();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_secret_per_job),
        cmocka_unit_test(test_secret_multi_node_warns),
        cmocka_unit_test(test_stranger_cannot_use_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
