/* ddp-cnn: the network of PyTorch's examples/mnist, its forward pass, the
 * data set's splits and the evaluation. */
#include <stdio.h>

#include "cnn.h"

/* Sequential(Conv2d(1, 32, 3), ReLU, Conv2d(32, 64, 3), ReLU, MaxPool2d(2),
 * Dropout(0.25), Flatten, Linear(9216, 128), ReLU, Dropout(0.5),
 * Linear(128, 10)), PyTorch's default init from the seed.  Dropout masks
 * come from the seed and the rank (each rank drops its own units; two
 * streams per rank, so that no rank's second is another's first). */
int build_model(const args *a, int rank, ddp_model_t **model)
{
    enum { N = 11 };
    ddp_module_t *l[N] = {NULL}, *seq;
    ddp_conv2d_options c1 = ddp_conv2d_defaults(1, 32, 3), c2 = ddp_conv2d_defaults(32, 64, 3);
    ddp_pool2d_options pool = ddp_pool2d_defaults(2);
    uint64_t dseed = (a->seed * 1000003ULL + (uint64_t)rank) * 2;
    int rc;
    if ((rc = ddp_conv2d_create(&c1, 0, &l[0])) < 0 || (rc = ddp_relu_create(&l[1])) < 0 ||
        (rc = ddp_conv2d_create(&c2, 0, &l[2])) < 0 || (rc = ddp_relu_create(&l[3])) < 0 ||
        (rc = ddp_max_pool2d_create(&pool, &l[4])) < 0 ||
        (rc = ddp_dropout_create(a->dropout ? 0.25f : 0.0f, dseed, &l[5])) < 0 ||
        (rc = ddp_flatten_create(&l[6])) < 0 ||
        (rc = ddp_linear_create(9216, 128, 1, 0, &l[7])) < 0 ||
        (rc = ddp_relu_create(&l[8])) < 0 ||
        (rc = ddp_dropout_create(a->dropout ? 0.5f : 0.0f, dseed + 1, &l[9])) < 0 ||
        (rc = ddp_linear_create(128, CLASSES, 1, 0, &l[10])) < 0) {
        for (int i = 0; i < N; i++)
            ddp_module_destroy(l[i]);
        return rc;
    }
    if ((rc = ddp_sequential_create(l, N, &seq)) < 0 ||
        (rc = ddp_model_from_module(seq, model)) < 0)
        return rc;
    return ddp_model_reset_parameters(*model, a->seed);
}

/* One batch on a fresh tape: the images as (B, 1, 28, 28), *logp the
 * log-probabilities (B, 10) (F.log_softmax of the logits). */
int forward(job *j, const ddp_batch *b, ddp_var_t **logp)
{
    ddp_tensor x;
    ddp_var_t *in, *logits;
    ddp_tape_reset(j->tape);
    int rc = ddp_tensor_wrap(&x, b->x, 4, (int64_t[]){(int64_t)b->size, 1, SIDE, SIDE});
    if (rc < 0 || (rc = ddp_tape_input(j->tape, &x, 0, &in)) < 0)
        return rc;
    rc = j->dm && ddp_model_is_training(j->model)
             ? ddp_data_parallel_forward(j->dm, j->tape, in, &logits)
             : ddp_model_forward(j->model, j->tape, in, &logits);
    return rc < 0 ? rc : ddp_op_log_softmax(j->tape, logits, logp);
}

int open_split(const char *dir, int train, ddp_dataset_t **ds)
{
    ddp_mnist_options mo = ddp_mnist_defaults();
    mo.train = train;
    mo.normalize = 1; /* examples/mnist's Normalize((0.1307,), (0.3081,)) */
    mo.mean = 0.1307f;
    mo.std = 0.3081f;
    int rc = ddp_mnist_create(dir, &mo, ds);
    if (rc < 0) {
        stop_error("%s", ddp_last_error());
        return rc;
    }
    if (ddp_dataset_sample_numel(*ds) != SIDE * SIDE) {
        stop_error("%s: %s images are not 28x28 (%zu pixels each)", dir,
                   train ? "training" : "test", ddp_dataset_sample_numel(*ds));
        ddp_dataset_destroy(*ds);
        *ds = NULL;
        return DDP_ERR_FORMAT;
    }
    return 0;
}

/* *loss: the mean NLL over the split, *acc: percent right. */
int evaluate(job *j, ddp_dataset_t *test, double *loss, double *acc)
{
    ddp_loader_options o = ddp_loader_defaults();
    o.batch_size = EVAL_BATCH;
    ddp_loader_t *dl;
    int rc = ddp_loader_create(test, &o, &dl);
    if (rc < 0)
        return rc;
    ddp_model_train(j->model, 0);
    ddp_tape_set_grad_enabled(j->tape, 0); /* torch.no_grad() */
    size_t correct = 0, n = 0;
    double loss_sum = 0;
    ddp_batch b;
    rc = ddp_loader_epoch_begin(dl, 0);
    while (rc >= 0 && (rc = ddp_loader_next(dl, &b)) == 1) {
        ddp_var_t *logp, *l;
        if ((rc = forward(j, &b, &logp)) < 0 ||
            (rc = ddp_op_nll_loss(j->tape, logp, b.y64, &l)) < 0)
            break;
        loss_sum += (double)ddp_var_item(l) * (double)b.size;
        const float *z = ddp_var_tensor(logp)->data; /* (B, 10) */
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
    ddp_tape_set_grad_enabled(j->tape, 1);
    ddp_model_train(j->model, 1);
    *acc = n ? 100.0 * (double)correct / (double)n : 0.0;
    *loss = n ? loss_sum / (double)n : 0.0;
    return rc < 0 ? rc : 0;
}
