/* ZeRO memory benchmark driver (bench/zero_mem.sh runs it): one training
 * run of an MLP 784-H-...-H-10 (H = 4096, 3 hidden layers: about 37 M
 * parameters) with Adam, as plain DDP or ZeRO stage 1 or 2, and on rank 0
 * one line:
 *
 *   zero_mem mode=ddp world=2 params=36818954 state_bytes=294551632 \
 *       peak_rss=883986432 train_rss=800000000 samples_per_s=19.0 \
 *       samples_per_s_med=19.4 cpu_ms_per_step=700.0
 *
 * state_bytes, peak_rss and train_rss are the largest over the ranks (peak
 * RSS: each rank's VmHWM from /proc/self/status, the whole run's high-water
 * mark, setup included; train_rss: the high-water mark of the training
 * steps alone, VmHWM reset through /proc/self/clear_refs after the setup,
 * 0 where the kernel cannot); samples/s over the timed steps (after
 * --warmup untimed ones), all ranks' samples over the slowest rank's time;
 * samples_per_s_med the same from the median step (the slowest rank's
 * median), which a burst of load on a shared machine moves less;
 * cpu_ms_per_step the CPU time (user + system, every thread) of all ranks
 * together per timed step: what the mode costs the machine, which load
 * changes much less than wall time.
 *
 *   build/bin/ddprun --standalone --nproc-per-node 2 build/bench/zero_mem \
 *       --mode ddp|zero1|zero2|zero2p1 [--hidden H] [--layers L] [--batch B] [--steps N]
 *       [--warmup W] [--batchnorm 0|1] [--save-dir DIR] [--export FILE]
 *
 * --save-dir writes a sharded checkpoint of the trained model at the end
 * (ZeRO modes), --export then writes its consolidated file from rank 0,
 * and the same weights saved directly to EXPORT.direct
 * (bench/zero_export_check.py reads both with PyTorch).
 */
#include <math.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"
#include "ddp/ext.h"
#include "ddp/nn_module.h"

#define IN 784
#define OUT 10
#define MAX_LAYERS 8

static void check(int rc, const char *what)
{
    if (rc < 0) {
        fprintf(stderr, "zero_mem: %s: %s\n", what, ddp_last_error());
        exit(1);
    }
}

/* batchnorm: a BatchNorm1d after each hidden Linear (module buffers in the
 * checkpoints: the export check). */
static ddp_model_t *make_model(int hidden, int layers, int batchnorm)
{
    ddp_module_t *mods[3 * MAX_LAYERS + 1], *seq;
    int n = 0, in = IN;
    for (int l = 0; l < layers; l++) {
        check(ddp_linear_create(in, hidden, 1, (uint64_t)l + 1, &mods[n++]), "linear");
        if (batchnorm) {
            ddp_batchnorm_options bo = ddp_batchnorm_defaults(hidden);
            check(ddp_batchnorm1d_create(&bo, &mods[n++]), "batchnorm");
        }
        check(ddp_relu_create(&mods[n++]), "relu");
        in = hidden;
    }
    check(ddp_linear_create(in, OUT, 1, 99, &mods[n++]), "linear");
    check(ddp_sequential_create(mods, n, &seq), "sequential");
    ddp_model_t *m;
    check(ddp_model_from_module(seq, &m), "model");
    return m;
}

/* VmHWM of this process in bytes, 0 when unknown. */
static double peak_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lf kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

/* This process's CPU time (user + system, all threads) in seconds. */
static double cpu_seconds(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    const char *mode, *save_dir, *export_path;
    char save_path[4096]; /* EXPORT.direct: the model saved directly */
    int hidden, layers, batch, steps, warmup, stage, pool, batchnorm;
} opts;

static void parse(int argc, char **argv, opts *o)
{
    *o = (opts){.mode = "ddp", .hidden = 4096, .layers = 3, .batch = 8, .steps = 5, .warmup = 2};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--mode"))
            o->mode = v;
        else if (!strcmp(k, "--hidden"))
            o->hidden = atoi(v);
        else if (!strcmp(k, "--layers"))
            o->layers = atoi(v);
        else if (!strcmp(k, "--batch"))
            o->batch = atoi(v);
        else if (!strcmp(k, "--steps"))
            o->steps = atoi(v);
        else if (!strcmp(k, "--warmup"))
            o->warmup = atoi(v);
        else if (!strcmp(k, "--batchnorm"))
            o->batchnorm = atoi(v);
        else if (!strcmp(k, "--save-dir"))
            o->save_dir = v;
        else if (!strcmp(k, "--export")) {
            o->export_path = v;
            snprintf(o->save_path, sizeof o->save_path, "%s.direct", v);
        }
        else {
            fprintf(stderr, "zero_mem: unknown flag %s\n", k);
            exit(2);
        }
    }
    /* zero2p1: stage 2 with a one-buffer gradient pool (less memory, less
     * overlap) */
    o->stage = !strcmp(o->mode, "zero1") ? 1 : !strncmp(o->mode, "zero2", 5) ? 2 : 0;
    o->pool = !strcmp(o->mode, "zero2p1") ? 1 : 0;
    if (o->stage == 2 && o->pool == 0 && strcmp(o->mode, "zero2"))
        o->stage = 0;
    if ((o->stage == 0 && strcmp(o->mode, "ddp")) || o->hidden < 1 || o->layers < 1 ||
        o->layers > MAX_LAYERS || o->batch < 1 || o->steps < 1 || o->warmup < 0) {
        fprintf(stderr, "zero_mem: bad arguments\n");
        exit(2);
    }
}

int main(int argc, char **argv)
{
    opts o;
    parse(argc, argv, &o);
    ddp_launch_info li;
    check(ddp_launch_info_from_env(&li), "launcher environment");
    ddp_pg_t *pg;
    check(ddp_init_process_group("tcp", "env://", li.rank, li.world_size, 300, &pg), "init");
    ddp_model_t *m = make_model(o.hidden, o.layers, o.batchnorm);
    ddp_tape_t *tape;
    check(ddp_tape_create(&tape), "tape");
    ddp_data_parallel_t *dm = NULL; /* stage 2 reduces the gradients itself */
    if (o.stage != 2)
        check(ddp_data_parallel_create(m, pg, NULL, &dm), "DDP");
    ddp_zero_t *z = NULL;
    ddp_optim_t *opt;
    ddp_adam_options ao = ddp_adam_defaults();
    if (o.stage) {
        ddp_zero_options zo = ddp_zero_defaults();
        zo.stage = o.stage;
        zo.pool_buffers = o.pool;
        check(ddp_zero_create(m, pg, &zo, &z), "ZeRO");
        check(ddp_adam_create(ddp_zero_shard_model(z), &ao, &opt), "Adam");
    } else {
        check(ddp_adam_create(m, &ao, &opt), "Adam");
    }
    /* The setup's peak (building the model copies every parameter from its
     * layer's storage into the model's blocks: for a moment both are
     * alive), then the high-water mark is reset (Linux >= 4.0), so that the
     * end's VmHWM is the training's own peak. */
    double setup_rss = peak_rss();
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    int reset = cr && fputs("5", cr) >= 0;
    if (cr && fclose(cr) != 0)
        reset = 0;
    float *xs = malloc((size_t)o.batch * IN * sizeof *xs);
    int64_t *labels = malloc((size_t)o.batch * sizeof *labels);
    ddp_tensor x;
    check(ddp_tensor_wrap(&x, xs, 2, (int64_t[]){o.batch, IN}), "wrap");
    /* Per timed step: its wall time on this rank (the ranks are coupled
     * by the collectives, so every rank's step lasts about as long); the
     * median of those resists a burst of load on a shared machine better
     * than the total does. */
    double *step_s = calloc((size_t)o.steps, sizeof *step_s);
    double t0 = 0, ts = 0, c0 = 0;
    for (int s = 0; s < o.warmup + o.steps; s++) {
        if (s == o.warmup) {
            check(ddp_pg_barrier(pg), "barrier");
            t0 = ts = ddp_time_now();
            c0 = cpu_seconds();
        }
        for (int i = 0; i < o.batch * IN; i++)
            xs[i] = (float)sin(0.01 * i + 0.7 * s + li.rank);
        for (int i = 0; i < o.batch; i++)
            labels[i] = (i + s) % OUT;
        ddp_var_t *xv, *y, *loss;
        ddp_tape_reset(tape);
        check(ddp_tape_input(tape, &x, 0, &xv), "input");
        check(dm ? ddp_data_parallel_forward(dm, tape, xv, &y) : ddp_model_forward(m, tape, xv, &y),
              "forward");
        check(ddp_op_cross_entropy(tape, y, labels, &loss), "loss");
        if (o.stage == 2)
            ddp_optim_zero_grad(opt); /* the shard's gradient */
        else
            ddp_model_zero_grad(m);
        check(dm ? ddp_data_parallel_backward(dm, tape, loss) : ddp_zero_backward(z, tape, loss),
              "backward");
        check(z ? ddp_zero_step(z, opt) : ddp_optim_step(opt), "step");
        if (s >= o.warmup) {
            double now = ddp_time_now();
            step_s[s - o.warmup] = now - ts;
            ts = now;
        }
    }
    double dt = ddp_time_now() - t0, cpu = cpu_seconds() - c0;
    qsort(step_s, (size_t)o.steps, sizeof *step_s, cmp_double);
    double med = o.steps % 2 ? step_s[o.steps / 2]
                             : 0.5 * (step_s[o.steps / 2 - 1] + step_s[o.steps / 2]);
    free(step_s);
    size_t total;
    ddp_model_param_block(m, &total);
    double train_rss = peak_rss();
    double v[5] = {z ? (double)ddp_zero_state_bytes(z, opt)
                     : (double)ddp_optim_num_states(opt) * (double)total * sizeof(float),
                   setup_rss > train_rss ? setup_rss : train_rss, reset ? train_rss : 0, dt, med};
    check(ddp_pg_all_reduce(pg, v, 5, DDP_FLOAT64, DDP_MAX), "all-reduce");
    check(ddp_pg_all_reduce(pg, &cpu, 1, DDP_FLOAT64, DDP_SUM), "all-reduce");
    if (li.rank == 0)
        printf("zero_mem mode=%s world=%d params=%zu state_bytes=%.0f peak_rss=%.0f "
               "train_rss=%.0f samples_per_s=%.1f samples_per_s_med=%.1f cpu_ms_per_step=%.1f\n",
               o.mode, li.world_size, total, v[0], v[1], v[2],
               (double)o.steps * o.batch * li.world_size / v[3],
               (double)o.batch * li.world_size / v[4], 1e3 * cpu / o.steps);
    if (o.save_dir && z) {
        ddp_train_state st = {.global_step = o.warmup + o.steps};
        check(ddp_zero_checkpoint_save(o.save_dir, z, opt, &st), "checkpoint save");
        if (o.export_path && li.rank == 0)
            check(ddp_zero_checkpoint_export(o.save_dir, o.export_path), "export");
        if (o.export_path && li.rank == 0) /* the same weights the ordinary way */
            check(ddp_model_save_safetensors(m, o.save_path), "save");
    }
    ddp_optim_destroy(opt);
    ddp_zero_destroy(z);
    ddp_data_parallel_destroy(dm);
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
    free(xs);
    free(labels);
    ddp_destroy_process_group(pg);
    return 0;
}
