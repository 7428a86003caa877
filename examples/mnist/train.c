/* ddp-mnist, the reference program: the training loop (steps, log lines,
 * throughput, the per-phase profile of DDP_MNIST_PROFILE=1 and the fault
 * that --crash-at-step injects). */
#include <signal.h>
#include <stdio.h>
#include <time.h>

#include "mnist.h"

static const char *const phase_names[PH_N] = {"load", "forward", "backward", "optimizer"};

/* The fault that --crash-at-step injects: rank 1 (or a lone rank 0) dies
 * as kill -9 would kill it, in the first attempt only. */
void maybe_crash(const job *j)
{
    if (j->a->crash_at == j->st.global_step && j->restart == 0 &&
        j->rank == (j->world > 1 ? 1 : 0)) {
        fflush(NULL);
        raise(SIGKILL);
    }
}

/* Seconds on clock (CPU time clocks for the profile). */
static double clock_seconds(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double wall_clock(void) { return clock_seconds(CLOCK_REALTIME); }

/* With profiling, adds the time since *t to phase ph and restarts *t. */
static void lap(job *j, int ph, double *t)
{
    if (!j->profile)
        return;
    double now = ddp_time_now();
    j->phase[ph] += now - *t;
    *t = now;
}

static int train_step(job *j, const ddp_batch *b, float *loss_value)
{
    ddp_var_t *logits, *loss;
    int rc;
    double t = j->profile ? ddp_time_now() : 0;
    if ((rc = forward(j->dm, j->model, j->tape, b, &logits)) < 0 ||
        (rc = ddp_op_cross_entropy(j->tape, logits, b->y64, &loss)) < 0)
        return rc;
    zero_grad(j);
    lap(j, PH_FORWARD, &t);
    rc = backward(j, loss);
    lap(j, PH_BACKWARD, &t);
    if (rc < 0 || (rc = optimizer_step(j)) < 0)
        return rc;
    lap(j, PH_STEP, &t);
    *loss_value = ddp_var_item(loss);
    return 0;
}

/* cpu: this process's CPU time over the loop (all its threads: training,
 * loader workers, the process group's), main: the training thread's. */
static void print_profile(const job *j, size_t steps, double dt, double cpu, double main_cpu)
{
    if (!j->profile || steps == 0)
        return;
    char line[512];
    int n = snprintf(line, sizeof line, "Profile rank %d: %zu steps, %.1f us/step:", j->rank,
                     steps, dt / (double)steps * 1e6);
    double rest = dt;
    for (int ph = 0; ph < PH_N && n > 0 && (size_t)n < sizeof line; ph++) {
        rest -= j->phase[ph];
        n += snprintf(line + n, sizeof line - (size_t)n, " %s %.1f", phase_names[ph],
                      j->phase[ph] / (double)steps * 1e6);
    }
    if (n > 0 && (size_t)n < sizeof line)
        snprintf(line + n, sizeof line - (size_t)n,
                 " other %.1f; cpu %.1f us/step (training thread %.1f, others %.1f)",
                 rest / (double)steps * 1e6, cpu / (double)steps * 1e6,
                 main_cpu / (double)steps * 1e6, (cpu - main_cpu) / (double)steps * 1e6);
    fprintf(stderr, "%s\n", line);
}

/* Prints the global samples/s: every rank's samples over the slowest
 * rank's time. */
static int report_throughput(job *j, size_t samples, double dt)
{
    int64_t n = (int64_t)samples;
    if (j->pg) {
        int rc;
        if ((rc = ddp_pg_all_reduce(j->pg, &n, 1, DDP_INT64, DDP_SUM)) < 0 ||
            (rc = ddp_pg_all_reduce(j->pg, &dt, 1, DDP_FLOAT64, DDP_MAX)) < 0)
            return rc;
    }
    if (j->rank == 0)
        printf("Throughput: %.0f samples/s\n", dt > 0 ? (double)n / dt : 0.0);
    return 0;
}

int train(job *j, ddp_loader_t *dl)
{
    const args *a = j->a;
    size_t total = ddp_loader_length(dl), steps = 0;
    int rc = report_begin(j);
    if (rc < 0)
        return rc;
    double t0 = ddp_time_now();
    double cpu0 = clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
    double main0 = clock_seconds(CLOCK_THREAD_CPUTIME_ID);
    for (long epoch = (long)j->st.epoch; epoch < a->epochs; epoch++) {
        if ((rc = ddp_loader_epoch_begin(dl, (uint64_t)epoch)) >= 0)
            rc = report_epoch_begin(j, epoch, total);
        size_t skip = epoch == j->st.epoch ? (size_t)j->st.step : 0; /* trained before */
        ddp_batch b;
        double tl = j->profile ? ddp_time_now() : 0;
        while (rc >= 0 && (rc = ddp_loader_next(dl, &b)) == 1) {
            lap(j, PH_LOAD, &tl);
            if (b.index < skip)
                continue;
            float loss;
            if ((rc = train_step(j, &b, &loss)) < 0)
                break;
            steps++;
            j->samples += b.size;
            j->epoch_samples += b.size;
            j->st.global_step++;
            if (j->samples == b.size && j->rank == 0 && j->timestamps)
                printf("First step at: %.6f\n", wall_clock()); /* for bench/ddp_mnist.sh */
            maybe_crash(j);
            if ((rc = report_step(j, epoch, &b, total, loss)) < 0)
                break;
            if (j->ckpt[0] && j->st.global_step % a->ckpt_every == 0)
                rc = b.index + 1 == total ? save_checkpoint(j, epoch + 1, 0)
                                          : save_checkpoint(j, epoch, (int64_t)b.index + 1);
            if (rc < 0)
                break;
            if (j->profile)
                tl = ddp_time_now();
        }
        if (rc < 0 || (rc = report_epoch_end(j)) < 0)
            return rc;
        fflush(stdout);
    }
    print_profile(j, steps, ddp_time_now() - t0, clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0,
                  clock_seconds(CLOCK_THREAD_CPUTIME_ID) - main0);
    if (a->epochs > j->st.epoch)
        return report_throughput(j, j->samples, ddp_time_now() - t0);
    return 0;
}
