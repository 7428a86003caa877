/* Single-process MLP training-step throughput on synthetic data: the
 * reference model Sequential(Linear(784,256), ReLU(), Linear(256,10)),
 * CrossEntropyLoss and SGD(lr=0.01), one full step (forward, zero_grad,
 * backward, step) per batch.  Twin of bench/train_mlp_torch.py.
 *
 * Usage: train_mlp [batch ...]   (default: 64 256)
 * Env:   DDP_BENCH_SECONDS (default 2) time per batch size after warm-up.
 * Prints one line per batch size:
 *   libddp batch=64 steps=N seconds=S samples_per_s=X ms_per_step=Y loss=L
 */
#include <stdio.h>
#include <stdlib.h>

#include "ddp.h"

#define IN 784
#define HIDDEN 256
#define CLASSES 10
#define NBATCHES 16 /* distinct synthetic batches, cycled */

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
        if ((rc = ddp_backward(tape, l, model)) < 0 || (rc = ddp_optim_step(opt)) < 0)
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
