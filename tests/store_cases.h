/* Store test cases shared by tests/test_store_file.c and test_store_tcp.c:
 * every operation of the store interface, run against whatever store the
 * including file opens through its fixture, with real processes (fork). */
#ifndef DDP_TESTS_STORE_CASES_H
#define DDP_TESTS_STORE_CASES_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/store.h"
#include "fork_children.h"

/* Ranks of the multi-rank cases: forked processes, or threads when the
 * including file defines STORE_RANKS_AS_THREADS to 1 (in-process stores). */
#ifndef STORE_RANKS_AS_THREADS
#define STORE_RANKS_AS_THREADS 0
#endif

/* Supplied by the including file: opens a fresh handle on the store under
 * test (in the test or in a rank), as member `rank` of world_size. */
static int open_store(int rank, int world_size, ddp_store_t **out);
/* Called before each case: a fresh, empty store. */
static void fresh_store(void);

static ddp_store_t *open_one(void)
{
    ddp_store_t *s = NULL;
    assert_int_equal(open_store(0, 1, &s), 0);
    assert_non_null(s);
    return s;
}

static void assert_value(ddp_store_t *s, const char *key, const void *want, size_t want_len)
{
    void *v = NULL;
    size_t len = 99;
    assert_int_equal(ddp_store_get(s, key, &v, &len), 0);
    assert_int_equal(len, want_len);
    assert_memory_equal(v, want, want_len);
    free(v);
}

/* ---- single process: every operation ------------------------------------ */

static void case_set_get_overwrite(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = open_one();
    assert_int_equal(ddp_store_set(s, "a", "hello", 5), 0);
    assert_value(s, "a", "hello", 5);
    assert_int_equal(ddp_store_set(s, "a", "bye", 3), 0);
    assert_value(s, "a", "bye", 3);
    const uint8_t bin[6] = {0, 1, 0, 255, 10, 0};
    assert_int_equal(ddp_store_set(s, "bin", bin, sizeof bin), 0);
    assert_value(s, "bin", bin, sizeof bin);
    assert_int_equal(ddp_store_set(s, "empty", NULL, 0), 0);
    assert_value(s, "empty", "", 0);
    /* A larger value goes through whole. */
    size_t big = 1 << 20;
    uint8_t *b = malloc(big);
    for (size_t i = 0; i < big; i++)
        b[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(ddp_store_set(s, "big", b, big), 0);
    assert_value(s, "big", b, big);
    free(b);
    int64_t n = 0;
    assert_int_equal(ddp_store_num_keys(s, &n), 0);
    assert_int_equal(n, 4);
    ddp_store_destroy(s);
}

static void case_bad_arguments(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = open_one();
    void *v;
    size_t len;
    assert_int_equal(ddp_store_set(s, "", "x", 1), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "empty key"));
    assert_int_equal(ddp_store_set(s, NULL, "x", 1), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "key is NULL"));
    assert_int_equal(ddp_store_set(s, "k", NULL, 3), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "value of key 'k' is NULL"));
    char *longkey = malloc(5000);
    memset(longkey, 'k', 4999);
    longkey[4999] = 0;
    assert_int_equal(ddp_store_get(s, longkey, &v, &len), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "longer than 4096 bytes"));
    free(longkey);
    assert_int_equal(ddp_store_get(NULL, "k", &v, &len), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "ddp_store_get: store is NULL"));
    assert_int_equal(ddp_store_set(s, "k", "x", (size_t)100 << 20), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "more than the limit"));
    ddp_store_destroy(NULL);
    ddp_store_destroy(s);
}

static void case_add(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = open_one();
    int64_t r = 0;
    assert_int_equal(ddp_store_add(s, "n", 5, &r), 0);
    assert_int_equal(r, 5);
    assert_int_equal(ddp_store_add(s, "n", -7, &r), 0);
    assert_int_equal(r, -2);
    assert_int_equal(ddp_store_add(s, "n", 0, NULL), 0);
    assert_value(s, "n", "-2", 2); /* stored as decimal text, as torch does */
    assert_int_equal(ddp_store_set(s, "m", "41", 2), 0);
    assert_int_equal(ddp_store_add(s, "m", 1, &r), 0);
    assert_int_equal(r, 42);
    assert_int_equal(ddp_store_set(s, "text", "abc", 3), 0);
    assert_int_equal(ddp_store_add(s, "text", 1, &r), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "add to key 'text': its value 'abc' is not an integer"));
    assert_int_equal(ddp_store_set(s, "max", "9223372036854775807", 19), 0);
    assert_int_equal(ddp_store_add(s, "max", 1, &r), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "overflows"));
    ddp_store_destroy(s);
}

static void case_compare_set(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = open_one();
    void *a = NULL;
    size_t alen = 0;
    /* Absent key, non-empty expected: nothing set, no current value. */
    assert_int_equal(ddp_store_compare_set(s, "c", "x", 1, "y", 1, &a, &alen), 0);
    assert_null(a);
    int exists = 1;
    const char *c = "c";
    assert_int_equal(ddp_store_check(s, &c, 1, &exists), 0);
    assert_int_equal(exists, 0);
    /* Absent key, empty expected: set. */
    assert_int_equal(ddp_store_compare_set(s, "c", NULL, 0, "first", 5, &a, &alen), 0);
    assert_int_equal(alen, 5);
    assert_memory_equal(a, "first", 5);
    free(a);
    /* Mismatch: unchanged, returns the current value. */
    assert_int_equal(ddp_store_compare_set(s, "c", "nope", 4, "second", 6, &a, &alen), 0);
    assert_int_equal(alen, 5);
    assert_memory_equal(a, "first", 5);
    free(a);
    /* Match: swapped. */
    assert_int_equal(ddp_store_compare_set(s, "c", "first", 5, "second", 6, &a, &alen), 0);
    assert_int_equal(alen, 6);
    assert_memory_equal(a, "second", 6);
    free(a);
    assert_value(s, "c", "second", 6);
    /* NULL actual is allowed. */
    assert_int_equal(ddp_store_compare_set(s, "c", "second", 6, "third", 5, NULL, NULL), 0);
    assert_value(s, "c", "third", 5);
    ddp_store_destroy(s);
}

static void case_check_delete_num_keys(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = open_one();
    const char *keys[] = {"k1", "k2", "k3"};
    int exists = -1;
    int64_t n = -1;
    assert_int_equal(ddp_store_num_keys(s, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(ddp_store_set(s, "k1", "1", 1), 0);
    assert_int_equal(ddp_store_set(s, "k2", "2", 1), 0);
    assert_int_equal(ddp_store_check(s, keys, 2, &exists), 0);
    assert_int_equal(exists, 1);
    assert_int_equal(ddp_store_check(s, keys, 3, &exists), 0);
    assert_int_equal(exists, 0);
    assert_int_equal(ddp_store_num_keys(s, &n), 0);
    assert_int_equal(n, 2);
    int deleted = -1;
    assert_int_equal(ddp_store_delete_key(s, "k1", &deleted), 0);
    assert_int_equal(deleted, 1);
    assert_int_equal(ddp_store_delete_key(s, "k1", &deleted), 0);
    assert_int_equal(deleted, 0);
    assert_int_equal(ddp_store_delete_key(s, "never", NULL), 0);
    assert_int_equal(ddp_store_check(s, keys, 1, &exists), 0);
    assert_int_equal(exists, 0);
    assert_int_equal(ddp_store_num_keys(s, &n), 0);
    assert_int_equal(n, 1);
    /* A deleted key can be set again; add restarts from 0. */
    assert_int_equal(ddp_store_add(s, "k1", 3, NULL), 0);
    assert_value(s, "k1", "3", 1);
    ddp_store_destroy(s);
}

/* ---- timeouts ----------------------------------------------------------- */

static void case_get_timeout_names_key(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = open_one();
    ddp_store_set_timeout(s, 0.3);
    assert_true(ddp_store_timeout(s) == 0.3);
    void *v = NULL;
    size_t len = 0;
    double t0 = ddp_time_now();
    assert_int_equal(ddp_store_get(s, "missing/key", &v, &len), DDP_ERR_TIMEOUT);
    double dt = ddp_time_now() - t0;
    assert_true(dt >= 0.29 && dt < 0.8);
    assert_null(v);
    assert_non_null(strstr(ddp_last_error(), "key 'missing/key' not set within 0.3 s"));
    /* The handle stays usable after a timeout. */
    assert_int_equal(ddp_store_set(s, "missing/key", "late", 4), 0);
    assert_value(s, "missing/key", "late", 4);
    ddp_store_destroy(s);
}

static int set_later(int rank, void *arg)
{
    (void)arg;
    ddp_store_t *s = NULL;
    CHILD_CHECK(open_store(1 + rank, 2, &s) == 0);
    sleep_s(0.15);
    CHILD_CHECK(ddp_store_set(s, "w1", "1", 1) == 0);
    CHILD_CHECK(ddp_store_set(s, "w2", "2", 1) == 0);
    sleep_s(0.05);
    CHILD_CHECK(ddp_store_set(s, "w3", "3", 1) == 0);
    ddp_store_destroy(s);
    return 0;
}

static void case_wait_several_keys(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = NULL;
    assert_int_equal(open_store(0, 2, &s), 0);
    const char *keys[] = {"w1", "w2", "w3"};
    rank_group g;
    double t0 = ddp_time_now();
    start_ranks(&g, STORE_RANKS_AS_THREADS, 1, set_later, NULL);
    assert_int_equal(ddp_store_wait(s, keys, 3, 10.0), 0);
    double dt = ddp_time_now() - t0;
    assert_true(dt >= 0.18 && dt < 5.0);
    assert_int_equal(join_ranks(&g, 20), 0);
    /* One key missing: times out naming it, within timeout + 0.5 s. */
    const char *keys2[] = {"w1", "nope", "w3"};
    t0 = ddp_time_now();
    assert_int_equal(ddp_store_wait(s, keys2, 3, 0.2), DDP_ERR_TIMEOUT);
    dt = ddp_time_now() - t0;
    assert_true(dt >= 0.19 && dt < 0.7);
    assert_non_null(strstr(ddp_last_error(), "key 'nope' not set within 0.2 s"));
    assert_non_null(strstr(ddp_last_error(), "waited for 'w1', 'nope', 'w3'"));
    /* Negative timeout: the store's default (set short here). */
    ddp_store_set_timeout(s, 0.1);
    assert_int_equal(ddp_store_wait(s, keys2, 3, -1), DDP_ERR_TIMEOUT);
    assert_int_equal(ddp_store_wait(s, keys, 3, 0), 0);
    ddp_store_destroy(s);
}

static int get_blocking(int rank, void *arg)
{
    (void)arg;
    ddp_store_t *s = NULL;
    CHILD_CHECK(open_store(1 + rank, 3, &s) == 0);
    ddp_store_set_timeout(s, 10);
    void *v = NULL;
    size_t len = 0;
    CHILD_CHECK(ddp_store_get(s, "late", &v, &len) == 0);
    CHILD_CHECK(len == 4 && memcmp(v, "here", 4) == 0);
    free(v);
    ddp_store_destroy(s);
    return 0;
}

static void case_get_waits_for_set(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = NULL;
    assert_int_equal(open_store(0, 3, &s), 0);
    rank_group g;
    start_ranks(&g, STORE_RANKS_AS_THREADS, 2, get_blocking, NULL);
    sleep_s(0.1);
    assert_int_equal(ddp_store_set(s, "late", "here", 4), 0);
    assert_int_equal(join_ranks(&g, 20), 0);
    ddp_store_destroy(s);
}

/* ---- concurrency -------------------------------------------------------- */

#define ADD_PROCS 4
#define ADDS_EACH 200

static int add_many(int rank, void *arg)
{
    (void)arg;
    ddp_store_t *s = NULL;
    CHILD_CHECK(open_store(1 + rank, ADD_PROCS + 1, &s) == 0);
    int64_t prev = 0;
    for (int i = 0; i < ADDS_EACH; i++) {
        int64_t r = 0;
        CHILD_CHECK(ddp_store_add(s, "counter", 1, &r) == 0);
        CHILD_CHECK(r > prev && r <= ADD_PROCS * ADDS_EACH);
        prev = r;
    }
    char key[32];
    snprintf(key, sizeof key, "done/%d", rank);
    CHILD_CHECK(ddp_store_set(s, key, "", 0) == 0);
    ddp_store_destroy(s);
    return 0;
}

static void case_concurrent_add(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = NULL;
    assert_int_equal(open_store(0, ADD_PROCS + 1, &s), 0);
    rank_group g;
    start_ranks(&g, STORE_RANKS_AS_THREADS, ADD_PROCS, add_many, NULL);
    assert_int_equal(join_ranks(&g, 60), 0);
    int64_t r = -1;
    assert_int_equal(ddp_store_add(s, "counter", 0, &r), 0);
    assert_int_equal(r, ADD_PROCS * ADDS_EACH);
    const char *done[] = {"done/0", "done/1", "done/2", "done/3"};
    int exists = 0;
    assert_int_equal(ddp_store_check(s, done, ADD_PROCS, &exists), 0);
    assert_int_equal(exists, 1);
    ddp_store_destroy(s);
}

/* ---- prefix views ------------------------------------------------------- */

static void case_prefix_isolation(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = open_one();
    ddp_store_t *a = NULL, *b = NULL, *aa = NULL;
    assert_int_equal(ddp_store_prefix_create("group_a", s, &a), 0);
    assert_int_equal(ddp_store_prefix_create("group_b", s, &b), 0);
    assert_int_equal(ddp_store_prefix_create("sub", a, &aa), 0);
    assert_int_equal(ddp_store_set(a, "k", "A", 1), 0);
    assert_int_equal(ddp_store_set(b, "k", "B", 1), 0);
    assert_int_equal(ddp_store_set(aa, "k", "AA", 2), 0);
    assert_value(a, "k", "A", 1);
    assert_value(b, "k", "B", 1);
    assert_value(aa, "k", "AA", 2);
    assert_value(s, "group_a/k", "A", 1);
    assert_value(s, "group_a/sub/k", "AA", 2);
    const char *k = "k";
    int exists = 1;
    assert_int_equal(ddp_store_check(s, &k, 1, &exists), 0);
    assert_int_equal(exists, 0);
    int64_t r = 0;
    assert_int_equal(ddp_store_add(a, "n", 2, &r), 0);
    assert_int_equal(ddp_store_add(b, "n", 5, &r), 0);
    assert_int_equal(r, 5);
    void *act = NULL;
    size_t alen = 0;
    assert_int_equal(ddp_store_compare_set(b, "k", "B", 1, "B2", 2, &act, &alen), 0);
    assert_int_equal(alen, 2);
    free(act);
    assert_value(a, "k", "A", 1);
    int deleted = 0;
    assert_int_equal(ddp_store_delete_key(a, "k", &deleted), 0);
    assert_int_equal(deleted, 1);
    assert_value(b, "k", "B2", 2);
    /* Timeouts on a view name the full key and follow the view's timeout. */
    ddp_store_set_timeout(a, 0.1);
    void *v = NULL;
    size_t len;
    assert_int_equal(ddp_store_get(a, "absent", &v, &len), DDP_ERR_TIMEOUT);
    assert_non_null(strstr(ddp_last_error(), "'group_a/absent'"));
    const char *ks[] = {"n", "absent"};
    assert_int_equal(ddp_store_wait(a, ks, 2, 0.1), DDP_ERR_TIMEOUT);
    assert_non_null(strstr(ddp_last_error(), "key 'group_a/absent' not set"));
    assert_int_equal(ddp_store_wait(a, ks, 1, 0.1), 0);
    ddp_store_t *bad = (ddp_store_t *)&bad;
    assert_int_equal(ddp_store_prefix_create("", s, &bad), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "empty prefix"));
    assert_null(bad);
    assert_int_equal(ddp_store_prefix_create("p", NULL, &bad), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "base store is NULL"));
    ddp_store_destroy(aa);
    ddp_store_destroy(a);
    ddp_store_destroy(b);
    ddp_store_destroy(s);
}


/* ---- threads and fork --------------------------------------------------- */

static void *add_from_thread(void *arg)
{
    ddp_store_t *s = arg;
    for (int i = 0; i < 100; i++)
        if (ddp_store_add(s, "threads", 1, NULL) < 0)
            return (void *)1;
    return NULL;
}

static void case_threads_share_a_handle(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = open_one();
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, add_from_thread, s), 0);
    for (int i = 0; i < 4; i++) {
        void *r = (void *)1;
        pthread_join(t[i], &r);
        assert_null(r);
    }
    int64_t n = 0;
    assert_int_equal(ddp_store_add(s, "threads", 0, &n), 0);
    assert_int_equal(n, 400);
    ddp_store_destroy(s);
}

#if !STORE_RANKS_AS_THREADS
static int use_inherited(int rank, void *arg)
{
    (void)rank;
    ddp_store_t *inherited = arg, *p = NULL, *own = NULL;
    CHILD_CHECK(ddp_store_set(inherited, "x", "1", 1) == DDP_ERR_STATE);
    CHILD_CHECK(strstr(ddp_last_error(), "used in process") != NULL);
    CHILD_CHECK(strstr(ddp_last_error(), "create a new handle in the child") != NULL);
    CHILD_CHECK(ddp_store_prefix_create("p", inherited, &p) == DDP_ERR_STATE);
    ddp_store_destroy(inherited); /* releases the child's copy only */
    CHILD_CHECK(open_store(1, 2, &own) == 0);
    CHILD_CHECK(ddp_store_set(own, "child_ok", "yes", 3) == 0);
    ddp_store_destroy(own);
    return 0;
}

static void case_fork_child_refuses_parent_handle(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = open_one();
    assert_int_equal(ddp_store_set(s, "before", "1", 1), 0);
    assert_int_equal(run_children(1, use_inherited, s, 20), 0);
    assert_value(s, "child_ok", "yes", 3);
    assert_value(s, "before", "1", 1);
    ddp_store_destroy(s);
}
#endif

#define STORE_CASES                                         \
    cmocka_unit_test(case_set_get_overwrite),               \
    cmocka_unit_test(case_bad_arguments),                   \
    cmocka_unit_test(case_add),                             \
    cmocka_unit_test(case_compare_set),                     \
    cmocka_unit_test(case_check_delete_num_keys),           \
    cmocka_unit_test(case_get_timeout_names_key),           \
    cmocka_unit_test(case_wait_several_keys),               \
    cmocka_unit_test(case_get_waits_for_set),               \
    cmocka_unit_test(case_concurrent_add),                  \
    cmocka_unit_test(case_prefix_isolation),                \
    cmocka_unit_test(case_threads_share_a_handle)          \
    STORE_CASES_FORK

#if STORE_RANKS_AS_THREADS
#define STORE_CASES_FORK
#else
#define STORE_CASES_FORK , cmocka_unit_test(case_fork_child_refuses_parent_handle)
#endif

#endif
