/* Transport selection: shm when every rank of a group is on one host, tcp
 * otherwise; DDP_TRANSPORT=auto|tcp|shm overrides.  See shm.h.
 *
 * The host identity is the host name plus the kernel's boot id (two
 * containers with the same name on different machines differ by boot id;
 * a rebooted host gets a new one), or DDP_HOST_ID when set (tests make
 * several "hosts" out of one machine with it).  Every rank publishes
 * "<mode> <host id>" through the transport rendezvous and every rank
 * applies the same rule to the same records, so all agree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "transport/rendezvous.h"
#include "transport/shm.h"

enum { MODE_AUTO, MODE_TCP, MODE_SHM };
static const char *const mode_names[] = {"auto", "tcp", "shm"};

int ddp__host_id(char *out, size_t len)
{
    const char *env = getenv("DDP_HOST_ID");
    if (env && *env) {
        DDP_FAIL_IF(strlen(env) >= len || strchr(env, ' ') || strchr(env, '\n'),
                    DDP_ERR_INVALID_ARG,
                    "DDP_HOST_ID='%s': expected at most %zu characters, no spaces", env, len - 1);
        snprintf(out, len, "%s", env);
        return 0;
    }
    char host[256] = "", boot[64] = "";
    if (gethostname(host, sizeof host - 1) < 0)
        snprintf(host, sizeof host, "unknown");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f))
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    for (char *c = host; *c; c++) /* the record is space-separated */
        if (*c == ' ' || *c == '\n')
            *c = '_';
    snprintf(out, len, "%.200s/%.40s", host, boot[0] ? boot : "no-boot-id");
    return 0;
}

static int read_mode(int *mode)
{
    const char *env = getenv("DDP_TRANSPORT");
    *mode = MODE_AUTO;
    if (!env || !*env)
        return 0;
    for (int i = 0; i < 3; i++)
        if (strcmp(env, mode_names[i]) == 0) {
            *mode = i;
            return 0;
        }
    return DDP_ERROR(DDP_ERR_INVALID_ARG, "DDP_TRANSPORT='%s': expected auto, tcp or shm", env);
}

int ddp__transport_select(ddp_store_t *store, const char *prefix, int rank, int size,
                          double timeout_s, int *use_shm)
{
    int rc = 0, mode;
    char rec[320], key[300];
    ddp__rdzv_rec *recs = NULL;
    *use_shm = 0;
    DDP_TRY(read_mode(&mode));
    int n = snprintf(rec, sizeof rec, "%s ", mode_names[mode]);
    DDP_TRY(ddp__host_id(rec + n, sizeof rec - (size_t)n));
    snprintf(key, sizeof key, "%s/transport", prefix);
    if (mode == MODE_TCP) {
        /* Nothing to wait for: tcp whatever the others say.  The record (in
         * rendezvous.c's "<world size>\n<record>" form) tells ranks left on
         * auto to follow, and fails ranks forced to shm.  No join claim, no
         * wait: the TCP rendezvous checks ranks, and this rank starts
         * listening at once (as before there was a choice). */
        char full[400], rkey[340];
        int len = snprintf(full, sizeof full, "%d\n%s", size, rec);
        snprintf(rkey, sizeof rkey, "%s/rank/%d", key, rank);
        return ddp_store_set(store, rkey, full, (size_t)len);
    }
    recs = calloc((size_t)(size > 0 ? size : 1), sizeof *recs);
    DDP_FAIL_IF(!recs, DDP_ERR_NOMEM, "out of memory");
    DDP_TRY_OUT(ddp__rdzv_exchange(store, key, rank, size, rec, strlen(rec), timeout_s, recs));

    /* Same rule everywhere: any tcp -> tcp; shm forced -> one host or fail. */
    int forced[3] = {-1, -1, -1}, other_host = -1;
    const char *host0 = NULL;
    size_t host0_len = 0;
    for (int r = 0; r < size; r++) {
        const char *v = recs[r].data, *sp = memchr(v, ' ', recs[r].len);
        DDP_FAIL_OUT(!sp, DDP_ERR_FORMAT, "malformed transport record of rank %d", r);
        size_t mlen = (size_t)(sp - v), hlen = recs[r].len - mlen - 1;
        int m = -1;
        for (int i = 0; i < 3; i++)
            if (strlen(mode_names[i]) == mlen && memcmp(v, mode_names[i], mlen) == 0)
                m = i;
        DDP_FAIL_OUT(m < 0, DDP_ERR_FORMAT, "malformed transport record of rank %d", r);
        if (forced[m] < 0)
            forced[m] = r;
        if (r == 0) {
            host0 = sp + 1;
            host0_len = hlen;
        } else if (other_host < 0 && (hlen != host0_len || memcmp(sp + 1, host0, hlen) != 0)) {
            other_host = r;
        }
    }
    DDP_FAIL_OUT(forced[MODE_TCP] >= 0 && forced[MODE_SHM] >= 0, DDP_ERR_MISMATCH,
                 "ranks disagree on DDP_TRANSPORT: rank %d says tcp, rank %d says shm",
                 forced[MODE_TCP], forced[MODE_SHM]);
    if (forced[MODE_SHM] >= 0 && other_host >= 0) {
        const char *h = recs[other_host].data;
        const char *sp = memchr(h, ' ', recs[other_host].len);
        rc = DDP_ERROR(DDP_ERR_INVALID_ARG,
                       "DDP_TRANSPORT=shm (rank %d) but the group spans hosts: rank 0 is on "
                       "'%.*s', rank %d on '%.*s'",
                       forced[MODE_SHM], (int)host0_len, host0, other_host,
                       (int)(recs[other_host].len - (size_t)(sp - h) - 1), sp + 1);
        goto out;
    }
    *use_shm = forced[MODE_TCP] < 0 && other_host < 0;
out:
    ddp__rdzv_free(recs, size);
    free(recs);
    return rc;
}
