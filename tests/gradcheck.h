/* Shared test helpers for gradient checks: central finite differences on a
 * float64 reference forward, compared with libddp's float32 analytic
 * gradients.  Header-only (each tests/test_*.c is its own binary).  Op
 * checks use the library's ddp_gradcheck (test_autograd.c, test_loss.c,
 * test_norm.c, test_function.c); gc_check stays for gradients a whole
 * model's backward leaves in its parameters (test_autograd_hooks.c), which
 * ddp_gradcheck's input vars do not cover. */
#ifndef DDP_TEST_GRADCHECK_H
#define DDP_TEST_GRADCHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"

#define GC_MAX 8
#define GC_TOL 1e-4

/* Reference loss in float64 from the inputs x[0..n-1]. */
typedef double (*gc_ref_fn)(double *const *x, void *ctx);

/* Fills x (n) with U(-1, 1) values, keeping |x| >= 0.05 (away from ReLU's
 * kink, where finite differences are meaningless). */
static inline void gc_fill(float *x, size_t n, ddp__rng *rng)
{
    for (size_t i = 0; i < n; i++) {
        double u;
        do
            u = 2.0 * ddp__rng_uniform(rng) - 1.0;
        while (fabs(u) < 0.05);
        x[i] = (float)u;
    }
}

/* Worst error of the analytic gradients grads[i] (lens[i] floats) of the
 * float values vals[i] against central differences of ref, relative to the
 * largest numeric gradient of that input.  Returns the worst over inputs
 * (and prints each when DDP_TEST_VERBOSE is set). */
static inline double gc_check(int n, float *const *vals, const float *const *grads,
                              const size_t *lens, gc_ref_fn ref, void *ctx)
{
    double *x[GC_MAX];
    for (int i = 0; i < n; i++) {
        x[i] = malloc(lens[i] * sizeof(double));
        for (size_t j = 0; j < lens[i]; j++)
            x[i][j] = vals[i][j];
    }
    double worst = 0.0;
    const double h = 1e-5;
    for (int i = 0; i < n; i++) {
        double maxerr = 0.0, maxnum = 0.0;
        for (size_t j = 0; j < lens[i]; j++) {
            double keep = x[i][j];
            x[i][j] = keep + h;
            double fp = ref(x, ctx);
            x[i][j] = keep - h;
            double fm = ref(x, ctx);
            x[i][j] = keep;
            double num = (fp - fm) / (2 * h);
            double an = grads[i] ? grads[i][j] : 0.0;
            if (fabs(num) > maxnum)
                maxnum = fabs(num);
            if (fabs(num - an) > maxerr)
                maxerr = fabs(num - an);
        }
        double rel = maxerr / (maxnum > 1e-6 ? maxnum : 1e-6);
        if (getenv("DDP_TEST_VERBOSE"))
            fprintf(stderr, "  input %d: max |num| %.3g, max err %.3g, rel %.3g\n", i, maxnum,
                    maxerr, rel);
        if (rel > worst)
            worst = rel;
    }
    for (int i = 0; i < n; i++)
        free(x[i]);
    return worst;
}

/* float64 y (rows, out) = x (rows, in) W^T + b (b may be NULL). */
static inline void gc_linear(double *y, const double *x, const double *w, const double *b,
                             int rows, int in, int out)
{
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < out; o++) {
            double s = b ? b[o] : 0.0;
            for (int k = 0; k < in; k++)
                s += x[r * in + k] * w[o * in + k];
            y[r * out + o] = s;
        }
}

#endif
