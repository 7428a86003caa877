/* Store latency benchmark: mean microseconds per set, get (of an existing
 * key), add and check on a TCPStore over loopback (the rank-0 handle, whose
 * server runs in a thread of this process, as torch's master TCPStore does)
 * on a HashStore (in memory) and on a FileStore.  bench/store.sh runs it beside torch's stores.
 *   usage: store [N=5000] [VALUE_BYTES=64]
 * Prints one line per store: "libddp <store> set_us=.. get_us=.. add_us=.. check_us=.."
 *   usage: store barrier RANKS ROUNDS
 * Store barriers among RANKS forked processes over a TCPStore (rank 0 the
 * server): each round every rank adds to a counter, the last one sets a
 * release key, all wait for it.  Prints "libddp barrier ranks=R us=.." */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp/store.h"

static int die(const char *what)
{
    fprintf(stderr, "store bench: %s: %s\n", what, ddp_last_error());
    return 1;
}

static int run(const char *name, ddp_store_t *s, int n, size_t vbytes)
{
    char *value = malloc(vbytes);
    memset(value, 'x', vbytes);
    const char *key = "k";
    for (int i = 0; i < 200; i++) /* warm-up: connection, caches, allocator */
        if (ddp_store_set(s, key, value, vbytes) < 0)
            return die("set");
    double t[5];
    t[0] = ddp_time_now();
    for (int i = 0; i < n; i++)
        if (ddp_store_set(s, key, value, vbytes) < 0)
            return die("set");
    t[1] = ddp_time_now();
    for (int i = 0; i < n; i++) {
        void *v;
        size_t len;
        if (ddp_store_get(s, key, &v, &len) < 0)
            return die("get");
        free(v);
    }
    t[2] = ddp_time_now();
    for (int i = 0; i < n; i++)
        if (ddp_store_add(s, "counter", 1, NULL) < 0)
            return die("add");
    t[3] = ddp_time_now();
    for (int i = 0; i < n; i++) {
        int exists;
        if (ddp_store_check(s, &key, 1, &exists) < 0)
            return die("check");
    }
    t[4] = ddp_time_now();
    printf("libddp %s set_us=%.2f get_us=%.2f add_us=%.2f check_us=%.2f\n", name,
           (t[1] - t[0]) / n * 1e6, (t[2] - t[1]) / n * 1e6, (t[3] - t[2]) / n * 1e6,
           (t[4] - t[3]) / n * 1e6);
    free(value);
    return 0;
}

static int barrier_rank(int rank, int ranks, int rounds, int port, double *us)
{
    ddp_store_t *s = NULL;
    if (ddp_store_tcp_create("127.0.0.1", port, 0, ranks, 60, &s) < 0)
        return die("connect");
    double t0 = 0;
    for (int i = -1; i < rounds; i++) { /* round -1: everyone connected */
        if (i == 0)
            t0 = ddp_time_now();
        char count[32], go[32];
        snprintf(count, sizeof count, "count/%d", i);
        snprintf(go, sizeof go, "go/%d", i);
        int64_t n = 0;
        if (ddp_store_add(s, count, 1, &n) < 0)
            return die("add");
        if (n == ranks && ddp_store_set(s, go, "", 0) < 0)
            return die("set");
        const char *k = go;
        if (ddp_store_wait(s, &k, 1, -1) < 0)
            return die("wait");
    }
    *us = (ddp_time_now() - t0) / rounds * 1e6;
    (void)rank;
    ddp_store_destroy(s);
    return 0;
}

static int barrier_bench(int ranks, int rounds)
{
    ddp_store_t *server = NULL;
    if (ddp_store_tcp_create("127.0.0.1", 0, 1, ranks, 60, &server) < 0)
        return die("tcp store");
    int port = ddp_store_tcp_port(server);
    pid_t pids[256];
    for (int r = 1; r < ranks; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            double us;
            _exit(barrier_rank(r, ranks, rounds, port, &us));
        }
    }
    double us = 0;
    int rc = barrier_rank(0, ranks, rounds, port, &us);
    for (int r = 1; r < ranks; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            rc = 1;
    }
    ddp_store_destroy(server);
    if (rc == 0)
        printf("libddp barrier ranks=%d us=%.1f\n", ranks, us);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "barrier") == 0) {
        int ranks = argc > 2 ? atoi(argv[2]) : 4, rounds = argc > 3 ? atoi(argv[3]) : 500;
        if (ranks < 1 || ranks > 256 || rounds < 1) {
            fprintf(stderr, "usage: store barrier RANKS(1-256) ROUNDS\n");
            return 2;
        }
        return barrier_bench(ranks, rounds);
    }
    int n = argc > 1 ? atoi(argv[1]) : 5000;
    size_t vbytes = argc > 2 ? (size_t)atol(argv[2]) : 64;
    if (n <= 0) {
        fprintf(stderr, "usage: store [N] [VALUE_BYTES]\n");
        return 2;
    }
    ddp_store_t *s = NULL;
    if (ddp_store_tcp_create("127.0.0.1", 0, 1, 1, 30, &s) < 0)
        return die("tcp store");
    int rc = run("tcp", s, n, vbytes);
    ddp_store_destroy(s);
    if (rc)
        return rc;
    if (ddp_store_hash_create(&s) < 0)
        return die("hash store");
    rc = run("hash", s, n, vbytes);
    ddp_store_destroy(s);
    if (rc)
        return rc;
    char path[64];
    snprintf(path, sizeof path, "/tmp/ddp-bench-filestore-%d", (int)getpid());
    unlink(path);
    if (ddp_store_file_create(path, 1, &s) < 0)
        return die("file store");
    rc = run("file", s, n, vbytes);
    ddp_store_destroy(s);
    return rc;
}
