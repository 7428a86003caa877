/* Store latency benchmark: mean microseconds per set, get (of an existing
 * key), add and check on a TCPStore over loopback (the rank-0 handle, whose
 * server runs in a thread of this process, as torch's master TCPStore does)
 * and on a FileStore.  bench/store.sh runs it beside torch's stores.
 *   usage: store [N=5000] [VALUE_BYTES=64]
 * Prints one line per store: "libddp <store> set_us=.. get_us=.. add_us=.. check_us=.." */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(int argc, char **argv)
{
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
    char path[64];
    snprintf(path, sizeof path, "/tmp/ddp-bench-filestore-%d", (int)getpid());
    unlink(path);
    if (ddp_store_file_create(path, 1, &s) < 0)
        return die("file store");
    rc = run("file", s, n, vbytes);
    ddp_store_destroy(s);
    return rc;
}
