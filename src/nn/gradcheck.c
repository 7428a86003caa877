/* ddp_gradcheck: torch.autograd.gradcheck for the float32 tape.  The
 * computation under test runs in float32 on a tape and its backward gives
 * the analytic vector-Jacobian product w^T J; a float64 reference of the
 * same function gives the numeric one by central differences (see
 * include/ddp/nn_function.h for why the numeric side needs a float64
 * reference and what that check proves). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "ddp/nn_function.h"
#include "nn/autograd.h"

ddp_gradcheck_options ddp_gradcheck_defaults(void)
{
    return (ddp_gradcheck_options){
        .eps = 1e-6, .atol = 1e-5, .rtol = 1e-3, .fwd_tol = 1e-5, .nout = 1, .seed = 0};
}

typedef struct check {
    ddp_gradcheck_build_fn build;
    ddp_gradcheck_ref_fn ref;
    void *user;
    ddp_gradcheck_options o;
    int nin;
    const ddp_tensor *in;
    float **x32;     /* (nin) the float32 points */
    double **x64;    /* (nin) the same in float64, perturbed in turn */
    double **grad;   /* (nin) analytic gradients, summed over the outputs */
    double *y64;     /* (ny) reference outputs */
    float *w;        /* (ny) output weights */
    int64_t ny;
} check;

static int check_args(ddp_gradcheck_build_fn build, ddp_gradcheck_ref_fn ref, int nin,
                      const ddp_tensor *in, const ddp_gradcheck_options *o)
{
    DDP_FAIL_IF(!build || !ref || !in, DDP_ERR_INVALID_ARG, "gradcheck: NULL build, ref or in");
    DDP_FAIL_IF(nin < 1 || nin > DDP_VAR_MAX_IN, DDP_ERR_INVALID_ARG,
                "gradcheck: %d inputs (1 .. %d)", nin, DDP_VAR_MAX_IN);
    for (int i = 0; i < nin; i++)
        DDP_FAIL_IF(!in[i].data || in[i].numel < 1, DDP_ERR_INVALID_ARG,
                    "gradcheck: input %d has no data", i);
    DDP_FAIL_IF(!(o->eps > 0) || !(o->atol >= 0) || !(o->rtol >= 0) || !(o->fwd_tol >= 0),
                DDP_ERR_INVALID_ARG,
                "gradcheck: eps %g must be > 0 and atol %g, rtol %g, fwd_tol %g >= 0", o->eps,
                o->atol, o->rtol, o->fwd_tol);
    DDP_FAIL_IF(o->nout < 1 || o->nout > DDP_FUNCTION_MAX_OUT, DDP_ERR_INVALID_ARG,
                "gradcheck: nout %d (1 .. %d)", o->nout, DDP_FUNCTION_MAX_OUT);
    return 0;
}

static int alloc_points(check *c)
{
    c->x32 = calloc((size_t)c->nin, sizeof *c->x32);
    c->x64 = calloc((size_t)c->nin, sizeof *c->x64);
    c->grad = calloc((size_t)c->nin, sizeof *c->grad);
    DDP_FAIL_IF(!c->x32 || !c->x64 || !c->grad, DDP_ERR_NOMEM, "gradcheck: out of memory");
    for (int i = 0; i < c->nin; i++) {
        size_t n = (size_t)c->in[i].numel;
        c->x32[i] = malloc(n * sizeof(float));
        c->x64[i] = malloc(n * sizeof(double));
        c->grad[i] = calloc(n, sizeof(double));
        DDP_FAIL_IF(!c->x32[i] || !c->x64[i] || !c->grad[i], DDP_ERR_NOMEM,
                    "gradcheck: out of memory for input %d (%zu elements)", i, n);
        memcpy(c->x32[i], c->in[i].data, n * sizeof(float));
        for (size_t j = 0; j < n; j++)
            c->x64[i][j] = c->in[i].data[j];
    }
    return 0;
}

static void free_points(check *c)
{
    for (int i = 0; i < c->nin; i++) {
        if (c->x32)
            free(c->x32[i]);
        if (c->x64)
            free(c->x64[i]);
        if (c->grad)
            free(c->grad[i]);
    }
    free(c->x32);
    free(c->x64);
    free(c->grad);
    free(c->y64);
    free(c->w);
}

/* The reference's weighted output sum at the current x64. */
static int ref_dot(check *c, double *out)
{
    int rc = c->ref((const double *const *)c->x64, c->nin, c->y64, c->user);
    if (rc < 0)
        return ddp__error_context(rc, "gradcheck: reference");
    double s = 0.0;
    for (int64_t j = 0; j < c->ny; j++)
        s += (double)c->w[j] * c->y64[j];
    *out = s;
    return 0;
}

/* The float32 forward against the reference at the unperturbed point. */
static int check_forward(check *c, ddp_var_t **outs)
{
    int rc = c->ref((const double *const *)c->x64, c->nin, c->y64, c->user);
    if (rc < 0)
        return ddp__error_context(rc, "gradcheck: reference");
    int64_t off = 0;
    for (int k = 0; k < c->o.nout; k++) {
        const ddp_tensor *t = ddp_var_tensor(outs[k]);
        for (int64_t j = 0; j < t->numel; j++) {
            double r = c->y64[off + j], f = t->data[j];
            double tol = c->o.fwd_tol * (fabs(r) > 1.0 ? fabs(r) : 1.0);
            DDP_FAIL_IF(!(fabs(f - r) <= tol), DDP_ERR_MISMATCH,
                        "gradcheck: output %d element %lld: float32 forward %.9g, float64 "
                        "reference %.9g (tolerance %.3g): the reference is not the op's "
                        "function", k, (long long)j, f, r, tol);
        }
        off += t->numel;
    }
    return 0;
}

/* Analytic w^T J for every input: one backward per output (from the
 * output with its weights), summed; an input a pass does not reach gets
 * nothing from it. */
static int analytic(check *c, ddp_tape_t *tape, ddp_var_t **x, ddp_var_t **outs)
{
    int64_t off = 0;
    for (int k = 0; k < c->o.nout; k++) {
        int64_t n = outs[k]->t.numel;
        if (outs[k]->requires_grad) {
            DDP_TRY(ddp_tape_backward_grad(tape, outs[k], c->w + off, NULL));
            for (int i = 0; i < c->nin; i++) {
                const float *g = ddp_var_grad(x[i]);
                if (!x[i]->reachable || !x[i]->grad_written || !g)
                    continue;
                for (int64_t j = 0; j < x[i]->t.numel; j++)
                    c->grad[i][j] += g[j];
            }
        }
        off += n;
    }
    return 0;
}

static int numeric(check *c)
{
    double eps = c->o.eps;
    for (int i = 0; i < c->nin; i++) {
        for (int64_t j = 0; j < c->in[i].numel; j++) {
            double keep = c->x64[i][j], fp, fm;
            c->x64[i][j] = keep + eps;
            DDP_TRY(ref_dot(c, &fp));
            c->x64[i][j] = keep - eps;
            DDP_TRY(ref_dot(c, &fm));
            c->x64[i][j] = keep;
            double num = (fp - fm) / (2.0 * eps), an = c->grad[i][j];
            double tol = c->o.atol + c->o.rtol * fabs(num);
            DDP_FAIL_IF(!(fabs(an - num) <= tol), DDP_ERR_MISMATCH,
                        "gradcheck: input %d element %lld: analytic %.9g, numeric %.9g "
                        "(tolerance %.3g)", i, (long long)j, an, num, tol);
        }
    }
    return 0;
}

static int run(check *c, ddp_tape_t *tape)
{
    ddp_var_t *x[DDP_VAR_MAX_IN], *outs[DDP_FUNCTION_MAX_OUT] = {NULL};
    for (int i = 0; i < c->nin; i++) {
        ddp_tensor t;
        DDP_TRY(ddp_tensor_wrap(&t, c->x32[i], c->in[i].ndim, c->in[i].shape));
        DDP_TRY(ddp_tape_input(tape, &t, 1, &x[i]));
    }
    int rc = c->build(tape, x, c->nin, outs, c->o.nout, c->user);
    if (rc < 0)
        return ddp__error_context(rc, "gradcheck: build");
    c->ny = 0;
    for (int k = 0; k < c->o.nout; k++) {
        DDP_FAIL_IF(!outs[k] || !ddp__tape_has(tape, outs[k]), DDP_ERR_INVALID_ARG,
                    "gradcheck: build gave no output %d on the tape", k);
        c->ny += outs[k]->t.numel;
    }
    c->y64 = malloc((size_t)c->ny * sizeof *c->y64);
    c->w = malloc((size_t)c->ny * sizeof *c->w);
    DDP_FAIL_IF(!c->y64 || !c->w, DDP_ERR_NOMEM, "gradcheck: out of memory");
    ddp__rng rng;
    ddp__rng_seed(&rng, c->o.seed);
    for (int64_t j = 0; j < c->ny; j++) /* U(-1, 1): no weight pattern hides an entry */
        c->w[j] = (float)(2.0 * ddp__rng_uniform(&rng) - 1.0);
    DDP_TRY(check_forward(c, outs));
    DDP_TRY(analytic(c, tape, x, outs));
    return numeric(c);
}

int ddp_gradcheck(ddp_gradcheck_build_fn build, ddp_gradcheck_ref_fn ref, int nin,
                  const ddp_tensor *in, const ddp_gradcheck_options *opts, void *user)
{
    check c = {.build = build, .ref = ref, .user = user, .nin = nin, .in = in};
    c.o = opts ? *opts : ddp_gradcheck_defaults();
    DDP_TRY(check_args(build, ref, nin, in, &c.o));
    ddp_tape_t *tape = NULL;
    int rc = alloc_points(&c);
    if (rc == 0)
        rc = ddp_tape_create(&tape);
    if (rc == 0)
        rc = run(&c, tape);
    ddp_tape_destroy(tape);
    free_points(&c);
    return rc;
}
