/* Pipeline bubble benchmark: the idle share of each stage against the
 * schedule's theory (S - 1) / (M + S - 1), for GPipe and 1F1B, and the
 * cost of the shape header sent before every activation and gradient.
 *
 *   build/bench/pipeline_bubble [--stages S] [--micro 1,2,4,8,16] [--width H]
 *       [--batch B] [--steps N] [--rounds R]
 *
 * Forks S processes (one replica of an S-stage pipeline over a file://
 * store); each stage is Linear(H,H), ReLU, Linear(H,H), ReLU (the last ends
 * with cross-entropy over H classes), so stages take equal time.  In each
 * of R rounds every (schedule, M) pair runs N steps, the pairs alternated
 * so that the machine's load falls on all alike.  A stage's bubble is its
 * own timeline's idle / (busy + idle) (ddp_pipeline_times: busy = forward
 * and backward compute, idle = waiting to receive), averaged over the
 * stages; the medians over the rounds are printed with their spread.
 * Measured per stage, the figure stays meaningful when S processes share
 * fewer cores (4 stages on 2 vCPUs): a stage that waits sleeps, and what it
 * waits for is the schedule, plus the others' compute stretched by sharing.
 *
 * Header cost: ranks 0 and 1 bounce one activation (B/M_max rows x H
 * floats) back and forth with and without the 128-byte header message,
 * alternated, and print the median microseconds per one-way transfer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp.h"
#include "ddp/pipeline.h"

#define MAXM 16
#define MAXROUNDS 64

typedef struct cfg {
    int S, nm, m[MAXM], H, B, steps, rounds;
    char url[256];
} cfg;

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

static int stage_model(const cfg *c, int stage, ddp_model_t **out)
{
    ddp_model_t *m;
    if (ddp_model_create(&m) < 0)
        return -1;
    for (int i = 0; i < 4; i++) {
        ddp_module_t *mod;
        char name[32];
        snprintf(name, sizeof name, "%d", stage * 4 + i);
        int rc = i % 2 ? ddp_relu_create(&mod)
                       : ddp_linear_create(c->H, c->H, 1, (uint64_t)(stage * 4 + i), &mod);
        if (rc < 0 || ddp_model_add_module(m, name, mod) < 0)
            return -1;
    }
    *out = m;
    return ddp_model_seal(m);
}

/* Runs N steps of pp; this stage's bubble over them. */
static int measure(const cfg *c, ddp_pipeline_t *pp, ddp_optim_t *opt, const ddp_tensor *x,
                   const int64_t *labels, double *bubble)
{
    float loss;
    ddp_optim_zero_grad(opt); /* one step of warm-up: arenas, first touches */
    if (ddp_pipeline_step(pp, x, labels, c->B, &loss) < 0)
        return -1;
    ddp_pipeline_reset_times(pp);
    for (int t = 0; t < c->steps; t++) {
        ddp_optim_zero_grad(opt);
        if (ddp_pipeline_step(pp, x, labels, c->B, &loss) < 0 || ddp_optim_step(opt) < 0)
            return -1;
    }
    double busy, idle;
    ddp_pipeline_times(pp, &busy, &idle);
    *bubble = idle / (busy + idle);
    return 0;
}

/* Median us per one-way transfer of n floats (with the header first when
 * hdr), over 200 round trips between ranks 0 and 1. */
static double bounce(ddp_pg_t *pg, float *buf, size_t n, int hdr)
{
    int64_t h[16] = {0};
    int me = ddp_pg_rank(pg), peer = 1 - me;
    double t[200];
    for (int i = 0; i < 200; i++) {
        double t0 = ddp_time_now();
        for (int k = 0; k < 2; k++) {
            if (k == me) {
                if (hdr)
                    ddp_pg_send(pg, h, 16, DDP_INT64, peer, 0);
                ddp_pg_send(pg, buf, n, DDP_FLOAT32, peer, 1);
            } else {
                if (hdr)
                    ddp_pg_recv(pg, h, 16, DDP_INT64, peer, 0);
                ddp_pg_recv(pg, buf, n, DDP_FLOAT32, peer, 1);
            }
        }
        t[i] = (ddp_time_now() - t0) * 0.5e6;
    }
    return median(t, 200);
}

static void header_cost(const cfg *c, ddp_pg_t *world)
{
    int r = ddp_pg_rank(world);
    int ranks[2] = {0, 1};
    ddp_pg_t *pair = NULL;
    if (ddp_pg_new_group(world, ranks, 2, &pair) < 0 || !pair)
        return;
    size_t n = (size_t)(c->B / c->m[c->nm - 1]) * (size_t)c->H;
    float *buf = calloc(n, sizeof *buf);
    double with[MAXROUNDS], without[MAXROUNDS];
    for (int k = 0; k < c->rounds && buf; k++) {
        without[k] = bounce(pair, buf, n, 0);
        with[k] = bounce(pair, buf, n, 1);
    }
    if (r == 0 && buf) {
        double w = median(with, c->rounds), wo = median(without, c->rounds);
        printf("header cost, %zu floats per transfer: %.1f us with the header, %.1f us "
               "without, +%.1f us (%.0f %%)\n", n, w, wo, w - wo, 100.0 * (w - wo) / wo);
    }
    free(buf);
    ddp_destroy_process_group(pair);
}

static int run_stage(const cfg *c, int rank)
{
    ddp_pg_t *world;
    if (ddp_init_process_group("tcp", c->url, rank, c->S, 120, &world) < 0)
        return 1;
    ddp_model_t *model;
    ddp_optim_t *opt;
    ddp_sgd_options so = ddp_sgd_defaults(0.01);
    if (stage_model(c, rank, &model) < 0 || ddp_sgd_create(model, &so, &opt) < 0)
        return 1;
    ddp_pipeline_t *pp[2][MAXM];
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < c->nm; i++) {
            ddp_pipeline_options o = ddp_pipeline_defaults(c->S, c->m[i]);
            o.schedule = s ? DDP_SCHEDULE_1F1B : DDP_SCHEDULE_GPIPE;
            o.input_ndim = 1;
            o.input_shape[0] = c->H;
            if (ddp_pipeline_create(world, model, &o, &pp[s][i]) < 0)
                return fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error()), 1;
        }
    float *x = calloc((size_t)c->B * (size_t)c->H, sizeof *x);
    int64_t *labels = calloc((size_t)c->B, sizeof *labels);
    for (int64_t i = 0; i < (int64_t)c->B * c->H; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int i = 0; i < c->B; i++)
        labels[i] = i % c->H;
    ddp_tensor xt;
    ddp_tensor_wrap(&xt, x, 2, (int64_t[]){c->B, c->H});
    static double got[2][MAXM][MAXROUNDS];
    for (int k = 0; k < c->rounds; k++)
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < c->nm; i++) {
                double b, all[64];
                if (measure(c, pp[s][i], opt, &xt, labels, &b) < 0 ||
                    ddp_pg_all_gather(world, &b, all, 1, DDP_FLOAT64) < 0)
                    return fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error()), 1;
                double mean = 0;
                for (int r = 0; r < c->S; r++)
                    mean += all[r] / c->S;
                got[s][i][k] = mean;
            }
    if (rank == 0) {
        printf("S=%d stages, width %d, batch %d, %d steps x %d rounds\n", c->S, c->H, c->B,
               c->steps, c->rounds);
        printf("%-6s %4s %8s %16s %22s\n", "sched", "M", "theory", "measured (median)",
               "spread (min-max)   ratio");
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < c->nm; i++) {
                double th = (double)(c->S - 1) / (double)(c->m[i] + c->S - 1);
                double med = median(got[s][i], c->rounds);
                printf("%-6s %4d %8.3f %16.3f %10.3f-%.3f %9.2f\n", s ? "1F1B" : "GPipe",
                       c->m[i], th, med, got[s][i][0], got[s][i][c->rounds - 1],
                       th > 0 ? med / th : 0.0);
            }
    }
    if (c->S >= 2)
        header_cost(c, world);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < c->nm; i++)
            ddp_pipeline_destroy(pp[s][i]);
    free(x);
    free(labels);
    ddp_optim_destroy(opt);
    ddp_model_destroy(model);
    ddp_destroy_process_group(world);
    return 0;
}

static int parse(int argc, char **argv, cfg *c)
{
    *c = (cfg){.S = 2, .nm = 5, .m = {1, 2, 4, 8, 16}, .H = 256, .B = 256, .steps = 20,
               .rounds = 5};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--stages"))
            c->S = atoi(v);
        else if (!strcmp(k, "--width"))
            c->H = atoi(v);
        else if (!strcmp(k, "--batch"))
            c->B = atoi(v);
        else if (!strcmp(k, "--steps"))
            c->steps = atoi(v);
        else if (!strcmp(k, "--rounds"))
            c->rounds = atoi(v);
        else if (!strcmp(k, "--micro")) {
            c->nm = 0;
            for (char *p = argv[i + 1]; *p && c->nm < MAXM; p = *p ? p + 1 : p)
                c->m[c->nm++] = (int)strtol(p, &p, 10);
        } else
            return -1;
    }
    if (c->S < 1 || c->S > 64 || c->H < 1 || c->B < 1 || c->steps < 1 || c->rounds < 1 ||
        c->rounds > MAXROUNDS || c->nm < 1)
        return -1;
    for (int i = 0; i < c->nm; i++)
        if (c->m[i] < 1 || c->m[i] > c->B)
            return -1;
    return 0;
}

int main(int argc, char **argv)
{
    cfg c;
    if (parse(argc, argv, &c) < 0) {
        fprintf(stderr, "usage: pipeline_bubble [--stages S] [--micro 1,2,4] [--width H] "
                        "[--batch B] [--steps N] [--rounds R]\n");
        return 2;
    }
    char dir[] = "/tmp/ddp-bubble-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    snprintf(c.url, sizeof c.url, "file://%s/store", dir);
    pid_t pids[64];
    for (int r = 0; r < c.S; r++) {
        fflush(NULL);
        if ((pids[r] = fork()) == 0) {
            int rc = run_stage(&c, r);
            fflush(NULL); /* _exit does not */
            _exit(rc);
        }
    }
    int failed = 0;
    for (int r = 0; r < c.S; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        failed += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    char path[300];
    snprintf(path, sizeof path, "%s/store", dir);
    unlink(path);
    rmdir(dir);
    return failed ? 1 : 0;
}
