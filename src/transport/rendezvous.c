/* Record exchange through the store; see rendezvous.h.
 *
 * Keys under prefix: "join/<r>" counts the processes claiming rank r (a
 * second one gets DDP_ERR_EXISTS), "rank/<r>" holds "<world size>\n" and the
 * record.  Missing ranks are polled with ddp_store_check and a growing
 * sleep (1 to 20 ms) rather than one blocking wait, so that the timeout can
 * name exactly the ranks that did not come and a world-size disagreement is
 * reported as soon as the first disagreeing record appears.  Every
 * DDP_RENDEZVOUS_REPORT_S seconds (default 10; 0: never) a rank still
 * waiting logs who is missing, at warn level, so that a job whose peers
 * never come does not sit silent for the whole timeout. */
#include "transport/rendezvous.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/env.h"
#include "base/log.h"
#include "base/time.h"

int ddp__rdzv_check_rank(int rank, int size)
{
    DDP_FAIL_IF(size < 1, DDP_ERR_INVALID_ARG, "world size %d must be at least 1", size);
    DDP_FAIL_IF(rank < 0 || rank >= size, DDP_ERR_INVALID_ARG,
                "rank %d out of range for world size %d", rank, size);
    return 0;
}

void ddp__format_ranks(char *out, size_t len, const unsigned char *missing, int size)
{
    int count = 0;
    for (int i = 0; i < size; i++)
        count += missing[i] != 0;
    size_t off = (size_t)snprintf(out, len, "%s", count == 1 ? "rank" : "ranks");
    int listed = 0;
    for (int i = 0; i < size && off < len; i++) {
        if (!missing[i])
            continue;
        if (listed == 16) {
            snprintf(out + off, len - off, ", ...");
            break;
        }
        off += (size_t)snprintf(out + off, len - off, "%s %d", listed ? "," : "", i);
        listed++;
    }
}

void ddp__rdzv_free(ddp__rdzv_rec *recs, int size)
{
    for (int i = 0; recs && i < size; i++) {
        free(recs[i].data);
        recs[i].data = NULL;
        recs[i].len = 0;
    }
}

/* Parses "<world size>\n<record>" of rank r into recs[r]. */
static int take_record(ddp__rdzv_rec *recs, int r, int rank, int size, void *val, size_t len)
{
    const char *nl = memchr(val, '\n', len < 16 ? len : 16);
    int ws = nl ? atoi(val) : -1;
    if (ws != size) {
        free(val);
        return DDP_ERROR(DDP_ERR_MISMATCH,
                         "world size mismatch: rank %d was started with world size %d, rank %d "
                         "with %d",
                         r, ws, rank, size);
    }
    size_t skip = (size_t)(nl - (const char *)val) + 1;
    memmove(val, (char *)val + skip, len - skip);
    recs[r].data = val;
    recs[r].len = len - skip;
    return 0;
}

/* The store failed while ranks were missing (its host exited, say, after
 * giving up on them): the error names who never came, as the timeout on
 * the store's host does, not just the key being read. */
static int store_failed(int rc, const unsigned char *missing, int rank, int size, int left,
                        const char *prefix, double waited)
{
    char who[256];
    ddp__format_ranks(who, sizeof who, missing, size);
    return ddp__error_context(rc,
                              "rank %d: rendezvous '%s' waiting for %s (%d of %d joined, %.1f s): "
                              "%s",
                              rank, prefix, who, size - left, size, waited,
                              rc == DDP_ERR_CONNECTION
                                  ? "the store went away (did its host give up or exit?)"
                                  : "the store failed");
}

int ddp__rdzv_exchange(ddp_store_t *store, const char *prefix, int rank, int size,
                       const void *rec, size_t len, double timeout_s, ddp__rdzv_rec *recs)
{
    int rc = 0;
    char key[256];
    char *buf = NULL;
    unsigned char *missing = NULL;
    DDP_TRY(ddp__rdzv_check_rank(rank, size));
    memset(recs, 0, sizeof *recs * (size_t)size);
    double every; /* DDP_RENDEZVOUS_REPORT_S: seconds between "still waiting" reports */
    DDP_TRY(ddp__env_seconds("DDP_RENDEZVOUS_REPORT_S", &every));

    int64_t joins = 0;
    snprintf(key, sizeof key, "%s/join/%d", prefix, rank);
    DDP_TRY_OUT(ddp_store_add(store, key, 1, &joins));
    DDP_FAIL_OUT(joins > 1, DDP_ERR_EXISTS,
                 "rank %d joined twice: another process already claimed rank %d of '%s' (a "
                 "rank started twice, or two jobs with one id on one store?)",
                 rank, rank, prefix);

    buf = malloc(len + 16);
    DDP_FAIL_OUT(!buf, DDP_ERR_NOMEM, "out of memory");
    int hl = snprintf(buf, 16, "%d\n", size);
    memcpy(buf + hl, rec, len);
    snprintf(key, sizeof key, "%s/rank/%d", prefix, rank);
    DDP_TRY_OUT(ddp_store_set(store, key, buf, (size_t)hl + len));

    missing = malloc((size_t)size);
    DDP_FAIL_OUT(!missing, DDP_ERR_NOMEM, "out of memory");
    memset(missing, 1, (size_t)size);
    int left = size;
    /* Polls from 1 ms up to 20 ms: the records usually come within a few
     * ms of each other, and a slow rank should not cost a poll per ms. */
    ddp__backoff b;
    ddp__backoff_init(&b, timeout_s, 0.02);
    b.sleep_s = 0.001;
    double start = ddp_time_now(), next_report = start + every;
    for (;;) {
        for (int r = 0; r < size; r++) {
            if (!missing[r])
                continue;
            snprintf(key, sizeof key, "%s/rank/%d", prefix, r);
            const char *keys[1] = {key};
            int exists = 0;
            void *val = NULL;
            size_t vlen = 0;
            rc = ddp_store_check(store, keys, 1, &exists);
            if (rc == 0 && exists)
                rc = ddp_store_get(store, key, &val, &vlen);
            if (rc < 0) {
                rc = store_failed(rc, missing, rank, size, left, prefix, ddp_time_now() - start);
                goto out;
            }
            if (!exists)
                continue;
            DDP_TRY_OUT(take_record(recs, r, rank, size, val, vlen));
            missing[r] = 0;
            left--;
        }
        if (left == 0)
            break;
        double now = ddp_time_now();
        if (every > 0 && now >= next_report) {
            char who[256];
            ddp__format_ranks(who, sizeof who, missing, size);
            DDP_WARN("rank %d: rendezvous '%s': waiting for %s (%d of %d joined, %.3g s of "
                     "%.3g s)",
                     rank, prefix, who, size - left, size, now - start, timeout_s);
            next_report = now + every;
        }
        if (ddp__backoff_sleep(&b) < 0) {
            char who[256];
            ddp__format_ranks(who, sizeof who, missing, size);
            rc = DDP_ERROR(DDP_ERR_TIMEOUT, "%s did not join within %.1f s", who, timeout_s);
            goto out;
        }
    }
out:
    if (rc < 0)
        ddp__rdzv_free(recs, size);
    free(missing);
    free(buf);
    return rc;
}
