/* Where a batch's time goes when the training thread builds it (num_workers
 * = 0): ddp_loader_next between "training steps" that evict the caches, as
 * ddp-mnist's forward/backward/SGD do (their working set is ~3.5 MB:
 * Linear(784,256)'s weights and gradients, activations), against ways of
 * gathering the same kind of batch here (64 random samples of Fashion-MNIST,
 * p / 255 per pixel, labels as int64).
 *
 * Usage: loader_gather [DIR] [STEPS] [EVICT_KB]
 *
 * Variants, one batch each per step, in turn, so that noise from other
 * processes hits all alike (mean and median time per batch):
 *   next     ddp_loader_next: the library as built
 *   rows     row by row, convert then the next row (the library before it
 *            prefetched)
 *   touch    only reading every cache line of the 64 rows (memory alone)
 *   touch-4k the same from a copy of the images in 4 KiB pages (the
 *            library's array is in 2 MiB pages where the kernel allows it:
 *            transparent huge pages, madvise mode)
 *   stage    copying the rows into a 50 KB buffer, then converting it
 *   pf8      rows, with each row's lines prefetched 8 rows ahead
 *   pf32     the same, 32 rows ahead
 *   pfall    all 64 rows prefetched, then converted (what the library does)
 *   pfnext   rows, then the next batch's rows prefetched for the next call
 * after the mean time of ddp_loader_epoch_begin (the sampler's permutation,
 * once per epoch). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ddp.h"
#include "ddp/ext.h"

enum { NEXT, ROWS, TOUCH, TOUCH4K, STAGE, PF8, PF32, PFALL, PFNEXT, NV };
static const char *const names[NV] = {"next", "rows", "touch", "touch-4k", "stage",
                                      "pf8", "pf32", "pfall", "pfnext"};

#define B 64

typedef struct gather {
    const uint8_t *px, *lb;
    const uint8_t *px4k; /* a copy of px in 4 KiB pages */
    size_t numel;
    float *x;
    int64_t *y;
    uint8_t *stage;
    size_t next_at; /* pfnext: where its next batch starts, from this one's */
} gather;

/* mnist.c's conversion: blocks of 16 so that it vectorises at -O2. */
static void convert(const uint8_t *restrict p, float *restrict x, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++)
            x[i + j] = (float)p[i + j] / 255.0f;
    for (; i < n; i++)
        x[i] = (float)p[i] / 255.0f;
}

static void prefetch(const gather *g, size_t k)
{
    uintptr_t p = (uintptr_t)(g->px + k * g->numel);
    for (uintptr_t line = p & ~(uintptr_t)63; line < p + g->numel; line += 64)
        __builtin_prefetch((const void *)line, 0, 3);
    __builtin_prefetch(g->lb + k, 0, 3);
}

static void one(const gather *g, const size_t *idx, size_t i)
{
    convert(g->px + idx[i] * g->numel, g->x + i * g->numel, g->numel);
    g->y[i] = g->lb[idx[i]];
}

static unsigned run(int v, const gather *g, const size_t *idx)
{
    unsigned acc = 0;
    size_t ahead = v == PF8 ? 8 : v == PF32 ? 32 : B;
    switch (v) {
    case ROWS:
    case PFNEXT:
        for (size_t i = 0; i < B; i++)
            one(g, idx, i);
        if (v == PFNEXT) /* where its next call will read (see main) */
            for (size_t i = 0; i < B; i++)
                prefetch(g, idx[g->next_at + i]);
        break;
    case TOUCH:
    case TOUCH4K:
        for (size_t i = 0; i < B; i++)
            for (size_t o = 0; o < g->numel; o += 64)
                acc += (v == TOUCH ? g->px : g->px4k)[idx[i] * g->numel + o];
        break;
    case STAGE:
        for (size_t i = 0; i < B; i++) {
            memcpy(g->stage + i * g->numel, g->px + idx[i] * g->numel, g->numel);
            g->y[i] = g->lb[idx[i]];
        }
        convert(g->stage, g->x, B * g->numel);
        break;
    default: /* PF8, PF32, PFALL */
        for (size_t i = 0; i < ahead; i++)
            prefetch(g, idx[i]);
        for (size_t i = 0; i < B; i++) {
            if (i + ahead < B)
                prefetch(g, idx[i + ahead]);
            one(g, idx, i);
        }
    }
    return acc + (unsigned)g->x[0];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, double *t, size_t n, size_t evict)
{
    double sum = 0;
    for (size_t s = 0; s < n; s++)
        sum += t[s];
    qsort(t, n, sizeof *t, cmp_double);
    printf("%-8s batch %d, evict %zu KB: mean %.1f us, median %.1f us\n", name, B,
           evict >> 10, sum / (double)n * 1e6, t[n / 2] * 1e6);
}

static int fail(void)
{
    fprintf(stderr, "loader_gather: %s\n", ddp_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    size_t steps = argc > 2 ? (size_t)atol(argv[2]) : 900;
    size_t evict = (argc > 3 ? (size_t)atol(argv[3]) : 4096) << 10;
    ddp_dataset_t *ds;
    if (ddp_mnist_create(dir, NULL, &ds) < 0)
        return fail();
    const ddp_idx *im, *lb;
    ddp_mnist_raw(ds, &im, &lb);
    size_t n = im->count;
    ddp_loader_options o = ddp_loader_defaults();
    o.batch_size = B;
    o.shuffle = 1;
    ddp_loader_t *dl;
    ddp_sampler_t *sm;
    if (ddp_loader_create(ds, &o, &dl) < 0 || ddp_sampler_random_create(n, 1, &sm) < 0)
        return fail();
    size_t *order = malloc(n * sizeof *order);
    gather g = {.px = im->data, .lb = lb->data, .numel = im->item_bytes,
                .x = malloc(B * im->item_bytes * sizeof(float)),
                .y = malloc(B * sizeof(int64_t)), .stage = malloc(B * im->item_bytes)};
    size_t bytes = n * g.numel;
    uint8_t *copy = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0);
    if (copy == MAP_FAILED) {
        perror("loader_gather: mmap");
        return 1;
    }
    madvise(copy, bytes, MADV_NOHUGEPAGE);
    memcpy(copy, g.px, bytes);
    g.px4k = copy;
    float *scratch = calloc(1, evict);
    double *t[NV];
    for (int v = 0; v < NV; v++)
        t[v] = calloc(steps, sizeof(double));
    ddp_sampler_fill(sm, order);
    double te = ddp_time_now();
    for (int e = 5; e >= 0; e--) /* epoch 0 last: the one the loop starts with */
        if (ddp_loader_epoch_begin(dl, (uint64_t)e) < 0)
            return fail();
    printf("epoch_begin (a permutation of %zu): %.2f ms\n", n, (ddp_time_now() - te) / 6 * 1e3);
    volatile unsigned sink = 0;
    /* Every variant reads other rows (rows read by one would be in the
     * cache for the next). */
    size_t pos = 0, epochs = 0;
    for (size_t s = 0; s < steps; s++) {
        for (int v = 0; v < NV; v++) {
            for (size_t i = 0; i < evict / sizeof(float); i += 16) /* a "training step" */
                scratch[i] += 1.0f;
            if (pos + (NV + 1) * B > n)
                pos = 0;
            g.next_at = NV * B;
            double t0 = ddp_time_now();
            if (v == NEXT) {
                ddp_batch b;
                int rc = ddp_loader_next(dl, &b);
                if (rc == 0 && (ddp_loader_epoch_begin(dl, ++epochs) < 0 ||
                                ddp_loader_next(dl, &b) != 1))
                    return fail();
                sink += (unsigned)b.x[0];
            } else {
                sink += run(v, &g, order + pos);
            }
            t[v][s] = ddp_time_now() - t0;
            pos += B;
        }
    }
    (void)sink;
    for (int v = 0; v < NV; v++)
        report(names[v], t[v], steps, evict);
    /* pfnext's rows survive one step, not the NV of the loop above: pfall
     * and pfnext again, each for runs of 50 batches in a row, each on its
     * half of the order. */
    size_t half = n / 2, at[2] = {0, 0}, k[2] = {0, 0};
    g.next_at = B;
    for (size_t s = 0; s < steps; s++) {
        int w = (int)(s / 50 % 2), v = w ? PFNEXT : PFALL;
        for (size_t i = 0; i < evict / sizeof(float); i += 16)
            scratch[i] += 1.0f;
        if (at[w] + 2 * B > half)
            at[w] = 0;
        double t0 = ddp_time_now();
        sink += run(v, &g, order + w * half + at[w]);
        t[v][k[w]++] = ddp_time_now() - t0;
        at[w] += B;
    }
    printf("one step between batches:\n");
    report(names[PFALL], t[PFALL], k[0], evict);
    report(names[PFNEXT], t[PFNEXT], k[1], evict);
    for (int v = 0; v < NV; v++)
        free(t[v]);
    free(order);
    free(g.x);
    free(g.y);
    free(g.stage);
    free(scratch);
    munmap(copy, bytes);
    ddp_sampler_destroy(sm);
    ddp_loader_destroy(dl);
    ddp_dataset_destroy(ds);
    return 0;
}
