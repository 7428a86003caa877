/* A user's own op with its own backward, trained under DDP: a "scaled tanh"
 * layer y = a * tanh(x) with a learnable scale a per feature (PyTorch's
 * torch.autograd.Function with a parameter input), checked with
 * ddp_gradcheck at start, then a small regression MLP
 *   x (B, 8) -> Linear(8, 16) -> scaled_tanh(a: 16) -> Linear(16, 1)
 * fitted to y = sin(x0 + ... + x7) / 2 with MSE and SGD on every rank of the
 * job, each rank drawing its own samples.  Run it with a launcher:
 *   ddprun --standalone --nproc-per-node 2 build/bin/ddp-custom_op [STEPS]
 * Rank 0 prints the first and last loss; every rank prints a checksum of
 * its parameters, equal on all ranks when DDP kept them in step. */
#include <math.h>
#include <string.h>

#include <ddp.h>

enum { B = 32, IN = 8, HID = 16 };

/* ---- the op: in[0] = x (B, H), in[1] = a (H); out[0] = a * tanh(x) ---- */

static int scaled_tanh_forward(ddp_function_ctx *ctx, int nin, const ddp_tensor *in, int nout,
                               ddp_tensor *out)
{
    (void)nin, (void)nout;
    int64_t h = in[1].numel, rows = in[0].numel / h;
    float *th = ddp_function_ctx_alloc(ctx, (size_t)in[0].numel * sizeof(float)); /* (B, H) */
    if (!th)
        return ddp_function_fail(ctx, DDP_ERR_NOMEM, "no memory for tanh(x)");
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < h; j++) {
            th[r * h + j] = tanhf(in[0].data[r * h + j]);
            out[0].data[r * h + j] = in[1].data[j] * th[r * h + j];
        }
    ddp_function_ctx_save(ctx, th); /* backward needs tanh(x), not x */
    return 0;
}

/* dx = dy * a * (1 - tanh^2 x), da = sum over rows of dy * tanh x */
static int scaled_tanh_backward(ddp_function_ctx *ctx, int nout, const ddp_tensor *dout, int nin,
                                ddp_tensor *din)
{
    (void)nout, (void)nin;
    const float *th = ddp_function_ctx_saved(ctx), *dy = dout[0].data;
    const ddp_tensor *a = ddp_function_ctx_input(ctx, 1);
    int64_t h = a->numel, rows = dout[0].numel / h;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < h; j++) {
            float t = th[r * h + j], g = dy[r * h + j];
            if (din[0].data)
                din[0].data[r * h + j] = g * a->data[j] * (1.0f - t * t);
            if (din[1].data)
                din[1].data[j] += g * t;
        }
    return 0;
}

static const ddp_function scaled_tanh = {"scaled_tanh", scaled_tanh_forward,
                                         scaled_tanh_backward, NULL};

/* ---- ddp_gradcheck at start: the op against a float64 reference ---- */

static int check_build(ddp_tape_t *tape, ddp_var_t *const *in, int nin, ddp_var_t **out,
                       int nout, void *user)
{
    (void)nin, (void)nout, (void)user;
    return ddp_function_apply(&scaled_tanh, tape, 2, in, 1, NULL, out);
}

static int check_ref(const double *const *in, int nin, double *out, void *user)
{
    (void)nin, (void)user;
    for (int i = 0; i < 3 * 4; i++)
        out[i] = in[1][i % 4] * tanh(in[0][i]);
    return 0;
}

static int gradcheck_op(void)
{
    float x[12], a[4] = {0.5f, -1.5f, 2.0f, 1.0f};
    for (int i = 0; i < 12; i++)
        x[i] = (float)sin(1.7 * i + 0.3);
    ddp_tensor in[2];
    DDP_CHECK(ddp_tensor_wrap(&in[0], x, 2, (int64_t[]){3, 4}));
    DDP_CHECK(ddp_tensor_wrap(&in[1], a, 1, (int64_t[]){4}));
    return ddp_gradcheck(check_build, check_ref, 2, in, NULL, NULL);
}

/* ---- the model and its data ---- */

typedef struct {
    ddp_model_t *model;
    ddp_module_t *fc1, *fc2; /* owned by the model */
    ddp_param *scale;
} net;

static void net_create(net *n)
{
    DDP_CHECK(ddp_model_create(&n->model));
    DDP_CHECK(ddp_linear_create(IN, HID, 1, 1, &n->fc1));
    DDP_CHECK(ddp_linear_create(HID, 1, 1, 2, &n->fc2));
    DDP_CHECK(ddp_model_add_module(n->model, "fc1", n->fc1));
    DDP_CHECK(ddp_model_add_param(n->model, "scale", 1, (int64_t[]){HID}, &n->scale));
    DDP_CHECK(ddp_model_add_module(n->model, "fc2", n->fc2));
    DDP_CHECK(ddp_model_seal(n->model));
    n->scale = ddp_model_find_param(n->model, "scale");
    for (int j = 0; j < HID; j++)
        n->scale->data[j] = 1.0f;
}

static int net_forward(net *n, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y)
{
    ddp_var_t *h, *a, *t[2];
    int rc;
    if ((rc = ddp_module_forward(n->fc1, tape, x, &h)) < 0 ||
        (rc = ddp_tape_param(tape, n->scale, &a)) < 0 ||
        (rc = ddp_function_apply(&scaled_tanh, tape, 2, (ddp_var_t *[]){h, a}, 1, NULL, t)) < 0)
        return rc;
    return ddp_module_forward(n->fc2, tape, t[0], y);
}

/* A batch of this rank's samples: x uniform in [-1, 1], y = sin(sum x) / 2. */
static void draw(uint64_t *state, float *x, float *y)
{
    for (int r = 0; r < B; r++) {
        double s = 0.0;
        for (int j = 0; j < IN; j++) {
            *state = *state * 6364136223846793005ull + 1442695040888963407ull;
            x[r * IN + j] = (float)((double)(*state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
            s += x[r * IN + j];
        }
        y[r] = (float)(sin(s) / 2.0);
    }
}

/* FNV-1a over the parameter block's bytes. */
static uint64_t checksum(ddp_model_t *m)
{
    size_t n;
    const unsigned char *p = (const unsigned char *)ddp_model_param_block(m, &n);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n * sizeof(float); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 300;
    ddp_pg_t *pg;
    DDP_CHECK(ddp_init_process_group_env("tcp", 0, &pg));
    int rank = ddp_pg_rank(pg);
    if (gradcheck_op() != 0) {
        fprintf(stderr, "rank %d: scaled_tanh fails gradcheck: %s\n", rank, ddp_last_error());
        return 1;
    }
    if (rank == 0)
        printf("gradcheck scaled_tanh: ok\n");
    net n;
    net_create(&n);
    ddp_data_parallel_t *dm;
    ddp_optim_t *opt;
    ddp_tape_t *tape;
    DDP_CHECK(ddp_data_parallel_create(n.model, pg, NULL, &dm)); /* rank 0's weights for all */
    DDP_CHECK(ddp_sgd_create(n.model, &(ddp_sgd_options){.lr = 0.05, .momentum = 0.9}, &opt));
    DDP_CHECK(ddp_tape_create(&tape));
    uint64_t rng = 12345 + 977 * (uint64_t)rank;
    float x[B * IN], y[B], first = 0, last = 0;
    for (int step = 0; step < steps; step++) {
        ddp_tensor tx, ty;
        ddp_var_t *vx, *vy, *out, *loss;
        draw(&rng, x, y);
        ddp_tape_reset(tape);
        DDP_CHECK(ddp_tensor_wrap(&tx, x, 2, (int64_t[]){B, IN}));
        DDP_CHECK(ddp_tensor_wrap(&ty, y, 2, (int64_t[]){B, 1}));
        DDP_CHECK(ddp_tape_input(tape, &tx, 0, &vx));
        DDP_CHECK(ddp_tape_input(tape, &ty, 0, &vy));
        /* A hand-written forward: backward through DDP buckets "scale" with
         * the Linear parameters, reduced as soon as its gradient is final. */
        DDP_CHECK(net_forward(&n, tape, vx, &out));
        DDP_CHECK(ddp_op_mse_loss(tape, out, vy, &loss));
        ddp_optim_zero_grad(opt);
        DDP_CHECK(ddp_data_parallel_backward(dm, tape, loss));
        DDP_CHECK(ddp_optim_step(opt));
        float l = ddp_var_item(loss);
        if (step < 10) /* mean over the first and last ten steps */
            first += l / 10;
        if (step >= steps - 10)
            last += l / 10;
    }
    if (rank == 0)
        printf("loss: first %.6f last %.6f\n", first, last);
    printf("rank %d parameters checksum %016llx\n", rank, (unsigned long long)checksum(n.model));
    ddp_tape_destroy(tape);
    ddp_optim_destroy(opt);
    ddp_data_parallel_destroy(dm);
    ddp_model_destroy(n.model);
    ddp_destroy_process_group(pg);
    return 0;
}
