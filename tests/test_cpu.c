/* base/cpu.c: the CPU's features against /proc/cpuinfo's flags, the
 * OPENBLAS_CORETYPE advice for every kind of kernel set OpenBLAS may
 * choose, and the library's warning where this machine's OpenBLAS chose
 * older kernels than the CPU runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "ddp.h"

/* Whether /proc/cpuinfo's first flags line names flag; -1 when unreadable. */
static int cpuinfo_has(const char *flag)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return -1;
    static char line[16384];
    int found = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            found = 0;
            for (char *t = strtok(strchr(line, ':') + 1, " \n"); t; t = strtok(NULL, " \n"))
                if (!strcmp(t, flag))
                    found = 1;
            break;
        }
    fclose(f);
    return found;
}

static void test_features_match_cpuinfo(void **state)
{
    (void)state;
#if defined(__x86_64__)
    unsigned f = ddp__cpu_features();
    if (cpuinfo_has("avx2") < 0)
        skip(); /* no /proc/cpuinfo flags: nothing to compare with */
    assert_int_equal(!!(f & DDP__CPU_AVX2), cpuinfo_has("avx2"));
    assert_int_equal(!!(f & DDP__CPU_FMA), cpuinfo_has("fma"));
    assert_int_equal(!!(f & DDP__CPU_F16C), cpuinfo_has("f16c"));
    int avx512 = cpuinfo_has("avx512f") && cpuinfo_has("avx512bw") && cpuinfo_has("avx512dq") &&
                 cpuinfo_has("avx512vl");
    assert_int_equal(!!(f & DDP__CPU_AVX512), avx512);
    assert_int_equal(ddp__cpu_features(), f); /* asked once, the same after */
#else
    assert_int_equal(ddp__cpu_features(), 0);
#endif
}

static void test_blas_core_advice(void **state)
{
    (void)state;
    unsigned avx2 = DDP__CPU_AVX2 | DDP__CPU_FMA, avx512 = avx2 | DDP__CPU_AVX512 | DDP__CPU_F16C;
    /* a pre-AVX2 set on a CPU with AVX2 and FMA: the CPU's own */
    assert_string_equal(ddp__cpu_blas_core_for("Prescott", avx512), "SkylakeX");
    assert_string_equal(ddp__cpu_blas_core_for("prescott", avx2), "Haswell");
    assert_string_equal(ddp__cpu_blas_core_for("Nehalem", avx2 | DDP__CPU_F16C), "Haswell");
    assert_string_equal(ddp__cpu_blas_core_for("Sandybridge", avx512), "SkylakeX");
    assert_string_equal(ddp__cpu_blas_core_for("Core2", avx512), "SkylakeX");
    assert_string_equal(ddp__cpu_blas_core_for("Piledriver", avx2), "Haswell");
    /* the CPU's own kernels, or newer ones than libddp knows: left alone */
    const char *fine[] = {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen",
                          "Excavator", "SomeFutureCore", ""};
    for (size_t i = 0; i < sizeof fine / sizeof *fine; i++)
        assert_null(ddp__cpu_blas_core_for(fine[i], avx512));
    /* a CPU without AVX2 and FMA: Prescott may be the best it has */
    assert_null(ddp__cpu_blas_core_for("Prescott", 0));
    assert_null(ddp__cpu_blas_core_for("Prescott", DDP__CPU_AVX2));
    assert_null(ddp__cpu_blas_core_for("Prescott", DDP__CPU_FMA));
    assert_null(ddp__cpu_blas_core_for(NULL, avx512));
}

/* Where beta 0 is free (Winograd F(4x4)'s GEMMs write M then, instead of
 * adding into an M kept zero): OpenBLAS's small-matrix kernel sets only,
 * by name in any case, whatever this host's OpenBLAS. */
static void test_blas_beta0_free(void **state)
{
    (void)state;
    assert_true(ddp__cpu_blas_beta0_free("SkylakeX"));
    assert_true(ddp__cpu_blas_beta0_free("COOPERLAKE"));
    const char *not[] = {"Haswell", "Zen", "Prescott", "Skylake", ""};
    for (size_t i = 0; i < sizeof not / sizeof *not; i++)
        assert_false(ddp__cpu_blas_beta0_free(not[i]));
    assert_false(ddp__cpu_blas_beta0_free(NULL));
}

/* The warning's text for every branch, whatever this host's OpenBLAS. */
static void test_blas_warning_text(void **state)
{
    (void)state;
    unsigned avx2 = DDP__CPU_AVX2 | DDP__CPU_FMA, avx512 = avx2 | DDP__CPU_AVX512;
    char buf[512];
    assert_int_equal(ddp__cpu_blas_warning(buf, sizeof buf, "Prescott", avx512, NULL), 1);
    assert_string_equal(buf, "OpenBLAS runs its Prescott kernels on a CPU with AVX-512 (its CPU "
                             "detection does not know this model), so GEMMs run several times "
                             "slower: set OPENBLAS_CORETYPE=SkylakeX (ddprun sets it for its "
                             "workers)");
    assert_int_equal(ddp__cpu_blas_warning(buf, sizeof buf, "Nehalem", avx2, NULL), 1);
    assert_non_null(strstr(buf, "its Nehalem kernels on a CPU with AVX2 ("));
    assert_non_null(strstr(buf, "set OPENBLAS_CORETYPE=Haswell "));
    /* the user chose (even the fallback itself), or the choice is fine: nothing */
    assert_int_equal(ddp__cpu_blas_warning(buf, sizeof buf, "Prescott", avx512, "Prescott"), 0);
    assert_string_equal(buf, "");
    assert_int_equal(ddp__cpu_blas_warning(buf, sizeof buf, "Prescott", avx512, ""), 0);
    assert_int_equal(ddp__cpu_blas_warning(buf, sizeof buf, "SkylakeX", avx512, NULL), 0);
    assert_int_equal(ddp__cpu_blas_warning(buf, sizeof buf, "Prescott", 0, NULL), 0);
    /* a short buffer: cut, terminated */
    char small[16];
    memset(small, 'x', sizeof small);
    assert_int_equal(ddp__cpu_blas_warning(small, sizeof small, "Prescott", avx512, NULL), 1);
    assert_int_equal(strlen(small), sizeof small - 1);
}

static char logged[4096];
static void keep_log(int level, const char *msg, void *user)
{
    (void)user;
    if (level == DDP_LOG_WARN && strstr(msg, "OpenBLAS"))
        snprintf(logged, sizeof logged, "%s", msg);
}

/* The first GEMM logs that warning where this process's OpenBLAS (loaded
 * before any code of ours) fell back, nothing elsewhere; and the GEMM's
 * result stays right. */
static void test_first_gemm_warns_of_fallback(void **state)
{
    (void)state;
    ddp_log_set_level(DDP_LOG_WARN);
    ddp_log_set_callback(keep_log, NULL);
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {0};
    ddp_sgemm(0, 0, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    ddp_log_set_callback(NULL, NULL);
    assert_true(c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50);
    char want[512]; /* the text test_blas_warning_text checks, for this host */
    ddp__cpu_blas_warning(want, sizeof want, openblas_get_corename(), ddp__cpu_features(),
                          getenv("OPENBLAS_CORETYPE"));
    assert_string_equal(logged, want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_features_match_cpuinfo),
        cmocka_unit_test(test_blas_core_advice),
        cmocka_unit_test(test_blas_beta0_free),
        cmocka_unit_test(test_blas_warning_text),
        cmocka_unit_test(test_first_gemm_warns_of_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
