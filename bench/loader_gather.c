/* Where a batch's time goes when the training thread builds it (num_workers
 * = 0): the loader's ddp_loader_next between "training steps" that evict the
 * caches, as ddp-mnist's forward/backward/SGD do (their working set is
 * ~3.5 MB: Linear(784,256)'s weights and gradients, activations).
 *
 * Usage: loader_gather [DIR] [STEPS] [EVICT_KB]
 *
 * Prints, per variant, the mean and median time per batch of
 *   next      ddp_loader_next (the library as built), batch 64, random order
 *   rows      the same samples gathered here, row by row as the library did
 *             before it prefetched (p / 255 per pixel, labels as int64)
 *   rows-pf   the same with software prefetch of the rows D samples ahead
 *   touch     only reading each sample's 784 bytes (the memory cost alone)
 * alternating the variants step by step so that noise from other processes
 * hits all of them alike. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"

#define NV 13
static const char *const names[NV] = {"next", "rows", "rows-pf", "touch", "lut", "lut-pf", "dbl16", "stage", "pfall", "pf8", "pf16", "pf32", "pfnext"};
static uint8_t stage[64 * 784];
static float lut[256];

static void lut_row(const uint8_t *restrict p, float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lut[p[i]];
}

static void dbl_row(const uint8_t *restrict p, float *restrict x, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++)
            x[i + j] = (float)((double)p[i + j] * (1.0 / 255.0));
    for (; i < n; i++)
        x[i] = (float)((double)p[i] * (1.0 / 255.0));
}

static void convert_row(const uint8_t *p, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)p[i] / 255.0f;
}

static void convert16(const uint8_t *restrict p, float *restrict x, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++)
            x[i + j] = (float)p[i + j] / 255.0f;
    for (; i < n; i++)
        x[i] = (float)p[i] / 255.0f;
}

static void prefetch_row(const uint8_t *p, size_t n)
{
    for (size_t o = 0; o < n; o += 64)
        __builtin_prefetch(p + o, 0, 3);
    __builtin_prefetch(p + n - 1, 0, 3);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    size_t steps = argc > 2 ? (size_t)atol(argv[2]) : 900;
    size_t evict = (argc > 3 ? (size_t)atol(argv[3]) : 4096) << 10;
    const size_t B = 64, D = 6;
    ddp_dataset *ds;
    if (ddp_mnist_create(dir, NULL, &ds) < 0) {
        fprintf(stderr, "loader_gather: %s\n", ddp_last_error());
        return 1;
    }
    const ddp_idx *im, *lb;
    ddp_mnist_raw(ds, &im, &lb);
    size_t numel = im->item_bytes, n = im->count;
    ddp_loader_opts o = ddp_loader_defaults();
    o.batch_size = B;
    o.shuffle = 1;
    ddp_loader *dl;
    ddp_sampler *sm;
    if (ddp_loader_create(ds, &o, &dl) < 0 || ddp_loader_epoch_begin(dl, 0) < 0 ||
        ddp_sampler_random_create(n, 1, &sm) < 0) {
        fprintf(stderr, "loader_gather: %s\n", ddp_last_error());
        return 1;
    }
    size_t *order = malloc(n * sizeof *order);
    float *x = malloc(B * numel * sizeof *x), *scratch = malloc(evict);
    int64_t *y = malloc(B * sizeof *y);
    double *t[NV];
    for (int v = 0; v < NV; v++)
        t[v] = calloc(steps, sizeof(double));
    ddp_sampler_fill(sm, order);
    for (int p = 0; p < 256; p++)
        lut[p] = (float)p / 255.0f;
    memset(scratch, 0, evict);
    volatile float sink = 0;
    size_t pos = 0, pos12 = 0;
    for (size_t s = 0; s < steps; s++) {
        for (int v = 0; v < NV; v++) {
            /* A "training step": read and write EVICT_KB. */
            for (size_t i = 0; i < evict / sizeof(float); i += 16)
                scratch[i] += 1.0f;
            if (pos + B > n)
                pos = 0;
            const size_t *idx = order + pos;
            pos += B;
            double t0 = ddp_time_now();
            if (v == 0) {
                ddp_batch b;
                if (ddp_loader_next(dl, &b) != 1)
                    ddp_loader_epoch_begin(dl, s), ddp_loader_next(dl, &b);
                sink += b.x[0];
            } else if (v == 1 || v == 2) {
                for (size_t i = 0; i < B; i++) {
                    if (v == 2 && i + D < B) {
                        prefetch_row(im->data + idx[i + D] * numel, numel);
                        __builtin_prefetch(lb->data + idx[i + D], 0, 3);
                    }
                    if (v == 2 && i == 0)
                        for (size_t j = 1; j < D && j < B; j++)
                            prefetch_row(im->data + idx[j] * numel, numel);
                    convert_row(im->data + idx[i] * numel, x + i * numel, numel);
                    y[i] = lb->data[idx[i]];
                }
                sink += x[0];
            } else if (v == 12) {
                idx = order + pos12;
                for (size_t i = 0; i < B; i++) {
                    convert16(im->data + idx[i] * numel, x + i * numel, numel);
                    y[i] = lb->data[idx[i]];
                }
                pos12 = pos12 + 2 * B > n ? 0 : pos12 + B;
                for (size_t i = 0; i < B; i++) {
                    prefetch_row(im->data + order[pos12 + i] * numel, numel);
                    __builtin_prefetch(lb->data + order[pos12 + i], 0, 3);
                }
                sink += x[0];
            } else if (v >= 9) {
                size_t W = v == 9 ? 8 : v == 10 ? 16 : 32;
                for (size_t i = 0; i < W && i < B; i++) {
                    prefetch_row(im->data + idx[i] * numel, numel);
                    __builtin_prefetch(lb->data + idx[i], 0, 3);
                }
                for (size_t i = 0; i < B; i++) {
                    if (i + W < B) {
                        prefetch_row(im->data + idx[i + W] * numel, numel);
                        __builtin_prefetch(lb->data + idx[i + W], 0, 3);
                    }
                    convert16(im->data + idx[i] * numel, x + i * numel, numel);
                    y[i] = lb->data[idx[i]];
                }
                sink += x[0];
            } else if (v == 7) {
                for (size_t i = 0; i < B; i++) {
                    memcpy(stage + i * numel, im->data + idx[i] * numel, numel);
                    y[i] = lb->data[idx[i]];
                }
                convert16(stage, x, B * numel);
                sink += x[0];
            } else if (v == 8) {
                for (size_t i = 0; i < B; i++) {
                    prefetch_row(im->data + idx[i] * numel, numel);
                    __builtin_prefetch(lb->data + idx[i], 0, 3);
                }
                for (size_t i = 0; i < B; i++) {
                    convert16(im->data + idx[i] * numel, x + i * numel, numel);
                    y[i] = lb->data[idx[i]];
                }
                sink += x[0];
            } else if (v >= 4) {
                for (size_t i = 0; i < B; i++) {
                    if (v == 5 && i + D < B) {
                        prefetch_row(im->data + idx[i + D] * numel, numel);
                        __builtin_prefetch(lb->data + idx[i + D], 0, 3);
                    }
                    if (v == 5 && i == 0)
                        for (size_t j = 1; j < D && j < B; j++)
                            prefetch_row(im->data + idx[j] * numel, numel);
                    if (v == 6)
                        dbl_row(im->data + idx[i] * numel, x + i * numel, numel);
                    else
                        lut_row(im->data + idx[i] * numel, x + i * numel, numel);
                    y[i] = lb->data[idx[i]];
                }
                sink += x[0];
            } else {
                unsigned acc = 0;
                for (size_t i = 0; i < B; i++)
                    for (size_t o2 = 0; o2 < numel; o2 += 64)
                        acc += im->data[idx[i] * numel + o2];
                sink += (float)acc;
            }
            t[v][s] = ddp_time_now() - t0;
        }
    }
    (void)sink;
    for (int v = 0; v < NV; v++) {
        double sum = 0;
        for (size_t s = 0; s < steps; s++)
            sum += t[v][s];
        qsort(t[v], steps, sizeof(double), cmp_double);
        printf("%-8s batch %zu, evict %zu KB: mean %.1f us, median %.1f us\n", names[v], B,
               evict >> 10, sum / (double)steps * 1e6, t[v][steps / 2] * 1e6);
        free(t[v]);
    }
    free(order);
    free(x);
    free(y);
    free(scratch);
    ddp_sampler_destroy(sm);
    ddp_loader_destroy(dl);
    ddp_dataset_destroy(ds);
    return 0;
}
