/* ddp-cnn: its command line (flags, defaults, --help, one-line complaints
 * with exit status 2).  The flags are ddp-mnist's where they mean the same. */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cnn.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ddp-cnn [options]\n"
            "Trains PyTorch's examples/mnist network (Conv2d(1,32,3), ReLU, Conv2d(32,64,3),\n"
            "ReLU, MaxPool2d(2), Dropout(0.25), Flatten, Linear(9216,128), ReLU,\n"
            "Dropout(0.5), Linear(128,10), log_softmax + NLL) with Adadelta and\n"
            "StepLR(1, gamma) on an MNIST-format data set, then reports test accuracy.\n"
            "\n"
            "  --data DIR        folder with train-/t10k-{images-idx3,labels-idx1}-ubyte[.gz]\n"
            "                    (default /usr/share/datasets/fashion-mnist)\n"
            "  --epochs N        passes over the training set (default 1; 0: only evaluate)\n"
            "  --batch-size N    samples per step and rank (default 64)\n"
            "  --lr X            Adadelta learning rate (default 1.0)\n"
            "  --gamma X         learning rate decay per epoch (default 0.7)\n"
            "  --seed N          initialisation, shuffling and dropout seed (default 1)\n"
            "  --no-shuffle      visit the training set in order\n"
            "  --no-dropout      dropout off (p = 0): steps that depend on nothing random\n"
            "  --max-steps N     stop after N optimizer steps in all\n"
            "  --workers N       DataLoader worker threads (default 1, or 0 when this\n"
            "                    host runs at least as many ranks as it has CPUs)\n"
            "  --load FILE       start from parameters saved with --save (safetensors)\n"
            "  --save FILE       write the trained parameters (safetensors)\n"
            "Distributed (started by ddprun, mpirun or srun, or by hand):\n"
            "  --backend NAME    process group backend: tcp (default), or mpi\n"
            "  --init-method URL env:// (default), tcp://HOST:PORT or file:///PATH\n"
            "  --rank N, --world-size N   instead of the launcher's environment\n"
            "  --timeout S       rendezvous and collective timeout (default 300)\n"
            "  --checkpoint-dir DIR       rank 0 writes DIR/checkpoint.safetensors\n"
            "  --checkpoint-every N       ... every N optimizer steps (default 100)\n"
            "  --resume          continue from DIR's checkpoint\n"
            "  --help            this text\n"
            "\n"
            "Exit status: 0 ok, 2 bad flags, data set or --load file, 1 other failure.\n");
}

__attribute__((format(printf, 1, 2))) static int bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ddp-cnn: ");
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

/* Checks that hold between flags. */
static int check_args(const args *a)
{
    if ((a->rank < 0) != (a->world_size < 0))
        return bad_usage("--rank and --world-size go together");
    if (a->rank >= 0 && a->rank >= a->world_size)
        return bad_usage("--rank %ld is out of range for --world-size %ld", a->rank,
                         a->world_size);
    if (a->resume && !a->ckpt_dir)
        return bad_usage("--resume needs --checkpoint-dir");
    return 0;
}

int parse_args(int argc, char **argv, args *a)
{
    enum { O_DATA = 256, O_EPOCHS, O_BATCH, O_LR, O_GAMMA, O_SEED, O_NOSHUF, O_NODROP,
           O_MAXSTEPS, O_LOAD, O_SAVE, O_WORKERS, O_HELP, O_BACKEND, O_INIT, O_RANK, O_WORLD,
           O_TIMEOUT, O_CKDIR, O_CKEVERY, O_RESUME };
    static const struct option opts[] = {
        {"data", required_argument, NULL, O_DATA},
        {"epochs", required_argument, NULL, O_EPOCHS},
        {"batch-size", required_argument, NULL, O_BATCH},
        {"lr", required_argument, NULL, O_LR},
        {"gamma", required_argument, NULL, O_GAMMA},
        {"seed", required_argument, NULL, O_SEED},
        {"no-shuffle", no_argument, NULL, O_NOSHUF},
        {"no-dropout", no_argument, NULL, O_NODROP},
        {"max-steps", required_argument, NULL, O_MAXSTEPS},
        {"load", required_argument, NULL, O_LOAD},
        {"save", required_argument, NULL, O_SAVE},
        {"workers", required_argument, NULL, O_WORKERS},
        {"help", no_argument, NULL, O_HELP},
        {"backend", required_argument, NULL, O_BACKEND},
        {"init-method", required_argument, NULL, O_INIT},
        {"rank", required_argument, NULL, O_RANK},
        {"world-size", required_argument, NULL, O_WORLD},
        {"timeout", required_argument, NULL, O_TIMEOUT},
        {"checkpoint-dir", required_argument, NULL, O_CKDIR},
        {"checkpoint-every", required_argument, NULL, O_CKEVERY},
        {"resume", no_argument, NULL, O_RESUME},
        {NULL, 0, NULL, 0},
    };
    *a = (args){.data = "/usr/share/datasets/fashion-mnist", .epochs = 1, .batch = 64,
                .lr = 1.0, .gamma = 0.7, .seed = 1, .shuffle = 1, .dropout = 1,
                .max_steps = -1, .workers = -1, .backend = "tcp", .rank = -1,
                .world_size = -1, .timeout = 300, .ckpt_every = 100};
    opterr = 0;
    int c, rc = 0;
    long seed;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case O_DATA: a->data = optarg; break;
        case O_EPOCHS: rc = parse_long("--epochs", optarg, 0, 1000000, &a->epochs); break;
        case O_BATCH: rc = parse_long("--batch-size", optarg, 1, 1 << 16, &a->batch); break;
        case O_LR: rc = parse_double("--lr", optarg, 0.0, &a->lr); break;
        case O_GAMMA: rc = parse_double("--gamma", optarg, 0.0, &a->gamma); break;
        case O_SEED:
            rc = parse_long("--seed", optarg, 0, 0x7fffffffL, &seed);
            a->seed = (unsigned long long)seed;
            break;
        case O_NOSHUF: a->shuffle = 0; break;
        case O_NODROP: a->dropout = 0; break;
        case O_MAXSTEPS: rc = parse_long("--max-steps", optarg, 0, 1L << 40, &a->max_steps); break;
        case O_LOAD: a->load = optarg; break;
        case O_SAVE: a->save = optarg; break;
        case O_WORKERS: rc = parse_long("--workers", optarg, 0, 64, &a->workers); break;
        case O_HELP: usage(stdout); return -1;
        case O_BACKEND:
            a->backend = optarg;
            if (ddp_pg_backend_check(optarg) < 0)
                return bad_usage("--backend: %s", ddp_last_error());
            break;
        case O_INIT: a->init_method = optarg; break;
        case O_RANK: rc = parse_long("--rank", optarg, 0, 1 << 20, &a->rank); break;
        case O_WORLD: rc = parse_long("--world-size", optarg, 1, 1 << 20, &a->world_size); break;
        case O_TIMEOUT: rc = parse_double("--timeout", optarg, 0.001, &a->timeout); break;
        case O_CKDIR: a->ckpt_dir = optarg; break;
        case O_CKEVERY:
            rc = parse_long("--checkpoint-every", optarg, 1, 1L << 40, &a->ckpt_every);
            break;
        case O_RESUME: a->resume = 1; break;
        case ':': return bad_usage("option '%s' needs a value", argv[optind - 1]);
        default: return bad_usage("unknown option '%s'", argv[optind - 1]);
        }
        if (rc)
            return rc;
    }
    if (optind < argc)
        return bad_usage("unexpected argument '%s'", argv[optind]);
    return check_args(a);
}
