/* DDP and module buffers with 2 real processes: a rank that starts with
 * other buffers holds rank 0's after construction; with broadcast_buffers
 * (the default) rank 0's buffers reach every rank before each forward, and
 * without it each rank keeps its own; buffers are in no bucket; ranks whose
 * buffers differ in number or size fail alike at construction. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "ddp.h"
#include "ddp/ext.h"
#include "fork_children.h"
#include "pg_util.h"

#define IN 4
#define HID 6
#define B 8

/* Sequential(Linear(4, 6), BatchNorm1d(6), ReLU, Linear(6, 2)). */
static int make_model(int track, ddp_model_t **out)
{
    ddp_module_t *mods[4], *seq;
    ddp_batchnorm_options o = ddp_batchnorm_defaults(HID);
    o.track_running_stats = track;
    if (ddp_linear_create(IN, HID, 1, 1, &mods[0]) < 0 ||
        ddp_batchnorm1d_create(&o, &mods[1]) < 0 || ddp_relu_create(&mods[2]) < 0 ||
        ddp_linear_create(HID, 2, 1, 2, &mods[3]) < 0 ||
        ddp_sequential_create(mods, 4, &seq) < 0)
        return -1;
    return ddp_model_from_module(seq, out);
}

/* A training forward on a batch that depends on seed. */
static int forward(ddp_data_parallel_t *dm, ddp_tape_t *tape, int seed)
{
    static float x[B * IN];
    for (int i = 0; i < B * IN; i++)
        x[i] = (float)sin(0.7 * i + 1.3 * seed);
    ddp_tensor t;
    DDP_TRY(ddp_tensor_wrap(&t, x, 2, (int64_t[]){B, IN}));
    ddp_tape_reset(tape);
    ddp_var_t *v, *y;
    DDP_TRY(ddp_tape_input(tape, &t, 0, &v));
    return ddp_data_parallel_forward(dm, tape, v, &y);
}

typedef struct shared {
    job j;
    int broadcast;        /* the option under test */
    unsigned char got[2][256]; /* each rank's buffer block after the last forward */
    size_t nbytes;
} shared;

static int rank_main(int rank, void *arg)
{
    shared *s = arg;
    ddp_pg_t *pg;
    CHILD_CHECK(ddp_init_process_group("tcp", s->j.url, rank, 2, 20.0, &pg) == 0);
    ddp_model_t *m;
    CHILD_CHECK(make_model(1, &m) == 0);
    float *rm = ddp_model_find_buffer(m, "1.running_mean")->data;
    int64_t *nbt = ddp_model_find_buffer(m, "1.num_batches_tracked")->data;
    if (rank == 1) { /* a replica that starts elsewhere */
        for (int c = 0; c < HID; c++)
            rm[c] = 5.0f;
        *nbt = 99;
    }
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    CHILD_CHECK(o.broadcast_buffers == 1); /* PyTorch's default */
    o.broadcast_buffers = s->broadcast;
    ddp_data_parallel_t *dm;
    CHILD_CHECK(ddp_data_parallel_create(m, pg, &o, &dm) == 0);
    /* Construction: rank 0's buffers everywhere. */
    CHILD_CHECK(rm[0] == 0.0f && rm[HID - 1] == 0.0f && *nbt == 0);
    /* No buffer in a bucket: the buckets hold exactly the parameters. */
    size_t numel = 0, pnumel;
    ddp_model_param_block(m, &pnumel);
    for (int b = 0; b < ddp_data_parallel_num_buckets(dm); b++) {
        size_t n;
        CHILD_CHECK(ddp_data_parallel_bucket_info(dm, b, NULL, &n) == 0);
        numel += n;
    }
    CHILD_CHECK(numel == pnumel);
    ddp_tape_t *tape;
    CHILD_CHECK(ddp_tape_create(&tape) == 0);
    CHILD_CHECK(forward(dm, tape, rank) == 0); /* each rank its own batch */
    CHILD_CHECK(*nbt == 1);
    if (rank == 1)
        rm[0] = 42.0f;
    CHILD_CHECK(forward(dm, tape, 7) == 0); /* the same batch on both */
    size_t nbytes;
    const void *block = ddp_model_buffer_block(m, &nbytes); /* before nbytes is read */
    memcpy(s->got[rank], block, nbytes);
    s->nbytes = nbytes;
    ddp_tape_destroy(tape);
    ddp_data_parallel_destroy(dm);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    return 0;
}

static void run(int broadcast, shared *s)
{
    job_init(&s->j);
    s->broadcast = broadcast;
    assert_int_equal(run_children(2, rank_main, s, 60.0), 0);
    job_cleanup(&s->j);
    assert_true(s->nbytes > 0 && s->nbytes <= sizeof s->got[0]);
}

static void test_broadcast_buffers(void **state)
{
    (void)state;
    shared *s = shared_page(sizeof *s);
    run(1, s);
    /* Rank 1's 42 was replaced by rank 0's before the second forward, and
     * both then saw the same batch: the blocks are equal to the bit. */
    assert_memory_equal(s->got[0], s->got[1], s->nbytes);
    run(0, s);
    /* Without broadcast_buffers, rank 1's running statistics are its own. */
    assert_memory_not_equal(s->got[0], s->got[1], s->nbytes);
}

static int mismatch_main(int rank, void *arg)
{
    shared *s = arg;
    ddp_pg_t *pg;
    CHILD_CHECK(ddp_init_process_group("tcp", s->j.url, rank, 2, 20.0, &pg) == 0);
    ddp_model_t *m;
    CHILD_CHECK(make_model(rank == 0, &m) == 0); /* rank 1: no running statistics */
    ddp_data_parallel_t *dm;
    CHILD_CHECK(ddp_data_parallel_create(m, pg, NULL, &dm) == DDP_ERR_MISMATCH);
    CHILD_CHECK(strstr(ddp_last_error(), "rank 1 differs from rank 0: 0 buffers of 0 bytes on "
                                         "rank 1, 3 of 56 bytes on rank 0") != NULL);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_buffer_mismatch(void **state)
{
    (void)state;
    shared *s = shared_page(sizeof *s);
    job_init(&s->j);
    assert_int_equal(run_children(2, mismatch_main, s, 60.0), 0);
    job_cleanup(&s->j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_broadcast_buffers),
        cmocka_unit_test(test_buffer_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
