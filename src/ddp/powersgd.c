/* PowerSGD (include/ddp/powersgd.h): PyTorch 1.13's powerSGD_hook, step
 * for step.  launch adds the error, computes every P = M Q and starts the
 * all-reduce of the uncompressed tensors; finish (on the caller's thread,
 * once that is done) all-reduces the Ps, orthogonalises them, computes and
 * all-reduces the Qs, and writes M = P Q^T / world_size back into the
 * bucket.  The P and Q all-reduces are blocking: they do not overlap
 * backward (PyTorch chains them as futures on its communication stream). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "ddp/powersgd.h"
#include "ddp/powersgd_impl.h"

typedef struct bucket {
    size_t n;            /* floats; 0 until first seen */
    float *error, *copy; /* error feedback (n) and the input kept for it */
    float *p, *q, *u;    /* Ps, Qs, the uncompressed tensors packed */
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
    free(b->copy);
    free(b->p);
    free(b->q);
    free(b->u);
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
    if (k->n != n || k->np != np || k->nq != nq || k->sig != sig) { /* new, or moved */
        bucket_free(k);
        DDP_TRY(grow(&k->error, n));
        DDP_TRY(grow(&k->copy, n));
        DDP_TRY(grow(&k->p, np));
        DDP_TRY(grow(&k->q, nq));
        DDP_TRY(grow(&k->u, nu));
        memset(k->error, 0, n * sizeof *k->error);
        k->n = n;
        k->np = np;
        k->nq = nq;
        k->sig = sig;
        snprintf(k->name[0], sizeof k->name[0], "powersgd.error.%d", b);
        snprintf(k->name[1], sizeof k->name[1], "powersgd.q.%d", b);
    }
    k->nu = nu;
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

/* Every compressed tensor: Q ready (random or warm, orthogonalised), P = M Q. */
static void compute_ps(ddp_powersgd_t *s, bucket *k, float *data, const ddp_powersgd_tensor *t,
                       int nt)
{
    int randomize = !s->o.warm_start || !k->have_q;
    size_t pi = 0, qi = 0;
    for (int i = 0; i < nt; i++) {
        if (!compressed(s, &t[i]))
            continue;
        int r = rank_of(s, &t[i]);
        float *q = k->q + qi, *p = k->p + pi;
        if (randomize)
            for (size_t e = 0; e < (size_t)t[i].cols * (size_t)r; e++)
                q[e] = normal(&s->rng);
        orthogonalize(q, t[i].cols, r, s->o.orthogonalization_epsilon);
        ddp_sgemm(0, 0, (int)t[i].rows, r, (int)t[i].cols, 1.0f, data + t[i].offset,
                  (int)t[i].cols, q, r, 0.0f, p, r);
        pi += (size_t)t[i].rows * (size_t)r;
        qi += (size_t)t[i].cols * (size_t)r;
    }
    k->have_q = 1;
}

/* Packs (to 1) or unpacks (to 0) the uncompressed tensors through k->u. */
static void pack_uncompressed(const ddp_powersgd_t *s, bucket *k, float *data,
                              const ddp_powersgd_tensor *t, int nt, int to_u, float scale)
{
    size_t ui = 0;
    for (int i = 0; i < nt; i++) {
        if (compressed(s, &t[i]))
            continue;
        size_t n = (size_t)(t[i].rows * t[i].cols);
        float *d = data + t[i].offset;
        if (to_u)
            memcpy(k->u + ui, d, n * sizeof *d);
        else
            for (size_t e = 0; e < n; e++)
                d[e] = k->u[ui + e] * scale;
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
    if (s->o.use_error_feedback) {
        for (size_t e = 0; e < n; e++)
            data[e] += k->error[e];
        memcpy(k->copy, data, n * sizeof *data);
    }
    for (int i = 0; i < nt; i++) {
        double full = (double)(t[i].rows * t[i].cols);
        s->before += full;
        s->after += compressed(s, &t[i]) ? (double)(t[i].rows + t[i].cols) * rank_of(s, &t[i])
                                         : full;
    }
    compute_ps(s, k, data, t, nt);
    pack_uncompressed(s, k, data, t, nt, 1, 1.0f);
    if (k->nu == 0)
        return 0;
    return ddp_pg_all_reduce_async(pg, k->u, k->nu, DDP_FLOAT32, DDP_SUM, work);
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
    pack_uncompressed(s, k, data, t, nt, 0, 1.0f / ws);
    if (k->np)
        DDP_TRY(ddp_pg_all_reduce(pg, k->p, k->np, DDP_FLOAT32, DDP_SUM));
    size_t pi = 0, qi = 0;
    for (int i = 0; i < nt; i++) { /* orthogonalise P, Q = M^T P */
        if (!compressed(s, &t[i]))
            continue;
        int r = rank_of(s, &t[i]);
        orthogonalize(k->p + pi, t[i].rows, r, s->o.orthogonalization_epsilon);
        ddp_sgemm(1, 0, (int)t[i].cols, r, (int)t[i].rows, 1.0f, data + t[i].offset,
                  (int)t[i].cols, k->p + pi, r, 0.0f, k->q + qi, r);
        pi += (size_t)t[i].rows * (size_t)r;
        qi += (size_t)t[i].cols * (size_t)r;
    }
    if (k->nq)
        DDP_TRY(ddp_pg_all_reduce(pg, k->q, k->nq, DDP_FLOAT32, DDP_SUM));
    for (size_t e = 0; e < k->nq; e++)
        k->q[e] /= ws;
    pi = qi = 0;
    for (int i = 0; i < nt; i++) { /* M = P Q^T */
        if (!compressed(s, &t[i]))
            continue;
        int r = rank_of(s, &t[i]);
        ddp_sgemm(0, 1, (int)t[i].rows, (int)t[i].cols, r, 1.0f, k->p + pi, r, k->q + qi, r,
                  0.0f, data + t[i].offset, (int)t[i].cols);
        pi += (size_t)t[i].rows * (size_t)r;
        qi += (size_t)t[i].cols * (size_t)r;
    }
    if (s->o.use_error_feedback)
        for (size_t e = 0; e < n; e++)
            k->error[e] = k->copy[e] - data[e];
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
