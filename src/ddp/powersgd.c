/* PowerSGD (include/ddp/powersgd.h): PyTorch 1.13's powerSGD_hook, step
 * for step.  launch adds the error, computes every P = M Q and starts one
 * all-reduce of the uncompressed tensors and the Ps together, so that it
 * runs while backward goes on (PyTorch sends them as two messages);
 * finish (on the caller's thread, once that is done) orthogonalises the Ps,
 * computes and all-reduces the Qs (blocking: it needs the summed P), and
 * writes M = P Q^T / world_size back into the bucket.  M is kept in the
 * error buffer rather than in a copy of the bucket (the new error is then
 * M - P Q^T in place); the passes over M are powersgd_kernels.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "base/timeline.h"
#include "ddp/powersgd.h"
#include "ddp/powersgd_impl.h"

typedef struct bucket {
    size_t n;            /* floats; 0 until first seen */
    float *error;        /* error feedback (n); during an iteration M = grad + error */
    float *u;            /* the uncompressed tensors packed (nu), then the Ps (np): one message */
    float *p;            /* = u + nu */
    float *q, *qt;       /* Qs (cols x r each, the state) and the same transposed (r x cols) */
    size_t np, nq, nu;
    int have_q;          /* Q holds last iteration's values (warm start) */
    uint64_t sig;        /* digest of the layout the state belongs to */
    char name[2][32];
} bucket;

struct ddp_powersgd {
    ddp_powersgd_options o;
    ddp_powersgd_layout_fn layout;
    void *user;
    void (*free_user)(void *); /* owned user (powersgd_ddp.c), or NULL */
    int64_t iter;
    ddp__rng rng;
    bucket *b;
    int nb;
    int nbuckets;        /* the layout's bucket count, last seen */
    double before, after;
};

ddp_powersgd_options ddp_powersgd_defaults(void)
{
    return (ddp_powersgd_options){.matrix_approximation_rank = 1,
                                  .start_powersgd_iter = 1000,
                                  .min_compression_rate = 2,
                                  .use_error_feedback = 1,
                                  .warm_start = 1};
}

int ddp_powersgd_create(const ddp_powersgd_options *o, ddp_powersgd_layout_fn layout,
                        void *user, ddp_powersgd_t **out)
{
    DDP_FAIL_IF(!o || !layout || !out, DDP_ERR_INVALID_ARG, "powersgd: NULL argument");
    DDP_FAIL_IF(o->matrix_approximation_rank < 1, DDP_ERR_INVALID_ARG,
                "powersgd: matrix_approximation_rank %d must be >= 1",
                o->matrix_approximation_rank);
    /* PyTorch's rule: the buckets are rebuilt after the first iteration,
     * and error feedback or a warm Q kept across that would land on other
     * tensors. */
    DDP_FAIL_IF(o->start_powersgd_iter <= 1 && (o->use_error_feedback || o->warm_start),
                DDP_ERR_INVALID_ARG,
                "powersgd: start_powersgd_iter %lld must be > 1 with use_error_feedback or "
                "warm_start (the buckets are rebuilt after the first iteration)",
                (long long)o->start_powersgd_iter);
    DDP_FAIL_IF(o->start_powersgd_iter < 0, DDP_ERR_INVALID_ARG,
                "powersgd: start_powersgd_iter must be >= 0");
    DDP_FAIL_IF(!(o->min_compression_rate >= 0) || !(o->orthogonalization_epsilon >= 0),
                DDP_ERR_INVALID_ARG,
                "powersgd: min_compression_rate and orthogonalization_epsilon must be >= 0");
    ddp_powersgd_t *s = calloc(1, sizeof *s);
    DDP_FAIL_IF(!s, DDP_ERR_NOMEM, "powersgd: out of memory");
    s->o = *o;
    s->layout = layout;
    s->user = user;
    ddp__rng_seed(&s->rng, o->random_seed);
    *out = s;
    return 0;
}

static void bucket_free(bucket *b)
{
    free(b->error);
    free(b->u);
    free(b->q);
    free(b->qt);
    memset(b, 0, sizeof *b);
}

void ddp_powersgd_destroy(ddp_powersgd_t *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->nb; i++)
        bucket_free(&s->b[i]);
    free(s->b);
    if (s->free_user)
        s->free_user(s->user);
    free(s);
}

void ddp__powersgd_own_user(ddp_powersgd_t *s, void (*free_fn)(void *)) { s->free_user = free_fn; }

int64_t ddp_powersgd_iter(const ddp_powersgd_t *s) { return s ? s->iter : 0; }
void ddp_powersgd_set_iter(ddp_powersgd_t *s, int64_t iter)
{
    if (s)
        s->iter = iter;
}

void ddp_powersgd_stats(const ddp_powersgd_t *s, double *before, double *after)
{
    if (before)
        *before = s ? s->before : 0;
    if (after)
        *after = s ? s->after : 0;
}

/* ---- the layout of one bucket -------------------------------------- */

static int rank_of(const ddp_powersgd_t *s, const ddp_powersgd_tensor *t)
{
    int64_t r = s->o.matrix_approximation_rank;
    r = r < t->rows ? r : t->rows;
    return (int)(r < t->cols ? r : t->cols);
}

/* PyTorch's _should_compress: (rows + cols) r * rate < rows cols. */
static int compressed(const ddp_powersgd_t *s, const ddp_powersgd_tensor *t)
{
    double full = (double)t->rows * (double)t->cols;
    return (double)(t->rows + t->cols) * rank_of(s, t) * s->o.min_compression_rate < full;
}

static int grow(float **p, size_t n)
{
    float *q = realloc(*p, (n ? n : 1) * sizeof *q);
    DDP_FAIL_IF(!q, DDP_ERR_NOMEM, "powersgd: out of memory");
    *p = q;
    return 0;
}

/* Bucket b's state, (re)made for n floats and this layout. */
static int bucket_for(ddp_powersgd_t *s, int b, size_t n, const ddp_powersgd_tensor *t, int nt,
                      bucket **out)
{
    if (b >= s->nb) {
        bucket *nbk = realloc(s->b, (size_t)(b + 1) * sizeof *nbk);
        DDP_FAIL_IF(!nbk, DDP_ERR_NOMEM, "powersgd: out of memory");
        memset(nbk + s->nb, 0, (size_t)(b + 1 - s->nb) * sizeof *nbk);
        s->b = nbk;
        s->nb = b + 1;
    }
    bucket *k = &s->b[b];
    size_t np = 0, nq = 0, nu = 0;
    for (int i = 0; i < nt; i++) {
        DDP_FAIL_IF(t[i].rows < 1 || t[i].cols < 1 ||
                        t[i].offset + (size_t)(t[i].rows * t[i].cols) > n,
                    DDP_ERR_INVALID_ARG,
                    "powersgd: bucket %d: tensor %d (%lld x %lld at %zu) is outside its %zu "
                    "floats",
                    b, i, (long long)t[i].rows, (long long)t[i].cols, t[i].offset, n);
        if (compressed(s, &t[i])) {
            np += (size_t)t[i].rows * (size_t)rank_of(s, &t[i]);
            nq += (size_t)t[i].cols * (size_t)rank_of(s, &t[i]);
        } else {
            nu += (size_t)(t[i].rows * t[i].cols);
        }
    }
    uint64_t sig = 1469598103934665603ULL; /* FNV-1a over the tensors' places */
    for (int i = 0; i < nt; i++) {
        uint64_t v[3] = {t[i].offset, (uint64_t)t[i].rows, (uint64_t)t[i].cols};
        for (int w = 0; w < 3; w++)
            sig = (sig ^ v[w]) * 1099511628211ULL;
    }
    if (k->n != n || k->np != np || k->nq != nq || k->nu != nu || k->sig != sig) { /* new, or moved */
        bucket_free(k);
        DDP_TRY(grow(&k->error, n));
        DDP_TRY(grow(&k->u, nu + np));
        DDP_TRY(grow(&k->q, nq));
        DDP_TRY(grow(&k->qt, nq));
        memset(k->error, 0, n * sizeof *k->error);
        k->n = n;
        k->np = np;
        k->nq = nq;
        k->sig = sig;
        snprintf(k->name[0], sizeof k->name[0], "powersgd.error.%d", b);
        snprintf(k->name[1], sizeof k->name[1], "powersgd.q.%d", b);
    }
    k->nu = nu;
    k->p = k->u + nu;
    *out = k;
    return 0;
}

/* ---- the numerics ----------------------------------------------------- */

/* PyTorch's _orthogonalize_gram_schmidt on a (rows x r) row-major matrix:
 * each column normalised (a zero column stays zero), then removed from the
 * columns after it. */
static void orthogonalize(float *m, int64_t rows, int r, double eps)
{
    for (int i = 0; i < r; i++) {
        double norm = 0;
        for (int64_t k = 0; k < rows; k++)
            norm += (double)m[k * r + i] * m[k * r + i];
        float d = (float)sqrt(norm) + (float)eps;
        float inv = d > 0 ? 1.0f / d : 0.0f;
        for (int64_t k = 0; k < rows; k++)
            m[k * r + i] *= inv;
        for (int j = i + 1; j < r; j++) {
            double dot = 0;
            for (int64_t k = 0; k < rows; k++)
                dot += (double)m[k * r + i] * m[k * r + j];
            for (int64_t k = 0; k < rows; k++)
                m[k * r + j] -= (float)dot * m[k * r + i];
        }
    }
}

/* A standard normal (Box-Muller) from libddp's generator. */
static float normal(ddp__rng *g)
{
    double u1 = ddp__rng_uniform(g), u2 = ddp__rng_uniform(g);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* (rows x r) row-major m into (r x rows) t, or back (to_t 0). */
static void transpose(float *m, float *t, int64_t rows, int r, int to_t)
{
    for (int64_t k = 0; k < rows; k++)
        for (int j = 0; j < r; j++) {
            if (to_t)
                t[j * rows + k] = m[k * r + j];
            else
                m[k * r + j] = t[j * rows + k];
        }
}

/* Every compressed tensor: Q ready (random or warm, orthogonalised),
 * M = grad (+ error) into the error buffer, P = M Q; the uncompressed
 * tensors' M packed into u. */
static void compute_ps(ddp_powersgd_t *s, bucket *k, const float *data,
                       const ddp_powersgd_tensor *t, int nt)
{
    int randomize = !s->o.warm_start || !k->have_q, add = s->o.use_error_feedback;
    size_t pi = 0, qi = 0, ui = 0;
    for (int i = 0; i < nt; i++) {
        float *e = k->error + t[i].offset;
        const float *g = data + t[i].offset;
        if (!compressed(s, &t[i])) {
            size_t n = (size_t)(t[i].rows * t[i].cols);
            for (size_t x = 0; x < n; x++)
                e[x] = add ? e[x] + g[x] : g[x];
            memcpy(k->u + ui, e, n * sizeof *e);
            ui += n;
            continue;
        }
        int r = rank_of(s, &t[i]);
        float *q = k->q + qi;
        if (randomize)
            for (size_t x = 0; x < (size_t)t[i].cols * (size_t)r; x++)
                q[x] = normal(&s->rng);
        orthogonalize(q, t[i].cols, r, s->o.orthogonalization_epsilon);
        transpose(q, k->qt + qi, t[i].cols, r, 1);
        ddp__psgd_add_project(e, g, k->qt + qi, k->p + pi, t[i].rows, t[i].cols, r, add);
        pi += (size_t)t[i].rows * (size_t)r;
        qi += (size_t)t[i].cols * (size_t)r;
    }
    k->have_q = 1;
}

/* The uncompressed tensors' sums out of u: averaged into the bucket, and
 * their error (what this rank's M was above the average). */
static void unpack_uncompressed(const ddp_powersgd_t *s, bucket *k, float *data,
                                const ddp_powersgd_tensor *t, int nt, float scale)
{
    size_t ui = 0;
    for (int i = 0; i < nt; i++) {
        if (compressed(s, &t[i]))
            continue;
        size_t n = (size_t)(t[i].rows * t[i].cols);
        float *d = data + t[i].offset, *e = k->error + t[i].offset;
        for (size_t x = 0; x < n; x++) {
            d[x] = k->u[ui + x] * scale;
            e[x] -= d[x];
        }
        ui += n;
    }
}

/* ---- the hook ------------------------------------------------------- */

static int launch(void *state, ddp_pg_t *pg, int b, float *data, size_t n, ddp_work_t **work)
{
    ddp_powersgd_t *s = state;
    *work = NULL;
    if (s->iter < s->o.start_powersgd_iter) /* vanilla all-reduce first */
        return ddp_pg_all_reduce_async(pg, data, n, DDP_FLOAT32, DDP_AVG, work);
    const ddp_powersgd_tensor *t;
    int nt, nbuckets;
    bucket *k = NULL;
    DDP_TRY(s->layout(s->user, b, &t, &nt, &nbuckets));
    s->nbuckets = nbuckets;
    DDP_TRY(bucket_for(s, b, n, t, nt, &k));
    for (int i = 0; i < nt; i++) {
        double full = (double)(t[i].rows * t[i].cols);
        s->before += full;
        s->after += compressed(s, &t[i]) ? (double)(t[i].rows + t[i].cols) * rank_of(s, &t[i])
                                         : full;
    }
    uint64_t t0 = ddp__tl_begin();
    compute_ps(s, k, data, t, nt);
    ddp__tl_end(t0, "powersgd P = M Q", "bucket", b);
    if (k->nu + k->np == 0)
        return 0;
    return ddp_pg_all_reduce_async(pg, k->u, k->nu + k->np, DDP_FLOAT32, DDP_SUM, work);
}

static int finish(void *state, ddp_pg_t *pg, int b, float *data, size_t n)
{
    ddp_powersgd_t *s = state;
    const ddp_powersgd_tensor *t;
    int nt, nbuckets;
    DDP_TRY(s->layout(s->user, b, &t, &nt, &nbuckets));
    if (s->iter < s->o.start_powersgd_iter) {
        if (b == nbuckets - 1)
            s->iter++;
        return 0;
    }
    bucket *k = &s->b[b];
    const float ws = (float)ddp_pg_size(pg);
    unpack_uncompressed(s, k, data, t, nt, 1.0f / ws);
    size_t pi = 0, qi = 0;
    uint64_t t0 = ddp__tl_begin();
    for (int i = 0; i < nt; i++) { /* orthogonalise P, Q = M^T P */
        if (!compressed(s, &t[i]))
            continue;
        int r = rank_of(s, &t[i]);
        orthogonalize(k->p + pi, t[i].rows, r, s->o.orthogonalization_epsilon);
        ddp__psgd_accumulate_q(k->qt + qi, k->error + t[i].offset, k->p + pi, t[i].rows,
                               t[i].cols, r);
        transpose(k->q + qi, k->qt + qi, t[i].cols, r, 0);
        pi += (size_t)t[i].rows * (size_t)r;
        qi += (size_t)t[i].cols * (size_t)r;
    }
    ddp__tl_end(t0, "powersgd Q = M^T P", "bucket", b);
    if (k->nq) {
        t0 = ddp__tl_begin();
        int rc = ddp_pg_all_reduce(pg, k->q, k->nq, DDP_FLOAT32, DDP_SUM);
        ddp__tl_end(t0, "powersgd Q all-reduce", "bucket", b);
        if (rc != 0) { /* the error buffer holds M now, not the error: start afresh
                        * (every size back to 0, so a save after it stays loadable) */
            bucket_free(k);
            return rc;
        }
    }
    for (size_t e = 0; e < k->nq; e++)
        k->q[e] /= ws;
    pi = qi = 0;
    t0 = ddp__tl_begin();
    for (int i = 0; i < nt; i++) { /* M = P Q^T; the error what it left out */
        if (!compressed(s, &t[i]))
            continue;
        int r = rank_of(s, &t[i]);
        transpose(k->q + qi, k->qt + qi, t[i].cols, r, 1);
        ddp__psgd_reconstruct(data + t[i].offset, k->error + t[i].offset, k->p + pi, k->qt + qi,
                              t[i].rows, t[i].cols, r, s->o.use_error_feedback);
        pi += (size_t)t[i].rows * (size_t)r;
        qi += (size_t)t[i].cols * (size_t)r;
    }
    ddp__tl_end(t0, "powersgd M = P Q^T", "bucket", b);
    if (!s->o.use_error_feedback) /* the buffer held M for this iteration only */
        memset(k->error, 0, n * sizeof *k->error);
    if (!s->o.warm_start)
        k->have_q = 0;
    if (b == nbuckets - 1)
        s->iter++;
    return 0;
}

ddp_comm_hook ddp_powersgd_hook(ddp_powersgd_t *s)
{
    return (ddp_comm_hook){.launch = launch, .finish = finish, .state = s};
}

/* The buckets of the current layout only (a rebuild may leave fewer). */
static int live_buckets(const ddp_powersgd_t *s) { return s->nb < s->nbuckets ? s->nb : s->nbuckets; }

int ddp_powersgd_num_states(const ddp_powersgd_t *s) { return s ? 2 * live_buckets(s) : 0; }

int ddp_powersgd_state(ddp_powersgd_t *s, int i, const char **name, float **data, size_t *count)
{
    DDP_FAIL_IF(!s || i < 0 || i >= 2 * live_buckets(s), DDP_ERR_NOT_FOUND,
                "powersgd: no state buffer %d", i);
    bucket *k = &s->b[i / 2];
    *name = k->name[i % 2];
    *data = i % 2 ? k->q : k->error;
    *count = i % 2 ? k->nq : k->n;
    return 0;
}

/* ---- the whole state as bytes (a rank's part of a checkpoint) --------- */

/* "PSGD", version 1, then (native byte order: a rank reads back what it
 * wrote) iter, the generator's 4 words, the bucket count, and per bucket
 * its sizes (n, np, nq, nu), layout digest, warm-start flag, error (n
 * floats) and Q (nq floats). */
#define BLOB_MAGIC 0x44475350u
#define BLOB_HEAD (4 + 4 + 8 + 32 + 4)
#define BUCKET_HEAD (5 * 8 + 4)

static uint8_t *put(uint8_t *p, const void *v, size_t n)
{
    memcpy(p, v, n);
    return p + n;
}

int ddp_powersgd_state_save(const ddp_powersgd_t *s, void **blob, size_t *len)
{
    DDP_FAIL_IF(!s || !blob || !len, DDP_ERR_INVALID_ARG, "powersgd: no state to save");
    *blob = NULL;
    *len = 0;
    int nb = live_buckets(s);
    size_t total = BLOB_HEAD;
    for (int b = 0; b < nb; b++)
        total += BUCKET_HEAD + (s->b[b].n + s->b[b].nq) * sizeof(float);
    uint8_t *out = malloc(total), *p = out;
    DDP_FAIL_IF(!out, DDP_ERR_NOMEM, "powersgd: out of memory");
    uint32_t head[2] = {BLOB_MAGIC, 1};
    int32_t nb32 = nb;
    p = put(p, head, sizeof head);
    p = put(p, &s->iter, 8);
    p = put(p, s->rng.s, 32);
    p = put(p, &nb32, 4);
    for (int b = 0; b < nb; b++) {
        const bucket *k = &s->b[b];
        uint64_t v[5] = {k->n, k->np, k->nq, k->nu, k->sig};
        int32_t have_q = k->have_q;
        p = put(p, v, sizeof v);
        p = put(p, &have_q, 4);
        p = put(p, k->error, k->n * sizeof(float));
        p = put(p, k->q, k->nq * sizeof(float));
    }
    *blob = out;
    *len = total;
    return 0;
}

/* The blob's bucket b at *p (len bytes left): checked, then made. */
static int load_bucket(ddp_powersgd_t *s, int b, const uint8_t **p, size_t *left)
{
    uint64_t v[5];
    int32_t have_q;
    DDP_FAIL_IF(*left < BUCKET_HEAD, DDP_ERR_FORMAT, "powersgd state: bucket %d cut short", b);
    memcpy(v, *p, sizeof v);
    memcpy(&have_q, *p + sizeof v, 4);
    *p += BUCKET_HEAD;
    *left -= BUCKET_HEAD;
    DDP_FAIL_IF(v[0] > (1ull << 40) || v[1] > v[0] || v[2] > (1ull << 40) || v[3] > v[0] ||
                    (v[0] + v[2]) * sizeof(float) > *left,
                DDP_ERR_FORMAT, "powersgd state: bucket %d's sizes (%llu, %llu, %llu, %llu) do "
                                "not fit the %zu bytes left",
                b, (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2],
                (unsigned long long)v[3], *left);
    bucket *k = &s->b[b];
    DDP_TRY(grow(&k->error, v[0]));
    DDP_TRY(grow(&k->u, v[3] + v[1]));
    DDP_TRY(grow(&k->q, v[2]));
    DDP_TRY(grow(&k->qt, v[2]));
    k->n = v[0];
    k->np = v[1];
    k->nq = v[2];
    k->nu = v[3];
    k->sig = v[4];
    k->have_q = have_q != 0;
    k->p = k->u + k->nu;
    memcpy(k->error, *p, k->n * sizeof(float));
    memcpy(k->q, *p + k->n * sizeof(float), k->nq * sizeof(float));
    *p += (k->n + k->nq) * sizeof(float);
    *left -= (k->n + k->nq) * sizeof(float);
    snprintf(k->name[0], sizeof k->name[0], "powersgd.error.%d", b);
    snprintf(k->name[1], sizeof k->name[1], "powersgd.q.%d", b);
    return 0;
}

int ddp_powersgd_state_load(ddp_powersgd_t *s, const void *blob, size_t len)
{
    const uint8_t *p = blob;
    uint32_t head[2] = {0, 0};
    int64_t iter;
    uint64_t rng[4];
    int32_t nb = -1;
    DDP_FAIL_IF(!s || !blob, DDP_ERR_INVALID_ARG, "powersgd: no state to load into");
    if (len >= BLOB_HEAD) {
        memcpy(head, p, 8);
        memcpy(&iter, p + 8, 8);
        memcpy(rng, p + 16, 32);
        memcpy(&nb, p + 48, 4);
    }
    DDP_FAIL_IF(len < BLOB_HEAD || head[0] != BLOB_MAGIC || head[1] != 1 || nb < 0 ||
                    nb > 1 << 20 || iter < 0,
                DDP_ERR_FORMAT, "powersgd state: not a PowerSGD state (%zu bytes)", len);
    /* an all-zero xoshiro state only ever draws zeros: Q's fresh starts
     * would all be zero */
    DDP_FAIL_IF(!(rng[0] | rng[1] | rng[2] | rng[3]), DDP_ERR_FORMAT,
                "powersgd state: its generator state is all zeros");
    bucket *nbk = calloc((size_t)nb + 1, sizeof *nbk); /* built aside: a failure changes nothing */
    DDP_FAIL_IF(!nbk, DDP_ERR_NOMEM, "powersgd: out of memory");
    ddp_powersgd_t tmp = *s;
    tmp.b = nbk;
    tmp.nb = nb;
    const uint8_t *q = p + BLOB_HEAD;
    size_t left = len - BLOB_HEAD;
    int rc = 0;
    for (int b = 0; rc == 0 && b < nb; b++)
        rc = load_bucket(&tmp, b, &q, &left);
    if (rc == 0 && left != 0)
        rc = DDP_ERROR(DDP_ERR_FORMAT, "powersgd state: %zu bytes after the last bucket", left);
    if (rc < 0) {
        for (int b = 0; b < nb; b++)
            bucket_free(&nbk[b]);
        free(nbk);
        return rc;
    }
    for (int b = 0; b < s->nb; b++)
        bucket_free(&s->b[b]);
    free(s->b);
    s->b = nbk;
    s->nb = nb;
    s->nbuckets = nb;
    s->iter = iter;
    memcpy(s->rng.s, rng, sizeof rng);
    return 0;
}
