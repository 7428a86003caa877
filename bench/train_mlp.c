/* Single-process MLP training-step throughput on synthetic data: the
 * reference model Sequential(Linear(784,256), ReLU(), Linear(256,10)),
 * CrossEntropyLoss and SGD(lr=0.01), one full step (forward, zero_grad,
 * backward, step) per batch.  Twin of bench/train_mlp_torch.py.
 *
 * Usage: train_mlp [batch ...]   (default: 64 256)
 * Env:   DDP_BENCH_SECONDS (default 2) time per batch size after warm-up.
 * Prints two lines per batch size: the training step, and the "GEMM roof":
 * the same five matrix products a step needs (forward x W1^T, h W2^T;
 * backward dW2 = dy^T h, dh = dy W2, dW1 = dh^T x; no dx for the input)
 * timed alone on the same data, i.e. the step's speed if everything but
 * OpenBLAS were free:
 *   libddp batch=64 steps=N seconds=S samples_per_s=X ms_per_step=Y loss=L
 *   roof batch=64 steps=N seconds=S samples_per_s=X ms_per_step=Y gflops=G
 */
#include <stdio.h>
#include <stdlib.h>

#include "ddp.h"

#define IN 784
#define HIDDEN 256
#define CLASSES 10
#define NBATCHES 16 /* distinct synthetic batches, cycled */

/* The step's GEMMs alone (same shapes, transposes and inputs). */
static void gemm_roof(int batch, double seconds, const float *images)
{
    float *w1 = calloc((size_t)HIDDEN * IN, sizeof(float));
    float *w2 = calloc((size_t)CLASSES * HIDDEN, sizeof(float));
    float *h = calloc((size_t)batch * HIDDEN, sizeof(float));
    float *y = calloc((size_t)batch * CLASSES, sizeof(float));
    float *dw1 = calloc((size_t)HIDDEN * IN, sizeof(float));
    float *dw2 = calloc((size_t)CLASSES * HIDDEN, sizeof(float));
    float *dh = calloc((size_t)batch * HIDDEN, sizeof(float));
    if (!w1 || !w2 || !h || !y || !dw1 || !dw2 || !dh)
        goto out;
    double t0 = 0;
    long steps = 0, warm = 20;
    for (long it = 0;; it++) {
        if (it == warm)
            t0 = ddp_time_now();
        const float *x = images + (size_t)(it % NBATCHES) * batch * IN;
        ddp_sgemm(0, 1, batch, HIDDEN, IN, 1, x, IN, w1, IN, 1, h, HIDDEN);
        ddp_sgemm(0, 1, batch, CLASSES, HIDDEN, 1, h, HIDDEN, w2, HIDDEN, 1, y, CLASSES);
        ddp_sgemm(1, 0, CLASSES, HIDDEN, batch, 1, y, CLASSES, h, HIDDEN, 1, dw2, HIDDEN);
        ddp_sgemm(0, 0, batch, HIDDEN, CLASSES, 1, y, CLASSES, w2, HIDDEN, 0, dh, HIDDEN);
        ddp_sgemm(1, 0, HIDDEN, IN, batch, 1, dh, HIDDEN, x, IN, 1, dw1, IN);
        if (it >= warm && (++steps & 15) == 0 && ddp_time_now() - t0 >= seconds)
            break;
    }
    double dt = ddp_time_now() - t0;
    double flops = 2.0 * batch * (2.0 * IN * HIDDEN + 3.0 * HIDDEN * CLASSES);
    printf("roof batch=%d steps=%ld seconds=%.3f samples_per_s=%.0f ms_per_step=%.4f "
           "gflops=%.1f\n", batch, steps, dt, steps * (double)batch / dt, dt * 1e3 / steps,
           flops * steps / dt / 1e9);
out:
    free(w1), free(w2), free(h), free(y), free(dw1), free(dw2), free(dh);
}

static int run(int batch, double seconds)
{
    ddp_module_t *layers[3];
    ddp_model_t *model = NULL;
    ddp_tape_t *tape = NULL;
    ddp_optim_t *opt = NULL;
    float *images = NULL;
    int64_t *labels = NULL;
    int rc = 0;
    if ((rc = ddp_linear_create(IN, HIDDEN, 1, 1, &layers[0])) < 0 ||
        (rc = ddp_relu_create(&layers[1])) < 0 ||
        (rc = ddp_linear_create(HIDDEN, CLASSES, 1, 2, &layers[2])) < 0)
        goto out;
    ddp_module_t *seq;
    if ((rc = ddp_sequential_create(layers, 3, &seq)) < 0 ||
        (rc = ddp_model_from_module(seq, &model)) < 0 || (rc = ddp_tape_create(&tape)) < 0)
        goto out;
    ddp_sgd_options so = ddp_sgd_defaults(0.01);
    if ((rc = ddp_sgd_create(model, &so, &opt)) < 0)
        goto out;
    images = malloc(sizeof(float) * NBATCHES * (size_t)batch * IN);
    labels = malloc(sizeof(int64_t) * NBATCHES * (size_t)batch);
    if (!images || !labels) {
        fprintf(stderr, "out of memory\n");
        rc = -1;
        goto out;
    }
    unsigned s = 12345;
    for (size_t i = 0; i < (size_t)NBATCHES * batch * IN; i++) {
        s = s * 1103515245u + 12345u;
        images[i] = (float)((s >> 8) & 0xffff) / 65536.0f;
    }
    for (size_t i = 0; i < (size_t)NBATCHES * batch; i++) {
        s = s * 1103515245u + 12345u;
        labels[i] = (s >> 16) % CLASSES;
    }
    double t0 = 0, loss = 0;
    long steps = 0, warm = 20;
    for (long it = 0;; it++) {
        if (it == warm)
            t0 = ddp_time_now();
        int b = (int)(it % NBATCHES);
        ddp_tensor x;
        ddp_var_t *in, *out, *l;
        ddp_tape_reset(tape);
        if ((rc = ddp_tensor_wrap(&x, images + (size_t)b * batch * IN, 2,
                                  (int64_t[]){batch, IN})) < 0 ||
            (rc = ddp_tape_input(tape, &x, 0, &in)) < 0 ||
            (rc = ddp_model_forward(model, tape, in, &out)) < 0 ||
            (rc = ddp_op_cross_entropy(tape, out, labels + (size_t)b * batch, &l)) < 0)
            goto out;
        ddp_optim_zero_grad(opt);
        if ((rc = ddp_tape_backward(tape, l, model)) < 0 || (rc = ddp_optim_step(opt)) < 0)
            goto out;
        loss = ddp_var_item(l);
        if (it >= warm) {
            steps++;
            if ((steps & 15) == 0 && ddp_time_now() - t0 >= seconds)
                break;
        }
    }
    double dt = ddp_time_now() - t0;
    printf("libddp batch=%d steps=%ld seconds=%.3f samples_per_s=%.0f ms_per_step=%.4f "
           "loss=%.4f\n", batch, steps, dt, steps * (double)batch / dt, dt * 1e3 / steps, loss);
    fflush(stdout);
    gemm_roof(batch, seconds, images);
out:
    if (rc < 0)
        fprintf(stderr, "train_mlp: %s\n", ddp_last_error());
    free(images);
    free(labels);
    ddp_optim_destroy(opt);
    ddp_tape_destroy(tape);
    ddp_model_destroy(model);
    return rc;
}

int main(int argc, char **argv)
{
    const char *env = getenv("DDP_BENCH_SECONDS");
    double seconds = env ? atof(env) : 2.0;
    int default_batches[] = {64, 256};
    int n = argc > 1 ? argc - 1 : 2;
    for (int i = 0; i < n; i++) {
        int batch = argc > 1 ? atoi(argv[i + 1]) : default_batches[i];
        if (batch <= 0) {
            fprintf(stderr, "usage: train_mlp [batch ...]\n");
            return 2;
        }
        if (run(batch, seconds) < 0)
            return 1;
    }
    return 0;
}
