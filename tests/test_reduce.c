/* The reduction kernels (coll/reduce.c) table by table: every instruction
 * set this CPU runs (portable, AVX2, AVX-512) gives the same bits as the
 * portable table for every dtype and op, on random bit patterns (NaN, inf,
 * subnormals and -0 included; where both operands are NaN, which payload
 * comes out may differ, NaN does not), every length up to 70 and a few long ones,
 * misaligned pointers and in place (dst == a, dst == b); the portable table
 * agrees with the scalar reference of coll_ref.h wherever the inputs are not
 * NaN; DDP_REDUCE_ISA caps the table ddp__reduce_kernel picks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll/reduce.h"
#include "coll_ref.h"

static int is_nan(const uint8_t *p, ddp_dtype dt)
{
    uint64_t v = 0;
    memcpy(&v, p, ddp_dtype_size(dt));
    switch (dt) {
    case DDP_FLOAT32: return (v & 0x7fffffffu) > 0x7f800000u;
    case DDP_FLOAT64: return (v & 0x7fffffffffffffffu) > 0x7ff0000000000000u;
    case DDP_FLOAT16: return (v & 0x7fffu) > 0x7c00u;
    case DDP_BFLOAT16: return (v & 0x7fffu) > 0x7f80u;
    default: return 0;
    }
}

/* Checks one (dtype, op, isa) on n elements at misalignment skew (elements)
 * and in-place mode inplace (0: dst apart, 1: dst == a, 2: dst == b). */
static void check(ddp_dtype dt, ddp_reduce_op op, int isa, size_t n, size_t skew, int inplace,
                  uint64_t seed)
{
    const size_t es = ddp_dtype_size(dt), bytes = (n + skew) * es + 64;
    uint8_t *a = malloc(bytes), *b = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(want);
    assert_non_null(got);
    uint64_t x = seed;
    for (size_t i = 0; i < bytes; i++) {
        x = ref_hash(x, i, seed);
        a[i] = (uint8_t)x;
        b[i] = (uint8_t)(x >> 8);
        /* Mostly ordinary values: the exponent bytes of every other
         * element get tamed so that sums and products stay finite too. */
        if (i % (2 * es) == es - 1 && (x >> 16) % 4)
            a[i] = (uint8_t)(0x3f ^ (a[i] & 0x80)), b[i] = (uint8_t)(0x3e ^ (b[i] & 0x80));
    }
    uint8_t *pa = a + skew * es, *pb = b + skew * es;
    ddp__reduce_fn portable = ddp__reduce_kernel_isa(dt, op, DDP__ISA_PORTABLE);
    ddp__reduce_fn fn = ddp__reduce_kernel_isa(dt, op, isa);
    assert_non_null(portable);
    assert_non_null(fn);
    portable(want + skew * es, pa, pb, n);
    uint8_t *dst;
    if (inplace == 1) {
        memcpy(got, a, bytes);
        dst = got + skew * es;
        fn(dst, dst, pb, n);
    } else if (inplace == 2) {
        memcpy(got, b, bytes);
        dst = got + skew * es;
        fn(dst, pa, dst, n);
    } else {
        dst = got + skew * es;
        fn(dst, pa, pb, n);
    }
    for (size_t i = 0; i < n; i++) {
        const uint8_t *w = want + (skew + i) * es, *g = dst + i * es;
        /* Two NaNs may give either one's payload (the compiler may swap the
         * operands of a commutative op): NaN is all that counts then. */
        int both_nan = is_nan(pa + i * es, dt) && is_nan(pb + i * es, dt);
        if (both_nan ? !(is_nan(w, dt) && is_nan(g, dt)) : memcmp(w, g, es) != 0)
            fail_msg("%s %s %s: n %zu skew %zu inplace %d: element %zu differs from portable",
                     ddp__reduce_isa_name(isa), ddp_dtype_name(dt), ddp_reduce_op_name(op), n,
                     skew, inplace, i);
        /* The portable table against the scalar reference. */
        if (is_nan(pa + i * es, dt) || is_nan(pb + i * es, dt))
            continue;
        uint8_t ref[8];
        memcpy(ref, pa + i * es, es);
        ref_combine_any(ref, pb + i * es, dt, op);
        if (!(is_nan(ref, dt) && is_nan(w, dt)) && memcmp(ref, w, es) != 0)
            fail_msg("portable %s %s: element %zu differs from the reference", ddp_dtype_name(dt),
                     ddp_reduce_op_name(op), i);
    }
    free(a);
    free(b);
    free(want);
    free(got);
}

static void test_tables_agree(void **state)
{
    (void)state;
    const int best = ddp__reduce_isa_best();
    fprintf(stderr, "best instruction set here: %s\n", ddp__reduce_isa_name(best));
    const size_t longs[] = {255, 1000, 4099};
    uint64_t seed = 1;
    for (int isa = 0; isa <= best; isa++)
        for (int dt = 0; dt < DDP_NUM_DTYPES; dt++)
            for (int op = 0; op < DDP_NUM_REDUCE_OPS; op++) {
                if (!op_applies(dt, op))
                    continue;
                for (size_t n = 0; n <= 70; n++)
                    check(dt, op, isa, n, n % 3, (int)(n % 3), ++seed);
                for (size_t k = 0; k < 3; k++)
                    for (int inplace = 0; inplace < 3; inplace++)
                        check(dt, op, isa, longs[k], k, inplace, ++seed);
            }
    /* Tables this CPU cannot run are not handed out. */
    for (int isa = best + 1; isa < DDP__ISA_COUNT; isa++)
        assert_null(ddp__reduce_kernel_isa(DDP_FLOAT32, DDP_SUM, isa));
    assert_null(ddp__reduce_kernel_isa(DDP_FLOAT32, DDP_BAND, DDP__ISA_PORTABLE));
}

/* DDP_REDUCE_ISA (read once per process: each case in a fresh child). */
static int child_picks(const char *value, int want)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("DDP_REDUCE_ISA", value, 1);
        int ok = ddp__reduce_kernel(DDP_FLOAT32, DDP_SUM) ==
                     ddp__reduce_kernel_isa(DDP_FLOAT32, DDP_SUM, want) &&
                 ddp__reduce_kernel(DDP_FLOAT16, DDP_MAX) ==
                     ddp__reduce_kernel_isa(DDP_FLOAT16, DDP_MAX, want);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void test_env_caps_the_table(void **state)
{
    (void)state;
    const int best = ddp__reduce_isa_best();
    assert_true(child_picks("portable", DDP__ISA_PORTABLE));
    assert_true(child_picks("avx2", best < DDP__ISA_AVX2 ? best : DDP__ISA_AVX2));
    assert_true(child_picks("avx512", best));
    assert_true(child_picks("auto", best));
    assert_true(child_picks("sse9", best)); /* here: auto; init reports it (below) */
    int isa = -1;
    unsetenv("DDP_REDUCE_ISA");
    assert_int_equal(ddp__reduce_isa_from_env(&isa), 0);
    assert_int_equal(isa, best);
    setenv("DDP_REDUCE_ISA", "portable", 1);
    assert_int_equal(ddp__reduce_isa_from_env(&isa), 0);
    assert_int_equal(isa, DDP__ISA_PORTABLE);
    setenv("DDP_REDUCE_ISA", "sse9", 1);
    assert_true(ddp__reduce_isa_from_env(&isa) < 0);
    unsetenv("DDP_REDUCE_ISA");
    assert_non_null(strstr(ddp_last_error(),
                           "DDP_REDUCE_ISA=sse9: expected auto, avx512, avx2 or portable"));
}

/* AVG's division: a power-of-two divisor multiplies by its reciprocal;
 * the bits must be those of the division, for every float32 and float64
 * pattern (random bits: subnormals, infinities, NaNs). */
static void test_divide_matches_division(void **state)
{
    (void)state;
    enum { N = 1 << 16 };
    uint32_t *f = malloc(N * sizeof *f);
    uint64_t *d = malloc(N * sizeof *d);
    assert_non_null(f);
    assert_non_null(d);
    const int divisors[] = {2, 3, 4, 8, 1024, 7};
    for (size_t k = 0; k < sizeof divisors / sizeof *divisors; k++) {
        int div = divisors[k];
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < N; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            f[i] = (uint32_t)(i < 64 ? i : x); /* the first ones: tiny subnormals */
            d[i] = i < 64 ? i : x;
        }
        ddp__reduce_divide(f, N, DDP_FLOAT32, div);
        ddp__reduce_divide(d, N, DDP_FLOAT64, div);
        x = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < N; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint32_t fb = (uint32_t)(i < 64 ? i : x);
            uint64_t db = i < 64 ? i : x;
            float fv;
            double dv;
            memcpy(&fv, &fb, 4);
            memcpy(&dv, &db, 8);
            volatile float fq = fv / (float)div;
            volatile double dq = dv / (double)div;
            float fr = fq;
            double dr = dq;
            if (fr == fr) /* NaN payloads may differ: a NaN stays a NaN */
                assert_memory_equal(&f[i], &fr, 4);
            else
                assert_true(((f[i] >> 23) & 0xff) == 0xff && (f[i] & 0x7fffff));
            if (dr == dr)
                assert_memory_equal(&d[i], &dr, 8);
            else
                assert_true(((d[i] >> 52) & 0x7ff) == 0x7ff && (d[i] & 0xfffffffffffffull));
        }
    }
    free(f);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables_agree),
        cmocka_unit_test(test_env_caps_the_table),
        cmocka_unit_test(test_divide_matches_division),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
