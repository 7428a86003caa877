/* Transport selection: shm when every rank of a group is on one host;
 * across hosts hierarchical (shm inside each host, tcp among one leader per
 * host) when some host holds several ranks, else tcp.  DDP_TRANSPORT=
 * auto|tcp|shm and DDP_HIERARCHICAL=auto|0|1 override.  See shm.h,
 * select.h and docs/hierarchical.md.
 *
 * The host identity is the host name plus the kernel's boot id (two
 * containers with the same name on different machines differ by boot id;
 * a rebooted host gets a new one), or DDP_HOST_ID when set (tests make
 * several "hosts" out of one machine with it).  Every rank publishes
 * "<DDP_TRANSPORT> <DDP_HIERARCHICAL> <host id>" through the transport
 * rendezvous and every rank applies the same rule to the same records, so
 * all agree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/host.h"
#include "transport/rendezvous.h"
#include "transport/select.h"
#include "transport/shm.h"

/* The words of the rank's record, in the order of the variables' words in
 * src/base/env.c (which reads them). */
enum { MODE_AUTO, MODE_TCP, MODE_SHM };
static const char *const mode_names[] = {"auto", "tcp", "shm"};
/* DDP_HIERARCHICAL, in the same order: auto, off, on. */
enum { HIER_AUTO, HIER_OFF, HIER_ON };
static const char *const hier_names[] = {"auto", "0", "1"};

/* The index of the word [v, v + len) in names[3], or -1. */
static int word_index(const char *v, size_t len, const char *const names[3])
{
    for (int i = 0; i < 3; i++)
        if (strlen(names[i]) == len && memcmp(v, names[i], len) == 0)
            return i;
    return -1;
}

/* One parsed record: "<mode> <hier> <host id>". */
typedef struct rec_view {
    int mode, hier;
    const char *host;
    size_t host_len;
} rec_view;

static int parse_record(const ddp__rdzv_rec *rec, int r, rec_view *out)
{
    const char *v = rec->data, *end = v + rec->len;
    const char *sp1 = memchr(v, ' ', rec->len);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(end - sp1 - 1)) : NULL;
    DDP_FAIL_IF(!sp2, DDP_ERR_FORMAT, "malformed transport record of rank %d", r);
    out->mode = word_index(v, (size_t)(sp1 - v), mode_names);
    out->hier = word_index(sp1 + 1, (size_t)(sp2 - sp1 - 1), hier_names);
    DDP_FAIL_IF(out->mode < 0 || out->hier < 0, DDP_ERR_FORMAT,
                "malformed transport record of rank %d", r);
    out->host = sp2 + 1;
    out->host_len = (size_t)(end - sp2 - 1);
    return 0;
}

void ddp__layout_free(ddp__layout *l)
{
    if (!l)
        return;
    free(l->host_of);
    l->host_of = NULL;
}

/* Host indices (numbered by lowest rank) of the records into l. */
static int number_hosts(const rec_view *v, int size, ddp__layout *l)
{
    l->host_of = malloc(sizeof *l->host_of * (size_t)size);
    DDP_FAIL_IF(!l->host_of, DDP_ERR_NOMEM, "out of memory");
    l->nhosts = 0;
    for (int r = 0; r < size; r++) {
        l->host_of[r] = -1;
        for (int q = 0; q < r && l->host_of[r] < 0; q++)
            if (v[q].host_len == v[r].host_len && memcmp(v[q].host, v[r].host, v[r].host_len) == 0)
                l->host_of[r] = l->host_of[q];
        if (l->host_of[r] < 0)
            l->host_of[r] = l->nhosts++;
    }
    return 0;
}

int ddp__transport_layout(ddp_store_t *store, const char *prefix, int rank, int size,
                          double timeout_s, ddp__layout *out)
{
    int rc = 0, mode, hier;
    char rec[330], key[300];
    ddp__rdzv_rec *recs = NULL;
    rec_view *v = NULL;
    memset(out, 0, sizeof *out);
    out->kind = DDP__LAYOUT_TCP;
    DDP_TRY(ddp__env_word("DDP_TRANSPORT", &mode));
    DDP_TRY(ddp__env_word("DDP_HIERARCHICAL", &hier));
    int n = snprintf(rec, sizeof rec, "%s %s ", mode_names[mode], hier_names[hier]);
    DDP_TRY(ddp__host_id(rec + n, sizeof rec - (size_t)n));
    snprintf(key, sizeof key, "%s/transport", prefix);
    if (mode == MODE_TCP) {
        /* Nothing to wait for: tcp whatever the others say.  The record (in
         * rendezvous.c's "<world size>\n<record>" form) tells ranks left on
         * auto to follow, and fails ranks forced to shm.  No join claim, no
         * wait: the TCP rendezvous checks ranks, and this rank starts
         * listening at once (as before there was a choice). */
        char full[420], rkey[340];
        int len = snprintf(full, sizeof full, "%d\n%s", size, rec);
        snprintf(rkey, sizeof rkey, "%s/rank/%d", key, rank);
        return ddp_store_set(store, rkey, full, (size_t)len);
    }
    recs = calloc((size_t)(size > 0 ? size : 1), sizeof *recs);
    v = calloc((size_t)(size > 0 ? size : 1), sizeof *v);
    DDP_FAIL_OUT(!recs || !v, DDP_ERR_NOMEM, "out of memory");
    DDP_TRY_OUT(ddp__rdzv_exchange(store, key, rank, size, rec, strlen(rec), timeout_s, recs));

    /* Same rule everywhere: any tcp -> tcp; shm forced -> one host or fail;
     * several hosts -> hierarchical unless turned off or useless. */
    int forced[3] = {-1, -1, -1}, hforced[3] = {-1, -1, -1};
    for (int r = 0; r < size; r++) {
        DDP_TRY_OUT(parse_record(&recs[r], r, &v[r]));
        if (forced[v[r].mode] < 0)
            forced[v[r].mode] = r;
        if (hforced[v[r].hier] < 0)
            hforced[v[r].hier] = r;
    }
    DDP_TRY_OUT(number_hosts(v, size, out));
    DDP_FAIL_OUT(forced[MODE_TCP] >= 0 && forced[MODE_SHM] >= 0, DDP_ERR_MISMATCH,
                 "ranks disagree on DDP_TRANSPORT: rank %d says tcp, rank %d says shm",
                 forced[MODE_TCP], forced[MODE_SHM]);
    DDP_FAIL_OUT(hforced[HIER_OFF] >= 0 && hforced[HIER_ON] >= 0, DDP_ERR_MISMATCH,
                 "ranks disagree on DDP_HIERARCHICAL: rank %d says 0, rank %d says 1",
                 hforced[HIER_OFF], hforced[HIER_ON]);
    int other = -1;
    for (int r = 1; r < size && other < 0; r++)
        if (out->host_of[r] != 0)
            other = r;
    if (forced[MODE_SHM] >= 0 && other >= 0) {
        rc = DDP_ERROR(DDP_ERR_INVALID_ARG,
                       "DDP_TRANSPORT=shm (rank %d) but the group spans hosts: rank 0 is on "
                       "'%.*s', rank %d on '%.*s'",
                       forced[MODE_SHM], (int)v[0].host_len, v[0].host, other,
                       (int)v[other].host_len, v[other].host);
        goto out;
    }
    if (forced[MODE_TCP] >= 0)
        out->kind = DDP__LAYOUT_TCP;
    else if (other < 0)
        out->kind = DDP__LAYOUT_SHM;
    else if (hforced[HIER_OFF] >= 0)
        out->kind = DDP__LAYOUT_TCP;
    else
        out->kind = hforced[HIER_ON] >= 0 || out->nhosts < size ? DDP__LAYOUT_HIER
                                                                : DDP__LAYOUT_TCP;
out:
    ddp__rdzv_free(recs, size);
    free(recs);
    free(v);
    if (rc < 0)
        ddp__layout_free(out);
    return rc;
}
