/* What this CPU can run, asked once (CPUID serialises the core and exits to
 * the hypervisor in a VM), and what follows from it for OpenBLAS's kernel
 * choice.  x86-64 only (with gcc or clang): elsewhere no feature is
 * reported. */
#ifndef DDP_BASE_CPU_H
#define DDP_BASE_CPU_H

#include <stddef.h>

enum {
    DDP__CPU_F16C = 1 << 0,
    DDP__CPU_AVX2 = 1 << 1,
    DDP__CPU_FMA = 1 << 2,
    DDP__CPU_AVX512 = 1 << 3 /* F, BW, DQ and VL */
};

/* The DDP__CPU_* bits this CPU has (0 off x86-64). */
unsigned ddp__cpu_features(void);

/* The OPENBLAS_CORETYPE to ask for when OpenBLAS, having chosen the kernel
 * set `chosen` (openblas_get_corename()), runs older kernels than a CPU
 * with `features` can: "SkylakeX" with AVX-512, "Haswell" with AVX2 and
 * FMA, when `chosen` is one of OpenBLAS's pre-AVX2 sets (Prescott, Core2,
 * Nehalem, Sandybridge, ...).  NULL when the choice is fine, unknown, or
 * NULL. */
const char *ddp__cpu_blas_core_for(const char *chosen, unsigned features);

/* Does a GEMM with beta 0 cost nothing over beta 1 under OpenBLAS's kernel
 * set `chosen`?  1 for its SkylakeX and Cooperlake sets, whose small-matrix
 * beta-0 kernels write C without reading it; elsewhere (and for NULL) beta
 * 0 is a pass of its own over C before the product. */
int ddp__cpu_blas_beta0_free(const char *chosen);

/* The same for this CPU. */
const char *ddp__cpu_blas_core(const char *chosen);

/* The library's warning (tensor.c) into buf: 1 when OpenBLAS chose `chosen`
 * on a CPU with `features` and `user_coretype` (OPENBLAS_CORETYPE, or NULL
 * when unset) did not choose for it, and ddp__cpu_blas_core_for names
 * better kernels; 0 (buf "") otherwise. */
int ddp__cpu_blas_warning(char *buf, size_t len, const char *chosen, unsigned features,
                          const char *user_coretype);

#endif
