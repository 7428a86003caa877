/* CPU features and OpenBLAS's kernel choice; see cpu.h.
 *
 * Why the second: a DYNAMIC_ARCH OpenBLAS picks its kernels from the CPU's
 * model number when it loads, and 0.3.21 (Debian 12's) falls back to its
 * Prescott (SSE3) kernels on an Intel model it does not know, whatever the
 * CPU's features (upstream fixed that in 0.3.25, OpenBLAS#4268).  On this
 * project's Xeon (family 6, model 207, AVX-512) that made every sgemm 4x
 * slower: 29 GFLOP/s for conv2's shapes against 103-112 with
 * OPENBLAS_CORETYPE=SkylakeX (bench/RESULTS.md, session 12).  OpenBLAS reads
 * that variable in its own constructor, before any code of ours runs, so a
 * process cannot mend its own choice: ddprun sets it for its workers and
 * the library warns (tensor.c). */
#include "base/cpu.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <strings.h>

#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__))
#include <cpuid.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

static unsigned detect(void)
{
    unsigned f = 0;
#if HAVE_X86
    /* F16C by CPUID leaf 1, ECX bit 29: a hypervisor may hide it where
     * AVX2 is shown, and clang cannot ask __builtin_cpu_supports for it */
    unsigned a, b, c = 0, d;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C))
        f |= DDP__CPU_F16C;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        f |= DDP__CPU_AVX2;
    if (__builtin_cpu_supports("fma"))
        f |= DDP__CPU_FMA;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        f |= DDP__CPU_AVX512;
#endif
    return f;
}

unsigned ddp__cpu_features(void)
{
    static _Atomic int known = -1; /* the features, once asked */
    int f = atomic_load_explicit(&known, memory_order_relaxed);
    if (f < 0) {
        f = (int)detect();
        atomic_store_explicit(&known, f, memory_order_relaxed);
    }
    return (unsigned)f;
}

/* OpenBLAS 0.3.21's x86 kernel sets older than AVX2 (its corename table,
 * driver/others/dynamic.c): on a CPU with AVX2 and FMA any of these is a
 * fallback, never the best it has. */
static const char *const pre_avx2[] = {
    "Unknown",   "Katmai", "Coppermine",  "Northwood", "Prescott",  "Banias",     "Atom",
    "Core2",     "Penryn", "Dunnington",  "Nehalem",   "Athlon",    "Opteron",    "Opteron_SSE3",
    "Barcelona", "Nano",   "Sandybridge", "Bobcat",    "Bulldozer", "Piledriver", "Steamroller"};

const char *ddp__cpu_blas_core_for(const char *chosen, unsigned features)
{
    if (!chosen || (features & (DDP__CPU_AVX2 | DDP__CPU_FMA)) != (DDP__CPU_AVX2 | DDP__CPU_FMA))
        return NULL;
    for (size_t i = 0; i < sizeof pre_avx2 / sizeof *pre_avx2; i++)
        if (strcasecmp(chosen, pre_avx2[i]) == 0)
            return features & DDP__CPU_AVX512 ? "SkylakeX" : "Haswell";
    return NULL;
}

int ddp__cpu_blas_beta0_free(const char *chosen)
{
    return chosen && (!strcasecmp(chosen, "SkylakeX") || !strcasecmp(chosen, "Cooperlake"));
}

const char *ddp__cpu_blas_core(const char *chosen)
{
    return ddp__cpu_blas_core_for(chosen, ddp__cpu_features());
}

int ddp__cpu_blas_warning(char *buf, size_t len, const char *chosen, unsigned features,
                          const char *user_coretype)
{
    const char *better = user_coretype ? NULL : ddp__cpu_blas_core_for(chosen, features);
    if (len)
        buf[0] = '\0';
    if (!better)
        return 0;
    snprintf(buf, len,
             "OpenBLAS runs its %s kernels on a CPU with %s (its CPU detection does not know "
             "this model), so GEMMs run several times slower: set OPENBLAS_CORETYPE=%s (ddprun "
             "sets it for its workers)",
             chosen, features & DDP__CPU_AVX512 ? "AVX-512" : "AVX2", better);
    return 1;
}
