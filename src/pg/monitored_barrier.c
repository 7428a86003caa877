/* ddp_pg_monitored_barrier: PyTorch's monitored_barrier.  Rank 0 collects
 * every other rank and names the ranks that did not come within the
 * timeout: the first one, or all of them with wait_all_ranks.  It goes
 * through the group's store rather than its transport, so that a missing
 * rank costs a named error and nothing else: the group is not broken, and
 * no collective's sequence number is taken.
 *
 * Protocol, under PREFIX/mbN/ (N counts the group's monitored barriers):
 * rank r > 0 sets in/r and waits for out; rank 0 waits for in/1, in/2, ...
 * until its deadline (with wait_all_ranks, the ranks after the first missing
 * one are only checked, since they had the same time), deletes what it saw,
 * and sets out to "ok" or to its message, which every rank then returns.
 * The last rank to read out (counted in ack) deletes out and ack.
 *
 * After a failure, keys would stay: a late rank's in/r (rank 0 no longer
 * looks), and out and ack when a rank never reads out.  So a rank whose
 * barrier failed deletes its own in/r, and rank 0, at barrier N, deletes
 * what barrier N-2 left (checked through out, which the last reader
 * deletes): the store holds two barriers' worth at most, however many
 * fail.  A rank two barriers behind then waits for an out that is gone and
 * fails with "rank 0 did not answer", which it did not in time either. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "pg/pg_impl.h"

#define KEY_LEN 320

/* Rank 0: which ranks are missing, in *missing (n, caller frees). */
static int collect(ddp_pg_t *pg, const char *base, double timeout_s, int wait_all, int **missing,
                   int *n)
{
    *n = 0;
    *missing = calloc((size_t)pg->size, sizeof **missing);
    DDP_FAIL_IF(!*missing, DDP_ERR_NOMEM, "out of memory");
    double deadline = ddp_time_now() + timeout_s;
    for (int r = 1; r < pg->size; r++) {
        char key[KEY_LEN + 32];
        snprintf(key, sizeof key, "%s/in/%d", base, r);
        const char *keys[1] = {key};
        double left = deadline - ddp_time_now();
        int here = 0, rc = 0;
        if (left > 0) {
            rc = ddp_store_wait(pg->store, keys, 1, left);
            here = rc == 0;
        } else {
            rc = ddp_store_check(pg->store, keys, 1, &here);
        }
        if (rc < 0 && rc != DDP_ERR_TIMEOUT)
            return rc;
        if (here) {
            ddp_store_delete_key(pg->store, key, NULL);
            continue;
        }
        (*missing)[(*n)++] = r;
        if (!wait_all)
            break;
    }
    return 0;
}

/* Rank 0's verdict as text: "ok", or the message naming the missing. */
static void verdict(const int *missing, int n, double timeout_s, int wait_all, char *out,
                    size_t len)
{
    if (n == 0) {
        snprintf(out, len, "ok");
        return;
    }
    size_t at = (size_t)snprintf(out, len, "monitored_barrier: rank%s ", n > 1 ? "s" : "");
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(out + at, len - at, "%s%d", i ? ", " : "", missing[i]);
    if (at < len)
        snprintf(out + at, len - at, " did not reach the barrier within %.1f s%s", timeout_s,
                 wait_all ? "" : " (the first missing; wait_all_ranks names all)");
}

/* Rank 0: the keys barrier id left behind, if it failed (see above). */
static void sweep(ddp_pg_t *pg, int id)
{
    char key[KEY_LEN + 32];
    snprintf(key, sizeof key, "%.250s/mb%d/out", pg->prefix, id);
    const char *keys[1] = {key};
    int there = 0;
    if (ddp_store_check(pg->store, keys, 1, &there) < 0 || !there)
        return; /* nothing left (the usual case), or nothing to do about it */
    ddp_store_delete_key(pg->store, key, NULL);
    snprintf(key, sizeof key, "%.250s/mb%d/ack", pg->prefix, id);
    ddp_store_delete_key(pg->store, key, NULL);
    for (int r = 1; r < pg->size; r++) {
        snprintf(key, sizeof key, "%.250s/mb%d/in/%d", pg->prefix, id, r);
        ddp_store_delete_key(pg->store, key, NULL);
    }
}

static int root_side(ddp_pg_t *pg, const char *base, double timeout_s, int wait_all)
{
    int *missing = NULL, n = 0;
    int rc = collect(pg, base, timeout_s, wait_all, &missing, &n);
    char msg[1024], key[KEY_LEN + 32];
    if (rc == 0) {
        verdict(missing, n, timeout_s, wait_all, msg, sizeof msg);
        snprintf(key, sizeof key, "%s/out", base);
        rc = ddp_store_set(pg->store, key, msg, strlen(msg));
    }
    free(missing);
    DDP_TRY(rc);
    DDP_FAIL_IF(n > 0, DDP_ERR_TIMEOUT, "%s", msg);
    return 0;
}

static int member_side(ddp_pg_t *pg, const char *base, double timeout_s)
{
    char key[KEY_LEN + 32];
    snprintf(key, sizeof key, "%s/in/%d", base, pg->rank);
    DDP_TRY(ddp_store_set(pg->store, key, "1", 1));
    snprintf(key, sizeof key, "%s/out", base);
    const char *keys[1] = {key};
    /* Rank 0 answers within timeout_s of its own arrival: some slack for
     * the ranks that came before it. */
    double wait_s = timeout_s + (timeout_s > 2 ? timeout_s : 2);
    int rc = ddp_store_wait(pg->store, keys, 1, wait_s);
    if (rc == DDP_ERR_TIMEOUT) {
        snprintf(key, sizeof key, "%s/in/%d", base, pg->rank);
        ddp_store_delete_key(pg->store, key, NULL); /* this rank gave up */
    }
    DDP_FAIL_IF(rc == DDP_ERR_TIMEOUT, DDP_ERR_TIMEOUT,
                "monitored_barrier on rank %d: rank 0 did not answer within %.1f s", pg->rank,
                wait_s);
    DDP_TRY(rc);
    void *v = NULL;
    size_t len = 0;
    DDP_TRY(ddp_store_get(pg->store, key, &v, &len));
    char msg[1024];
    snprintf(msg, sizeof msg, "%.*s", (int)len, (const char *)v);
    free(v);
    char ack[KEY_LEN + 32];
    snprintf(ack, sizeof ack, "%s/ack", base);
    int64_t seen = 0;
    if (ddp_store_add(pg->store, ack, 1, &seen) == 0 && seen == pg->size - 1) {
        ddp_store_delete_key(pg->store, key, NULL);
        ddp_store_delete_key(pg->store, ack, NULL);
    }
    if (strcmp(msg, "ok") != 0) { /* rank 0 may not have looked at in/r: done with it now */
        snprintf(key, sizeof key, "%s/in/%d", base, pg->rank);
        ddp_store_delete_key(pg->store, key, NULL);
    }
    DDP_FAIL_IF(strcmp(msg, "ok") != 0, DDP_ERR_TIMEOUT, "%s (rank %d was there)", msg, pg->rank);
    return 0;
}

int ddp_pg_monitored_barrier(ddp_pg_t *pg, double timeout_s, int wait_all_ranks)
{
    DDP_FAIL_IF(!pg, DDP_ERR_INVALID_ARG, "monitored_barrier: NULL process group");
    DDP_FAIL_IF(!pg->store, DDP_ERR_UNSUPPORTED,
                "monitored_barrier: backend %s has no store (use ddp_pg_barrier)", pg->be->name);
    if (timeout_s <= 0)
        timeout_s = pg->timeout_s;
    pthread_mutex_lock(&pg->mu);
    int id = ++pg->nbarriers; /* every rank counts the same calls */
    pthread_mutex_unlock(&pg->mu);
    if (pg->size == 1)
        return 0;
    char base[KEY_LEN];
    snprintf(base, sizeof base, "%.250s/mb%d", pg->prefix, id);
    if (pg->rank == 0 && id > 2)
        sweep(pg, id - 2);
    return pg->rank == 0 ? root_side(pg, base, timeout_s, wait_all_ranks)
                         : member_side(pg, base, timeout_s);
}
