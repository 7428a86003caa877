/* ddp-mnist, the reference program: its command line (flags, defaults,
 * --help, one-line complaints with exit status 2). */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "mnist.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ddp-mnist [options]\n"
            "Trains Sequential(Linear(784,256), ReLU, Linear(256,10)) (or the MLP of\n"
            "--hidden) with SGD and cross-entropy on an MNIST-format data set, then\n"
            "reports test accuracy.\n"
            "\n"
            "  --data DIR        folder with train-/t10k-{images-idx3,labels-idx1}-ubyte[.gz]\n"
            "                    (default /usr/share/datasets/fashion-mnist)\n"
            "  --epochs N        passes over the training set (default 1; 0: only evaluate)\n"
            "  --batch-size N    samples per step (default 64)\n"
            "  --lr X            learning rate (default 0.1)\n"
            "  --momentum X      SGD momentum (default 0)\n"
            "  --seed N          model initialisation and shuffling seed (default 0)\n"
            "  --hidden LIST     hidden layer widths, comma-separated, each followed by a\n"
            "                    ReLU (default 256; 2048,2048: the wide MLP 784-2048-2048-10)\n"
            "  --no-shuffle      visit the training set in order\n"
            "  --workers N       DataLoader worker threads (default 1, or 0 when this\n"
            "                    host runs at least as many ranks as it has CPUs)\n"
            "  --load FILE       start from parameters saved with --save (safetensors)\n"
            "  --save FILE       write the trained parameters (safetensors)\n"
            "  --metrics FILE    rank 0 writes one JSON line per log step (loss, lr,\n"
            "                    samples/s) and per evaluation (test loss, accuracy)\n"
            "  --eval-every N    also evaluate on the test split every N steps\n"
            "  --no-progress     log lines, not a progress bar, on a terminal too\n"
            "Distributed (started by ddprun, mpirun or srun, or by hand):\n"
            "  --backend NAME    process group backend: tcp (default; gloo is the same),\n"
            "                    or mpi when built with MPI\n"
            "  --init-method URL env:// (default), tcp://HOST:PORT or file:///PATH\n"
            "  --rank N, --world-size N   instead of the launcher's environment\n"
            "  --timeout S       rendezvous and collective timeout (default 300)\n"
            "  --checkpoint-dir DIR       rank 0 writes DIR/checkpoint.safetensors\n"
            "  --checkpoint-every N       ... every N optimizer steps (default 100)\n"
            "  --resume          continue from DIR's checkpoint (automatic after a\n"
            "                    ddprun restart when --checkpoint-dir is given)\n"
            "  --zero 1|2        ZeRO: shard the optimizer state (1) and the gradients\n"
            "                    (2) over the ranks (docs/zero.md); its checkpoints are\n"
            "                    sharded: DIR/zero-latest, resumable on any ranks\n"
            "  --powersgd RANK   compress gradients with PowerSGD of this matrix rank\n"
            "                    (PyTorch's powerSGD_hook: warm start, error feedback;\n"
            "                    include/ddp/powersgd.h); no effect on one process\n"
            "  --powersgd-start N plain all-reduces for the first N steps (PyTorch's\n"
            "                    start_powersgd_iter; default 1000, at least 2)\n"
            "  --crash-at-step N rank 1 (rank 0 alone) kills itself at global step N in\n"
            "                    the first attempt: a fault to test restarts with\n"
            "  --pipeline-stages S  the model cut into S stages (1 or 2), one per rank:\n"
            "                    world = replicas x S, rank = replica * S + stage; the\n"
            "                    last stage of replica 0 prints loss and test accuracy;\n"
            "                    checkpoints are sharded as --zero's (DIR/zero-latest)\n"
            "  --micro-batches M micro-batches per step with a pipeline (default 1;\n"
            "                    1F1B schedule, docs/pipeline.md)\n"
            "  --help            this text\n"
            "\n"
            "Exit status: 0 ok, 2 bad flags, data set, --load file or an unwritable\n"
            "output, 1 other failure.\n");
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

/* --hidden W1,W2,...: at most MAX_HIDDEN widths, each 1..65536. */
static int parse_hidden(const char *s, args *a)
{
    int n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || (*end && *end != ',') || v < 1 || v > 65536)
            return bad_usage("--hidden: expected widths in 1..65536 separated by commas, "
                             "got '%s'", s);
        if (n == MAX_HIDDEN)
            return bad_usage("--hidden: at most %d layers, got '%s'", MAX_HIDDEN, s);
        a->hidden[n++] = v;
        if (!*end)
            break;
        p = end + 1;
    }
    a->nhidden = n;
    return 0;
}

/* --powersgd is a DDP communication hook: ZeRO-2 and the pipeline go
 * without DDP, ZeRO-1 does not carry its state yet (checkpoints do:
 * checkpoint.c). */
static int check_powersgd_args(args *a)
{
    if (!a->powersgd) {
        if (a->powersgd_start >= 0)
            return bad_usage("--powersgd-start needs --powersgd");
        return 0;
    }
    const char *bad = a->zero ? "--zero" : a->pipeline_stages ? "--pipeline-stages" : NULL;
    if (bad)
        return bad_usage("--powersgd does not go with %s yet", bad);
    if (a->powersgd_start < 0)
        a->powersgd_start = 1000; /* PyTorch's default */
    return 0;
}

/* --pipeline-stages trains through examples/mnist/pipeline.c, which has
 * none of the outputs below yet. */
static int check_pipeline_args(args *a)
{
    if (!a->pipeline_stages) {
        if (a->micro_batches)
            return bad_usage("--micro-batches needs --pipeline-stages");
        return 0;
    }
    const char *bad = a->load ? "--load" : a->save ? "--save"
                    : a->metrics ? "--metrics" : a->eval_every ? "--eval-every"
                    : a->nhidden != 1 || a->hidden[0] != HIDDEN ? "--hidden" : NULL;
    if (bad)
        return bad_usage("--pipeline-stages does not support %s yet", bad);
    if (!a->micro_batches)
        a->micro_batches = 1;
    if (a->micro_batches > a->batch)
        return bad_usage("--micro-batches %ld is more than --batch-size %ld", a->micro_batches,
                         a->batch);
    return 0;
}

int parse_args(int argc, char **argv, args *a)
{
    enum { O_DATA = 256, O_EPOCHS, O_BATCH, O_LR, O_MOM, O_SEED, O_NOSHUF, O_LOAD, O_SAVE,
           O_WORKERS, O_HELP, O_BACKEND, O_INIT, O_RANK, O_WORLD, O_TIMEOUT, O_CKDIR,
           O_CKEVERY, O_RESUME, O_CRASH, O_METRICS, O_EVAL_EVERY, O_NO_PROGRESS,
           O_PP_STAGES, O_MICRO };
    enum { O_ZERO = 512 };
    enum { O_HIDDEN = 600, O_POWERSGD, O_POWERSGD_START };
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
        {"backend", required_argument, NULL, O_BACKEND},
        {"init-method", required_argument, NULL, O_INIT},
        {"rank", required_argument, NULL, O_RANK},
        {"world-size", required_argument, NULL, O_WORLD},
        {"timeout", required_argument, NULL, O_TIMEOUT},
        {"checkpoint-dir", required_argument, NULL, O_CKDIR},
        {"checkpoint-every", required_argument, NULL, O_CKEVERY},
        {"resume", no_argument, NULL, O_RESUME},
        {"crash-at-step", required_argument, NULL, O_CRASH},
        {"metrics", required_argument, NULL, O_METRICS},
        {"eval-every", required_argument, NULL, O_EVAL_EVERY},
        {"no-progress", no_argument, NULL, O_NO_PROGRESS},
        {"zero", required_argument, NULL, O_ZERO},
        {"hidden", required_argument, NULL, O_HIDDEN},
        {"powersgd", required_argument, NULL, O_POWERSGD},
        {"powersgd-start", required_argument, NULL, O_POWERSGD_START},
        {"pipeline-stages", required_argument, NULL, O_PP_STAGES},
        {"micro-batches", required_argument, NULL, O_MICRO},
        {NULL, 0, NULL, 0},
    };
    *a = (args){.data = "/usr/share/datasets/fashion-mnist", .epochs = 1, .batch = 64,
                .lr = 0.1, .momentum = 0.0, .seed = 0, .shuffle = 1, .workers = -1,
                .backend = "tcp", .rank = -1, .world_size = -1, .timeout = 300,
                .ckpt_every = 100, .crash_at = -1, .progress = 1, .hidden = {HIDDEN},
                .nhidden = 1, .powersgd_start = -1};
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
        case O_CRASH: rc = parse_long("--crash-at-step", optarg, 1, 1L << 40, &a->crash_at); break;
        case O_METRICS: a->metrics = optarg; break;
        case O_EVAL_EVERY:
            rc = parse_long("--eval-every", optarg, 1, 1L << 40, &a->eval_every);
            break;
        case O_NO_PROGRESS: a->progress = 0; break;
        case O_ZERO: rc = parse_long("--zero", optarg, 1, 2, &a->zero); break;
        case O_HIDDEN: rc = parse_hidden(optarg, a); break;
        case O_POWERSGD: rc = parse_long("--powersgd", optarg, 1, 1024, &a->powersgd); break;
        case O_POWERSGD_START:
            rc = parse_long("--powersgd-start", optarg, 2, 1L << 40, &a->powersgd_start);
            break;
        case O_PP_STAGES:
            rc = parse_long("--pipeline-stages", optarg, 1, 2, &a->pipeline_stages);
            break;
        case O_MICRO: rc = parse_long("--micro-batches", optarg, 1, 1 << 20, &a->micro_batches); break;
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
    if ((a->rank < 0) != (a->world_size < 0))
        return bad_usage("--rank and --world-size go together");
    if (a->rank >= 0 && a->rank >= a->world_size)
        return bad_usage("--rank %ld is out of range for --world-size %ld", a->rank,
                         a->world_size);
    if (a->resume && !a->ckpt_dir)
        return bad_usage("--resume needs --checkpoint-dir");
    if (a->zero && a->pipeline_stages)
        return bad_usage("--zero and --pipeline-stages do not go together yet");
    if ((rc = check_powersgd_args(a)) != 0)
        return rc;
    return check_pipeline_args(a);
}
