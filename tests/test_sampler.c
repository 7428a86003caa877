/* Tests of the samplers (src/data/sampler.c): sequential, random (a
 * permutation per epoch, reproducible by seed and epoch), distributed (the
 * index lists of torch's DistributedSampler with shuffle=False, written out
 * by hand from torch/utils/data/distributed.py), and a user sampler. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "ddp.h"

static void assert_permutation(const size_t *p, size_t n)
{
    char *seen = calloc(n, 1);
    for (size_t i = 0; i < n; i++) {
        assert_true(p[i] < n);
        assert_false(seen[p[i]]);
        seen[p[i]] = 1;
    }
    free(seen);
}

static void test_sequential(void **state)
{
    (void)state;
    ddp_sampler_t *s;
    assert_int_equal(ddp_sampler_sequential_create(5, &s), 0);
    assert_int_equal(ddp_sampler_length(s), 5);
    size_t out[5];
    ddp_sampler_set_epoch(s, 3);
    assert_int_equal(ddp_sampler_epoch(s), 3);
    assert_int_equal(ddp_sampler_fill(s, out), 0);
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(out[i], i);
    ddp_sampler_destroy(s);
    ddp_sampler_destroy(NULL);
}

static void test_random_by_seed_and_epoch(void **state)
{
    (void)state;
    enum { N = 1000 };
    ddp_sampler_t *a, *b, *c;
    assert_int_equal(ddp_sampler_random_create(N, 42, &a), 0);
    assert_int_equal(ddp_sampler_random_create(N, 42, &b), 0);
    assert_int_equal(ddp_sampler_random_create(N, 43, &c), 0);
    static size_t pa[3][N], pb[N], pc[N];
    for (int e = 0; e < 3; e++) {
        ddp_sampler_set_epoch(a, (uint64_t)e);
        assert_int_equal(ddp_sampler_fill(a, pa[e]), 0);
        assert_permutation(pa[e], N);
    }
    /* Epochs differ from each other and from the identity. */
    assert_memory_not_equal(pa[0], pa[1], sizeof pa[0]);
    assert_memory_not_equal(pa[1], pa[2], sizeof pa[0]);
    size_t fixed = 0;
    for (size_t i = 0; i < N; i++)
        fixed += pa[0][i] == i;
    assert_true(fixed < 10); /* a random permutation has ~1 fixed point */
    /* Same seed and epoch: the same order, whatever came before. */
    ddp_sampler_set_epoch(b, 2);
    assert_int_equal(ddp_sampler_fill(b, pb), 0);
    assert_memory_equal(pa[2], pb, sizeof pb);
    ddp_sampler_set_epoch(b, 0);
    assert_int_equal(ddp_sampler_fill(b, pb), 0);
    assert_memory_equal(pa[0], pb, sizeof pb);
    /* Another seed: another order. */
    assert_int_equal(ddp_sampler_fill(c, pc), 0);
    assert_memory_not_equal(pa[0], pc, sizeof pc);
    /* Uniformity: where index 0 lands over many epochs. */
    size_t first_half = 0;
    for (int e = 0; e < 400; e++) {
        ddp_sampler_set_epoch(c, (uint64_t)e);
        ddp_sampler_fill(c, pc);
        for (size_t i = 0; i < N / 2; i++)
            first_half += pc[i] == 0;
    }
    assert_true(first_half > 150 && first_half < 250); /* 200 +- 5 sigma */
    ddp_sampler_destroy(a);
    ddp_sampler_destroy(b);
    ddp_sampler_destroy(c);
}

static void fill_rank(size_t n, int R, int r, int shuffle, int drop_last, uint64_t epoch,
                      size_t *out, size_t *len)
{
    ddp_sampler_distributed_options o = ddp_sampler_distributed_defaults();
    o.num_replicas = R;
    o.rank = r;
    o.shuffle = shuffle;
    o.drop_last = drop_last;
    o.seed = 5;
    ddp_sampler_t *s;
    assert_int_equal(ddp_sampler_distributed_create(n, &o, &s), 0);
    *len = ddp_sampler_length(s);
    ddp_sampler_set_epoch(s, epoch);
    assert_int_equal(ddp_sampler_fill(s, out), 0);
    ddp_sampler_destroy(s);
}

static void test_distributed_like_torch(void **state)
{
    (void)state;
    /* DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=False):
     * padded to 12 with 0, 1, so rank 2 gets [2, 6, 0], rank 3 [3, 7, 1]. */
    static const size_t pad[4][3] = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
    static const size_t drop[4][2] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
    size_t out[16], len;
    for (int r = 0; r < 4; r++) {
        fill_rank(10, 4, r, 0, 0, 0, out, &len);
        assert_int_equal(len, 3);
        assert_memory_equal(out, pad[r], sizeof pad[r]);
        fill_rank(10, 4, r, 0, 1, 0, out, &len);
        assert_int_equal(len, 2);
        assert_memory_equal(out, drop[r], sizeof drop[r]);
    }
    /* More replicas than samples: the order repeats ([0,1,2,0,1,2,0,1]). */
    for (int r = 0; r < 8; r++) {
        fill_rank(3, 8, r, 0, 0, 0, out, &len);
        assert_int_equal(len, 1);
        assert_int_equal(out[0], (size_t)r % 3);
    }
}

static void test_distributed_shuffle_covers_all(void **state)
{
    (void)state;
    enum { N = 103, R = 4 };
    size_t out[R][32], len;
    for (uint64_t epoch = 0; epoch < 2; epoch++) {
        int count[N] = {0};
        for (int r = 0; r < R; r++) {
            fill_rank(N, R, r, 1, 0, epoch, out[r], &len);
            assert_int_equal(len, 26); /* ceil(103 / 4) */
            for (size_t i = 0; i < len; i++)
                count[out[r][i]]++;
        }
        /* 104 slots: every sample once, one (the first of the order) twice. */
        int twice = 0;
        for (int i = 0; i < N; i++) {
            assert_true(count[i] == 1 || count[i] == 2);
            twice += count[i] == 2;
        }
        assert_int_equal(twice, 1);
        /* The ranks interleave one shared permutation, the random sampler's. */
        ddp_sampler_t *rs;
        size_t perm[N];
        assert_int_equal(ddp_sampler_random_create(N, 5, &rs), 0);
        ddp_sampler_set_epoch(rs, epoch);
        ddp_sampler_fill(rs, perm);
        ddp_sampler_destroy(rs);
        for (int r = 0; r < R; r++)
            for (size_t i = 0; i < len; i++)
                assert_int_equal(out[r][i], perm[(r + i * R) % N]);
        /* drop_last: 25 each, disjoint, the last 3 of the order dropped. */
        int seen[N] = {0};
        for (int r = 0; r < R; r++) {
            fill_rank(N, R, r, 1, 1, epoch, out[r], &len);
            assert_int_equal(len, 25);
            for (size_t i = 0; i < len; i++)
                assert_int_equal(seen[out[r][i]]++, 0);
        }
        for (int i = 100; i < N; i++)
            assert_int_equal(seen[perm[i]], 0);
    }
    size_t e0[32], e1[32];
    fill_rank(N, R, 1, 1, 0, 0, e0, &len);
    fill_rank(N, R, 1, 1, 0, 1, e1, &len);
    assert_memory_not_equal(e0, e1, len * sizeof e0[0]);
}

static void test_distributed_errors(void **state)
{
    (void)state;
    ddp_sampler_distributed_options o = ddp_sampler_distributed_defaults();
    ddp_sampler_t *s;
    o.num_replicas = 4;
    o.rank = 4;
    assert_int_equal(ddp_sampler_distributed_create(10, &o, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "rank 4 out of range [0, 4)"));
    assert_null(s);
    o.num_replicas = 0;
    o.rank = 0;
    assert_int_equal(ddp_sampler_distributed_create(10, &o, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "num_replicas 0 < 1"));
    o.num_replicas = 4;
    o.drop_last = 1;
    assert_int_equal(ddp_sampler_distributed_create(3, &o, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "leaves every rank empty"));
    assert_int_equal(ddp_sampler_distributed_create(0, &o, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "empty dataset"));
    /* NULL options: defaults (one replica, shuffled). */
    assert_int_equal(ddp_sampler_distributed_create(10, NULL, &s), 0);
    assert_int_equal(ddp_sampler_length(s), 10);
    ddp_sampler_destroy(s);
}

/* A user sampler: the even indices backwards, shifted by the epoch. */
static size_t evens_len(void *self) { return *(size_t *)self / 2; }

static int evens_fill(void *self, uint64_t epoch, size_t *out)
{
    size_t n = *(size_t *)self, m = n / 2;
    if (epoch > 100)
        return DDP_ERR_INVALID_ARG;
    for (size_t i = 0; i < m; i++)
        out[i] = (2 * (m - 1 - i) + 2 * epoch) % n;
    return 0;
}

static void test_user_sampler(void **state)
{
    (void)state;
    static const ddp_sampler_ops ops = {evens_len, evens_fill, NULL};
    size_t n = 10, out[5];
    ddp_sampler_t *s;
    assert_int_equal(ddp_sampler_create(&ops, &n, &s), 0); /* self borrowed */
    assert_int_equal(ddp_sampler_length(s), 5);
    ddp_sampler_set_epoch(s, 1);
    assert_int_equal(ddp_sampler_fill(s, out), 0);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 8);
    assert_int_equal(out[4], 2);
    ddp_sampler_destroy(s);
    static const ddp_sampler_ops bad = {evens_len, NULL, NULL};
    assert_int_equal(ddp_sampler_create(&bad, &n, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "must provide length and fill"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential),
        cmocka_unit_test(test_random_by_seed_and_epoch),
        cmocka_unit_test(test_distributed_like_torch),
        cmocka_unit_test(test_distributed_shuffle_covers_all),
        cmocka_unit_test(test_distributed_errors),
        cmocka_unit_test(test_user_sampler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
