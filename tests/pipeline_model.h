/* The model and data of the pipeline tests (test_pipeline.c,
 * test_pipeline_ckpt.c): Sequential(Linear(20,16), ReLU, Linear(16,14),
 * ReLU, Linear(14,12), ReLU, Linear(12,5)), module i a Linear for even i
 * and a ReLU for odd, seeded so that every rank builds the same values;
 * deterministic batches.  Header-only (static). */
#ifndef DDP_TESTS_PIPELINE_MODEL_H
#define DDP_TESTS_PIPELINE_MODEL_H

#include <math.h>

#include "ddp.h"
#include "ddp/pipeline.h"

#define NMOD 7
static const int dims[] = {20, 16, 14, 12, 5};
#define IN 20
#define CLASSES 5
#define GLOBAL_B 24

static const int cuts2[] = {0, 4, 7}, cuts4[] = {0, 2, 4, 6, 7};

/* The full list's modules (seeded), into mods[NMOD]. */
static int make_modules(ddp_module_t **mods)
{
    for (int i = 0; i < NMOD; i++) {
        int rc = i % 2 ? ddp_relu_create(&mods[i])
                       : ddp_linear_create(dims[i / 2], dims[i / 2 + 1], 1, 100 + (uint64_t)i,
                                           &mods[i]);
        if (rc < 0) {
            while (i-- > 0)
                ddp_module_destroy(mods[i]);
            return rc;
        }
    }
    return 0;
}

/* The unsplit model: one Sequential ("0.weight", ...). */
__attribute__((unused)) static int build_full(ddp_model_t **out)
{
    ddp_module_t *mods[NMOD], *seq;
    DDP_TRY(make_modules(mods));
    DDP_TRY(ddp_sequential_create(mods, NMOD, &seq));
    return ddp_model_from_module(seq, out);
}

/* Stage s's part of the full list, cut at cuts (ddp_pipeline_split). */
__attribute__((unused)) static int build_stage(const int *cuts, int S, int s, ddp_model_t **out)
{
    ddp_module_t *mods[NMOD];
    DDP_TRY(make_modules(mods));
    return ddp_pipeline_split(mods, NMOD, cuts, S, s, out);
}

/* Step t's global batch: x in (-1, 1), labels from a hash of (t, row). */
__attribute__((unused)) static void make_batch(int t, float *x, int64_t *labels)
{
    for (int i = 0; i < GLOBAL_B; i++) {
        for (int j = 0; j < IN; j++)
            x[i * IN + j] = sinf(0.37f * (float)(i + 31 * t) + 0.11f * (float)j + 0.05f * (float)t);
        labels[i] = (i * 7 + t * 3) % CLASSES;
    }
}

__attribute__((unused)) static ddp_sgd_options sgd(void)
{
    ddp_sgd_options o = ddp_sgd_defaults(0.1);
    o.momentum = 0.9;
    return o;
}

/* The unsplit model's parameter count. */
__attribute__((unused)) static size_t full_numel(void)
{
    size_t n = 0;
    for (int i = 0; i + 1 < 5; i++)
        n += (size_t)dims[i] * (size_t)dims[i + 1] + (size_t)dims[i + 1];
    return n;
}

/* The largest |a - b| / max(1, |b|). */
__attribute__((unused)) static double max_rel_diff(const float *a, const float *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / fmax(1.0, fabs((double)b[i]));
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* Where stage model m's block starts in the full model's block. */
__attribute__((unused)) static size_t full_offset(ddp_model_t *m)
{
    ddp_model_t *full;
    if (build_full(&full) < 0)
        return 0;
    size_t off = ddp_model_find_param(full, ddp_model_param(m, 0)->name)->offset;
    ddp_model_destroy(full);
    return off;
}

#endif
