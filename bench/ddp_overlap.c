/* DDP overlap benchmark: per-step time of compute only, communication only,
 * and the DDP step, for an MLP 784-H-H-10 (H = 2048 by default).
 *
 *   build/bin/ddprun --standalone --nproc-per-node 2 build/bench/ddp_overlap \
 *       [--hidden H] [--batch B] [--iters N] [--cap-mb C]
 *
 * compute: forward + backward + SGD step on the local model, no DDP.
 * comm:    the all-reduces DDP issues per step (one per bucket, same sizes),
 *          launched back to back and waited for, with no compute.
 * ddp:     the DDP step (buckets reduced during backward).
 * Rank 0 prints the medians and ddp / max(compute, comm); the target is
 * <= 1.1 (perfect overlap is 1.0; no overlap is (compute + comm) / max).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"

#define IN 784
#define OUT 10

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int check(int rc, const char *what)
{
    if (rc < 0) {
        fprintf(stderr, "ddp_overlap: %s: %s\n", what, ddp_last_error());
        exit(1);
    }
    return rc;
}

static ddp_model_t *make_model(int hidden)
{
    ddp_module_t *mods[5];
    check(ddp_linear_create(IN, hidden, 1, 1, &mods[0]), "linear");
    check(ddp_relu_create(&mods[1]), "relu");
    check(ddp_linear_create(hidden, hidden, 1, 2, &mods[2]), "linear");
    check(ddp_relu_create(&mods[3]), "relu");
    check(ddp_linear_create(hidden, OUT, 1, 3, &mods[4]), "linear");
    ddp_module_t *seq;
    check(ddp_sequential_create(mods, 5, &seq), "sequential");
    ddp_model_t *m;
    check(ddp_model_from_module(seq, &m), "model");
    return m;
}

/* One training step; dm NULL: local only. */
static void step(ddp_ddp_t *dm, ddp_model_t *m, ddp_tape_t *tape, ddp_optim_t *opt,
                 const ddp_tensor *x, const int64_t *labels)
{
    ddp_var_t *in, *y, *loss;
    ddp_tape_reset(tape);
    check(ddp_tape_input(tape, x, 0, &in), "input");
    if (dm)
        check(ddp_ddp_forward(dm, tape, in, &y), "forward");
    else
        check(ddp_model_forward(m, tape, in, &y), "forward");
    check(ddp_op_cross_entropy(tape, y, labels, &loss), "loss");
    ddp_optim_zero_grad(opt);
    if (dm)
        check(ddp_ddp_backward(dm, tape, loss), "backward");
    else
        check(ddp_backward(tape, loss, m), "backward");
    check(ddp_optim_step(opt), "step");
}

int main(int argc, char **argv)
{
    int hidden = 2048, batch = 64, iters = 20;
    double cap_mb = 25;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--hidden"))
            hidden = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch"))
            batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cap-mb"))
            cap_mb = atof(argv[i + 1]);
        else {
            fprintf(stderr, "usage: ddp_overlap [--hidden H] [--batch B] [--iters N] [--cap-mb C]\n");
            return 2;
        }
    }
    if (hidden < 1 || batch < 1 || iters < 1 || iters > 10000 || !(cap_mb > 0)) {
        fprintf(stderr, "ddp_overlap: bad arguments\n");
        return 2;
    }
    ddp_launch_info li;
    check(ddp_launch_info_from_env(&li), "launcher environment");
    ddp_pg_t *pg;
    check(ddp_init_process_group("tcp", "env://", li.rank, li.world_size, 60, &pg), "init");

    ddp_model_t *m = make_model(hidden);
    ddp_tape_t *tape;
    check(ddp_tape_create(&tape), "tape");
    ddp_optim_t *opt;
    ddp_sgd_options so = ddp_sgd_defaults(0.01);
    check(ddp_sgd_create(m, &so, &opt), "sgd");
    float *xs = malloc((size_t)batch * IN * sizeof *xs);
    int64_t *labels = malloc((size_t)batch * sizeof *labels);
    for (int i = 0; i < batch * IN; i++)
        xs[i] = (float)sin(0.01 * i + li.rank);
    for (int i = 0; i < batch; i++)
        labels[i] = i % OUT;
    ddp_tensor x;
    int64_t shape[2] = {batch, IN};
    check(ddp_tensor_wrap(&x, xs, 2, shape), "wrap");
    double *t_comp = calloc((size_t)iters, sizeof(double));
    double *t_comm = calloc((size_t)iters, sizeof(double));
    double *t_ddp = calloc((size_t)iters, sizeof(double));

    /* Compute only (warm-up first: the tape's arena settles). */
    for (int i = 0; i < 3; i++)
        step(NULL, m, tape, opt, &x, labels);
    for (int i = 0; i < iters; i++) {
        double t0 = ddp_time_now();
        step(NULL, m, tape, opt, &x, labels);
        t_comp[i] = ddp_time_now() - t0;
    }

    ddp_ddp_options o = ddp_ddp_defaults();
    o.bucket_cap_mb = cap_mb;
    ddp_ddp_t *dm;
    check(ddp_ddp_create(m, pg, &o, &dm), "ddp");
    for (int i = 0; i < 3; i++) /* includes the bucket rebuild */
        step(dm, m, tape, opt, &x, labels);
    for (int i = 0; i < iters; i++) {
        check(ddp_barrier(pg), "barrier");
        double t0 = ddp_time_now();
        step(dm, m, tape, opt, &x, labels);
        t_ddp[i] = ddp_time_now() - t0;
    }

    /* Communication only: DDP's bucket sizes, launched back to back. */
    int nb = ddp_ddp_num_buckets(dm);
    size_t total;
    ddp_model_grad_block(m, &total);
    ddp_work_t **works = calloc((size_t)nb, sizeof *works);
    float *buf = calloc(total, sizeof *buf);
    for (int i = -3; i < iters; i++) {
        check(ddp_barrier(pg), "barrier");
        double t0 = ddp_time_now();
        size_t off = 0;
        for (int b = 0; b < nb; b++) {
            size_t n;
            check(ddp_ddp_bucket_info(dm, b, NULL, &n), "bucket");
            check(ddp_all_reduce_async(pg, buf + off, n, DDP_FLOAT32, DDP_AVG, &works[b]),
                  "all_reduce");
            off += n;
        }
        for (int b = 0; b < nb; b++) {
            check(ddp_work_wait(works[b], -1), "wait");
            ddp_work_free(works[b]);
        }
        if (i >= 0)
            t_comm[i] = ddp_time_now() - t0;
    }

    double comp = median(t_comp, iters), comm = median(t_comm, iters);
    double dstep = median(t_ddp, iters), roof = comp > comm ? comp : comm;
    if (li.rank == 0) {
        printf("model 784-%d-%d-10, %zu params (%.1f MB), batch %d per rank, %d ranks, %d buckets\n",
               hidden, hidden, total, (double)total * 4 / 1e6, batch, li.world_size, nb);
        printf("compute %.2f ms  comm %.2f ms  ddp %.2f ms  ddp/max %.3f  "
               "(no overlap would be %.3f)\n",
               comp * 1e3, comm * 1e3, dstep * 1e3, dstep / roof, (comp + comm) / roof);
    }
    free(works);
    free(buf);
    free(t_comp);
    free(t_comm);
    free(t_ddp);
    free(xs);
    free(labels);
    ddp_ddp_destroy(dm);
    ddp_optim_destroy(opt);
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
    ddp_pg_destroy(pg);
    return 0;
}
