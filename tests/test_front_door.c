/* The front door's helpers and program: ddp_init_process_group_env (a
 * group from the launcher's variables), ddp_loader_distributed_create (each
 * rank its DistributedSampler share), ddp_batch_input (a batch onto the
 * tape), DDP_CHECK (print, error file, exit 1), and examples/minimal.c run
 * by ddprun on 2 processes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data_fixture.h"
#include "ddp.h"
#include "fork_children.h"
#include "free_port.h"
#include "mnist_output.h"
#include "pg_util.h"
#include "scratch_dir.h"

/* ---- a dataset whose sample i is (i, -i) with label i ---- */

#define NSAMPLES 11

static size_t ds_length(void *self) { return (void)self, NSAMPLES; }

static int ds_get(void *self, size_t i, float *x, int64_t *label)
{
    (void)self;
    x[0] = (float)i;
    x[1] = -(float)i;
    *label = (int64_t)i;
    return 0;
}

static const ddp_dataset_ops ds_ops = {.length = ds_length, .get = ds_get};

/* ---- a group from the launcher's variables; each rank's share ---- */

typedef struct {
    int port;
    int64_t labels[2][2][8]; /* [rank][epoch][position] */
    int count[2][2];
    int size[2], rank[2];
} shared;

static int rank_main(int rank, void *arg)
{
    shared *sh = arg;
    char port[16], r[16];
    snprintf(port, sizeof port, "%d", sh->port);
    snprintf(r, sizeof r, "%d", rank);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    setenv("RANK", r, 1);
    setenv("WORLD_SIZE", "2", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group_env("tcp", 30, &pg) == 0);
    sh->size[rank] = ddp_pg_size(pg);
    sh->rank[rank] = ddp_pg_rank(pg);
    ddp_dataset_t *ds;
    CHILD_CHECK(ddp_dataset_create(&ds_ops, NULL, 2, &ds) == 0);
    ddp_loader_options o = ddp_loader_defaults();
    o.batch_size = 4;
    o.shuffle = 1;
    o.seed = 7;
    ddp_loader_t *dl;
    CHILD_CHECK(ddp_loader_distributed_create(ds, pg, &o, &dl) == 0);
    CHILD_CHECK(ddp_loader_length(dl) == 2); /* ceil(11 / 2) = 6 samples, batches 4 + 2 */
    for (int e = 0; e < 2; e++) {
        CHILD_CHECK(ddp_loader_epoch_begin(dl, (uint64_t)e) == 0);
        ddp_batch b;
        int rc;
        while ((rc = ddp_loader_next(dl, &b)) == 1)
            for (size_t i = 0; i < b.size && sh->count[rank][e] < 8; i++)
                sh->labels[rank][e][sh->count[rank][e]++] = b.y64[i];
        CHILD_CHECK(rc == 0);
    }
    ddp_loader_destroy(dl); /* frees its sampler (ASan builds check) */
    ddp_dataset_destroy(ds);
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_group_and_loader_from_the_environment(void **state)
{
    (void)state;
    shared *sh = shared_page(sizeof *sh);
    sh->port = free_port();
    assert_int_equal(run_children(2, rank_main, sh, 60), 0);
    for (int rank = 0; rank < 2; rank++) {
        assert_int_equal(sh->size[rank], 2);
        assert_int_equal(sh->rank[rank], rank);
        /* The same indices as a DistributedSampler made by hand. */
        ddp_sampler_distributed_options so = ddp_sampler_distributed_defaults();
        so.num_replicas = 2;
        so.rank = rank;
        so.seed = 7;
        ddp_sampler_t *s;
        assert_int_equal(ddp_sampler_distributed_create(NSAMPLES, &so, &s), 0);
        assert_int_equal(ddp_sampler_length(s), 6);
        for (int e = 0; e < 2; e++) {
            size_t idx[6];
            ddp_sampler_set_epoch(s, (uint64_t)e);
            assert_int_equal(ddp_sampler_fill(s, idx), 0);
            assert_int_equal(sh->count[rank][e], 6);
            for (int i = 0; i < 6; i++)
                assert_int_equal(sh->labels[rank][e][i], (int64_t)idx[i]);
        }
        ddp_sampler_destroy(s);
    }
    /* Shuffled: the two epochs differ; together the ranks cover every sample. */
    assert_memory_not_equal(sh->labels[0][0], sh->labels[0][1], 6 * sizeof(int64_t));
    int seen[NSAMPLES] = {0};
    for (int rank = 0; rank < 2; rank++)
        for (int i = 0; i < 6; i++)
            seen[sh->labels[rank][0][i]] = 1;
    for (int i = 0; i < NSAMPLES; i++)
        assert_int_equal(seen[i], 1);
}

static void test_group_without_a_launcher(void **state)
{
    (void)state;
    const char *vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                          "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
    ddp_pg_t *pg = NULL;
    assert_int_equal(ddp_init_process_group_env("tcp", 5, &pg), DDP_ERR_NOT_FOUND);
    assert_null(pg);
    assert_non_null(strstr(ddp_last_error(), "start the program with a launcher (ddprun"));
    setenv("RANK", "0", 1); /* half a pair: the launcher parser's message */
    assert_int_equal(ddp_init_process_group_env("tcp", 5, &pg), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "WORLD_SIZE"));
    unsetenv("RANK");
    assert_int_equal(ddp_init_process_group_env("tcp", 5, NULL), DDP_ERR_INVALID_ARG);
}

static void test_loader_without_a_group_and_bad_options(void **state)
{
    (void)state;
    ddp_dataset_t *ds;
    assert_int_equal(ddp_dataset_create(&ds_ops, NULL, 2, &ds), 0);
    ddp_loader_options o = ddp_loader_defaults();
    o.batch_size = 5;
    ddp_loader_t *dl;
    assert_int_equal(ddp_loader_distributed_create(ds, NULL, &o, &dl), 0); /* one process */
    assert_int_equal(ddp_loader_length(dl), 3);
    assert_int_equal(ddp_loader_epoch_begin(dl, 0), 0);
    ddp_batch b;
    assert_int_equal(ddp_loader_next(dl, &b), 1);
    for (size_t i = 0; i < b.size; i++) /* not shuffled: 0, 1, 2, ... */
        assert_int_equal(b.y64[i], (int64_t)i);

    /* The batch onto a tape: (size, sample_numel), a view of b.x. */
    ddp_tape_t *tape;
    ddp_var_t *x;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(ddp_batch_input(&b, tape, &x), 0);
    const ddp_tensor *t = ddp_var_tensor(x);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 5);
    assert_int_equal(t->shape[1], 2);
    assert_ptr_equal(t->data, b.x);
    assert_true(t->data[2 * 3 + 1] == -3.0f);
    ddp_batch empty = {0};
    assert_int_equal(ddp_batch_input(&empty, tape, &x), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "the batch is empty"));
    assert_int_equal(ddp_batch_input(NULL, tape, &x), DDP_ERR_INVALID_ARG);
    ddp_tape_destroy(tape);
    ddp_loader_destroy(dl);

    ddp_sampler_t *s;
    assert_int_equal(ddp_sampler_sequential_create(NSAMPLES, &s), 0);
    o.sampler = s;
    assert_int_equal(ddp_loader_distributed_create(ds, NULL, &o, &dl), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "opts->sampler must be NULL"));
    ddp_sampler_destroy(s);
    o.sampler = NULL;
    o.batch_size = 0; /* the loader's own check; the sampler made for it is freed */
    assert_int_equal(ddp_loader_distributed_create(ds, NULL, &o, &dl), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "batch_size"));
    ddp_dataset_destroy(ds);
}

/* ---- DDP_CHECK: in a child, a failing call prints, writes the error
 * file and exits 1 ---- */

static void test_check_macro(void **state)
{
    (void)state;
    char errfile[128], outfile[128];
    snprintf(errfile, sizeof errfile, "%s/error", dir);
    snprintf(outfile, sizeof outfile, "%s/stderr", dir);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(outfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        setenv("DDP_ERROR_FILE", errfile, 1);
        DDP_CHECK(ddp_tape_create(NULL));
        _exit(0); /* not reached */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 1);
    char *err = slurp(outfile), *line = slurp(errfile);
    assert_non_null(err);
    assert_non_null(strstr(err, "test_front_door.c:"));
    assert_non_null(strstr(err, ": ddp_tape_create(NULL): "));
    assert_non_null(strstr(err, "tape: out is NULL (DDP_ERR_INVALID_ARG)"));
    assert_non_null(line);
    assert_non_null(strstr(line, "tape: out is NULL"));
    free(err);
    free(line);
    /* A passing call does nothing. */
    ddp_tape_t *tape;
    DDP_CHECK(ddp_tape_create(&tape));
    ddp_tape_destroy(tape);
}

/* ---- examples/minimal.c under ddprun, 2 processes ---- */

static void test_minimal_program_on_two_ranks(void **state)
{
    (void)state;
    const char *build = getenv("DDP_TEST_BUILD");
    build = build ? build : "build";
    /* 12800 samples (100 steps of 64 per rank and epoch), learnable: the
     * 78 pixels of band `label` are bright, the others noise below 64. */
    enum { N = 12800, P = 784 };
    uint8_t *px = malloc((size_t)N * P), *lb = malloc(N);
    for (size_t i = 0; i < N; i++) {
        lb[i] = (uint8_t)((i * 7) % 10);
        for (size_t j = 0; j < P; j++)
            px[i * P + j] = j / 78 == lb[i] ? 255 : (uint8_t)((i * 31 + j * 7) % 64);
    }
    fx_write_idx(dir, "train-images-idx3-ubyte", 0, DDP_IDX_MAGIC_IMAGES, 3,
                 (uint32_t[]){N, 28, 28}, px, (size_t)N * P);
    fx_write_idx(dir, "train-labels-idx1-ubyte", 0, DDP_IDX_MAGIC_LABELS, 1, (uint32_t[]){N},
                 lb, N);
    free(px);
    free(lb);
    char cmd[2048], log[128];
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(cmd, sizeof cmd,
             "timeout -k 5 300 %s/bin/ddprun --standalone --nproc-per-node 2 "
             "%s/bin/ddp-minimal %s 2 >%s 2>&1",
             build, build, dir, log);
    int st = system(cmd);
    char *out = slurp(log);
    assert_non_null(out);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("ddp-minimal exit %d:\n%s", st, out);
    /* Rank 0 alone prints, once per 100 steps. */
    const char *e1 = strstr(out, "Epoch [1/2], Step [100/100], Loss: ");
    const char *e2 = strstr(out, "Epoch [2/2], Step [100/100], Loss: ");
    if (!e1 || !e2)
        fail_msg("missing step lines:\n%s", out);
    assert_null(strstr(e1 + 1, "Epoch [1/2]"));
    assert_null(strstr(e2 + 1, "Epoch [2/2]"));
    double l1 = atof(e1 + strlen("Epoch [1/2], Step [100/100], Loss: "));
    double l2 = atof(e2 + strlen("Epoch [2/2], Step [100/100], Loss: "));
    /* Uniform guessing over 10 classes is ln 10 = 2.30; the bands are
     * learnt within the first epoch. */
    if (!(l1 > 0 && l1 < 0.5 && l2 > 0 && l2 < l1))
        fail_msg("losses %g, %g:\n%s", l1, l2, out);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_and_loader_from_the_environment),
        cmocka_unit_test(test_group_without_a_launcher),
        cmocka_unit_test(test_loader_without_a_group_and_bad_options),
        IN_SCRATCH(test_check_macro),
        IN_SCRATCH(test_minimal_program_on_two_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
