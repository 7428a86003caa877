/* ddp-mnist, the reference program: the model, its forward pass, the data
 * set's splits and the evaluation on the test split. */
#include <stdio.h>

#include "mnist.h"

/* Sequential(Linear(784, h1), ReLU(), ..., Linear(hk, 10)) in a sealed
 * model (--hidden h1,...,hk; default 256: the reference MLP), parameters
 * drawn with PyTorch's default init from --seed. */
int build_model(const args *a, ddp_model_t **model)
{
    enum { MAX_LAYERS = 2 * MAX_HIDDEN + 1 };
    ddp_module_t *layers[MAX_LAYERS] = {NULL}, *seq;
    int n = 0, rc = 0;
    int in = IN;
    for (int i = 0; i < a->nhidden && rc >= 0; i++) {
        if ((rc = ddp_linear_create(in, (int)a->hidden[i], 1, 0, &layers[n++])) >= 0)
            rc = ddp_relu_create(&layers[n++]);
        in = (int)a->hidden[i];
    }
    if (rc >= 0)
        rc = ddp_linear_create(in, CLASSES, 1, 0, &layers[n++]);
    if (rc < 0) {
        for (int i = 0; i < n; i++)
            ddp_module_destroy(layers[i]);
        return rc;
    }
    if ((rc = ddp_sequential_create(layers, n, &seq)) < 0 ||
        (rc = ddp_model_from_module(seq, model)) < 0)
        return rc;
    return ddp_model_reset_parameters(*model, a->seed);
}

/* Forward pass of one batch on a fresh tape: *logits (B, 10); through DDP
 * when dm is not NULL. */
int forward(ddp_data_parallel_t *dm, ddp_model_t *model, ddp_tape_t *tape,
            const ddp_batch *b, ddp_var_t **logits)
{
    ddp_tensor x;
    ddp_var_t *in;
    ddp_tape_reset(tape);
    int rc = ddp_tensor_wrap(&x, b->x, 2, (int64_t[]){(int64_t)b->size, IN});
    if (rc < 0 || (rc = ddp_tape_input(tape, &x, 0, &in)) < 0)
        return rc;
    return dm ? ddp_data_parallel_forward(dm, tape, in, logits)
              : ddp_model_forward(model, tape, in, logits);
}

int open_split(const char *dir, int train, ddp_dataset_t **ds)
{
    ddp_mnist_options mo = ddp_mnist_defaults();
    mo.train = train;
    int rc = ddp_mnist_create(dir, &mo, ds);
    if (rc < 0) {
        stop_error("%s", ddp_last_error());
        return rc;
    }
    if (ddp_dataset_sample_numel(*ds) != IN) {
        stop_error("%s: %s images are not 28x28 (%zu pixels each, expected %d)",
                   dir, train ? "training" : "test", ddp_dataset_sample_numel(*ds), IN);
        ddp_dataset_destroy(*ds);
        *ds = NULL;
        return DDP_ERR_FORMAT;
    }
    return 0;
}

/* *loss: the mean cross-entropy over the split, *acc: percent right. */
int evaluate(ddp_model_t *model, ddp_tape_t *tape, ddp_dataset_t *test, double *loss,
             double *acc)
{
    ddp_loader_options o = ddp_loader_defaults();
    o.batch_size = EVAL_BATCH;
    ddp_loader_t *dl;
    int rc = ddp_loader_create(test, &o, &dl);
    if (rc < 0)
        return rc;
    ddp_model_train(model, 0);
    ddp_tape_set_grad_enabled(tape, 0); /* torch.no_grad() */
    size_t correct = 0, n = 0;
    double loss_sum = 0;
    ddp_batch b;
    rc = ddp_loader_epoch_begin(dl, 0);
    while (rc >= 0 && (rc = ddp_loader_next(dl, &b)) == 1) {
        ddp_var_t *logits, *l;
        if ((rc = forward(NULL, model, tape, &b, &logits)) < 0 ||
            (rc = ddp_op_cross_entropy(tape, logits, b.y64, &l)) < 0)
            break;
        loss_sum += (double)ddp_var_item(l) * (double)b.size; /* the batch's mean */
        const float *z = ddp_var_tensor(logits)->data; /* (B, 10) */
        for (size_t i = 0; i < b.size; i++) {
            int best = 0;
            for (int c = 1; c < CLASSES; c++)
                if (z[i * CLASSES + c] > z[i * CLASSES + best])
                    best = c;
            correct += best == b.y64[i];
        }
        n += b.size;
    }
    ddp_loader_destroy(dl);
    ddp_tape_set_grad_enabled(tape, 1);
    ddp_model_train(model, 1);
    *acc = n ? 100.0 * (double)correct / (double)n : 0.0;
    *loss = n ? loss_sum / (double)n : 0.0;
    return rc < 0 ? rc : 0;
}
