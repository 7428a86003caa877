/* Tests of DistributedDataParallel with real processes on loopback:
 * equivalence with a single process on the same samples (several world sizes
 * and bucket caps), determinism, no_sync, compression hooks (exact), unused
 * parameters, mismatched models, misuse (no_sync across a step, teardown
 * order), join with uneven inputs, a dead peer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "ddp.h"
#include "ddp/ext.h"
#include "fork_children.h"

#define IN 16
#define HID 32
#define OUT 4
#define B 8      /* per-rank batch */
#define STEPS 20

/* ==== shared pieces ======================================================= */

/* Sequential(Linear(16,32), ReLU, Linear(32,32), ReLU, Linear(32,4)), seeded;
 * extra_param adds a parameter that forward never uses. */
static int make_model(int hidden, int extra_param, ddp_model_t **out)
{
    ddp_module_t *mods[5];
    DDP_TRY(ddp_linear_create(IN, hidden, 1, 1, &mods[0]));
    DDP_TRY(ddp_relu_create(&mods[1]));
    DDP_TRY(ddp_linear_create(hidden, HID, 1, 2, &mods[2]));
    DDP_TRY(ddp_relu_create(&mods[3]));
    DDP_TRY(ddp_linear_create(HID, OUT, 1, 3, &mods[4]));
    ddp_module_t *seq;
    DDP_TRY(ddp_sequential_create(mods, 5, &seq));
    ddp_model_t *m;
    DDP_TRY(ddp_model_create(&m));
    DDP_TRY(ddp_model_add_module(m, "", seq));
    if (extra_param) {
        int64_t shape[1] = {3};
        ddp_param *p;
        DDP_TRY(ddp_model_add_param(m, "unused.weight", 1, shape, &p));
    }
    DDP_TRY(ddp_model_seal(m));
    *out = m;
    return 0;
}

/* Deterministic samples: x_i = sin(0.37 i + 0.11 j), label i % 4. */
static void sample(int64_t i, float *x, int64_t *label)
{
    for (int j = 0; j < IN; j++)
        x[j] = (float)sin(0.37 * (double)i + 0.11 * j);
    *label = i % OUT;
}

/* Forward + loss on samples [first, first + n). */
static int forward_loss(ddp_data_parallel_t *dm, ddp_model_t *m, ddp_tape_t *tape, int64_t first,
                        int n, ddp_var_t **loss)
{
    static float xs[1024 * IN];
    static int64_t labels[1024];
    for (int i = 0; i < n; i++)
        sample(first + i, xs + (size_t)i * IN, &labels[i]);
    ddp_tensor t;
    int64_t shape[2] = {n, IN};
    DDP_TRY(ddp_tensor_wrap(&t, xs, 2, shape));
    ddp_tape_reset(tape);
    ddp_var_t *x, *y;
    DDP_TRY(ddp_tape_input(tape, &t, 0, &x));
    if (dm)
        DDP_TRY(ddp_data_parallel_forward(dm, tape, x, &y));
    else
        DDP_TRY(ddp_model_forward(m, tape, x, &y));
    return ddp_op_cross_entropy(tape, y, labels, loss);
}

static char tmpdir[64];

static int setup_dir(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/ddp-test-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static int join_group(int rank, int n, const char *tag, ddp_pg_t **pg)
{
    char url[256];
    snprintf(url, sizeof url, "file://%s/store-%s", tmpdir, tag);
    return ddp_init_process_group("tcp", url, rank, n, 20.0, pg);
}

/* What a rank of most cases holds.  kit_open joins the group `tag` of world
 * ranks and makes the model (make_model) and a tape; the case adds the
 * wrapper and an optimizer; kit_close frees whatever is there. */
typedef struct {
    ddp_pg_t *pg;
    ddp_model_t *m;
    ddp_tape_t *tape;
    ddp_data_parallel_t *dm;
    ddp_optim_t *opt;
} rank_kit;

static int kit_open(rank_kit *k, int rank, int world, const char *tag, int hidden, int extra)
{
    memset(k, 0, sizeof *k);
    DDP_TRY(join_group(rank, world, tag, &k->pg));
    DDP_TRY(make_model(hidden ? hidden : HID, extra, &k->m));
    return ddp_tape_create(&k->tape);
}

static void kit_close(rank_kit *k)
{
    ddp_optim_destroy(k->opt);
    ddp_data_parallel_destroy(k->dm);
    ddp_tape_destroy(k->tape);
    ddp_model_destroy(k->m);
    ddp_destroy_process_group(k->pg);
}

/* The model's gradients wherever p->grad points (DDP: the buckets), in
 * registration order, into out (the model's numel floats). */
static void copy_grads(ddp_model_t *m, float *out)
{
    for (size_t i = 0; i < ddp_model_num_params(m); i++) {
        const ddp_param *p = ddp_model_param(m, i);
        memcpy(out + p->offset, p->grad, p->numel * sizeof *out);
    }
}

static int write_floats(const char *what, int rank, const float *v, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s.%d", tmpdir, what, rank);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(v, sizeof *v, n, f) != n)
        return -1;
    return fclose(f);
}

static float *read_floats(const char *what, int rank, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s.%d", tmpdir, what, rank);
    float *v = malloc(n * sizeof *v);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(v, sizeof *v, n, f), n);
    fclose(f);
    return v;
}

/* max |a - b| / max |b| */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return num / (den > 0 ? den : 1);
}

/* ==== equivalence ========================================================= */

typedef struct {
    int world;
    double cap_mb;
    int accumulate;         /* micro-batches per step (no_sync for all but the last) */
    ddp_comm_hook_kind hook;
    const char *tag;
    int user_hook;          /* register sum_then_divide_hook */
    int tail_chunks;        /* ddp_data_parallel_options.tail_chunks */
    int hidden;             /* first layer's width (0: HID) */
    const char *algo;       /* DDP_ALLREDUCE_ALGO for the ranks (NULL: auto) */
    const char *out;        /* parameters file name (NULL: "params") */
    /* tail_min_piece_mb (0: none; the test models are far below the
     * default 1 MiB floor) */
    double min_piece_mb;
    /* chunks per step the spy must see: 0, as many as ddp_grad_chunk_bounds
     * gives (more than one); -1 none; else that many */
    int expect_chunks;
    const char *env_tail_chunks; /* DDP_TAIL_CHUNKS, set in each rank (NULL: unset) */
} train_case;

/* Wraps DDP's chunk hook (nn.h rule 7) to count the chunks nn computed and
 * check that they tile the rows in order. */
typedef struct {
    ddp_grad_chunk_hook inner;
    int64_t next_row;
    int chunks, bad;
} chunk_spy;

static int spy_plan(ddp_param *p, int64_t rows, void *user)
{
    chunk_spy *s = user;
    s->next_row = 0;
    return s->inner.plan(p, rows, s->inner.user);
}

static int spy_chunk(ddp_param *p, int64_t r0, int64_t r1, void *user)
{
    chunk_spy *s = user;
    s->bad |= r0 != s->next_row || r1 <= r0 || r1 > p->shape[0] ||
              (r1 < p->shape[0] && r1 % DDP_GRAD_CHUNK_ROW_ALIGN != 0);
    s->next_row = r1;
    s->chunks++;
    return s->inner.chunk(p, r0, r1, s->inner.user);
}

/* A user hook: all-reduce the sum, divide by the world size in finish;
 * counts its calls. */
typedef struct {
    int launches, finishes;
} hook_counts;

static int sum_launch(void *state, ddp_pg_t *pg, int bucket, float *data, size_t n,
                      ddp_work_t **work)
{
    (void)bucket;
    ((hook_counts *)state)->launches++;
    return ddp_pg_all_reduce_async(pg, data, n, DDP_FLOAT32, DDP_SUM, work);
}

static int divide_finish(void *state, ddp_pg_t *pg, int bucket, float *data, size_t n)
{
    (void)bucket;
    ((hook_counts *)state)->finishes++;
    for (size_t i = 0; i < n; i++)
        data[i] /= (float)ddp_pg_size(pg);
    return 0;
}

/* STEPS steps of SGD(momentum 0.9); the global batch of step s is samples
 * [s * world * B * acc, ...), rank r taking its B-slice of each micro-batch. */
static int train_rank(int rank, void *arg)
{
    const train_case *c = arg;
    rank_kit k;
    ddp_sgd_options so = ddp_sgd_defaults(0.1);
    so.momentum = 0.9;
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    o.bucket_cap_mb = o.first_bucket_cap_mb = c->cap_mb;
    o.comm_hook = c->hook;
    o.tail_chunks = c->tail_chunks;
    o.tail_min_piece_mb = c->min_piece_mb;
    if (c->algo)
        setenv("DDP_ALLREDUCE_ALGO", c->algo, 1);
    if (c->env_tail_chunks)
        setenv("DDP_TAIL_CHUNKS", c->env_tail_chunks, 1);
    CHILD_CHECK(kit_open(&k, rank, c->world, c->tag, c->hidden, 0) == 0);
    ddp_model_t *m = k.m;
    if (rank == 1) /* different initial values: DDP must broadcast rank 0's */
        CHILD_CHECK(ddp_model_reset_parameters(m, 99) == 0);
    CHILD_CHECK(ddp_data_parallel_create(m, k.pg, &o, &k.dm) == 0);
    CHILD_CHECK(ddp_sgd_create(m, &so, &k.opt) == 0);
    ddp_data_parallel_t *dm = k.dm;
    if (c->cap_mb < 0.01)
        CHILD_CHECK(ddp_data_parallel_num_buckets(dm) > 1);
    hook_counts counts = {0, 0};
    ddp_comm_hook hook = {sum_launch, divide_finish, &counts};
    if (c->user_hook)
        CHILD_CHECK(ddp_data_parallel_register_comm_hook(dm, &hook) == 0);
    chunk_spy spy = {0};
    int chunks = c->env_tail_chunks ? atoi(c->env_tail_chunks) : c->tail_chunks;
    if (chunks) {
        CHILD_CHECK(ddp_model_grad_chunk_hook(m) != NULL);
        spy.inner = *ddp_model_grad_chunk_hook(m);
        ddp_model_set_grad_chunk_hook(m, &(ddp_grad_chunk_hook){spy_plan, spy_chunk, &spy});
    }
    int64_t micro = (int64_t)c->world * B;
    for (int s = 0; s < STEPS; s++) {
        ddp_optim_zero_grad(k.opt);
        for (int a = 0; a < c->accumulate; a++) {
            ddp_var_t *loss;
            int64_t first = ((int64_t)s * c->accumulate + a) * micro + (int64_t)rank * B;
            ddp_data_parallel_set_no_sync(dm, a + 1 < c->accumulate);
            CHILD_CHECK(forward_loss(dm, m, k.tape, first, B, &loss) == 0);
            CHILD_CHECK(ddp_data_parallel_backward(dm, k.tape, loss) == 0);
        }
        CHILD_CHECK(ddp_optim_step(k.opt) == 0);
    }
    CHILD_CHECK(ddp_data_parallel_buckets_rebuilt(dm));
    if (chunks) { /* every synchronised backward chunked the first layer's weight */
        int64_t bounds[64];
        int n = c->expect_chunks > 0   ? c->expect_chunks
                : c->expect_chunks < 0 ? 0
                                       : ddp_grad_chunk_bounds(c->hidden, chunks, bounds);
        CHILD_CHECK(!spy.bad && spy.chunks == STEPS * n);
        if (c->expect_chunks == 0)
            CHILD_CHECK(n > 1);
    }
    if (c->user_hook) /* one launch and one finish per bucket and step */
        CHILD_CHECK(counts.launches == STEPS * ddp_data_parallel_num_buckets(dm) &&
                    counts.finishes == counts.launches);
    size_t n;
    const float *params = ddp_model_param_block(m, &n);
    CHILD_CHECK(write_floats(c->out ? c->out : "params", rank, params, n) == 0);
    kit_close(&k);
    return 0;
}

/* The same training on one process with the whole global batch. */
static float *train_reference(int world, int accumulate, int hidden, size_t *n)
{
    ddp_model_t *m;
    ddp_tape_t *tape;
    ddp_optim_t *opt;
    ddp_sgd_options so = ddp_sgd_defaults(0.1);
    so.momentum = 0.9;
    assert_int_equal(make_model(hidden ? hidden : HID, 0, &m), 0);
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(ddp_sgd_create(m, &so, &opt), 0);
    int micro = world * B;
    for (int s = 0; s < STEPS; s++) {
        ddp_optim_zero_grad(opt);
        for (int k = 0; k < accumulate; k++) {
            ddp_var_t *loss;
            int64_t first = ((int64_t)s * accumulate + k) * micro;
            assert_int_equal(forward_loss(NULL, m, tape, first, micro, &loss), 0);
            assert_int_equal(ddp_tape_backward(tape, loss, m), 0);
        }
        assert_int_equal(ddp_optim_step(opt), 0);
    }
    const float *p = ddp_model_param_block(m, n);
    float *copy = malloc(*n * sizeof *copy);
    memcpy(copy, p, *n * sizeof *copy);
    ddp_optim_destroy(opt);
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
    return copy;
}

/* Runs a case; checks every rank holds bitwise the same parameters and that
 * they match the single-process reference within tol.  Returns rank 0's
 * parameters (caller frees) and their count in *count (may be NULL). */
static float *check_case(train_case *c, double tol, size_t *count)
{
    assert_int_equal(run_children(c->world, train_rank, c, 60), 0);
    size_t n;
    float *ref = train_reference(c->world, c->accumulate, c->hidden, &n);
    if (count)
        *count = n;
    const char *out = c->out ? c->out : "params";
    float *p0 = read_floats(out, 0, n);
    for (int r = 1; r < c->world; r++) {
        float *pr = read_floats(out, r, n);
        assert_memory_equal(p0, pr, n * sizeof *p0);
        free(pr);
    }
    double d = rel_diff(p0, ref, n);
    if (d > tol)
        fail_msg("%s: world %d, cap %g MiB: relative difference %.3g > %.3g", c->tag, c->world,
                 c->cap_mb, d, tol);
    free(ref);
    return p0;
}

static void test_equivalence(void **state)
{
    (void)state;
    const double caps[] = {1.0 / 1024, 64.0 / 1024, 25, 100};
    for (int world = 2; world <= 4; world++) {
        for (size_t k = 0; k < sizeof caps / sizeof *caps; k++) {
            char tag[32];
            snprintf(tag, sizeof tag, "eq-%d-%zu", world, k);
            train_case c = {.world = world, .cap_mb = caps[k], .accumulate = 1, .tag = tag};
            free(check_case(&c, 1e-5, NULL));
        }
    }
}

static void test_deterministic(void **state)
{
    (void)state;
    train_case a = {.world = 3, .cap_mb = 1.0 / 1024, .accumulate = 1, .tag = "det-a"};
    size_t n;
    float *pa = check_case(&a, 1e-5, &n);
    train_case b = {.world = 3, .cap_mb = 1.0 / 1024, .accumulate = 1, .tag = "det-b"};
    float *pb = check_case(&b, 1e-5, NULL);
    assert_memory_equal(pa, pb, n * sizeof *pa);
    free(pa);
    free(pb);
}

static void test_no_sync_accumulation(void **state)
{
    (void)state;
    train_case c = {.world = 2, .cap_mb = 1.0 / 1024, .accumulate = 3, .tag = "nosync"};
    free(check_case(&c, 1e-5, NULL));
}

/* x rounded to nearest, ties to even, in a binary format of `bits`
 * significant bits whose smallest normal exponent is emin (float16: 11,
 * -14; bfloat16: 8, -126; no overflow at these magnitudes): the reference
 * for the compression hooks, computed apart from their conversion code. */
static float round_to(float x, int bits, int emin)
{
    if (x == 0.0f)
        return x;
    int e;
    frexpf(x, &e); /* |x| in [2^(e-1), 2^e) */
    int lsb = (e - 1 > emin ? e - 1 : emin) - (bits - 1);
    return ldexpf(nearbyintf(ldexpf(x, -lsb)), lsb);
}

/* One step on 2 ranks, 1 KiB buckets: each rank's local gradients (the same
 * parameters and samples, no DDP) and DDP's with the hook *arg. */
static int hook_grads_rank(int rank, void *arg)
{
    ddp_comm_hook_kind hook = *(const ddp_comm_hook_kind *)arg;
    const char *tag = hook == DDP_HOOK_FP16 ? "fp16" : "bf16";
    rank_kit k;
    ddp_model_t *plain;
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    o.comm_hook = hook;
    o.bucket_cap_mb = o.first_bucket_cap_mb = 1.0 / 1024;
    CHILD_CHECK(kit_open(&k, rank, 2, tag, 0, 0) == 0);
    CHILD_CHECK(ddp_data_parallel_create(k.m, k.pg, &o, &k.dm) == 0);
    CHILD_CHECK(make_model(HID, 0, &plain) == 0);
    size_t n;
    const float *wrapped_params = ddp_model_param_block(k.m, &n);
    memcpy(ddp_model_param_block(plain, NULL), wrapped_params, n * sizeof(float));
    float *g = malloc(n * sizeof *g);
    CHILD_CHECK(g != NULL);
    char what[32];
    ddp_var_t *loss;
    for (int wrapped = 0; wrapped < 2; wrapped++) {
        ddp_model_t *m = wrapped ? k.m : plain;
        ddp_model_zero_grad(m);
        ddp_data_parallel_t *dm = wrapped ? k.dm : NULL;
        CHILD_CHECK(forward_loss(dm, m, k.tape, (int64_t)rank * B, B, &loss) == 0);
        CHILD_CHECK((dm ? ddp_data_parallel_backward(dm, k.tape, loss)
                        : ddp_tape_backward(k.tape, loss, m)) == 0);
        copy_grads(m, g);
        snprintf(what, sizeof what, "%s-%s", tag, wrapped ? "hooked" : "local");
        CHILD_CHECK(write_floats(what, rank, g, n) == 0);
    }
    free(g);
    ddp_model_destroy(plain);
    kit_close(&k);
    return 0;
}

/* The hook's gradients are exactly round(round(g0 / 2) + round(g1 / 2)),
 * rounded to the format as the hook does (divide, compress, sum with float
 * accumulation, widen), on both ranks; and most of them differ from the
 * unrounded average, so a DDP that ignored the hook would fail. */
static void check_hook_exact(ddp_comm_hook_kind hook, int bits, int emin)
{
    assert_int_equal(run_children(2, hook_grads_rank, &hook, 30), 0);
    const char *tag = hook == DDP_HOOK_FP16 ? "fp16" : "bf16";
    char what[32];
    float *l[2], *h[2];
    ddp_model_t *m;
    size_t n;
    assert_int_equal(make_model(HID, 0, &m), 0);
    ddp_model_param_block(m, &n);
    ddp_model_destroy(m);
    for (int r = 0; r < 2; r++) {
        snprintf(what, sizeof what, "%s-local", tag);
        l[r] = read_floats(what, r, n);
        snprintf(what, sizeof what, "%s-hooked", tag);
        h[r] = read_floats(what, r, n);
    }
    assert_memory_equal(h[0], h[1], n * sizeof *h[0]);
    size_t rounded = 0;
    for (size_t i = 0; i < n; i++) {
        float want = round_to(round_to(l[0][i] * 0.5f, bits, emin) +
                                  round_to(l[1][i] * 0.5f, bits, emin),
                              bits, emin);
        float avg = (l[0][i] + l[1][i]) * 0.5f;
        if (h[0][i] != want)
            fail_msg("%s: gradient %zu is %.9g, the hook's rounding gives %.9g (average %.9g)",
                     tag, i, (double)h[0][i], (double)want, (double)avg);
        rounded += want != avg;
    }
    if (rounded < n / 2)
        fail_msg("%s: only %zu of %zu averages change when rounded: the test cannot tell", tag,
                 rounded, n);
    for (int r = 0; r < 2; r++) {
        free(l[r]);
        free(h[r]);
    }
}

static void test_compression_hooks(void **state)
{
    (void)state;
    check_hook_exact(DDP_HOOK_FP16, 11, -14);
    check_hook_exact(DDP_HOOK_BF16, 8, -126);
    /* 20 steps with gradients rounded to fp16 (11 significant bits) or
     * bf16 (8 bits): measured 7e-5 and 2e-3 of the weights' scale; the
     * documented tolerances are 5e-4 and 5e-3 after 20 steps. */
    train_case h = {.world = 2, .cap_mb = 1.0 / 1024, .accumulate = 1, .hook = DDP_HOOK_FP16,
                    .tag = "fp16-train"};
    free(check_case(&h, 5e-4, NULL));
    train_case bf = {.world = 2, .cap_mb = 1.0 / 1024, .accumulate = 1, .hook = DDP_HOOK_BF16,
                     .tag = "bf16-train"};
    free(check_case(&bf, 5e-3, NULL));
}

static void test_user_comm_hook(void **state)
{
    (void)state;
    train_case c = {.world = 3, .cap_mb = 1.0 / 1024, .accumulate = 1, .tag = "user-hook",
                    .user_hook = 1};
    free(check_case(&c, 1e-5, NULL));
}

/* ==== tail-free overlap ==================================================== */

/* The chunked path (tail_chunks) against the unchunked one: bitwise the same
 * parameters after STEPS steps on every rank, and both within tolerance of
 * the single-process run.  The first layer is 150 (3 chunks of 48-row
 * units and a rest: 48, 48, 54 rows) or 400 wide (7 chunks); caps of 1 KiB
 * put every parameter in its own bucket (the layer's bias and weight in
 * different buckets), 25 MiB all in one; 20 KiB splits the model in two.
 * With 3 ranks the default choice runs pieces of the last bucket with other
 * algorithms than the whole bucket (ring vs recursive doubling), whose
 * per-element reduction orders differ (docs/algorithms.md): DDP_ALLREDUCE_ALGO
 * pins one algorithm there (direct, then rd), so any difference comes from
 * the chunked path itself. */
static void test_tail_chunks_bitwise(void **state)
{
    (void)state;
    const struct {
        int world, hidden, chunks;
        double cap_mb;
        const char *algo;
    } cases[] = {
        {2, 150, 3, 1.0 / 1024, NULL},  {2, 150, 3, 25, NULL},   {2, 400, 7, 20.0 / 1024, NULL},
        {3, 150, 3, 1.0 / 1024, "direct"}, {3, 400, 7, 25, "direct"}, {3, 150, 3, 20.0 / 1024, "rd"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char tag_on[32], tag_off[32];
        snprintf(tag_on, sizeof tag_on, "tail-on-%zu", k);
        snprintf(tag_off, sizeof tag_off, "tail-off-%zu", k);
        train_case on = {.world = cases[k].world, .cap_mb = cases[k].cap_mb, .accumulate = 1,
                         .tag = tag_on, .tail_chunks = cases[k].chunks,
                         .hidden = cases[k].hidden, .algo = cases[k].algo, .out = "on"};
        train_case off = on;
        off.tag = tag_off;
        off.tail_chunks = 0;
        off.out = "off";
        size_t n;
        float *pon = check_case(&on, 1e-5, &n), *poff = check_case(&off, 1e-5, NULL);
        if (memcmp(pon, poff, n * sizeof *pon) != 0)
            fail_msg("world %d, %d chunks, cap %g MiB: chunked parameters differ from unchunked "
                     "(relative %.3g)",
                     cases[k].world, cases[k].chunks, cases[k].cap_mb, rel_diff(pon, poff, n));
        free(pon);
        free(poff);
    }
}

/* The piece floor: 7 chunks asked of a 79 KB bucket become 2 with a floor of
 * 0.03 MiB (31 KB) and none with the default 1 MiB; both give the
 * unchunked parameters. */
static void test_tail_chunks_min_piece(void **state)
{
    (void)state;
    const double floors[] = {0.03, 1.0};
    const int chunks[] = {2, -1};
    for (int k = 0; k < 2; k++) {
        char tag[32];
        snprintf(tag, sizeof tag, "tail-floor-%d", k);
        train_case on = {.world = 2, .cap_mb = 25, .accumulate = 1, .tag = tag, .tail_chunks = 7,
                         .hidden = 400, .out = "floor"};
        on.min_piece_mb = floors[k];
        on.expect_chunks = chunks[k];
        size_t n;
        float *pon = check_case(&on, 1e-5, &n);
        train_case off = on;
        off.tail_chunks = 0;
        off.tag = k ? "tail-floor-off1" : "tail-floor-off0";
        off.out = "floor-off";
        float *poff = check_case(&off, 1e-5, NULL);
        assert_memory_equal(pon, poff, n * sizeof *pon);
        free(pon);
        free(poff);
    }
}

/* no_sync accumulation and the environment override with chunking on. */
static void test_tail_chunks_no_sync_env(void **state)
{
    (void)state;
    /* tail_chunks 0: the environment turns it on, and the spy must still
     * see chunks */
    train_case c = {.world = 2, .cap_mb = 25, .accumulate = 3, .tag = "tail-nosync",
                    .hidden = 400, .env_tail_chunks = "5"};
    free(check_case(&c, 1e-5, NULL));
}

/* ==== unused parameters, mismatches ======================================= */

static int unused_rank(int rank, void *arg)
{
    int find_unused = *(int *)arg;
    rank_kit k;
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    o.find_unused_parameters = find_unused;
    CHILD_CHECK(kit_open(&k, rank, 2, find_unused ? "unused-1" : "unused-0", 0, 1) == 0);
    CHILD_CHECK(ddp_data_parallel_create(k.m, k.pg, &o, &k.dm) == 0);
    for (int s = 0; s < 3; s++) {
        ddp_var_t *loss;
        CHILD_CHECK(forward_loss(k.dm, k.m, k.tape, (int64_t)(2 * s + rank) * B, B, &loss) == 0);
        int rc = ddp_data_parallel_backward(k.dm, k.tape, loss);
        if (find_unused) {
            CHILD_CHECK(rc == 0);
        } else {
            CHILD_CHECK(rc == DDP_ERR_STATE);
            CHILD_CHECK(strstr(ddp_last_error(), "parameters unused.weight received no gradient"));
            CHILD_CHECK(strstr(ddp_last_error(), "find_unused_parameters"));
        }
    }
    kit_close(&k);
    return 0;
}

static void test_unused_parameters(void **state)
{
    (void)state;
    int without = 0, with = 1;
    assert_int_equal(run_children(2, unused_rank, &without, 30), 0);
    assert_int_equal(run_children(2, unused_rank, &with, 30), 0);
}

static int mismatch_rank(int rank, void *arg)
{
    (void)arg;
    rank_kit k;
    CHILD_CHECK(kit_open(&k, rank, 3, "mismatch", rank == 2 ? 24 : HID, 0) == 0);
    CHILD_CHECK(ddp_data_parallel_create(k.m, k.pg, NULL, &k.dm) == DDP_ERR_MISMATCH);
    CHILD_CHECK(strstr(ddp_last_error(), "rank 2 differs from rank 0: parameter 0 is 0.weight "
                                         "(24, 16) on rank 2 but 0.weight (32, 16) on rank 0"));
    kit_close(&k);
    return 0;
}

static void test_mismatched_models(void **state)
{
    (void)state;
    assert_int_equal(run_children(3, mismatch_rank, NULL, 30), 0);
}

/* ==== bucket rebuild ===================================================== */

/* Parameters registered W1 (10, 4), W2 (12, 10), W3 (8, 12) but used in
 * the opposite order (logits = relu(relu(x W3) W2) W1): gradients become
 * ready W1, W2, W3, so the rebuild must reverse the initial buckets. */
static int reversed_model(ddp_model_t **out, ddp_param *w[3])
{
    const int64_t shapes[3][2] = {{10, 4}, {12, 10}, {8, 12}};
    ddp_model_t *m;
    DDP_TRY(ddp_model_create(&m));
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i + 1);
        DDP_TRY(ddp_model_add_param(m, name, 2, shapes[i], &w[i]));
    }
    DDP_TRY(ddp_model_seal(m));
    for (int i = 0; i < 3; i++)
        for (size_t k = 0; k < w[i]->numel; k++)
            w[i]->data[k] = (float)(0.3 * sin(1.7 * (double)k + i));
    *out = m;
    return 0;
}

static int reversed_step(ddp_data_parallel_t *dm, ddp_model_t *m, ddp_param *w[3], ddp_tape_t *tape,
                         int64_t first, int n)
{
    static float xs[64 * 8];
    static int64_t labels[64];
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 8; j++)
            xs[i * 8 + j] = (float)cos(0.21 * (double)(first + i) + 0.5 * j);
        labels[i] = (first + i) % 4;
    }
    ddp_tensor t;
    DDP_TRY(ddp_tensor_wrap(&t, xs, 2, (int64_t[]){n, 8}));
    ddp_tape_reset(tape);
    ddp_var_t *x, *v[3], *h, *loss;
    DDP_TRY(ddp_tape_input(tape, &t, 0, &x));
    for (int i = 0; i < 3; i++)
        DDP_TRY(ddp_tape_param(tape, w[i], &v[i]));
    DDP_TRY(ddp_op_matmul(tape, x, v[2], &h));
    DDP_TRY(ddp_op_relu(tape, h, &h));
    DDP_TRY(ddp_op_matmul(tape, h, v[1], &h));
    DDP_TRY(ddp_op_relu(tape, h, &h));
    DDP_TRY(ddp_op_matmul(tape, h, v[0], &h));
    DDP_TRY(ddp_op_cross_entropy(tape, h, labels, &loss));
    ddp_model_zero_grad(m);
    return dm ? ddp_data_parallel_backward(dm, tape, loss) : ddp_tape_backward(tape, loss, m);
}

static int rebuild_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    ddp_model_t *m;
    ddp_param *w[3];
    ddp_tape_t *tape;
    ddp_data_parallel_t *dm;
    ddp_optim_t *opt;
    ddp_sgd_options so = ddp_sgd_defaults(0.2);
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    o.bucket_cap_mb = o.first_bucket_cap_mb = 1e-9; /* one parameter per bucket */
    CHILD_CHECK(join_group(rank, 2, "rebuild", &pg) == 0);
    CHILD_CHECK(reversed_model(&m, w) == 0);
    CHILD_CHECK(ddp_tape_create(&tape) == 0);
    CHILD_CHECK(ddp_data_parallel_create(m, pg, &o, &dm) == 0);
    CHILD_CHECK(ddp_sgd_create(m, &so, &opt) == 0);
    size_t numel;
    CHILD_CHECK(ddp_data_parallel_bucket_info(dm, 0, NULL, &numel) == 0 && numel == 96); /* w3 */
    for (int s = 0; s < STEPS; s++) {
        CHILD_CHECK(reversed_step(dm, m, w, tape, (int64_t)(2 * s + rank) * B, B) == 0);
        CHILD_CHECK(ddp_optim_step(opt) == 0);
    }
    CHILD_CHECK(ddp_data_parallel_buckets_rebuilt(dm));
    CHILD_CHECK(ddp_data_parallel_bucket_info(dm, 0, NULL, &numel) == 0 && numel == 40); /* w1 */
    size_t n;
    const float *params = ddp_model_param_block(m, &n);
    CHILD_CHECK(write_floats("rebuild", rank, params, n) == 0);
    ddp_optim_destroy(opt);
    ddp_data_parallel_destroy(dm);
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_rebuild_from_ready_order(void **state)
{
    (void)state;
    assert_int_equal(run_children(2, rebuild_rank, NULL, 30), 0);
    ddp_model_t *m;
    ddp_param *w[3];
    ddp_tape_t *tape;
    ddp_optim_t *opt;
    ddp_sgd_options so = ddp_sgd_defaults(0.2);
    assert_int_equal(reversed_model(&m, w), 0);
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(ddp_sgd_create(m, &so, &opt), 0);
    for (int s = 0; s < STEPS; s++) {
        assert_int_equal(reversed_step(NULL, m, w, tape, (int64_t)2 * s * B, 2 * B), 0);
        assert_int_equal(ddp_optim_step(opt), 0);
    }
    size_t n;
    const float *ref = ddp_model_param_block(m, &n);
    float *p0 = read_floats("rebuild", 0, n), *p1 = read_floats("rebuild", 1, n);
    assert_memory_equal(p0, p1, n * sizeof *p0);
    double d = rel_diff(p0, ref, n);
    if (d > 1e-5)
        fail_msg("relative difference %.3g after the rebuild", d);
    free(p0);
    free(p1);
    ddp_optim_destroy(opt);
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
}

/* ==== misuse ============================================================== */

/* A plain ddp_tape_backward on a wrapped model is refused (its gradients would
 * not be averaged); destroy keeps gradient values and finishes nothing. */
static int misuse_rank(int rank, void *arg)
{
    (void)arg;
    rank_kit k;
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    o.comm_hook = DDP_HOOK_FP16;
    CHILD_CHECK(kit_open(&k, rank, 2, "misuse", 0, 0) == 0);
    CHILD_CHECK(ddp_data_parallel_create(k.m, k.pg, &o, &k.dm) == 0);
    ddp_var_t *loss;
    CHILD_CHECK(forward_loss(k.dm, k.m, k.tape, (int64_t)rank * B, B, &loss) == 0);
    CHILD_CHECK(ddp_tape_backward(k.tape, loss, k.m) == DDP_ERR_STATE);
    CHILD_CHECK(strstr(ddp_last_error(), "call ddp_data_parallel_backward, not ddp_tape_backward"));
    CHILD_CHECK(forward_loss(k.dm, k.m, k.tape, (int64_t)rank * B, B, &loss) == 0);
    CHILD_CHECK(ddp_data_parallel_backward(k.dm, k.tape, loss) == 0);
    ddp_model_zero_grad(k.m);
    ddp_data_parallel_destroy(k.dm);
    k.dm = NULL;
    size_t n;
    const float *g = ddp_model_grad_block(k.m, &n);
    for (size_t i = 0; i < n; i++)
        CHILD_CHECK(g[i] == 0.0f);
    kit_close(&k);
    return 0;
}

static void test_misuse_and_destroy(void **state)
{
    (void)state;
    assert_int_equal(run_children(2, misuse_rank, NULL, 30), 0);
}

/* no_sync left on across an optimizer step (the replicas diverge): the next
 * forward fails, saying what happened and what to do; so does a backward
 * after a plain model forward.  Accumulation (no_sync backwards, then a
 * synchronising one, then the step) goes on working after it. */
static int nosync_step_rank(int rank, void *arg)
{
    (void)arg;
    rank_kit k;
    ddp_sgd_options so = ddp_sgd_defaults(0.1);
    CHILD_CHECK(kit_open(&k, rank, 2, "nosync-step", 0, 0) == 0);
    CHILD_CHECK(ddp_data_parallel_create(k.m, k.pg, NULL, &k.dm) == 0);
    CHILD_CHECK(ddp_sgd_create(k.m, &so, &k.opt) == 0);
    ddp_var_t *loss;
    const char *what = "the parameters changed (ddp_optim_step?) after a backward under no_sync";
    for (int via_model = 0; via_model < 2; via_model++) {
        ddp_data_parallel_set_no_sync(k.dm, 1);
        CHILD_CHECK(forward_loss(k.dm, k.m, k.tape, (int64_t)rank * B, B, &loss) == 0);
        CHILD_CHECK(ddp_data_parallel_backward(k.dm, k.tape, loss) == 0);
        CHILD_CHECK(ddp_optim_step(k.opt) == 0); /* on this rank's gradients alone */
        ddp_optim_zero_grad(k.opt);
        int rc = forward_loss(via_model ? NULL : k.dm, k.m, k.tape, (int64_t)(2 + rank) * B, B,
                              &loss);
        if (via_model) { /* the plain forward knows nothing: backward notices */
            CHILD_CHECK(rc == 0);
            rc = ddp_data_parallel_backward(k.dm, k.tape, loss);
        }
        CHILD_CHECK(rc == DDP_ERR_STATE);
        CHILD_CHECK(strstr(ddp_last_error(), what));
        CHILD_CHECK(strstr(ddp_last_error(), "ddp_data_parallel_set_no_sync(dm, 0)) for the last "
                                             "backward before each optimizer step"));
    }
    /* Accumulation: two no_sync micro-batches, a synchronising one, the step. */
    for (int s = 0; s < 3; s++) {
        for (int a = 0; a < 3; a++) {
            int64_t first = (int64_t)(6 * s + 2 * a + rank) * B;
            ddp_data_parallel_set_no_sync(k.dm, a < 2);
            CHILD_CHECK(forward_loss(k.dm, k.m, k.tape, first, B, &loss) == 0);
            CHILD_CHECK(ddp_data_parallel_backward(k.dm, k.tape, loss) == 0);
        }
        CHILD_CHECK(ddp_optim_step(k.opt) == 0);
        ddp_optim_zero_grad(k.opt);
    }
    kit_close(&k);
    return 0;
}

static void test_no_sync_step(void **state)
{
    (void)state;
    assert_int_equal(run_children(2, nosync_step_rank, NULL, 30), 0);
}

/* Teardown in either order (PyTorch's DDP holds its ProcessGroup): the
 * group destroyed first stays whole for the wrapper, which reduces one more
 * step over it and tears it down in its own destroy; under ASan a freed
 * group would be a use after free. */
static int teardown_order_rank(int rank, void *arg)
{
    (void)arg;
    rank_kit k;
    CHILD_CHECK(kit_open(&k, rank, 2, "teardown", 0, 0) == 0);
    CHILD_CHECK(ddp_data_parallel_create(k.m, k.pg, NULL, &k.dm) == 0);
    ddp_var_t *loss;
    CHILD_CHECK(forward_loss(k.dm, k.m, k.tape, (int64_t)rank * B, B, &loss) == 0);
    CHILD_CHECK(ddp_data_parallel_backward(k.dm, k.tape, loss) == 0);
    ddp_destroy_process_group(k.pg); /* before the wrapper */
    k.pg = NULL;
    ddp_model_zero_grad(k.m);
    CHILD_CHECK(forward_loss(k.dm, k.m, k.tape, (int64_t)(2 + rank) * B, B, &loss) == 0);
    CHILD_CHECK(ddp_data_parallel_backward(k.dm, k.tape, loss) == 0);
    ddp_data_parallel_destroy(k.dm); /* tears the group down; the gradients stay */
    k.dm = NULL;
    size_t n;
    const float *g = ddp_model_grad_block(k.m, &n);
    CHILD_CHECK(write_floats("teardown", rank, g, n) == 0);
    kit_close(&k);
    return 0;
}

static void test_teardown_order(void **state)
{
    (void)state;
    assert_int_equal(run_children(2, teardown_order_rank, NULL, 30), 0);
    ddp_model_t *m;
    size_t n;
    assert_int_equal(make_model(HID, 0, &m), 0);
    ddp_model_param_block(m, &n);
    ddp_model_destroy(m);
    float *g0 = read_floats("teardown", 0, n), *g1 = read_floats("teardown", 1, n);
    assert_memory_equal(g0, g1, n * sizeof *g0); /* averaged after the group's destroy */
    free(g0);
    free(g1);
}

static int options_mismatch_rank(int rank, void *arg)
{
    (void)arg;
    rank_kit k;
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    if (rank == 1)
        o.comm_hook = DDP_HOOK_BF16;
    CHILD_CHECK(kit_open(&k, rank, 2, "optmismatch", 0, 0) == 0);
    CHILD_CHECK(ddp_data_parallel_create(k.m, k.pg, &o, &k.dm) == DDP_ERR_MISMATCH);
    CHILD_CHECK(strstr(ddp_last_error(), "rank 1 differs from rank 0: options "));
    CHILD_CHECK(strstr(ddp_last_error(),
                       "comm_hook 2, tail_chunks 0, tail_min_piece_mb 1 on rank 1 but"));
    kit_close(&k);
    return 0;
}

static void test_mismatched_options(void **state)
{
    (void)state;
    assert_int_equal(run_children(2, options_mismatch_rank, NULL, 30), 0);
}

/* ==== join, dead peers ==================================================== */

/* A join run: rank r has 4 + 3 r micro-batches; every rank ends with the
 * same parameters, written under tag. */
typedef struct {
    const char *tag;
    int hidden;     /* first layer's width (0: HID) */
    int tail;       /* tail_chunks (150-wide first layer: 3 chunks of 48, 48, 54 rows) */
    /* Reduce in pairs: no_sync on the even micro-batches, on every rank
     * (rank 1's last is left accumulated when it joins); the joined ranks
     * must shadow only the reducing iterations, or the group hangs on
     * mismatched all-reduces until its timeout. */
    int accumulate;
} join_case;

static int join_rank(int rank, void *arg)
{
    const join_case *c = arg;
    rank_kit k;
    ddp_sgd_options so = ddp_sgd_defaults(0.1);
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    o.bucket_cap_mb = o.first_bucket_cap_mb = 1.0 / 1024;
    o.tail_chunks = c->tail;
    o.tail_min_piece_mb = 0; /* the 150-wide model's bucket is tiny */
    CHILD_CHECK(kit_open(&k, rank, 3, c->tag, c->hidden, 0) == 0);
    CHILD_CHECK(ddp_data_parallel_create(k.m, k.pg, &o, &k.dm) == 0);
    CHILD_CHECK(ddp_sgd_create(k.m, &so, &k.opt) == 0);
    CHILD_CHECK(ddp_data_parallel_join_enable(k.dm, 1, 0) == 0);
    chunk_spy spy = {0};
    if (c->tail) {
        spy.inner = *ddp_model_grad_chunk_hook(k.m);
        ddp_model_set_grad_chunk_hook(k.m, &(ddp_grad_chunk_hook){spy_plan, spy_chunk, &spy});
    }
    size_t n;
    const float *p0 = ddp_model_param_block(k.m, &n);
    float *start = malloc(n * sizeof *start);
    CHILD_CHECK(start != NULL);
    memcpy(start, p0, n * sizeof *start);
    int syncs = 0;
    ddp_optim_zero_grad(k.opt);
    for (int s = 0; s < 4 + 3 * rank; s++) {
        int hold = c->accumulate && s % 2 == 0; /* the same pattern on every rank */
        ddp_var_t *loss;
        ddp_data_parallel_set_no_sync(k.dm, hold);
        CHILD_CHECK(forward_loss(k.dm, k.m, k.tape, (int64_t)(3 * s + rank) * B, B, &loss) == 0);
        CHILD_CHECK(ddp_data_parallel_backward(k.dm, k.tape, loss) == 0);
        if (!hold) {
            CHILD_CHECK(ddp_optim_step(k.opt) == 0);
            ddp_optim_zero_grad(k.opt);
            syncs++;
        }
    }
    /* every synchronising step of this rank computed its 3 chunks */
    CHILD_CHECK(!spy.bad && spy.chunks == (c->tail ? 3 * syncs : 0));
    ddp_data_parallel_set_no_sync(k.dm, 0);
    CHILD_CHECK(ddp_data_parallel_join(k.dm) == 0);
    const float *params = ddp_model_param_block(k.m, &n);
    CHILD_CHECK(memcmp(params, start, n * sizeof *start) != 0); /* it trained */
    CHILD_CHECK(write_floats(c->tag, rank, params, n) == 0);
    free(start);
    kit_close(&k);
    return 0;
}

/* Every rank of a join run ended with the same parameters; returns rank 0's. */
static float *join_result(const char *tag, int hidden, size_t *n)
{
    ddp_model_t *m;
    assert_int_equal(make_model(hidden, 0, &m), 0);
    ddp_model_param_block(m, n);
    float *p0 = read_floats(tag, 0, *n);
    for (int r = 1; r < 3; r++) {
        float *pr = read_floats(tag, r, *n);
        assert_memory_equal(p0, pr, *n * sizeof *p0);
        free(pr);
    }
    ddp_model_destroy(m);
    return p0;
}

static void test_join_uneven_inputs(void **state)
{
    (void)state;
    size_t n;
    join_case plain = {"join", 0, 0, 0};
    assert_int_equal(run_children(3, join_rank, &plain, 30), 0);
    free(join_result("join", HID, &n));
    /* With tail_chunks the joined ranks shadow the pieces of the last bucket
     * (1 KiB caps: the first layer's weight alone, 9.6 KB, reduced by
     * recursive doubling whole or in pieces): bitwise the unchunked run. */
    join_case off = {"join-tail-0", 150, 0, 0}, on = {"join-tail-3", 150, 3, 0};
    assert_int_equal(run_children(3, join_rank, &off, 30), 0);
    assert_int_equal(run_children(3, join_rank, &on, 30), 0);
    float *poff = join_result("join-tail-0", 150, &n), *pon = join_result("join-tail-3", 150, &n);
    assert_memory_equal(poff, pon, n * sizeof *pon);
    free(poff);
    free(pon);
    /* With no_sync micro-batches: no hang, identical replicas. */
    join_case nosync = {"join-nosync", 0, 0, 1};
    assert_int_equal(run_children(3, join_rank, &nosync, 30), 0);
    free(join_result("join-nosync", HID, &n));
}

/* Rank 1 dies (SIGKILL) after two steps; rank 0's next backward fails fast,
 * naming it. */
static int dead_peer_rank(int rank, void *arg)
{
    (void)arg;
    rank_kit k;
    CHILD_CHECK(kit_open(&k, rank, 2, "dead", 0, 0) == 0);
    CHILD_CHECK(ddp_data_parallel_create(k.m, k.pg, NULL, &k.dm) == 0);
    for (int s = 0;; s++) {
        ddp_var_t *loss;
        if (rank == 1 && s == 2)
            raise(SIGKILL);
        CHILD_CHECK(forward_loss(k.dm, k.m, k.tape, (int64_t)s * B, B, &loss) == 0);
        double t0 = ddp_time_now();
        int rc = ddp_data_parallel_backward(k.dm, k.tape, loss);
        if (rc < 0) {
            CHILD_CHECK(s == 2);
            CHILD_CHECK(ddp_time_now() - t0 < 2.0);
            CHILD_CHECK(strstr(ddp_last_error(), "rank 1"));
            break;
        }
    }
    kit_close(&k);
    return 0;
}

static void test_dead_peer(void **state)
{
    (void)state;
    /* Rank 1 is killed on purpose: only rank 0 reports success. */
    assert_int_equal(run_children(2, dead_peer_rank, NULL, 30), 1);
}

static void test_bad_options(void **state)
{
    (void)state;
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    o.bucket_cap_mb = 0;
    ddp_data_parallel_t *dm;
    ddp_model_t *m;
    assert_int_equal(make_model(HID, 0, &m), 0);
    assert_int_equal(ddp_data_parallel_create(m, (ddp_pg_t *)m, &o, &dm), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "bucket caps must be > 0 MiB"));
    o = ddp_data_parallel_defaults();
    o.tail_chunks = -1;
    assert_int_equal(ddp_data_parallel_create(m, (ddp_pg_t *)m, &o, &dm), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "tail_chunks -1 out of range (0 = off, at most"));
    setenv("DDP_TAIL_CHUNKS", "3x", 1);
    assert_int_equal(ddp_data_parallel_create(m, (ddp_pg_t *)m, NULL, &dm), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "DDP_TAIL_CHUNKS=3x: expected an integer from 0 to 1024"));
    unsetenv("DDP_TAIL_CHUNKS");
    o = ddp_data_parallel_defaults();
    o.tail_min_piece_mb = -1;
    assert_int_equal(ddp_data_parallel_create(m, (ddp_pg_t *)m, &o, &dm), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "tail_min_piece_mb -1 out of range"));
    ddp_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_equivalence, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_deterministic, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_no_sync_accumulation, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_compression_hooks, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_user_comm_hook, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_unused_parameters, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_mismatched_models, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_rebuild_from_ready_order, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_misuse_and_destroy, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_teardown_order, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_no_sync_step, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_mismatched_options, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_join_uneven_inputs, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_tail_chunks_bitwise, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_tail_chunks_no_sync_env, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_tail_chunks_min_piece, setup_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_dead_peer, setup_dir, remove_dir),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
