/* Tests of init-method URLs (src/store/url.c): the parser on good and bad
 * input (messages checked), env:// variables, and rendezvous through
 * ddp_store_from_url with real processes for file://, tcp:// and env://. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "free_port.h"
#include "base/rng.h"
#include "ddp/store.h"
#include "fork_children.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

static void test_parse_good(void **state)
{
    (void)state;
    ddp_init_url u;
    assert_int_equal(ddp_init_url_parse("file:///tmp/ddp/rdzv", &u), 0);
    assert_int_equal(u.kind, DDP_INIT_FILE);
    assert_string_equal(u.path, "/tmp/ddp/rdzv");
    assert_int_equal(u.rank, -1);
    assert_int_equal(u.world_size, -1);

    assert_int_equal(ddp_init_url_parse("file://localhost/tmp/a%20b?rank=1&world_size=4", &u), 0);
    assert_string_equal(u.path, "/tmp/a b");
    assert_int_equal(u.rank, 1);
    assert_int_equal(u.world_size, 4);

    assert_int_equal(ddp_init_url_parse("tcp://127.0.0.1:29500", &u), 0);
    assert_int_equal(u.kind, DDP_INIT_TCP);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 29500);

    assert_int_equal(ddp_init_url_parse("TCP://node-01.cluster_a:1/?world_size=8&&rank=7&", &u), 0);
    assert_string_equal(u.host, "node-01.cluster_a");
    assert_int_equal(u.port, 1);
    assert_int_equal(u.rank, 7);
    assert_int_equal(u.world_size, 8);

    assert_int_equal(ddp_init_url_parse("tcp://[fe80::1:2]:65535?", &u), 0);
    assert_string_equal(u.host, "fe80::1:2");
    assert_int_equal(u.port, 65535);

    assert_int_equal(ddp_init_url_parse("env://", &u), 0);
    assert_int_equal(u.kind, DDP_INIT_ENV);
    assert_int_equal(ddp_init_url_parse("env://?rank=0&world_size=1", &u), 0);
    assert_int_equal(u.world_size, 1);
}

static void expect_bad(const char *url, const char *msg)
{
    ddp_init_url u;
    ddp_clear_error();
    int rc = ddp_init_url_parse(url, &u);
    if (rc != DDP_ERR_INVALID_ARG || !strstr(ddp_last_error(), msg))
        fprintf(stderr, "url '%s': rc %d, message '%s', wanted '%s'\n", url, rc,
                ddp_last_error(), msg);
    assert_int_equal(rc, DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), msg));
}

static void test_parse_bad(void **state)
{
    (void)state;
    expect_bad("", "empty init method URL");
    expect_bad(NULL, "empty init method URL");
    expect_bad("tcp://host", "init method 'tcp://host': missing port (write tcp://HOST:PORT)");
    expect_bad("tcp://host:", "init method 'tcp://host:': missing port after ':'");
    expect_bad("tcp://host:0", "port '0' is not a number in 1-65535");
    expect_bad("tcp://host:65536", "init method 'tcp://host:65536': port '65536' is not a number");
    expect_bad("tcp://host:12ab", "port '12ab' is not a number");
    expect_bad("tcp://host:-1", "port '-1' is not a number");
    expect_bad("tcp://:1234", "missing host");
    expect_bad("tcp://", "missing host and port");
    expect_bad("tcp://[::1:80", "without its closing ']'");
    expect_bad("tcp://[::1]", "missing port (write tcp://[ADDR]:PORT)");
    expect_bad("tcp://[::1]x:80", "garbage after the IPv6 address");
    expect_bad("tcp://[zz::1]:80", "'zz::1' is not an IPv6 address");
    expect_bad("tcp://::1:80", "more than one ':'");
    expect_bad("tcp://h:1/path", "tcp:// takes no path");
    expect_bad("tcp://user@h:1", "user names are not supported");
    expect_bad("tcp://ho st:1", "space or control character at offset 8");
    expect_bad("tcp://h$:1", "invalid character '$' in host name");
    expect_bad("http://example.com", "init method 'http://example.com': unknown scheme 'http'");
    expect_bad("/tmp/x", "init method '/tmp/x': no scheme");
    expect_bad("file://", "init method 'file://': empty path");
    expect_bad("file://tmp/x", "the path must be absolute");
    expect_bad("file:///", "names a directory");
    expect_bad("file:///tmp/dir/", "names a directory");
    expect_bad("file:///tmp/x%zz", "bad percent-escape");
    expect_bad("file:///tmp/x%2", "bad percent-escape");
    expect_bad("file:///tmp/x%00y", "bad percent-escape, NUL byte");
    expect_bad("env://host:1", "env:// takes no address");
    expect_bad("tcp://h:1?rank=x", "rank='x' is not an integer >= 0");
    expect_bad("tcp://h:1?world_size=0", "world_size='0' is not an integer >= 1");
    expect_bad("tcp://h:1?rank=-1", "rank='-1' is not an integer");
    expect_bad("tcp://h:1?foo=1", "unknown query parameter 'foo' (known: rank, world_size)");
    expect_bad("tcp://h:1?rank=1&rank=1", "query parameter 'rank' given twice");
    expect_bad("tcp://h:1?rank=2&world_size=2", "rank 2 out of range for world_size 2");
    expect_bad("tcp://h:1?rank", "query parameter 'rank' has no value");
    expect_bad("tcp://h:1#frag", "fragments");
    expect_bad("tcp://h:1\x01", "control character");
    expect_bad("\xff\xfe garbage", "control character");
    expect_bad("zz", "no scheme");
    char *longurl = malloc(9000);
    memcpy(longurl, "file:///", 8);
    memset(longurl + 8, 'a', 8990);
    longurl[8998] = 0;
    expect_bad(longurl, "longer than 8192 bytes");
    longurl[4200] = 0;
    expect_bad(longurl, "path over 4095 bytes");
    free(longurl);
    assert_int_equal(ddp_init_url_parse("env://", NULL), DDP_ERR_INVALID_ARG);
}

/* Random strings over URL characters: accepted or rejected with a message
 * quoting them, never a crash (ASan checks the parser). */
static void test_parse_random(void **state)
{
    (void)state;
    static const char alphabet[] = "filetcpenv:/[]?&=%0123456789abAZ._-@#localhostrank";
    static const char *starts[] = {"", "file://", "tcp://", "env://", "tcp://[", "file:///"};
    ddp__rng rng;
    ddp__rng_seed(&rng, 3);
    int good = 0;
    for (int i = 0; i < 5000; i++) {
        char url[64];
        size_t n = (size_t)snprintf(url, sizeof url, "%s", starts[i % 6]);
        size_t extra = (size_t)ddp__rng_below(&rng, 24);
        for (size_t j = 0; j < extra; j++)
            url[n++] = alphabet[ddp__rng_below(&rng, sizeof alphabet - 1)];
        url[n] = 0;
        ddp_init_url u;
        int rc = ddp_init_url_parse(url, &u);
        if (rc == 0) {
            good++;
            assert_true(u.kind >= DDP_INIT_FILE && u.kind <= DDP_INIT_ENV);
            if (u.kind == DDP_INIT_TCP)
                assert_true(u.port >= 1 && u.port <= 65535 && u.host[0]);
            if (u.kind == DDP_INIT_FILE)
                assert_true(u.path[0] == '/');
        } else {
            assert_int_equal(rc, DDP_ERR_INVALID_ARG);
            assert_true(strstr(ddp_last_error(), url) != NULL || !url[0]);
        }
    }
    assert_true(good > 0);
}

/* ---- environment -------------------------------------------------------- */

static void clear_env(void)
{
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
}

static void test_env_read(void **state)
{
    (void)state;
    clear_env();
    ddp_init_env e;
    assert_int_equal(ddp_init_env_read(&e), 0);
    assert_string_equal(e.master_addr, "");
    assert_int_equal(e.master_port, -1);
    assert_int_equal(e.rank, -1);
    assert_int_equal(e.local_rank, -1);
    setenv("MASTER_ADDR", "[::1]", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    assert_int_equal(ddp_init_env_read(&e), 0);
    assert_string_equal(e.master_addr, "::1");
    assert_int_equal(e.master_port, 29500);
    assert_int_equal(e.rank, 3);
    assert_int_equal(e.world_size, 4);
    assert_int_equal(e.local_rank, 1);
    setenv("RANK", "three", 1);
    assert_int_equal(ddp_init_env_read(&e), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "RANK=three: expected an integer from 0 to"));
    setenv("RANK", "3", 1);
    setenv("MASTER_ADDR", "node 1", 1);
    assert_int_equal(ddp_init_env_read(&e), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(),
                           "MASTER_ADDR='node 1' is not a host name or address (bad character ' ')"));
    setenv("MASTER_ADDR", "10.0.0.1", 1);
    setenv("MASTER_PORT", "99999", 1);
    assert_int_equal(ddp_init_env_read(&e), DDP_ERR_INVALID_ARG);
    assert_non_null(
        strstr(ddp_last_error(), "MASTER_PORT=99999: expected an integer from 1 to 65535"));
    clear_env();
}

static void test_from_url_errors(void **state)
{
    (void)state;
    clear_env();
    ddp_store_t *s = (ddp_store_t *)&s;
    assert_int_equal(ddp_store_from_url("env://", 0, 1, 1, &s, NULL, NULL), DDP_ERR_INVALID_ARG);
    assert_null(s);
    assert_non_null(strstr(ddp_last_error(), "init method 'env://': MASTER_ADDR is not set"));
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    assert_int_equal(ddp_store_from_url("env://", 0, 1, 1, &s, NULL, NULL), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "MASTER_PORT is not set"));
    assert_int_equal(ddp_store_from_url("env://", -1, -1, 1, &s, NULL, NULL), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "world size not given (set RANK and WORLD_SIZE"));
    setenv("WORLD_SIZE", "2", 1);
    assert_int_equal(ddp_store_from_url("env://", -1, -1, 1, &s, NULL, NULL), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "rank not given"));
    clear_env();
    assert_int_equal(ddp_store_from_url("tcp://127.0.0.1:1?rank=2", 1, 4, 1, &s, NULL, NULL),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "rank 1 given, but the URL says rank=2"));
    assert_int_equal(ddp_store_from_url("tcp://127.0.0.1:1", 4, 4, 1, &s, NULL, NULL),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "rank 4 out of range for world size 4"));
    assert_int_equal(ddp_store_from_url("file:///tmp/x", 0, -1, 1, &s, NULL, NULL),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "world size not given (pass it or add"));
    assert_int_equal(ddp_store_from_url("tcp:/127.0.0.1:1", 0, 1, 1, &s, NULL, NULL),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "init method 'tcp:/127.0.0.1:1': no scheme"));
    /* A failing store says which rendezvous it was. */
    assert_int_equal(ddp_store_from_url("file:///nonexistent-dir/x", 0, 1, 1, &s, NULL, NULL),
                     DDP_ERR_IO);
    assert_non_null(strstr(ddp_last_error(),
                           "rendezvous at 'file:///nonexistent-dir/x' as rank 0 of 1: "));
    assert_non_null(strstr(ddp_last_error(), "No such file or directory"));
}

/* ---- rendezvous with real processes ------------------------------------- */

#define WORLD 3

static char url[256];

/* Each rank: join, count arrivals, agree on a value set by rank 0, and
 * leave only when everyone is done (rank 0 may be the server). */
static int rendezvous(int rank, void *arg)
{
    int use_env = arg != NULL;
    ddp_store_t *s = NULL;
    int r = -1, ws = -1;
    if (use_env) {
        char v[16];
        snprintf(v, sizeof v, "%d", rank);
        setenv("RANK", v, 1);
        CHILD_CHECK(ddp_store_from_url(url, -1, -1, 20, &s, &r, &ws) == 0);
    } else {
        CHILD_CHECK(ddp_store_from_url(url, rank, -1, 20, &s, &r, &ws) == 0);
    }
    CHILD_CHECK(r == rank && ws == WORLD);
    CHILD_CHECK(ddp_store_timeout(s) == 20);
    if (rank == 0)
        CHILD_CHECK(ddp_store_set(s, "seed", "1234", 4) == 0);
    int64_t n = 0;
    CHILD_CHECK(ddp_store_add(s, "arrived", 1, &n) == 0);
    void *v = NULL;
    size_t len = 0;
    CHILD_CHECK(ddp_store_get(s, "seed", &v, &len) == 0);
    CHILD_CHECK(len == 4 && memcmp(v, "1234", 4) == 0);
    free(v);
    char key[16];
    snprintf(key, sizeof key, "done/%d", rank);
    CHILD_CHECK(ddp_store_set(s, key, "", 0) == 0);
    const char *all[WORLD] = {"done/0", "done/1", "done/2"};
    CHILD_CHECK(ddp_store_wait(s, all, WORLD, 20) == 0);
    CHILD_CHECK(ddp_store_add(s, "arrived", 0, &n) == 0 && n == WORLD);
    CHILD_CHECK(ddp_store_add(s, "left", 1, &n) == 0);
    if (rank == 0) { /* the server stays until every client has finished */
        const char *left = "left";
        for (int i = 0; i < 2000 && n < WORLD; i++) {
            sleep_s(0.005);
            CHILD_CHECK(ddp_store_add(s, left, 0, &n) == 0);
        }
    }
    ddp_store_destroy(s);
    return 0;
}

static void test_rendezvous_file(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "/tmp/ddp-test-url-%d", (int)getpid());
    unlink(path);
    snprintf(url, sizeof url, "file://%s?world_size=%d", path, WORLD);
    assert_int_equal(run_children(WORLD, rendezvous, NULL, 30), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), -1); /* removed by the last member */
}

static void test_rendezvous_tcp(void **state)
{
    (void)state;
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d?world_size=%d", free_port(), WORLD);
    assert_int_equal(run_children(WORLD, rendezvous, NULL, 30), 0);
}

static void test_rendezvous_env(void **state)
{
    (void)state;
    char port[16];
    snprintf(port, sizeof port, "%d", free_port());
    /* A host name, as users write MASTER_ADDR; a bare chroot may lack one. */
    struct addrinfo *ai = NULL, hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    if (getaddrinfo("localhost", NULL, &hints, &ai) != 0) {
        fprintf(stderr, "skipped: the name localhost does not resolve here (no /etc/hosts "
                        "entry): env:// with a host name cannot be tried\n");
        skip();
    }
    freeaddrinfo(ai);
    setenv("MASTER_ADDR", "localhost", 1);
    setenv("MASTER_PORT", port, 1);
    setenv("WORLD_SIZE", "3", 1);
    snprintf(url, sizeof url, "env://");
    assert_int_equal(run_children(WORLD, rendezvous, url, 30), 0);
    clear_env();
}

static void test_store_bind_override(void **state)
{
    (void)state;
    /* Rank 0 listens where DDP_STORE_BIND says, not on the URL's host. */
    snprintf(url, sizeof url, "tcp://127.0.0.2:%d?world_size=2", free_port());
    setenv("DDP_STORE_BIND", "127.0.0.1", 1);
    ddp_store_t *s0 = NULL, *s1 = NULL;
    assert_int_equal(ddp_store_from_url(url, 0, -1, 5, &s0, NULL, NULL), 0);
    unsetenv("DDP_STORE_BIND");
    assert_int_equal(ddp_store_set(s0, "k", "v", 1), 0);
    assert_int_equal(ddp_store_from_url(url, 1, -1, 0.3, &s1, NULL, NULL), DDP_ERR_TIMEOUT);
    assert_non_null(strstr(ddp_last_error(), "as rank 1 of 2: "));
    assert_non_null(strstr(ddp_last_error(), "Connection refused"));
    int port = ddp_store_tcp_port(s0);
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", port, 0, 2, 5, &s1), 0);
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(ddp_store_get(s1, "k", &v, &len), 0);
    assert_int_equal(len, 1);
    free(v);
    ddp_store_destroy(s1);
    ddp_store_destroy(s0);
}

/* A rank of another job (TORCHELASTIC_RUN_ID) is refused by the store of
 * a running job, as a client and as a would-be server, and the running
 * job's store is untouched; a handle of the public API (no job) is let in. */
static void test_stranger_job_refused(void **state)
{
    (void)state;
    char u[64];
    snprintf(u, sizeof u, "tcp://127.0.0.1:%d?world_size=2", free_port());
    ddp_store_t *s0 = NULL, *s1 = NULL, *x = NULL;
    setenv("TORCHELASTIC_RUN_ID", "job-a", 1);
    assert_int_equal(ddp_store_from_url(u, 0, -1, 5, &s0, NULL, NULL), 0);
    assert_int_equal(ddp_store_set(s0, "ddp/world/join/1", "1", 1), 0);

    setenv("TORCHELASTIC_RUN_ID", "job-b", 1);
    double t0 = ddp_time_now();
    assert_int_equal(ddp_store_from_url(u, 1, -1, 5, &x, NULL, NULL), DDP_ERR_EXISTS);
    assert_true(ddp_time_now() - t0 < 2.0);
    assert_null(x);
    assert_non_null(strstr(ddp_last_error(), "as rank 1 of 2: "));
    assert_non_null(strstr(ddp_last_error(), "address in use by another job (id 'job-a'; this "
                                             "job's id is 'job-b'): a different job holds this "
                                             "store"));
    assert_int_equal(ddp_store_from_url(u, 0, -1, 5, &x, NULL, NULL), DDP_ERR_EXISTS);
    assert_non_null(strstr(ddp_last_error(), "as rank 0 of 2: cannot listen: "));
    assert_non_null(strstr(ddp_last_error(), "another job (id 'job-a'; this job's id is 'job-b')"));
    unsetenv("TORCHELASTIC_RUN_ID");
    assert_int_equal(ddp_store_from_url(u, 1, -1, 5, &x, NULL, NULL), DDP_ERR_EXISTS);
    assert_non_null(strstr(ddp_last_error(), "(id 'job-a'; this job has no id)"));

    /* Nothing of the strangers reached the store. */
    int64_t n = -1;
    assert_int_equal(ddp_store_num_keys(s0, &n), 0);
    assert_int_equal(n, 1);
    setenv("TORCHELASTIC_RUN_ID", "job-a", 1);
    assert_int_equal(ddp_store_from_url(u, 1, -1, 5, &s1, NULL, NULL), 0);
    unsetenv("TORCHELASTIC_RUN_ID");
    assert_int_equal(ddp_store_add(s1, "ddp/world/join/1", 0, &n), 0);
    assert_int_equal(n, 1);
    ddp_store_t *any = NULL;
    assert_int_equal(ddp_store_tcp_create("127.0.0.1", ddp_store_tcp_port(s0), 0, 2, 5, &any), 0);
    ddp_store_destroy(any);
    ddp_store_destroy(s1);
    ddp_store_destroy(s0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_good),
        cmocka_unit_test(test_parse_bad),
        cmocka_unit_test(test_parse_random),
        cmocka_unit_test(test_env_read),
        cmocka_unit_test(test_from_url_errors),
        cmocka_unit_test(test_rendezvous_file),
        cmocka_unit_test(test_rendezvous_tcp),
        cmocka_unit_test(test_rendezvous_env),
        cmocka_unit_test(test_store_bind_override),
        cmocka_unit_test(test_stranger_job_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
