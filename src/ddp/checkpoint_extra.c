/* A training checkpoint's extras in __metadata__ (see include/ddp/ddp.h):
 * "libddp.optimizer.lr" (every group's lr, "%.17g" comma-separated: exact
 * in float64), "libddp.lr_scheduler.{last_epoch,best,num_bad_epochs,
 * cooldown_counter}" and "libddp.rng.<name>" (hex words, comma-separated);
 * and the plain save/load, which are the _ex ones without extras. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ddp/checkpoint_extra.h"

#define SCHED_KEYS 4
#define KEY_LEN 96

ddp_checkpoint_options ddp_checkpoint_defaults(void)
{
    ddp_checkpoint_options x;
    memset(&x, 0, sizeof x);
    return x;
}

int ddp_checkpoint_save(const char *path, ddp_model_t *model, ddp_optim_t *opt,
                        const ddp_train_state *st)
{
    return ddp_checkpoint_save_ex(path, model, opt, st, NULL);
}

int ddp_checkpoint_load(const char *path, ddp_model_t *model, ddp_optim_t *opt,
                        ddp_train_state *st)
{
    return ddp_checkpoint_load_ex(path, model, opt, st, NULL);
}

static const char *const SCHED_KEY[SCHED_KEYS] = {
    "libddp.lr_scheduler.last_epoch", "libddp.lr_scheduler.best",
    "libddp.lr_scheduler.num_bad_epochs", "libddp.lr_scheduler.cooldown_counter"};

/* ==== save ================================================================ */

/* "v0,v1,..." of n values, each printed by fmt into at most 24 characters
 * (a %.17g double or a 16-digit hex word).  Caller frees. */
static char *join(int n, const double *d, const uint64_t *w)
{
    char *s = malloc((size_t)(n > 0 ? n : 1) * 26), *p = s;
    if (!s)
        return NULL;
    *s = 0;
    for (int i = 0; i < n; i++)
        p += d ? sprintf(p, "%s%.17g", i ? "," : "", d[i])
               : sprintf(p, "%s%016" PRIx64, i ? "," : "", w[i]);
    return s;
}

int ddp__checkpoint_write(const char *path, const ddp__st_out *t, size_t n,
                          const char *const *meta, size_t nmeta, ddp_optim_t *opt,
                          const ddp_checkpoint_options *x)
{
    int nrng = x ? x->nrngs : 0, ng = ddp_optim_num_groups(opt), rc = 0;
    DDP_FAIL_IF(nrng < 0 || (nrng > 0 && !x->rngs), DDP_ERR_INVALID_ARG,
                "checkpoint: %d rngs from a NULL array", nrng);
    size_t cap = nmeta + 1 + SCHED_KEYS + (size_t)nrng, k = nmeta;
    const char **m = calloc(2 * cap, sizeof *m);
    char **owned = calloc(1 + (size_t)nrng, sizeof *owned), (*keys)[KEY_LEN] = NULL;
    char num[SCHED_KEYS][32];
    keys = calloc((size_t)(nrng > 0 ? nrng : 1), sizeof *keys);
    DDP_FAIL_OUT(!m || !owned || !keys, DDP_ERR_NOMEM, "checkpoint: out of memory");
    memcpy(m, meta, 2 * nmeta * sizeof *m);
    if (ng > 0) {
        double *lr = malloc((size_t)ng * sizeof *lr);
        DDP_FAIL_OUT(!lr, DDP_ERR_NOMEM, "checkpoint: out of memory");
        for (int g = 0; g < ng; g++)
            lr[g] = ddp_optim_group_lr(opt, g);
        owned[0] = join(ng, lr, NULL);
        free(lr);
        DDP_FAIL_OUT(!owned[0], DDP_ERR_NOMEM, "checkpoint: out of memory");
        m[2 * k] = "libddp.optimizer.lr", m[2 * k + 1] = owned[0], k++;
    }
    if (x && x->scheduler) {
        ddp_lr_state s = ddp_lr_scheduler_state(x->scheduler);
        snprintf(num[0], sizeof num[0], "%" PRId64, s.last_epoch);
        snprintf(num[1], sizeof num[1], "%.17g", s.best);
        snprintf(num[2], sizeof num[2], "%" PRId64, s.num_bad_epochs);
        snprintf(num[3], sizeof num[3], "%" PRId64, s.cooldown_counter);
        for (int j = 0; j < SCHED_KEYS; j++)
            m[2 * k] = SCHED_KEY[j], m[2 * k + 1] = num[j], k++;
    }
    for (int r = 0; r < nrng; r++) {
        const ddp_checkpoint_rng *g = &x->rngs[r];
        DDP_FAIL_OUT(!g->name || !g->state || g->nwords <= 0, DDP_ERR_INVALID_ARG,
                     "checkpoint: rng %d needs a name, a state and nwords > 0", r);
        snprintf(keys[r], KEY_LEN, "libddp.rng.%s", g->name);
        owned[1 + r] = join(g->nwords, NULL, g->state);
        DDP_FAIL_OUT(!owned[1 + r], DDP_ERR_NOMEM, "checkpoint: out of memory");
        m[2 * k] = keys[r], m[2 * k + 1] = owned[1 + r], k++;
    }
    rc = ddp__st_write(path, t, n, m, k);
out:
    for (int i = 0; owned && i <= nrng; i++)
        free(owned[i]);
    free(owned);
    free(keys);
    free(m);
    return rc;
}

/* ==== load ================================================================ */

/* Parses n comma-separated values of s (doubles into d, or hex words into
 * w); fails naming key unless there are exactly n. */
static int split(const char *path, const char *key, const char *s, int n, double *d,
                 uint64_t *w)
{
    const char *p = s;
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        if (d)
            d[i] = strtod(p, &end);
        else
            w[i] = strtoull(p, &end, 16);
        DDP_FAIL_IF(errno || end == p || (*end != (i + 1 < n ? ',' : '\0')), DDP_ERR_FORMAT,
                    "checkpoint %s: %s is '%s', not %d comma-separated %s", path, key, s, n,
                    d ? "numbers" : "hex words");
        p = end + 1;
    }
    return 0;
}

int ddp__checkpoint_extra_load(const char *path, const ddp__st_file *f, ddp_optim_t *opt,
                               const ddp_checkpoint_options *x)
{
    int ng = ddp_optim_num_groups(opt), nrng = x ? x->nrngs : 0, total = 0, rc = 0;
    DDP_FAIL_IF(nrng < 0 || (nrng > 0 && !x->rngs), DDP_ERR_INVALID_ARG,
                "checkpoint: %d rngs from a NULL array", nrng);
    for (int r = 0; r < nrng; r++) {
        DDP_FAIL_IF(!x->rngs[r].name || !x->rngs[r].state || x->rngs[r].nwords <= 0,
                    DDP_ERR_INVALID_ARG, "checkpoint: rng %d needs a name, a state and "
                    "nwords > 0", r);
        total += x->rngs[r].nwords;
    }
    double *lr = calloc((size_t)(ng > 0 ? ng : 1), sizeof *lr);
    uint64_t *words = calloc((size_t)(total > 0 ? total : 1), sizeof *words);
    DDP_FAIL_OUT(!lr || !words, DDP_ERR_NOMEM, "checkpoint: out of memory");
    /* Phase 1: read and check everything. */
    const char *lrs = ng > 0 ? ddp__st_meta(f, "libddp.optimizer.lr") : NULL;
    if (lrs) /* absent from checkpoints older than parameter groups */
        DDP_TRY_OUT(split(path, "libddp.optimizer.lr", lrs, ng, lr, NULL));
    ddp_lr_state s = {0, 0, 0, 0};
    if (x && x->scheduler) {
        const char *best = ddp__st_meta(f, SCHED_KEY[1]);
        DDP_TRY_OUT(ddp__checkpoint_meta_int(path, f, SCHED_KEY[0], &s.last_epoch));
        DDP_FAIL_OUT(!best, DDP_ERR_FORMAT, "checkpoint %s: no %s in __metadata__", path,
                     SCHED_KEY[1]);
        DDP_TRY_OUT(split(path, SCHED_KEY[1], best, 1, &s.best, NULL));
        DDP_TRY_OUT(ddp__checkpoint_meta_int(path, f, SCHED_KEY[2], &s.num_bad_epochs));
        DDP_TRY_OUT(ddp__checkpoint_meta_int(path, f, SCHED_KEY[3], &s.cooldown_counter));
    }
    for (int r = 0, at = 0; r < nrng; at += x->rngs[r].nwords, r++) {
        char key[KEY_LEN];
        snprintf(key, sizeof key, "libddp.rng.%s", x->rngs[r].name);
        const char *v = ddp__st_meta(f, key);
        DDP_FAIL_OUT(!v, DDP_ERR_FORMAT, "checkpoint %s: no %s in __metadata__", path, key);
        DDP_TRY_OUT(split(path, key, v, x->rngs[r].nwords, NULL, words + at));
    }
    /* Phase 2: set (the lrs first: a plateau's state takes them as its own). */
    for (int g = 0; lrs && g < ng; g++)
        ddp_optim_set_group_lr(opt, g, lr[g]);
    if (x && x->scheduler)
        DDP_TRY_OUT(ddp_lr_scheduler_set_state(x->scheduler, &s));
    for (int r = 0, at = 0; r < nrng; at += x->rngs[r].nwords, r++)
        memcpy(x->rngs[r].state, words + at, (size_t)x->rngs[r].nwords * sizeof *words);
out:
    free(lr);
    free(words);
    return rc;
}
