/* The TCPStore server against strangers who take descriptors
 * (src/store/tcp_server_accept.c): a real server process with a lowered
 * RLIMIT_NOFILE, flooded from this process with more connections than it
 * has descriptors, must still serve real clients and still open its own
 * files; and a server whose process has no descriptor left at all must
 * refuse newcomers (closing them, not leaving them hanging), stay idle
 * rather than spin, and serve again once descriptors are back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "ddp/store.h"
#include "fork_children.h"
#include "free_port.h"

#define FD_LIMIT 64 /* the server process's descriptors */
#define FLOOD 200   /* connections from this process: more than that */

static int raw_connect(int port)
{
    int fd = loopback_connect(port);
    assert_true(fd >= 0);
    return fd;
}

/* 1 when the server has closed fd (after sending HELLO, or nothing), 0 if
 * it is still open after wait_s. */
static int closed_within(int fd, double wait_s)
{
    struct timeval tv = {(time_t)wait_s, (long)((wait_s - (double)(time_t)wait_s) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[256];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return 1;
        if (n < 0)
            return 0;
    }
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* Real clients still get every operation done. */
static int client_round(int port, const char *tag)
{
    ddp_store_t *c = NULL;
    CHILD_CHECK(ddp_store_tcp_create("127.0.0.1", port, 0, 2, 10, &c) == 0);
    CHILD_CHECK(ddp_store_set(c, tag, "v", 1) == 0);
    void *v = NULL;
    size_t len = 0;
    CHILD_CHECK(ddp_store_get(c, tag, &v, &len) == 0 && len == 1 && memcmp(v, "v", 1) == 0);
    free(v);
    const char *keys[] = {tag};
    CHILD_CHECK(ddp_store_wait(c, keys, 1, 5) == 0);
    ddp_store_destroy(c);
    return 0;
}

/* hog_fds: when the rest of the process takes every descriptor left. */
enum { HOG_NONE, HOG_AT_START, HOG_WHEN_TOLD };

/* Takes every descriptor left. */
static int hog_all(int *hog)
{
    int n = 0;
    while (n < FD_LIMIT && (hog[n] = open("/dev/null", O_RDONLY)) >= 0)
        n++;
    return n;
}

/* The server's side: lowers its limit, serves, and when told ("go") opens
 * files of its own, saying how that went and how much CPU it used. */
static int serve(int report_fd, int hog_fds)
{
    struct rlimit rl = {FD_LIMIT, FD_LIMIT};
    CHILD_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    ddp_store_t *s = NULL;
    CHILD_CHECK(ddp_store_tcp_create("127.0.0.1", 0, 1, 2, 30, &s) == 0);
    int port = ddp_store_tcp_port(s);
    int hog[FD_LIMIT], nhog = hog_fds == HOG_AT_START ? hog_all(hog) : 0;
    double t0 = ddp_time_now(), c0 = cpu_s();
    CHILD_CHECK(write(report_fd, &port, sizeof port) == (ssize_t)sizeof port);
    if (hog_fds == HOG_WHEN_TOLD) {
        char go;
        CHILD_CHECK(read(report_fd, &go, 1) == 1); /* strangers are connected */
        nhog = hog_all(hog);
        CHILD_CHECK(write(report_fd, "h", 1) == 1);
        CHILD_CHECK(read(report_fd, &go, 1) == 1); /* the real client is done */
    } else if (hog_fds == HOG_AT_START) {
        char go;
        CHILD_CHECK(read(report_fd, &go, 1) == 1); /* the parent's flood is over */
        double busy = (cpu_s() - c0) / (ddp_time_now() - t0);
        CHILD_CHECK(write(report_fd, &busy, sizeof busy) == (ssize_t)sizeof busy);
    }
    while (nhog > 0)
        close(hog[--nhog]);
    void *v = NULL;
    size_t len;
    ddp_store_set_timeout(s, 60);
    CHILD_CHECK(ddp_store_get(s, "go", &v, &len) == 0);
    free(v);
    char path[64], verdict[200] = "ok";
    int fds[8];
    for (int i = 0; i < 8; i++) {
        snprintf(path, sizeof path, "/tmp/ddp-flood-%d-%d", (int)getpid(), i);
        fds[i] = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
        if (fds[i] < 0)
            snprintf(verdict, sizeof verdict, "open %s: %s", path, strerror(errno));
        else
            unlink(path);
    }
    for (int i = 0; i < 8; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    CHILD_CHECK(ddp_store_set(s, "opened", verdict, strlen(verdict)) == 0);
    CHILD_CHECK(ddp_store_get(s, "done", &v, &len) == 0);
    free(v);
    ddp_store_destroy(s);
    return 0;
}

static pid_t start_server(int hog_fds, int *port, int *sock)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        _exit(serve(sv[1], hog_fds));
    }
    close(sv[1]);
    struct timeval tv = {20, 0};
    setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(read(sv[0], port, sizeof *port), (ssize_t)sizeof *port);
    *sock = sv[0];
    return pid;
}

/* Tells the server to open its files, checks it could, and ends it. */
static void finish_server(pid_t pid, int port, int sock)
{
    ddp_store_t *c = NULL;
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", port, 0, 2, 10, &c), 0);
    assert_int_equal(ddp_store_set(c, "go", "", 0), 0);
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(ddp_store_get(c, "opened", &v, &len), 0);
    assert_int_equal(len, 2);
    assert_memory_equal(v, "ok", 2);
    free(v);
    assert_int_equal(ddp_store_set(c, "done", "", 0), 0);
    ddp_store_destroy(c);
    rank_group g = {.n = 1, .pids = {pid}};
    assert_int_equal(join_ranks(&g, 20), 0);
    close(sock);
}

static void flood(int port, int max_held)
{
    int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++)
        fds[i] = raw_connect(port);
    /* Real clients after the flood: the newest, they must get in. */
    assert_int_equal(client_round(port, "after-flood-1"), 0);
    assert_int_equal(client_round(port, "after-flood-2"), 0);
    int closed = 0;
    for (int i = 0; i < FLOOD; i++)
        closed += closed_within(fds[i], 0.01);
    /* The server held at most max_held of them: the rest were dropped. */
    assert_true(closed >= FLOOD - max_held);
    assert_true(closed < FLOOD); /* and it did hold some: it is the cap that works */
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
}

static void test_flood_without_secret(void **state)
{
    (void)state;
    int port, sock;
    pid_t pid = start_server(HOG_NONE, &port, &sock);
    flood(port, FD_LIMIT / 4); /* the cap: a quarter of the limit */
    finish_server(pid, port, sock);
}

static void test_flood_with_secret(void **state)
{
    (void)state;
    setenv("DDP_SECRET", "flood secret", 1);
    setenv("DDP_STORE_MAX_UNAUTH", "5", 1); /* below a quarter of the limit: this one rules */
    int port, sock;
    pid_t pid = start_server(HOG_NONE, &port, &sock);
    unsetenv("DDP_STORE_MAX_UNAUTH");
    flood(port, 5);
    finish_server(pid, port, sock);
    unsetenv("DDP_SECRET");
}

/* More real clients at once than strangers may be held: each that is
 * dropped before its handshake is done comes back, and all get in. */
static int burst_client(int rank, void *arg)
{
    char tag[32];
    snprintf(tag, sizeof tag, "burst-%d", rank);
    return client_round(*(int *)arg, tag);
}

static void test_burst_of_real_clients(void **state)
{
    (void)state;
    setenv("DDP_STORE_MAX_UNAUTH", "2", 1);
    int port, sock;
    pid_t pid = start_server(HOG_NONE, &port, &sock);
    unsetenv("DDP_STORE_MAX_UNAUTH");
    assert_int_equal(run_children(24, burst_client, &port, 60), 0);
    finish_server(pid, port, sock);
}

static void test_no_descriptor_left(void **state)
{
    (void)state;
    int port, sock;
    pid_t pid = start_server(HOG_AT_START, &port, &sock);
    /* No descriptor to give: each newcomer is accepted on the reserve and
     * closed at once, not left waiting for a HELLO that never comes. */
    for (int i = 0; i < 50; i++) {
        int fd = raw_connect(port);
        assert_true(closed_within(fd, 5.0));
        close(fd);
    }
    sleep_s(0.3);
    assert_int_equal(write(sock, "g", 1), 1);
    double busy = 1;
    assert_int_equal(read(sock, &busy, sizeof busy), (ssize_t)sizeof busy);
    /* Idle between events, not spinning on EMFILE (a spin is ~1.0). */
    assert_true(busy < 0.5);
    assert_int_equal(client_round(port, "descriptors-back"), 0);
    finish_server(pid, port, sock);
}

/* Out of descriptors with strangers held: the oldest stranger makes room
 * for the newcomer, which gets in. */
static void test_stranger_makes_room(void **state)
{
    (void)state;
    int port, sock;
    pid_t pid = start_server(HOG_WHEN_TOLD, &port, &sock);
    int fds[8];
    for (int i = 0; i < 8; i++)
        fds[i] = raw_connect(port);
    for (int i = 0; i < 8; i++) /* each has its HELLO: accepted and held */
        assert_false(closed_within(fds[i], 0.2));
    assert_int_equal(write(sock, "f", 1), 1);
    char h;
    assert_int_equal(read(sock, &h, 1), 1);
    assert_int_equal(client_round(port, "room"), 0);
    assert_true(closed_within(fds[0], 5.0)); /* the oldest went */
    assert_int_equal(write(sock, "g", 1), 1);
    for (int i = 0; i < 8; i++)
        close(fds[i]);
    finish_server(pid, port, sock);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flood_without_secret),
        cmocka_unit_test(test_flood_with_secret),
        cmocka_unit_test(test_burst_of_real_clients),
        cmocka_unit_test(test_no_descriptor_left),
        cmocka_unit_test(test_stranger_makes_room),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
