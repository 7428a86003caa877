/* OPENBLAS_CORETYPE for the workers, as torchrun sets OMP_NUM_THREADS: where
 * OpenBLAS would fall back to older kernels than this CPU runs
 * (src/base/cpu.c: Debian 12's OpenBLAS runs SSE3 kernels on Intel models it
 * does not know, GEMMs 4x slower), the workers get the kernels the CPU's
 * features call for.  OpenBLAS is asked once, by loading it here: ddprun
 * does not link it (Makefile), and only OpenBLAS knows what it would
 * choose.  A user's own OPENBLAS_CORETYPE stays, and so does a machine
 * without OpenBLAS. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/cpu.h"
#include "ddprun.h"

/* OpenBLAS's kernel set as it would choose it on its own: its name, copied
 * into out, or "" when there is no OpenBLAS to ask. */
static void openblas_choice(char *out, size_t len)
{
    out[0] = '\0';
    /* its constructor starts a thread per core, or per OPENBLAS_NUM_THREADS:
     * one for the question, the user's value back after */
    const char *user = getenv("OPENBLAS_NUM_THREADS");
    char saved[32] = "";
    int had = user != NULL && snprintf(saved, sizeof saved, "%s", user) < (int)sizeof saved;
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    void *lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (lib) {
        char *(*corename)(void) = (char *(*)(void))dlsym(lib, "openblas_get_corename");
        const char *name = corename ? corename() : NULL;
        snprintf(out, len, "%s", name ? name : "");
        dlclose(lib);
    }
    if (had)
        setenv("OPENBLAS_NUM_THREADS", saved, 1);
    else
        unsetenv("OPENBLAS_NUM_THREADS");
}

void ddprun_blas_env(void)
{
    unsigned need = DDP__CPU_AVX2 | DDP__CPU_FMA;
    if (getenv("OPENBLAS_CORETYPE") || (ddp__cpu_features() & need) != need)
        return;
    char chosen[64];
    openblas_choice(chosen, sizeof chosen);
    const char *better = ddp__cpu_blas_core(chosen);
    if (!better)
        return;
    setenv("OPENBLAS_CORETYPE", better, 1);
    fprintf(stderr,
            "ddprun: OpenBLAS would run its %s kernels on this CPU (it does not know the "
            "model); workers get OPENBLAS_CORETYPE=%s\n",
            chosen, better);
}
