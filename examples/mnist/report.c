/* ddp-mnist, the reference program: what rank 0 shows and records while it
 * trains.  On a terminal a progress bar per epoch replaces the log lines
 * (include/ddp/progress.h); elsewhere (pipes, CI, files) the log lines are
 * exactly what they always were.  --metrics writes a record per log step
 * and per evaluation; --eval-every evaluates during training too. */
#include <stdarg.h>
#include <stdio.h>

#include "mnist.h"

#define LOG_EVERY 100

int report_begin(job *j)
{
    ddp_progress_options po = ddp_progress_defaults();
    po.mode = j->rank == 0 && j->a->progress ? DDP_PROGRESS_AUTO : DDP_PROGRESS_OFF;
    j->rec_time = ddp_time_now();
    j->rec_samples = j->samples = 0;
    return ddp_progress_create(&po, &j->bar);
}

int report_epoch_begin(job *j, long epoch, size_t total)
{
    char label[64];
    snprintf(label, sizeof label, "Epoch %ld/%ld", epoch + 1, j->a->epochs);
    j->epoch_samples = 0;
    return ddp_progress_begin(j->bar, label, total);
}

/* The record of a log step: its loss, the mean loss and samples/s since
 * the last record (rank 0's losses; samples of all ranks: this rank's share
 * times the world, the ranks run in lockstep). */
static int record_step(job *j, long epoch, size_t step, float loss)
{
    double now = ddp_time_now(), dt = now - j->rec_time;
    double rate = dt > 0 ? (double)(j->samples - j->rec_samples) * j->world / dt : 0;
    double mean = j->loss_n ? j->loss_sum / (double)j->loss_n : (double)loss;
    j->rec_time = now;
    j->rec_samples = j->samples;
    j->loss_sum = 0;
    j->loss_n = 0;
    ddp_metric f[] = {
        {"epoch", (double)epoch + 1},
        {"step", (double)step},
        {"global_step", (double)j->st.global_step},
        {"loss", loss},
        {"mean_loss", mean},
        {"lr", ddp_optim_lr(j->opt)},
        {"samples_per_s", rate},
    };
    return ddp_metrics_write(j->metrics, "train", f, sizeof f / sizeof *f);
}

int report_step(job *j, long epoch, const ddp_batch *b, size_t total, float loss)
{
    if (j->rank != 0)
        return 0;
    size_t step = b->index + 1;
    j->loss_sum += loss;
    j->loss_n++;
    int rc = ddp_progress_update(j->bar, step, j->epoch_samples * (size_t)j->world, loss);
    if (rc == 0 && step % LOG_EVERY == 0) {
        if (!ddp_progress_enabled(j->bar))
            printf("Epoch [%ld/%ld], Step [%zu/%zu], Loss: %.4f\n", epoch + 1, j->a->epochs,
                   step, total, loss);
        if (j->metrics)
            rc = record_step(j, epoch, step, loss);
    }
    if (rc == 0 && j->a->eval_every && j->st.global_step % j->a->eval_every == 0)
        rc = report_eval(j, epoch + 1, 0);
    return rc;
}

int report_epoch_end(job *j) { return ddp_progress_end(j->bar); }

int report_eval(job *j, long epoch, int final)
{
    if (j->rank != 0)
        return 0;
    double loss, acc;
    int rc = evaluate(j->model, j->tape, j->test, &loss, &acc);
    if (rc < 0)
        return rc;
    if (final) {
        printf("Test accuracy: %.2f %%\n", acc);
    } else {
        if ((rc = ddp_progress_clear(j->bar)) < 0)
            return rc;
        printf("Evaluation at step %lld: test loss %.4f, accuracy %.2f %%\n",
               (long long)j->st.global_step, loss, acc);
    }
    ddp_metric f[] = {
        {"epoch", (double)epoch},
        {"global_step", (double)j->st.global_step},
        {"test_loss", loss},
        {"accuracy", acc},
    };
    return j->metrics ? ddp_metrics_write(j->metrics, "eval", f, sizeof f / sizeof *f) : 0;
}

void report_end(job *j)
{
    ddp_progress_destroy(j->bar);
    j->bar = NULL;
    ddp_metrics_destroy(j->metrics);
    j->metrics = NULL;
}

void stop_error(const char *fmt, ...)
{
    char line[2048];
    int at = snprintf(line, sizeof line, "ddp-mnist: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + at, sizeof line - (size_t)at, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
    ddp_error_file_write(line); /* best effort: the program stops anyway */
}
