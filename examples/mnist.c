/* ddp-mnist: the reference program.  PyTorch's beginner feed-forward example
 * in C against libddp, on one process or, started by ddprun (or mpirun,
 * srun), on N processes with DistributedDataParallel:
 *
 *   model = Sequential(Linear(784, 256), ReLU(), Linear(256, 10))
 *   loss  = CrossEntropyLoss(); opt = SGD(model.parameters(), lr, momentum)
 *   data  = DataLoader(FashionMNIST(train=True, transform=ToTensor()),
 *                      batch_size=64, shuffle=True, num_workers)
 *   for epoch: for i, (images, labels) in enumerate(data): step;
 *       every 100 steps print "Epoch [e/N], Step [i/total], Loss: x.xxxx"
 *   then "Throughput: N samples/s" (training loop only, all ranks together)
 *   and "Test accuracy: NN.NN %" on the test split, from rank 0.
 *
 * Distributed: rank and world size come from the launcher's environment
 * (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_*, SLURM_*) or --rank and
 * --world-size; rendezvous through --init-method (env://, tcp://HOST:PORT,
 * file:///PATH).  Each rank trains on its DistributedSampler share; DDP
 * averages gradients during backward.  With --checkpoint-dir, rank 0 saves
 * model, optimizer and position every --checkpoint-every steps; --resume
 * (automatic after a ddprun restart) continues from there and ends with the
 * same weights as an uninterrupted run.
 *
 * Exit status: 0 on success, 2 for bad flags, a missing/malformed data set
 * or --load file (one line on stderr), 1 for any other failure.  See --help. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
    const char *backend;
    const char *init_method; /* NULL: env:// when distributed */
    long rank, world_size;   /* -1: from the launcher's environment */
    double timeout;
    const char *ckpt_dir;
    long ckpt_every;
    int resume;
    long crash_at;           /* fault injection for restart tests: -1 off */
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
            "  --workers N       DataLoader worker threads (default 1, or 0 when this\n"
            "                    host runs at least as many ranks as it has CPUs)\n"
            "  --load FILE       start from parameters saved with --save (safetensors)\n"
            "  --save FILE       write the trained parameters (safetensors)\n"
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
            "  --crash-at-step N rank 1 (rank 0 alone) kills itself at global step N in\n"
            "                    the first attempt: a fault to test restarts with\n"
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
           O_WORKERS, O_HELP, O_BACKEND, O_INIT, O_RANK, O_WORLD, O_TIMEOUT, O_CKDIR,
           O_CKEVERY, O_RESUME, O_CRASH };
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
        {NULL, 0, NULL, 0},
    };
    *a = (args){.data = "/usr/share/datasets/fashion-mnist", .epochs = 1, .batch = 64,
                .lr = 0.1, .momentum = 0.0, .seed = 0, .shuffle = 1, .workers = -1,
                .backend = "tcp", .rank = -1, .world_size = -1, .timeout = 300,
                .ckpt_every = 100, .crash_at = -1};
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
        case O_CKEVERY: rc = parse_long("--checkpoint-every", optarg, 1, 1L << 40, &a->ckpt_every); break;
        case O_RESUME: a->resume = 1; break;
        case O_CRASH: rc = parse_long("--crash-at-step", optarg, 1, 1L << 40, &a->crash_at); break;
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

/* Forward pass of one batch on a fresh tape: *logits (B, 10); through DDP
 * when dm is not NULL. */
static int forward(ddp_data_parallel_t *dm, ddp_model_t *model, ddp_tape_t *tape,
                   const ddp_batch *b, ddp_var_t **logits)
{
    ddp_tensor x;
    ddp_var_t *in;
    ddp_tape_reset(tape);
    int rc = ddp_tensor_wrap(&x, b->x, 2, (int64_t[]){(int64_t)b->size, IN});
    if (rc < 0 || (rc = ddp_tape_input(tape, &x, 0, &in)) < 0)
        return rc;
    return dm ? ddp_data_parallel_forward(dm, tape, in, logits) : ddp_model_forward(model, tape, in, logits);
}

static int open_split(const char *dir, int train, ddp_dataset_t **ds)
{
    ddp_mnist_options mo = ddp_mnist_defaults();
    mo.train = train;
    int rc = ddp_mnist_create(dir, &mo, ds);
    if (rc < 0) {
        fprintf(stderr, "ddp-mnist: %s\n", ddp_last_error());
        return rc;
    }
    if (ddp_dataset_sample_numel(*ds) != IN) {
        fprintf(stderr, "ddp-mnist: %s: %s images are not 28x28 (%zu pixels each, expected %d)\n",
                dir, train ? "training" : "test", ddp_dataset_sample_numel(*ds), IN);
        ddp_dataset_destroy(*ds);
        *ds = NULL;
        return DDP_ERR_FORMAT;
    }
    return 0;
}

/* DDP_MNIST_PROFILE=1: where a training step's time goes, per phase,
 * printed by every rank on stderr at the end (bench/ddp_mnist.sh). */
enum { PH_LOAD, PH_FORWARD, PH_BACKWARD, PH_STEP, PH_N };
static const char *const phase_names[PH_N] = {"load", "forward", "backward", "optimizer"};

/* One job: this process's place in it and what it trains. */
typedef struct job {
    const args *a;
    int rank, world, restart;
    int local_world;      /* processes of the job on this host (launcher's word, else 1) */
    ddp_pg_t *pg;         /* NULL when alone */
    ddp_data_parallel_t *dm;        /* NULL when alone */
    ddp_model_t *model;
    ddp_tape_t *tape;
    ddp_optim_t *opt;
    ddp_train_state st;   /* where training starts (after a resume) */
    char ckpt[4096];      /* checkpoint path, "" without --checkpoint-dir */
    int profile;          /* DDP_MNIST_PROFILE=1 */
    int timestamps;       /* DDP_MNIST_TIMESTAMPS=1 */
    double phase[PH_N];   /* seconds spent in each phase (with profile) */
} job;

static int save_checkpoint(job *j, int64_t epoch, int64_t step)
{
    ddp_train_state st = {.epoch = epoch, .step = step, .global_step = j->st.global_step,
                          .seed = j->a->seed, .world_size = j->world};
    return j->rank == 0 ? ddp_checkpoint_save(j->ckpt, j->model, j->opt, &st) : 0;
}

/* The fault that --crash-at-step injects: rank 1 (or a lone rank 0) dies
 * as kill -9 would kill it, in the first attempt only. */
static void maybe_crash(const job *j)
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
    ddp_optim_zero_grad(j->opt);
    lap(j, PH_FORWARD, &t);
    rc = j->dm ? ddp_data_parallel_backward(j->dm, j->tape, loss) : ddp_tape_backward(j->tape, loss, j->model);
    lap(j, PH_BACKWARD, &t);
    if (rc < 0 || (rc = ddp_optim_step(j->opt)) < 0)
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

static int train(job *j, ddp_loader_t *dl)
{
    const args *a = j->a;
    size_t total = ddp_loader_length(dl), samples = 0, steps = 0;
    double t0 = ddp_time_now();
    double cpu0 = clock_seconds(CLOCK_PROCESS_CPUTIME_ID), main0 = clock_seconds(CLOCK_THREAD_CPUTIME_ID);
    for (long epoch = (long)j->st.epoch; epoch < a->epochs; epoch++) {
        int rc = ddp_loader_epoch_begin(dl, (uint64_t)epoch);
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
            samples += b.size;
            j->st.global_step++;
            if (samples == b.size && j->rank == 0 && j->timestamps)
                printf("First step at: %.6f\n", wall_clock()); /* for bench/ddp_mnist.sh */
            maybe_crash(j);
            if (j->rank == 0 && (b.index + 1) % 100 == 0)
                printf("Epoch [%ld/%ld], Step [%zu/%zu], Loss: %.4f\n", epoch + 1, a->epochs,
                       b.index + 1, total, loss);
            if (j->ckpt[0] && j->st.global_step % a->ckpt_every == 0)
                rc = b.index + 1 == total ? save_checkpoint(j, epoch + 1, 0)
                                          : save_checkpoint(j, epoch, (int64_t)b.index + 1);
            if (rc < 0)
                break;
            if (j->profile)
                tl = ddp_time_now();
        }
        if (rc < 0)
            return rc;
        fflush(stdout);
    }
    print_profile(j, steps, ddp_time_now() - t0, clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0,
                  clock_seconds(CLOCK_THREAD_CPUTIME_ID) - main0);
    if (a->epochs > j->st.epoch)
        return report_throughput(j, samples, ddp_time_now() - t0);
    return 0;
}

static int evaluate(ddp_model_t *model, ddp_tape_t *tape, ddp_dataset_t *test, double *acc)
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
    ddp_batch b;
    rc = ddp_loader_epoch_begin(dl, 0);
    while (rc >= 0 && (rc = ddp_loader_next(dl, &b)) == 1) {
        ddp_var_t *logits;
        if ((rc = forward(NULL, model, tape, &b, &logits)) < 0)
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

/* Rank and world size from the flags or the launcher; a process group when
 * there is more than one process or an init method was given. */
static int join_job(job *j)
{
    const args *a = j->a;
    ddp_launch_info li;
    int rc = ddp_launch_info_from_env(&li);
    if (rc == DDP_ERR_INVALID_ARG)
        return rc;
    j->rank = 0;
    j->world = 1;
    j->local_world = rc == 0 ? li.local_world_size : 1;
    if (a->rank >= 0) {
        j->rank = (int)a->rank;
        j->world = (int)a->world_size;
    } else if (rc == 0) {
        j->rank = li.rank;
        j->world = li.world_size;
    }
    const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
    j->restart = restart ? atoi(restart) : 0;
    if (j->world == 1 && !a->init_method)
        return 0;
    return ddp_init_process_group(a->backend, a->init_method ? a->init_method : "env://",
                                  j->rank, j->world, a->timeout, &j->pg);
}

/* Rank 0 loads the checkpoint when resuming: 1 loaded, 0 none to load, < 0
 * failed (message printed). */
static int load_checkpoint(job *j)
{
    if (!j->ckpt[0] || !(j->a->resume || j->restart > 0) || j->rank != 0)
        return 0;
    int rc = ddp_checkpoint_load(j->ckpt, j->model, j->opt, &j->st);
    if (rc == DDP_ERR_NOT_FOUND) {
        printf("No checkpoint at %s yet: starting from the beginning\n", j->ckpt);
        return 0;
    }
    if (rc < 0) {
        fprintf(stderr, "ddp-mnist: %s\n", ddp_last_error());
        return rc;
    }
    if (j->st.world_size != j->world) {
        fprintf(stderr, "ddp-mnist: %s was written by %d ranks; resume it with %d, not %d\n",
                j->ckpt, j->st.world_size, j->st.world_size, j->world);
        return DDP_ERR_MISMATCH;
    }
    printf("Resuming from %s: epoch %lld, step %lld\n", j->ckpt, (long long)j->st.epoch + 1,
           (long long)j->st.step);
    return 1;
}

/* Rank 0's load result, position and optimizer state go to every rank (the
 * parameters follow with DDP's broadcast), so only rank 0 needs the file. */
static int share_checkpoint(job *j, int loaded)
{
    if (!j->pg)
        return loaded < 0 ? loaded : 0;
    int64_t v[5] = {loaded, j->st.epoch, j->st.step, j->st.global_step, ddp_optim_steps(j->opt)};
    int rc = ddp_pg_broadcast(j->pg, v, 5, DDP_INT64, 0);
    if (rc == 0 && v[0] < 0 && j->rank != 0)
        fprintf(stderr, "ddp-mnist: rank %d: rank 0 could not load %s\n", j->rank, j->ckpt);
    if (rc < 0 || v[0] <= 0)
        return rc < 0 ? rc : v[0] < 0 ? DDP_ERR_MISMATCH : 0;
    j->st.epoch = v[1];
    j->st.step = v[2];
    j->st.global_step = v[3];
    ddp_optim_set_steps(j->opt, v[4]);
    for (int k = 0; k < ddp_optim_num_states(j->opt); k++) {
        const char *name;
        float *data;
        size_t n;
        if ((rc = ddp_optim_state(j->opt, k, &name, &data, &n)) < 0 ||
            (rc = ddp_pg_broadcast(j->pg, data, n, DDP_FLOAT32, 0)) < 0)
            return rc;
    }
    return 0;
}

int main(int argc, char **argv)
{
    args a;
    int prc = parse_args(argc, argv, &a);
    if (prc)
        return prc < 0 ? 0 : prc;
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines appear as they happen */
    /* The library is silent unless asked; a program shows its warnings
     * (a rendezvous still waiting for ranks, say) unless DDP_LOG_LEVEL says. */
    setenv("DDP_LOG_LEVEL", "warn", 0); /* 0: a level the user set stays */

    int status = 1, rc = 0;
    job j = {.a = &a};
    ddp_dataset_t *train_ds = NULL, *test_ds = NULL;
    ddp_loader_t *dl = NULL;
    ddp_sampler_t *sampler = NULL;
    if (ddp_env_bool("DDP_MNIST_PROFILE", &j.profile) < 0 ||
        ddp_env_bool("DDP_MNIST_TIMESTAMPS", &j.timestamps) < 0) {
        fprintf(stderr, "ddp-mnist: %s\n", ddp_last_error());
        return 2;
    }

    if ((rc = join_job(&j)) < 0) {
        status = rc == DDP_ERR_INVALID_ARG ? 2 : 1;
        goto out;
    }
    if (a.ckpt_dir) {
        snprintf(j.ckpt, sizeof j.ckpt, "%s/checkpoint.safetensors", a.ckpt_dir);
        if (j.rank == 0 && mkdir(a.ckpt_dir, 0755) < 0 && errno != EEXIST) {
            fprintf(stderr, "ddp-mnist: --checkpoint-dir %s: %s\n", a.ckpt_dir, strerror(errno));
            status = 2;
            goto out;
        }
    }

    /* Data first, every input before the first step: a missing or broken
     * file of either split is a usage error (exit 2) found at once, not
     * after an epoch of training.  Every rank checks the test split, so that
     * all stop alike, and lets it go: rank 0 reads it again for the
     * evaluation once the training images (47 MB) are gone, so the peak
     * memory stays that of training (a re-read from the decompressed cache
     * takes a few ms). */
    double t0 = ddp_time_now();
    if (a.epochs > 0 && open_split(a.data, 1, &train_ds) < 0) {
        status = 2;
        goto out;
    }
    if (train_ds && j.rank == 0)
        printf("Loaded %zu training samples from %s in %.3f s\n",
               ddp_dataset_length(train_ds), a.data, ddp_time_now() - t0);
    if (open_split(a.data, 0, &test_ds) < 0) {
        status = 2;
        goto out;
    }
    ddp_dataset_destroy(test_ds);
    test_ds = NULL;

    if ((rc = build_model(a.seed, &j.model)) < 0 || (rc = ddp_tape_create(&j.tape)) < 0)
        goto out;
    /* With DDP, rank 0's parameters are broadcast: only it reads --load. */
    if (a.load && j.rank == 0 && (rc = ddp_model_load_safetensors(j.model, a.load)) < 0) {
        status = 2; /* a bad --load file is bad input, like a bad data set */
        goto out;
    }
    ddp_sgd_options so = ddp_sgd_defaults(a.lr);
    so.momentum = a.momentum;
    if ((rc = ddp_sgd_create(j.model, &so, &j.opt)) < 0)
        goto out;
    if ((rc = share_checkpoint(&j, load_checkpoint(&j))) < 0) {
        status = 2;
        rc = 0; /* already reported */
        goto out;
    }
    if (j.pg && (rc = ddp_data_parallel_create(j.model, j.pg, NULL, &j.dm)) < 0)
        goto out;

    if (train_ds) {
        ddp_loader_options lo = ddp_loader_defaults();
        lo.batch_size = (size_t)a.batch;
        lo.shuffle = a.shuffle;
        lo.seed = a.seed;
        lo.num_workers = (int)a.workers;
        /* A loader thread per rank competes with the ranks themselves when
         * every CPU already runs one: 3-10 % slower on 2 ranks x 2 CPUs
         * (7 of 7 alternated pairs); otherwise it has a core of its own. */
        if (a.workers < 0)
            lo.num_workers = j.local_world >= sysconf(_SC_NPROCESSORS_ONLN) ? 0 : 1;
        if (j.pg) { /* each rank its share: torch's DistributedSampler */
            ddp_sampler_distributed_options dso = ddp_sampler_distributed_defaults();
            dso.num_replicas = j.world;
            dso.rank = j.rank;
            dso.shuffle = a.shuffle;
            dso.seed = a.seed;
            if ((rc = ddp_sampler_distributed_create(ddp_dataset_length(train_ds), &dso,
                                                     &sampler)) < 0)
                goto out;
            lo.sampler = sampler;
            lo.shuffle = 0; /* the sampler shuffles: both is an error, as in PyTorch */
        }
        if ((rc = ddp_loader_create(train_ds, &lo, &dl)) < 0 || (rc = train(&j, dl)) < 0)
            goto out;
        /* The training images (47 MB) go before the evaluation's loader
         * comes in. */
        ddp_loader_destroy(dl);
        dl = NULL;
        ddp_dataset_destroy(train_ds);
        train_ds = NULL;
    }
    if (j.rank == 0) {
        if (a.save && (rc = ddp_model_save_safetensors(j.model, a.save)) < 0)
            goto out;
        double acc;
        if (open_split(a.data, 0, &test_ds) < 0) {
            status = 2;
            goto out;
        }
        if ((rc = evaluate(j.model, j.tape, test_ds, &acc)) < 0)
            goto out;
        printf("Test accuracy: %.2f %%\n", acc);
    }
    /* The others wait for rank 0's evaluation before leaving the group. */
    if (j.pg && (rc = ddp_pg_barrier(j.pg)) < 0)
        goto out;
    status = 0;
out:
    if (rc < 0) {
        if (j.pg)
            fprintf(stderr, "ddp-mnist: rank %d: %s\n", j.rank, ddp_last_error());
        else
            fprintf(stderr, "ddp-mnist: %s\n", ddp_last_error());
    }
    ddp_loader_destroy(dl);
    ddp_sampler_destroy(sampler);
    ddp_data_parallel_destroy(j.dm);
    ddp_optim_destroy(j.opt);
    ddp_tape_destroy(j.tape);
    ddp_model_destroy(j.model);
    ddp_dataset_destroy(test_ds);
    ddp_dataset_destroy(train_ds);
    ddp_destroy_process_group(j.pg);
    return status;
}
