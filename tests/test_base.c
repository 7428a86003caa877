/* Tests of base/: error codes and messages, RNG statistics, allocation,
 * the shared-secret loader (every rule and message of base/secret.h),
 * ddp_error_file_write (and ddp-mnist's use of it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/rng.h"
#include "base/secret.h"
#include "ddp/base.h"

static int fails_with_timeout(int rank)
{
    DDP_FAIL_IF(rank > 2, DDP_ERR_TIMEOUT, "rank %d did not arrive", rank);
    return 0;
}

static void test_error_message_and_code(void **state)
{
    (void)state;
    ddp_clear_error();
    assert_int_equal(fails_with_timeout(1), 0);
    assert_string_equal(ddp_last_error(), "");
    assert_int_equal(fails_with_timeout(3), DDP_ERR_TIMEOUT);
    const char *msg = ddp_last_error();
    assert_non_null(strstr(msg, "test_base.c:"));
    assert_non_null(strstr(msg, "rank 3 did not arrive"));
    ddp__error_context(DDP_ERR_TIMEOUT, "allreduce #%d", 812);
    assert_non_null(strstr(ddp_last_error(), "allreduce #812: test_base.c:"));
    assert_string_equal(ddp_strerror(DDP_ERR_TIMEOUT), "timed out");
    assert_string_equal(ddp_err_name(DDP_ERR_PEER), "DDP_ERR_PEER");
    assert_string_equal(ddp_err_name(12345), "DDP_ERR_UNKNOWN");
    DDP_ERROR_ERRNO(DDP_ERR_IO, 2, "open %s", "/x");
    assert_non_null(strstr(ddp_last_error(), "open /x: No such file or directory"));
}

/* xoshiro256** seeded by splitmix64 against a reference computed by an
 * independent implementation of Vigna's published algorithms (Python, whose
 * splitmix64 gives the published 6457827717110365317, 3203168211198807973,
 * 9817491932198370423 for seed 1234567). */
static void test_rng_reference_vector(void **state)
{
    (void)state;
    static const uint64_t want[4] = {0x15780b2e0c2ec716ULL, 0x6104d9866d113a7eULL,
                                     0xae17533239e499a1ULL, 0xecb8ad4703b360a1ULL};
    ddp__rng r;
    ddp__rng_seed(&r, 42);
    for (int i = 0; i < 4; i++)
        assert_true(ddp__rng_next(&r) == want[i]);
}

static void test_rng_reproducible_and_uniform(void **state)
{
    (void)state;
    ddp__rng a, b;
    ddp__rng_seed(&a, 42);
    ddp__rng_seed(&b, 42);
    for (int i = 0; i < 100; i++)
        assert_true(ddp__rng_next(&a) == ddp__rng_next(&b));
    double sum = 0, sumsq = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double u = ddp__rng_uniform(&a);
        assert_true(u >= 0.0 && u < 1.0);
        sum += u;
        sumsq += u * u;
    }
    double mean = sum / n, var = sumsq / n - mean * mean;
    /* U(0,1): mean 1/2, variance 1/12; 5 sigma bounds. */
    assert_true(fabs(mean - 0.5) < 5 * sqrt(1.0 / 12 / n));
    assert_true(fabs(var - 1.0 / 12) < 0.002);
    int counts[7] = {0};
    for (int i = 0; i < 70000; i++)
        counts[ddp__rng_below(&a, 7)]++;
    for (int i = 0; i < 7; i++)
        assert_true(counts[i] > 9500 && counts[i] < 10500);
}

/* Dropout's masks: the two halves of each draw against p 2^32, an odd
 * count's last element from a draw of its own; p 0 keeps all, p 1 none;
 * the kept share is 1 - p (within 5 standard deviations of 2^20 draws). */
static void test_rng_keep_mask(void **state)
{
    (void)state;
    enum { N = 1 << 20 };
    static float mask[N];
    ddp__rng r, ref;
    const double ps[] = {0.0, 0.25, 0.5, 0.9, 1.0};
    for (size_t k = 0; k < sizeof ps / sizeof *ps; k++) {
        ddp__rng_seed(&r, 7 + k), ddp__rng_seed(&ref, 7 + k);
        mask[N - 1] = -1.0f;
        ddp__rng_keep_mask(&r, mask, N - 1, ps[k], 2.0f); /* odd: a last half-used draw */
        assert_true(mask[N - 1] == -1.0f);                 /* nothing written past n */
        size_t kept = 0;
        uint64_t x = 0;
        for (size_t i = 0; i < N - 1; i++) {
            if (i % 2 == 0)
                x = ddp__rng_next(&ref);
            uint64_t half = i % 2 ? (x & 0xffffffffu) : x >> 32;
            int keep = (double)half >= ceil(ps[k] * 4294967296.0);
            assert_true(mask[i] == (keep ? 2.0f : 0.0f));
            kept += keep;
        }
        double share = (double)kept / (N - 1), sd = sqrt(ps[k] * (1 - ps[k]) / (N - 1));
        assert_true(fabs(share - (1 - ps[k])) <= 5 * sd + 1e-12);
    }
}

static void test_alloc_aligned(void **state)
{
    (void)state;
    float *p = ddp__calloc_aligned(1000 * sizeof(float));
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    for (int i = 0; i < 1000; i++)
        assert_true(p[i] == 0.0f);
    ddp__free_aligned(p);
    ddp__free_aligned(NULL);
}

/* ---- shared secret ------------------------------------------------------ */

static char secret_path[64];

/* Writes n bytes to the test's secret file and points DDP_SECRET_FILE at it. */
static void secret_file(const void *bytes, size_t n)
{
    snprintf(secret_path, sizeof secret_path, "/tmp/ddp-test-base-secret-%d", (int)getpid());
    FILE *f = fopen(secret_path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    unsetenv("DDP_SECRET");
    setenv("DDP_SECRET_FILE", secret_path, 1);
}

/* Loads the secret and checks it is want (NULL: none). */
static void expect_secret(const char *want, size_t want_len)
{
    uint8_t *sec = (uint8_t *)&sec;
    size_t len = 99;
    assert_int_equal(ddp__secret_load(&sec, &len), 0);
    if (!want) {
        assert_null(sec);
        assert_int_equal(len, 0);
        return;
    }
    assert_non_null(sec);
    assert_int_equal(len, want_len);
    assert_memory_equal(sec, want, want_len);
    free(sec);
}

/* Loading fails with code and a message that contains msg (and no secret). */
static void expect_secret_error(int code, const char *msg)
{
    uint8_t *sec = (uint8_t *)&sec;
    size_t len = 99;
    assert_int_equal(ddp__secret_load(&sec, &len), code);
    assert_null(sec);
    assert_int_equal(len, 0);
    if (!strstr(ddp_last_error(), msg))
        fail_msg("expected '%s' in '%s'", msg, ddp_last_error());
}

static void test_secret_sources(void **state)
{
    (void)state;
    unsetenv("DDP_SECRET");
    unsetenv("DDP_SECRET_FILE");
    expect_secret(NULL, 0);
    /* Empty variables count as unset. */
    setenv("DDP_SECRET", "", 1);
    setenv("DDP_SECRET_FILE", "", 1);
    expect_secret(NULL, 0);
    /* The variable's bytes as they are, trailing newline included. */
    setenv("DDP_SECRET", "horse battery\n", 1);
    expect_secret("horse battery\n", 14);
    unsetenv("DDP_SECRET");

    /* A file: one final "\n" or "\r\n" dropped, nothing else. */
    secret_file("horse battery", 13);
    expect_secret("horse battery", 13);
    secret_file("horse battery\n", 14);
    expect_secret("horse battery", 13);
    secret_file("horse battery\r\n", 15);
    expect_secret("horse battery", 13);
    secret_file("horse battery\n\n", 15);
    expect_secret("horse battery\n", 14);
    secret_file("horse battery\r", 14);
    expect_secret("horse battery\r", 14);
    secret_file("a\0b", 3); /* any bytes */
    expect_secret("a\0b", 3);

    /* The variable has the file's limit, and its message no copy of it. */
    char big[DDP__SECRET_MAX + 2];
    memset(big, 'k', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    unsetenv("DDP_SECRET_FILE");
    setenv("DDP_SECRET", big, 1);
    expect_secret_error(DDP_ERR_INVALID_ARG, "DDP_SECRET: 4097 bytes, more than 4096");
    assert_null(strstr(ddp_last_error(), "kkkk"));
    big[DDP__SECRET_MAX] = '\0';
    setenv("DDP_SECRET", big, 1);
    expect_secret(big, DDP__SECRET_MAX);
    unsetenv("DDP_SECRET");

    /* Both set: refused, whichever would have won. */
    secret_file("horse battery", 13);
    setenv("DDP_SECRET", "horse battery", 1);
    expect_secret_error(DDP_ERR_INVALID_ARG, "DDP_SECRET and DDP_SECRET_FILE=");
    assert_non_null(strstr(ddp_last_error(), "are both set: set only one"));
    unsetenv("DDP_SECRET");
    unlink(secret_path);
    unsetenv("DDP_SECRET_FILE");
}

static void test_secret_file_errors(void **state)
{
    (void)state;
    char msg[160];
    /* The limit is the file's size: at the limit it loads, one byte over it
     * is refused (never cut). */
    static uint8_t big[DDP__SECRET_MAX + 1];
    memset(big, 'x', sizeof big);
    secret_file(big, DDP__SECRET_MAX);
    expect_secret((const char *)big, DDP__SECRET_MAX);
    big[DDP__SECRET_MAX - 1] = '\n';
    secret_file(big, DDP__SECRET_MAX);
    expect_secret((const char *)big, DDP__SECRET_MAX - 1);
    secret_file(big, DDP__SECRET_MAX + 1);
    snprintf(msg, sizeof msg,
             "DDP_SECRET_FILE=%s: the file is larger than 4096 bytes, the limit for a secret",
             secret_path);
    expect_secret_error(DDP_ERR_INVALID_ARG, msg);

    /* Empty, or only a line ending. */
    snprintf(msg, sizeof msg, "DDP_SECRET_FILE=%s: the secret is empty", secret_path);
    secret_file("", 0);
    expect_secret_error(DDP_ERR_INVALID_ARG, msg);
    secret_file("\n", 1);
    expect_secret_error(DDP_ERR_INVALID_ARG, msg);
    secret_file("\r\n", 2);
    expect_secret_error(DDP_ERR_INVALID_ARG, msg);

    /* Missing, unreadable, a directory. */
    unlink(secret_path);
    snprintf(msg, sizeof msg, "DDP_SECRET_FILE=%s: No such file or directory", secret_path);
    expect_secret_error(DDP_ERR_IO, msg);
    if (geteuid() != 0) { /* root reads anything */
        secret_file("horse", 5);
        chmod(secret_path, 0);
        snprintf(msg, sizeof msg, "DDP_SECRET_FILE=%s: Permission denied", secret_path);
        expect_secret_error(DDP_ERR_IO, msg);
        unlink(secret_path);
    }
    setenv("DDP_SECRET_FILE", "/tmp", 1);
    expect_secret_error(DDP_ERR_IO, "DDP_SECRET_FILE=/tmp: a directory, not a regular file");
    /* A FIFO without a writer: refused at once (it used to read as empty,
     * and a blocking open would wait forever). */
    assert_int_equal(mkfifo(secret_path, 0600), 0);
    setenv("DDP_SECRET_FILE", secret_path, 1);
    double t0 = ddp_time_now();
    snprintf(msg, sizeof msg, "DDP_SECRET_FILE=%s: a FIFO, not a regular file", secret_path);
    expect_secret_error(DDP_ERR_IO, msg);
    assert_true(ddp_time_now() - t0 < 5.0);
    unlink(secret_path);
    setenv("DDP_SECRET_FILE", "/dev/zero", 1);
    expect_secret_error(DDP_ERR_IO,
                        "DDP_SECRET_FILE=/dev/zero: a character device, not a regular file");
    unsetenv("DDP_SECRET_FILE");
}

/* The first line of a file ("" when it cannot be read). */
static void first_line(const char *path, char *out, size_t len)
{
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    if (!fgets(out, (int)len, f))
        out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
}

static void test_error_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/ddp-errfile-XXXXXX", path[256], got[512];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/error", dir);
    unsetenv("DDP_ERROR_FILE");
    assert_int_equal(ddp_error_file_write("no launcher"), 0);
    setenv("DDP_ERROR_FILE", path, 1);
    assert_int_equal(ddp_error_file_write("prog: first\nsecond"), 0);
    first_line(path, got, sizeof got);
    assert_string_equal(got, "prog: first");
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((int)st.st_size, (int)strlen("prog: first\n")); /* one line only */
    /* ddp-mnist stops on a missing data folder and writes why: the same
     * line as its last on stderr. */
    const char *build = getenv("DDP_TEST_BUILD");
    char cmd[1024], err[256], last[512] = "";
    snprintf(err, sizeof err, "%s/stderr", dir);
    snprintf(cmd, sizeof cmd, "%s/bin/ddp-mnist --data %s/absent --epochs 1 2>%s",
             build ? build : "build", dir, err);
    assert_int_not_equal(system(cmd), 0);
    FILE *f = fopen(err, "r");
    assert_non_null(f);
    char line[512];
    while (fgets(line, sizeof line, f))
        snprintf(last, sizeof last, "%s", line);
    fclose(f);
    last[strcspn(last, "\n")] = '\0';
    first_line(path, got, sizeof got);
    assert_true(strncmp(got, "ddp-mnist: ", 11) == 0);
    assert_non_null(strstr(got, "absent"));
    assert_string_equal(got, last);
    /* A path that cannot be written is an error naming it. */
    snprintf(path, sizeof path, "%s/no/such/folder", dir);
    setenv("DDP_ERROR_FILE", path, 1);
    assert_int_equal(ddp_error_file_write("x"), DDP_ERR_IO);
    assert_non_null(strstr(ddp_last_error(), path));
    unsetenv("DDP_ERROR_FILE");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_message_and_code),
        cmocka_unit_test(test_rng_reference_vector),
        cmocka_unit_test(test_rng_reproducible_and_uniform),
        cmocka_unit_test(test_rng_keep_mask),
        cmocka_unit_test(test_alloc_aligned),
        cmocka_unit_test(test_secret_sources),
        cmocka_unit_test(test_secret_file_errors),
        cmocka_unit_test(test_error_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
