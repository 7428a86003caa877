/* The launchers' own rendezvous (torchrun's c10d backend): every ddprun of
 * a job meets in a TCPStore at --rdzv-endpoint, hosted by the launcher
 * that could bind that address (the others connect to it).  A job runs in
 * ROUNDS; each round the launchers that came are given node ranks in the
 * order they joined, the workers of all nodes are one world, and any
 * failure anywhere ends the round on every node at once.
 *
 * Keys, under "ddprun/<rdzv-id>/":
 *   round            the round in progress (a counter)
 *   r<R>/joined      launchers that joined round R (a counter: the slot)
 *   r<R>/node<k>     "HOST NPROC" of slot k
 *   r<R>/closed      the number of nodes of round R, set by slot 0 once at
 *                    least MIN came and the last call is over (or MAX came)
 *   r<R>/master      "HOST PORT" of the workers' own store (slot 0's host)
 *   r<R>/hb<k>       slot k's heartbeat (a counter bumped while it runs)
 *   r<R>/done<k>     slot k's workers all succeeded
 *   r<R>/restart     why round R ends: every node restarts in round R+1
 *   r<R>/fail        why the job stops: every node stops
 * A launcher that comes after its round closed waits for the next one
 * (admitted at the next restart). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/sock.h"
#include "ddp/store.h"
#include "ddprun.h"

#define KEY_MAX 512

__attribute__((format(printf, 3, 4))) static void key(const ddprun_rdzv *z, char *out,
                                                      const char *fmt, ...)
{
    int n = snprintf(out, KEY_MAX, "ddprun/%s/", z->id);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + n, (size_t)(KEY_MAX - n), fmt, ap);
    va_end(ap);
}

static void nap(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int lost(ddprun_rdzv *z, const char *what)
{
    fprintf(stderr,
            "ddprun: lost the rendezvous store at %s:%d (hosted by the first launcher of the "
            "job) while %s: %s\n",
            z->host, z->port, what, ddp_last_error());
    return -1;
}

static long long counter(ddprun_rdzv *z, const char *k, int64_t delta, int *err)
{
    int64_t v = 0;
    if (ddp_store_add(z->store, k, delta, &v) < 0)
        *err = 1;
    return v;
}

static int exists(ddprun_rdzv *z, const char *k, int *err)
{
    int e = 0;
    if (ddp_store_check(z->store, &k, 1, &e) < 0)
        *err = 1;
    return e;
}

int ddprun_rdzv_open(const ddprun_options *o, ddprun_rdzv *z)
{
    memset(z, 0, sizeof *z);
    snprintf(z->id, sizeof z->id, "%s", o->rdzv_id);
    snprintf(z->host, sizeof z->host, "%s", o->master_addr);
    z->port = o->master_port;
    z->min_nodes = o->min_nodes;
    z->max_nodes = o->max_nodes;
    z->nproc = o->nproc;
    z->join_timeout = o->rdzv_join_timeout;
    z->last_call = o->rdzv_last_call;
    z->hb_timeout = o->rdzv_heartbeat_timeout;
    if (ddp__sock_local_host(z->self, sizeof z->self) < 0) {
        fprintf(stderr, "ddprun: %s\n", ddp_last_error());
        return -1;
    }
    /* The launcher that can bind the endpoint hosts the store. */
    if (ddp_store_tcp_create(z->host, z->port, 1, 0, z->hb_timeout, &z->store) == 0) {
        z->is_host = 1;
        return 0;
    }
    if (ddp_store_tcp_create(z->host, z->port, 0, 0, z->join_timeout, &z->store) < 0) {
        fprintf(stderr, "ddprun: cannot reach the rendezvous store at %s:%d: %s\n", z->host,
                z->port, ddp_last_error());
        return -1;
    }
    ddp_store_set_timeout(z->store, z->hb_timeout);
    return 0;
}

void ddprun_rdzv_close(ddprun_rdzv *z)
{
    ddp_store_destroy(z->store);
    z->store = NULL;
}

/* Slot 0: waits for MIN launchers, then the last call (or MAX), closes the
 * round and publishes the workers' master address. */
static int close_round(ddprun_rdzv *z, const char *joined_key, int64_t *n)
{
    char k[KEY_MAX];
    int err = 0;
    double start = ddprun_now(), enough_at = 0;
    for (;;) {
        *n = counter(z, joined_key, 0, &err);
        if (err)
            return lost(z, "waiting for the other nodes");
        double t = ddprun_now();
        if (*n >= z->min_nodes && enough_at == 0)
            enough_at = t;
        if (*n >= z->max_nodes || (enough_at > 0 && t - enough_at >= z->last_call))
            break;
        if (enough_at == 0 && t - start > z->join_timeout) {
            fprintf(stderr,
                    "ddprun: only %lld of the %d nodes needed joined round %lld within %g s\n",
                    (long long)*n, z->min_nodes, (long long)z->round, z->join_timeout);
            return -1;
        }
        if (ddprun_got_signal)
            return -1;
        nap(0.05);
    }
    if (*n > z->max_nodes)
        *n = z->max_nodes;
    int port = 0, fd = -1;
    if (ddp__sock_listen(z->self, 0, 1, &fd, &port) < 0) { /* a free port for the workers */
        fprintf(stderr, "ddprun: %s\n", ddp_last_error());
        return -1;
    }
    close(fd);
    char rec[300];
    snprintf(rec, sizeof rec, "%s %d", z->self, port);
    key(z, k, "r%ld/master", (long)z->round);
    if (ddp_store_set(z->store, k, rec, strlen(rec)) < 0)
        return lost(z, "publishing the master address");
    snprintf(rec, sizeof rec, "%lld", (long long)*n);
    key(z, k, "r%ld/closed", (long)z->round);
    if (ddp_store_set(z->store, k, rec, strlen(rec)) < 0)
        return lost(z, "closing the round");
    return 0;
}

static int get_text(ddprun_rdzv *z, const char *k, char *out, size_t cap)
{
    void *v = NULL;
    size_t len = 0;
    if (ddp_store_get(z->store, k, &v, &len) < 0)
        return -1;
    snprintf(out, cap, "%s", (char *)v);
    free(v);
    return 0;
}

/* Reads the closed round: node count, every node's nproc (all equal),
 * the master address. */
static int read_round(ddprun_rdzv *z, int64_t n)
{
    char k[KEY_MAX], rec[300];
    for (int64_t s = 0; s < n; s++) {
        key(z, k, "r%ld/node%ld", (long)z->round, (long)s);
        if (get_text(z, k, rec, sizeof rec) < 0)
            return lost(z, "reading the nodes of the round");
        char host[256];
        int nproc = 0;
        if (sscanf(rec, "%255s %d", host, &nproc) != 2 || nproc != z->nproc) {
            fprintf(stderr,
                    "ddprun: node %lld (%s) runs %d workers per node, this node %d: every "
                    "node needs the same --nproc-per-node\n",
                    (long long)s, host, nproc, z->nproc);
            return -1;
        }
    }
    key(z, k, "r%ld/master", (long)z->round);
    if (get_text(z, k, rec, sizeof rec) < 0 ||
        sscanf(rec, "%255s %d", z->master_addr, &z->master_port) != 2)
        return lost(z, "reading the master address");
    return 0;
}

/* Waits until the round counter passes r (a launcher that came late). */
static int wait_next_round(ddprun_rdzv *z, int64_t r)
{
    char k[KEY_MAX];
    int err = 0;
    key(z, k, "round");
    double start = ddprun_now();
    while (counter(z, k, 0, &err) <= r && !err) {
        if (ddprun_got_signal || ddprun_now() - start > z->join_timeout) {
            fprintf(stderr, "ddprun: round %lld had already started; no restart came within "
                            "%g s to admit this node\n", (long long)r, z->join_timeout);
            return -1;
        }
        nap(0.1);
    }
    return err ? lost(z, "waiting for the next round") : 0;
}

int ddprun_rdzv_join(ddprun_rdzv *z)
{
    char k[KEY_MAX], jk[KEY_MAX], rec[300];
    for (;;) {
        int err = 0;
        key(z, k, "round");
        z->round = counter(z, k, 0, &err);
        key(z, jk, "r%ld/joined", (long)z->round);
        int64_t slot = err ? 0 : counter(z, jk, 1, &err) - 1;
        key(z, k, "r%ld/closed", (long)z->round);
        if (!err && exists(z, k, &err)) { /* too late for this round */
            if (wait_next_round(z, z->round) < 0)
                return -1;
            continue;
        }
        if (err)
            return lost(z, "joining");
        snprintf(rec, sizeof rec, "%s %d", z->self, z->nproc);
        key(z, k, "r%ld/node%ld", (long)z->round, (long)slot);
        if (ddp_store_set(z->store, k, rec, strlen(rec)) < 0)
            return lost(z, "joining");
        int64_t n = 0;
        if (slot == 0) {
            if (close_round(z, jk, &n) < 0)
                return -1;
        } else {
            key(z, k, "r%ld/closed", (long)z->round);
            const char *ks[1] = {k};
            if (ddp_store_wait(z->store, ks, 1, z->join_timeout + z->last_call) < 0)
                return lost(z, "waiting for the round to close");
            if (get_text(z, k, rec, sizeof rec) < 0)
                return lost(z, "reading the round");
            n = atoll(rec);
        }
        if (slot >= n) { /* joined while the round closed: the next one */
            if (wait_next_round(z, z->round) < 0)
                return -1;
            continue;
        }
        z->slot = (int)slot;
        z->nnodes = (int)n;
        free(z->seen_hb);
        free(z->seen_at);
        z->seen_hb = calloc((size_t)n, sizeof *z->seen_hb);
        z->seen_at = calloc((size_t)n, sizeof *z->seen_at);
        if (!z->seen_hb || !z->seen_at)
            return -1;
        for (int64_t s = 0; s < n; s++)
            z->seen_at[s] = ddprun_now();
        return read_round(z, n);
    }
}

/* Sets r<R>/<what> to why unless it is set, and for a restart opens the
 * next round. */
static int post(ddprun_rdzv *z, const char *what, const char *why)
{
    char k[KEY_MAX], rk[KEY_MAX], cur[32], next[32];
    snprintf(k, sizeof k, "ddprun/%s/r%lld/%s", z->id, (long long)z->round, what);
    if (ddp_store_compare_set(z->store, k, "", 0, why, strlen(why), NULL, NULL) < 0)
        return lost(z, "telling the other nodes");
    if (strcmp(what, "restart") == 0) {
        key(z, rk, "round");
        snprintf(cur, sizeof cur, "%lld", (long long)z->round);
        snprintf(next, sizeof next, "%lld", (long long)z->round + 1);
        if (ddp_store_compare_set(z->store, rk, cur, strlen(cur), next, strlen(next), NULL,
                                  NULL) < 0)
            return lost(z, "opening the next round");
    }
    return 0;
}

int ddprun_rdzv_restart(ddprun_rdzv *z, const char *why) { return post(z, "restart", why); }
int ddprun_rdzv_fail(ddprun_rdzv *z, const char *why) { return post(z, "fail", why); }

int ddprun_rdzv_done(ddprun_rdzv *z)
{
    char k[KEY_MAX];
    key(z, k, "r%ld/done%ld", (long)z->round, (long)z->slot);
    return ddp_store_set(z->store, k, "1", 1) < 0 ? lost(z, "reporting success") : 0;
}

/* Why another node ended the round (restart or fail key), copied to why. */
static int round_ended(ddprun_rdzv *z, const char *what, char *why, size_t len, int *err)
{
    char k[KEY_MAX];
    snprintf(k, sizeof k, "ddprun/%s/r%lld/%s", z->id, (long long)z->round, what);
    if (!exists(z, k, err) || *err)
        return 0;
    if (get_text(z, k, why, len) < 0)
        *err = 1;
    return !*err;
}

int ddprun_rdzv_poll(ddprun_rdzv *z, int *all_done, char *why, size_t len)
{
    char k[KEY_MAX];
    int err = 0, done = 1;
    if (round_ended(z, "fail", why, len, &err))
        return 2;
    if (!err && round_ended(z, "restart", why, len, &err))
        return 1;
    key(z, k, "r%ld/hb%ld", (long)z->round, (long)z->slot);
    counter(z, k, 1, &err);
    double t = ddprun_now();
    for (int s = 0; s < z->nnodes && !err; s++) {
        key(z, k, "r%ld/done%ld", (long)z->round, (long)s);
        if (exists(z, k, &err))
            continue;
        done = 0;
        if (s == z->slot)
            continue;
        key(z, k, "r%ld/hb%ld", (long)z->round, (long)s);
        long long hb = counter(z, k, 0, &err);
        if (hb != z->seen_hb[s]) {
            z->seen_hb[s] = hb;
            z->seen_at[s] = t;
        } else if (t - z->seen_at[s] > z->hb_timeout) {
            snprintf(why, len, "node %d stopped answering (no heartbeat for %.0f s)", s,
                     t - z->seen_at[s]);
            return 3;
        }
    }
    if (err)
        return lost(z, "watching the other nodes");
    *all_done = done;
    return 0;
}
