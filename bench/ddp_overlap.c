/* DDP overlap benchmark: per-step time of compute only, communication only,
 * and the DDP step with and without tail-free overlap, for an MLP
 * 784-H-H-10 (H = 2048 by default; --layers 1: 784-H-10, the reference
 * program's shape with H = 256).
 *
 *   build/bin/ddprun --standalone --nproc-per-node 2 build/bench/ddp_overlap \
 *       [--hidden H] [--batch B] [--iters N] [--cap-mb C] [--tail-chunks K] [--rounds R]
 *       [--layers 1|2] [--min-piece-mb F]
 *
 * compute: forward + backward + SGD step on the local model, no DDP.
 * comm:    the all-reduces DDP issues per step (one per bucket, same sizes),
 *          launched back to back and waited for, with no compute.
 * ddp:     the DDP step (buckets reduced during backward), tail_chunks 0.
 * tail:    the same with tail_chunks K (default 4): the first layer's weight
 *          gradient computed in row chunks, its bucket reduced piece by piece
 *          (tail_min_piece_mb F: the library's default unless given).
 * Each of R rounds (default 3) runs N steps of each of the four, so that
 * the machine's noise falls on all alike.  Rank 0 prints the medians (each
 * the slowest rank's: ranks on a shared machine run at different speeds
 * for seconds at a time, and a DDP step waits for the slowest) and
 * step / max(compute, comm); the target is <= 1.1 (perfect overlap is 1.0;
 * no overlap is (compute + comm) / max), and tail/ddp.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"
#include "ddp/ext.h"

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

/* 784-H-10 (layers 1: the reference program's shape) or 784-H-H-10. */
static ddp_model_t *make_model(int hidden, int layers)
{
    ddp_module_t *mods[5];
    int n = 0;
    check(ddp_linear_create(IN, hidden, 1, 1, &mods[n++]), "linear");
    check(ddp_relu_create(&mods[n++]), "relu");
    if (layers == 2) {
        check(ddp_linear_create(hidden, hidden, 1, 2, &mods[n++]), "linear");
        check(ddp_relu_create(&mods[n++]), "relu");
    }
    check(ddp_linear_create(hidden, OUT, 1, 3, &mods[n++]), "linear");
    ddp_module_t *seq;
    check(ddp_sequential_create(mods, n, &seq), "sequential");
    ddp_model_t *m;
    check(ddp_model_from_module(seq, &m), "model");
    return m;
}

/* One training step; dm NULL: local only. */
static void step(ddp_data_parallel_t *dm, ddp_model_t *m, ddp_tape_t *tape, ddp_optim_t *opt,
                 const ddp_tensor *x, const int64_t *labels)
{
    ddp_var_t *in, *y, *loss;
    ddp_tape_reset(tape);
    check(ddp_tape_input(tape, x, 0, &in), "input");
    if (dm)
        check(ddp_data_parallel_forward(dm, tape, in, &y), "forward");
    else
        check(ddp_model_forward(m, tape, in, &y), "forward");
    check(ddp_op_cross_entropy(tape, y, labels, &loss), "loss");
    ddp_optim_zero_grad(opt);
    if (dm)
        check(ddp_data_parallel_backward(dm, tape, loss), "backward");
    else
        check(ddp_tape_backward(tape, loss, m), "backward");
    check(ddp_optim_step(opt), "step");
}

int main(int argc, char **argv)
{
    int hidden = 2048, batch = 64, iters = 20, tail_chunks = 4, rounds = 3, layers = 2;
    double cap_mb = 25, min_piece_mb = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--hidden"))
            hidden = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch"))
            batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cap-mb"))
            cap_mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--tail-chunks"))
            tail_chunks = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers"))
            layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--min-piece-mb"))
            min_piece_mb = atof(argv[i + 1]);
        else {
            fprintf(stderr, "usage: ddp_overlap [--hidden H] [--batch B] [--iters N] "
                            "[--cap-mb C] [--tail-chunks K] [--rounds R] [--layers 1|2] "
                            "[--min-piece-mb F]\n");
            return 2;
        }
    }
    if (hidden < 1 || batch < 1 || iters < 1 || iters > 10000 || !(cap_mb > 0) ||
        tail_chunks < 2 || rounds < 1 || rounds > 1000 || (layers != 1 && layers != 2)) {
        fprintf(stderr, "ddp_overlap: bad arguments\n");
        return 2;
    }
    ddp_launch_info li;
    check(ddp_launch_info_from_env(&li), "launcher environment");
    ddp_pg_t *pg;
    check(ddp_init_process_group("tcp", "env://", li.rank, li.world_size, 60, &pg), "init");

    ddp_model_t *m = make_model(hidden, layers);
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
    size_t nt = (size_t)iters * (size_t)rounds;
    double *t_comp = calloc(nt, sizeof(double)), *t_comm = calloc(nt, sizeof(double));
    double *t_ddp = calloc(nt, sizeof(double)), *t_tail = calloc(nt, sizeof(double));
    size_t total;
    ddp_model_grad_block(m, &total);
    float *buf; /* like DDP's buckets, so "comm" runs DDP's all-reduce path */
    check(ddp_pg_symmetric_alloc(pg, total * sizeof *buf, (void **)&buf), "symmetric alloc");
    size_t *bucket_numel = NULL;
    ddp_work_t **works = NULL;
    int nb = 0;

    /* Each round: compute only, DDP, DDP with tail chunks, communication
     * only, so that the machine's noise falls on all four alike. */
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    o.bucket_cap_mb = cap_mb;
    if (min_piece_mb >= 0)
        o.tail_min_piece_mb = min_piece_mb;
    ddp_data_parallel_t *dm = NULL;
    for (int r = 0; r < rounds; r++) {
        size_t at = (size_t)r * (size_t)iters;
        /* Compute only (warm-up first: the tape's arena settles). */
        for (int i = -3; i < iters; i++) {
            double t0 = ddp_time_now();
            step(NULL, m, tape, opt, &x, labels);
            if (i >= 0)
                t_comp[at + (size_t)i] = ddp_time_now() - t0;
        }
        for (int tail = 0; tail < 2; tail++) {
            double *t = (tail ? t_tail : t_ddp) + at;
            o.tail_chunks = tail ? tail_chunks : 0;
            check(ddp_data_parallel_create(m, pg, &o, &dm), "ddp");
            for (int i = -3; i < iters; i++) { /* the warm-up includes the bucket rebuild */
                check(ddp_pg_barrier(pg), "barrier");
                double t0 = ddp_time_now();
                step(dm, m, tape, opt, &x, labels);
                if (i >= 0)
                    t[i] = ddp_time_now() - t0;
            }
            if (!bucket_numel) {
                nb = ddp_data_parallel_num_buckets(dm);
                bucket_numel = calloc((size_t)nb, sizeof *bucket_numel);
                works = calloc((size_t)nb, sizeof *works);
                for (int k = 0; k < nb; k++)
                    check(ddp_data_parallel_bucket_info(dm, k, NULL, &bucket_numel[k]), "bucket");
            }
            ddp_data_parallel_destroy(dm);
        }
        /* Communication only: DDP's bucket sizes, launched back to back. */
        for (int i = -3; i < iters; i++) {
            check(ddp_pg_barrier(pg), "barrier");
            double t0 = ddp_time_now();
            size_t off = 0;
            for (int k = 0; k < nb; k++) {
                check(ddp_pg_all_reduce_async(pg, buf + off, bucket_numel[k], DDP_FLOAT32, DDP_AVG,
                                           &works[k]),
                      "all_reduce");
                off += bucket_numel[k];
            }
            for (int k = 0; k < nb; k++) {
                check(ddp_work_wait(works[k], -1), "wait");
                ddp_work_destroy(works[k]);
            }
            if (i >= 0)
                t_comm[at + (size_t)i] = ddp_time_now() - t0;
        }
    }

    /* Each figure is the slowest rank's median: a synchronised step can
     * be no faster than the slowest rank's compute. */
    double med[4] = {median(t_comp, (int)nt), median(t_comm, (int)nt), median(t_ddp, (int)nt),
                     median(t_tail, (int)nt)};
    check(ddp_pg_all_reduce(pg, med, 4, DDP_FLOAT64, DDP_MAX), "all_reduce of the medians");
    double comp = med[0], comm = med[1], dstep = med[2], tstep = med[3];
    double roof = comp > comm ? comp : comm;
    if (li.rank == 0) {
        char desc[64];
        snprintf(desc, sizeof desc, layers == 2 ? "784-%d-%d-10" : "784-%d-10", hidden, hidden);
        printf("model %s, %zu params (%.1f MB), batch %d per rank, %d ranks, %d buckets\n", desc,
               total, (double)total * 4 / 1e6, batch, li.world_size, nb);
        printf("compute %.2f ms  comm %.2f ms  ddp %.2f ms  ddp/max %.3f  "
               "(no overlap would be %.3f)\n",
               comp * 1e3, comm * 1e3, dstep * 1e3, dstep / roof, (comp + comm) / roof);
        printf("tail_chunks %d: %.2f ms  tail/max %.3f  tail/ddp %.3f\n", tail_chunks,
               tstep * 1e3, tstep / roof, tstep / dstep);
    }
    free(works);
    free(bucket_numel);
    ddp_pg_symmetric_free(pg, buf);
    free(t_comp);
    free(t_comm);
    free(t_ddp);
    free(t_tail);
    free(xs);
    free(labels);
    ddp_optim_destroy(opt);
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    return 0;
}
