/* ddp-mnist: the reference program, single process.  PyTorch's beginner
 * feed-forward example in C against libddp:
 *
 *   model = Sequential(Linear(784, 256), ReLU(), Linear(256, 10))
 *   loss  = CrossEntropyLoss(); opt = SGD(model.parameters(), lr, momentum)
 *   data  = DataLoader(FashionMNIST(train=True, transform=ToTensor()),
 *                      batch_size=64, shuffle=True, num_workers)
 *   for epoch: for i, (images, labels) in enumerate(data): step;
 *       every 100 steps print "Epoch [e/N], Step [i/total], Loss: x.xxxx"
 *   then "Throughput: N samples/s" (training loop only) and
 *   "Test accuracy: NN.NN %" on the test split.
 *
 * Exit status: 0 on success, 2 for bad flags, a missing/malformed data set
 * or --load file (one line on stderr), 1 for any other failure.  See --help. */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"

#define IN 784
#define HIDDEN 256
#define CLASSES 10
#define EVAL_BATCH 1000

typedef struct args {
    const char *data;
    long epochs;
    long batch;
    double lr;
    double momentum;
    unsigned long long seed;
    int shuffle;
    const char *load;
    const char *save;
    long workers;
} args;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ddp-mnist [options]\n"
            "Trains Sequential(Linear(784,256), ReLU, Linear(256,10)) with SGD and\n"
            "cross-entropy on an MNIST-format data set, then reports test accuracy.\n"
            "\n"
            "  --data DIR        folder with train-/t10k-{images-idx3,labels-idx1}-ubyte[.gz]\n"
            "                    (default /usr/share/datasets/fashion-mnist)\n"
            "  --epochs N        passes over the training set (default 1; 0: only evaluate)\n"
            "  --batch-size N    samples per step (default 64)\n"
            "  --lr X            learning rate (default 0.1)\n"
            "  --momentum X      SGD momentum (default 0)\n"
            "  --seed N          model initialisation and shuffling seed (default 0)\n"
            "  --no-shuffle      visit the training set in order\n"
            "  --workers N       DataLoader worker threads (default 1)\n"
            "  --load FILE       start from parameters saved with --save (safetensors)\n"
            "  --save FILE       write the trained parameters (safetensors)\n"
            "  --help            this text\n"
            "\n"
            "Exit status: 0 ok, 2 bad flags, data set or --load file, 1 other failure.\n");
}

/* One-line complaint about the command line; exit status 2. */
__attribute__((format(printf, 1, 2))) static int bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ddp-mnist: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see --help)\n");
    va_end(ap);
    return 2;
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return bad_usage("%s: expected an integer in %ld..%ld, got '%s'", flag, lo, hi, s);
    *out = v;
    return 0;
}

static int parse_double(const char *flag, const char *s, double lo, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo) || v > 1e6)
        return bad_usage("%s: expected a number in %g..1e6, got '%s'", flag, lo, s);
    *out = v;
    return 0;
}

/* Returns 0 to run, 2 on bad flags, -1 after --help (exit 0). */
static int parse_args(int argc, char **argv, args *a)
{
    enum { O_DATA = 256, O_EPOCHS, O_BATCH, O_LR, O_MOM, O_SEED, O_NOSHUF, O_LOAD, O_SAVE,
           O_WORKERS, O_HELP };
    static const struct option opts[] = {
        {"data", required_argument, NULL, O_DATA},
        {"epochs", required_argument, NULL, O_EPOCHS},
        {"batch-size", required_argument, NULL, O_BATCH},
        {"lr", required_argument, NULL, O_LR},
        {"momentum", required_argument, NULL, O_MOM},
        {"seed", required_argument, NULL, O_SEED},
        {"no-shuffle", no_argument, NULL, O_NOSHUF},
        {"load", required_argument, NULL, O_LOAD},
        {"save", required_argument, NULL, O_SAVE},
        {"workers", required_argument, NULL, O_WORKERS},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    *a = (args){.data = "/usr/share/datasets/fashion-mnist", .epochs = 1, .batch = 64,
                .lr = 0.1, .momentum = 0.0, .seed = 0, .shuffle = 1, .workers = 1};
    opterr = 0; /* our own one-line messages */
    int c, rc = 0;
    long seed;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case O_DATA: a->data = optarg; break;
        case O_EPOCHS: rc = parse_long("--epochs", optarg, 0, 1000000, &a->epochs); break;
        case O_BATCH: rc = parse_long("--batch-size", optarg, 1, 1 << 20, &a->batch); break;
        case O_LR: rc = parse_double("--lr", optarg, 0.0, &a->lr); break;
        case O_MOM: rc = parse_double("--momentum", optarg, 0.0, &a->momentum); break;
        case O_SEED:
            rc = parse_long("--seed", optarg, 0, 0x7fffffffL, &seed);
            a->seed = (unsigned long long)seed;
            break;
        case O_NOSHUF: a->shuffle = 0; break;
        case O_LOAD: a->load = optarg; break;
        case O_SAVE: a->save = optarg; break;
        case O_WORKERS: rc = parse_long("--workers", optarg, 0, 64, &a->workers); break;
        case O_HELP: usage(stdout); return -1;
        case ':':
            return bad_usage("option '%s' needs a value", argv[optind - 1]);
        default:
            return bad_usage("unknown option '%s'", argv[optind - 1]);
        }
        if (rc)
            return rc;
    }
    if (optind < argc)
        return bad_usage("unexpected argument '%s'", argv[optind]);
    return 0;
}

/* Sequential(Linear(784,256), ReLU(), Linear(256,10)) in a sealed model,
 * parameters drawn with PyTorch's default init from seed. */
static int build_model(unsigned long long seed, ddp_model_t **model)
{
    ddp_module_t *layers[3] = {NULL, NULL, NULL}, *seq;
    int rc;
    if ((rc = ddp_linear_create(IN, HIDDEN, 1, 0, &layers[0])) < 0 ||
        (rc = ddp_relu_create(&layers[1])) < 0 ||
        (rc = ddp_linear_create(HIDDEN, CLASSES, 1, 0, &layers[2])) < 0) {
        for (int i = 0; i < 3; i++)
            ddp_module_destroy(layers[i]);
        return rc;
    }
    if ((rc = ddp_sequential_create(layers, 3, &seq)) < 0 ||
        (rc = ddp_model_from_module(seq, model)) < 0)
        return rc;
    return ddp_model_reset_parameters(*model, seed);
}

/* Forward pass of one batch on a fresh tape: *logits (B, 10). */
static int forward(ddp_model_t *model, ddp_tape_t *tape, const ddp_batch *b,
                   ddp_var_t **logits)
{
    ddp_tensor x;
    ddp_var_t *in;
    ddp_tape_reset(tape);
    int rc = ddp_tensor_wrap(&x, b->x, 2, (int64_t[]){(int64_t)b->size, IN});
    if (rc < 0 || (rc = ddp_tape_input(tape, &x, 0, &in)) < 0)
        return rc;
    return ddp_model_forward(model, tape, in, logits);
}

static int open_split(const char *dir, int train, ddp_dataset **ds)
{
    ddp_mnist_opts mo = ddp_mnist_defaults();
    mo.train = train;
    int rc = ddp_mnist_create(dir, &mo, ds);
    if (rc < 0) {
        fprintf(stderr, "ddp-mnist: %s\n", ddp_last_error());
        return rc;
    }
    if (ddp_dataset_sample_numel(*ds) != IN) {
        fprintf(stderr, "ddp-mnist: %s: images are not 28x28\n", dir);
        ddp_dataset_destroy(*ds);
        *ds = NULL;
        return DDP_ERR_FORMAT;
    }
    return 0;
}

static int train(const args *a, ddp_model_t *model, ddp_tape_t *tape, ddp_optim_t *opt,
                 ddp_loader *dl)
{
    size_t total = ddp_loader_length(dl), samples = 0;
    double t0 = ddp_time_now();
    for (long epoch = 0; epoch < a->epochs; epoch++) {
        int rc = ddp_loader_epoch_begin(dl, (uint64_t)epoch);
        ddp_batch b;
        while (rc >= 0 && (rc = ddp_loader_next(dl, &b)) == 1) {
            ddp_var_t *logits, *loss;
            if ((rc = forward(model, tape, &b, &logits)) < 0 ||
                (rc = ddp_op_cross_entropy(tape, logits, b.y64, &loss)) < 0)
                break;
            ddp_optim_zero_grad(opt);
            if ((rc = ddp_backward(tape, loss, model)) < 0 || (rc = ddp_optim_step(opt)) < 0)
                break;
            samples += b.size;
            if ((b.index + 1) % 100 == 0)
                printf("Epoch [%ld/%ld], Step [%zu/%zu], Loss: %.4f\n", epoch + 1, a->epochs,
                       b.index + 1, total, ddp_var_item(loss));
        }
        if (rc < 0)
            return rc;
        fflush(stdout);
    }
    double dt = ddp_time_now() - t0;
    if (a->epochs > 0)
        printf("Throughput: %.0f samples/s\n", dt > 0 ? (double)samples / dt : 0.0);
    return 0;
}

static int evaluate(ddp_model_t *model, ddp_tape_t *tape, ddp_dataset *test, double *acc)
{
    ddp_loader_opts o = ddp_loader_defaults();
    o.batch_size = EVAL_BATCH;
    ddp_loader *dl;
    int rc = ddp_loader_create(test, &o, &dl);
    if (rc < 0)
        return rc;
    ddp_model_train(model, 0);
    ddp_tape_set_grad_enabled(tape, 0); /* torch.no_grad() */
    size_t correct = 0, n = 0;
    ddp_batch b;
    rc = ddp_loader_epoch_begin(dl, 0);
    while (rc >= 0 && (rc = ddp_loader_next(dl, &b)) == 1) {
        ddp_var_t *logits;
        if ((rc = forward(model, tape, &b, &logits)) < 0)
            break;
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
    return rc < 0 ? rc : 0;
}

int main(int argc, char **argv)
{
    args a;
    int prc = parse_args(argc, argv, &a);
    if (prc)
        return prc < 0 ? 0 : prc;

    int status = 1, rc = 0;
    ddp_dataset *train_ds = NULL, *test_ds = NULL;
    ddp_loader *dl = NULL;
    ddp_model_t *model = NULL;
    ddp_tape_t *tape = NULL;
    ddp_optim_t *opt = NULL;

    /* Data first: a missing data set is a usage error (exit 2). */
    double t0 = ddp_time_now();
    if (a.epochs > 0 && open_split(a.data, 1, &train_ds) < 0) {
        status = 2;
        goto out;
    }
    if (train_ds)
        printf("Loaded %zu training samples from %s in %.3f s\n",
               ddp_dataset_length(train_ds), a.data, ddp_time_now() - t0);

    if ((rc = build_model(a.seed, &model)) < 0 || (rc = ddp_tape_create(&tape)) < 0)
        goto out;
    if (a.load && (rc = ddp_model_load_safetensors(model, a.load)) < 0) {
        status = 2; /* a bad --load file is bad input, like a bad data set */
        goto out;
    }
    ddp_sgd_options so = ddp_sgd_defaults(a.lr);
    so.momentum = a.momentum;
    if ((rc = ddp_sgd_create(model, &so, &opt)) < 0)
        goto out;

    if (train_ds) {
        ddp_loader_opts lo = ddp_loader_defaults();
        lo.batch_size = (size_t)a.batch;
        lo.shuffle = a.shuffle;
        lo.seed = a.seed;
        lo.num_workers = (int)a.workers;
        if ((rc = ddp_loader_create(train_ds, &lo, &dl)) < 0 ||
            (rc = train(&a, model, tape, opt, dl)) < 0)
            goto out;
        /* The training images (47 MB) go before the test split comes in:
         * peak memory is the larger of the two, not their sum. */
        ddp_loader_destroy(dl);
        dl = NULL;
        ddp_dataset_destroy(train_ds);
        train_ds = NULL;
    }
    if (a.save && (rc = ddp_model_save_safetensors(model, a.save)) < 0)
        goto out;
    if (open_split(a.data, 0, &test_ds) < 0) {
        status = 2;
        goto out;
    }
    double acc;
    if ((rc = evaluate(model, tape, test_ds, &acc)) < 0)
        goto out;
    printf("Test accuracy: %.2f %%\n", acc);
    status = 0;
out:
    if (rc < 0)
        fprintf(stderr, "ddp-mnist: %s\n", ddp_last_error());
    ddp_loader_destroy(dl);
    ddp_optim_destroy(opt);
    ddp_tape_destroy(tape);
    ddp_model_destroy(model);
    ddp_dataset_destroy(test_ds);
    ddp_dataset_destroy(train_ds);
    return status;
}
