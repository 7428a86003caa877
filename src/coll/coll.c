/* Dispatcher of the collectives: argument checks, algorithm choice, scratch
 * and block helpers shared by the algorithm files.  See coll.h. */
#include "coll/coll.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"

static const char *const coll_names[DDP__NUM_COLL] = {
    "all_reduce", "broadcast",  "reduce",         "all_gather", "gather", "scatter",
    "reduce_scatter", "all_to_all", "barrier", "send", "recv"};

const char *ddp__coll_name(int kind)
{
    return kind >= 0 && kind < DDP__NUM_COLL ? coll_names[kind] : "unknown";
}

int ddp__coll_algo_parse(const char *name)
{
    /* The words of DDP_ALLREDUCE_ALGO, in DDP__AR_* order. */
    const ddp__env_var *v = ddp__env_find("DDP_ALLREDUCE_ALGO");
    for (int i = 0; v && i < DDP__ENV_MAX_WORDS && v->words[i]; i++)
        if (strcmp(name, v->words[i]) == 0)
            return i;
    return -1;
}

int ddp__coll_ctx_init(ddp__coll_ctx *c, int rank, int size)
{
    memset(c, 0, sizeof *c);
    c->rank = rank;
    c->size = size;
    /* Defaults and ranges: src/base/env.c.  DDP_ALLREDUCE_SYMMETRIC_BYTES's
     * 32 MiB: below it the peers' buffers are still in the caches, and
     * reading them across cores measured slower than staging through the
     * small hot window (bench/RESULTS.md, issue 5). */
    DDP_TRY(ddp__env_word("DDP_ALLREDUCE_ALGO", &c->allreduce_algo)); /* DDP__AR_* order */
    DDP_TRY(ddp__env_size("DDP_CHUNK_BYTES", &c->chunk));
    DDP_TRY(ddp__env_size("DDP_ALLREDUCE_DIRECT_BYTES", &c->direct_max));
    DDP_TRY(ddp__env_size("DDP_ALLREDUCE_RD_BYTES", &c->rd_max));
    DDP_TRY(ddp__env_size("DDP_ALLREDUCE_RAB_BYTES", &c->rab_max));
    DDP_TRY(ddp__env_size("DDP_ALLREDUCE_SHARED_BYTES", &c->shared_min));
    DDP_TRY(ddp__env_size("DDP_SHARED_CHUNK_BYTES", &c->shared_chunk));
    DDP_TRY(ddp__env_size("DDP_RING_WINDOW_BYTES", &c->ring_window));
    DDP_TRY(ddp__env_size("DDP_ALLREDUCE_SYMMETRIC_BYTES", &c->symmetric_min));
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    c->cpus = cpus > 0 ? (int)cpus : 1;
    int isa; /* the kernels read it themselves; a bad value is reported here */
    DDP_TRY(ddp__reduce_isa_from_env(&isa));
    return 0;
}

void ddp__coll_ctx_free(ddp__coll_ctx *c)
{
    ddp__free_aligned(c->scratch);
    c->scratch = NULL;
    c->scratch_len = 0;
}

int ddp__coll_scratch(ddp__coll_ctx *c, size_t bytes, void **out)
{
    if (bytes > c->scratch_len) {
        /* calloc touches every page now, once, instead of in the hot loop. */
        uint8_t *p = ddp__calloc_aligned(bytes);
        DDP_FAIL_IF(!p, DDP_ERR_NOMEM, "out of memory for %zu bytes of scratch", bytes);
        ddp__free_aligned(c->scratch);
        c->scratch = p;
        c->scratch_len = bytes;
    }
    *out = c->scratch;
    return 0;
}

int ddp__coll_wait_array(ddp__coll_ctx *c, ddp__req *reqs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (reqs[i].kind && reqs[i].status == 0)
            DDP_TRY(ddp__coll_wait1(c, &reqs[i]));
    return 0;
}

static int blocks_alloc(ddp__blocks *b, int size)
{
    b->off = malloc(sizeof *b->off * (size_t)size);
    b->len = malloc(sizeof *b->len * (size_t)size);
    if (!b->off || !b->len) {
        ddp__blocks_free(b);
        return DDP_ERROR(DDP_ERR_NOMEM, "out of memory");
    }
    return 0;
}

int ddp__blocks_split(ddp__blocks *b, size_t count, int size)
{
    DDP_TRY(blocks_alloc(b, size));
    size_t base = count / (size_t)size, rem = count % (size_t)size;
    for (int i = 0; i < size; i++) {
        size_t u = (size_t)i;
        b->len[i] = base + (u < rem);
        b->off[i] = u * base + (u < rem ? u : rem);
    }
    return 0;
}

int ddp__blocks_equal(ddp__blocks *b, size_t count, int size)
{
    DDP_TRY(blocks_alloc(b, size));
    for (int i = 0; i < size; i++) {
        b->len[i] = count;
        b->off[i] = (size_t)i * count;
    }
    return 0;
}

void ddp__blocks_free(ddp__blocks *b)
{
    free(b->off);
    free(b->len);
    b->off = b->len = NULL;
}

/* ------------------------------------------------------------------ */
/* Checks                                                               */
/* ------------------------------------------------------------------ */

static int uses_op(int kind)
{
    return kind == DDP__ALL_REDUCE || kind == DDP__REDUCE || kind == DDP__REDUCE_SCATTER;
}

int ddp__coll_check(const ddp__coll_args *a, int rank, int size)
{
    const char *name = ddp__coll_name(a->kind);
    DDP_FAIL_IF((unsigned)a->dtype >= DDP_NUM_DTYPES, DDP_ERR_INVALID_ARG, "%s: unknown dtype %d",
                name, (int)a->dtype);
    if (uses_op(a->kind) && ddp__check_dtype_op(a->dtype, a->op) < 0)
        return ddp__error_context(DDP_ERR_INVALID_ARG, "%s", name);
    size_t es = ddp_dtype_size(a->dtype);
    DDP_FAIL_IF(a->count > ((size_t)1 << 46) / es / (size_t)size, DDP_ERR_INVALID_ARG,
                "%s: count %zu too large", name, a->count);
    int rooted = a->kind == DDP__BROADCAST || a->kind == DDP__REDUCE || a->kind == DDP__GATHER ||
                 a->kind == DDP__SCATTER;
    DDP_FAIL_IF(rooted && (a->root < 0 || a->root >= size), DDP_ERR_INVALID_ARG,
                "%s: root %d out of range for group size %d", name, a->root, size);
    if (a->kind == DDP__SEND || a->kind == DDP__RECV) {
        DDP_FAIL_IF(a->peer < 0 || a->peer >= size, DDP_ERR_INVALID_ARG,
                    "%s: peer rank %d out of range for group size %d", name, a->peer, size);
        DDP_FAIL_IF(a->peer == rank, DDP_ERR_INVALID_ARG, "%s: rank %d cannot %s itself", name,
                    rank, a->kind == DDP__SEND ? "send to" : "receive from");
        DDP_FAIL_IF(a->tag < 0, DDP_ERR_INVALID_ARG, "%s: tag %d must be >= 0", name, a->tag);
    }
    if (a->count == 0 || a->kind == DDP__BARRIER)
        return 0;
    /* Buffers: which ones this rank uses. */
    int needs_send = 1, needs_recv = 1;
    switch (a->kind) {
    case DDP__GATHER:
        needs_recv = rank == a->root;
        break;
    case DDP__SCATTER:
        needs_send = rank == a->root;
        break;
    case DDP__REDUCE: /* out of place (send != recv), the root's output only */
        needs_recv = rank == a->root;
        break;
    case DDP__SEND:
        needs_recv = 0;
        break;
    case DDP__RECV:
        needs_send = 0;
        break;
    }
    DDP_FAIL_IF(needs_send && !a->send, DDP_ERR_INVALID_ARG, "%s: NULL input buffer", name);
    DDP_FAIL_IF(needs_recv && !a->recv, DDP_ERR_INVALID_ARG, "%s: NULL output buffer", name);
    if (a->kind == DDP__ALL_TO_ALL || a->kind == DDP__REDUCE_SCATTER) {
        size_t bytes = a->count * es * (size_t)size;
        const char *s = a->send, *r = a->recv;
        DDP_FAIL_IF(s < r + (a->kind == DDP__ALL_TO_ALL ? bytes : a->count * es) && r < s + bytes,
                    DDP_ERR_INVALID_ARG, "%s: input and output buffers overlap", name);
    }
    if (a->kind == DDP__REDUCE && rank == a->root && a->send != a->recv) {
        const char *s = a->send, *r = a->recv;
        size_t bytes = a->count * es;
        DDP_FAIL_IF(s < r + bytes && r < s + bytes, DDP_ERR_INVALID_ARG,
                    "%s: input and output buffers overlap (pass the same buffer for in place)",
                    name);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                             */
/* ------------------------------------------------------------------ */

/* alpha / beta in bytes, fitted to where the tree and the ring cross over
 * tcp loopback here (between 64 and 256 KiB on 5 ranks, about 256 KiB on
 * 6: docs/algorithms.md, the tree's measurements). */
#define TREE_ALPHA_BYTES (256.0 * 1024)

/* Up to how many bytes the tree beats the ring on n ranks: its 2 D steps
 * of B (D = ceil(log2 n); one unit per half) against the ring's 2 (n-1)
 * steps of B/n, so (n-1-D) alpha > (D - (n-1)/n) B beta.  0 for n <= 3
 * (the tree is a chain there: as many steps as the ring). */
static size_t tree_max_bytes(int n)
{
    int depth = 0;
    while ((1 << depth) < n)
        depth++;
    double gain = n - 1 - depth, loss = depth - (double)(n - 1) / n;
    return gain > 0 ? (size_t)(TREE_ALPHA_BYTES * gain / loss) : 0;
}

/* Whether auto runs bytes over the shared window: ranks that share memory
 * reduce straight out of it, unless they outnumber the cores (then every
 * chunk waits for all of them to be scheduled, and the ring's buffered
 * messages do better). */
static int shared_fits(const ddp__coll_ctx *c, size_t bytes)
{
    const ddp__window *w = ddp__tp_window(c->tp);
    return bytes >= c->shared_min && c->size <= c->cpus && w &&
           ddp__allreduce_shared_slot(c, w) > 0;
}

static int all_reduce(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt, ddp_reduce_op op)
{
    if (c->size == 1 || count == 0)
        return 0;
    size_t bytes = count * ddp_dtype_size(dt);
    int algo = c->allreduce_algo;
    if (algo == DDP__AR_AUTO) {
        if (c->size == 2)
            algo = bytes <= c->direct_max ? DDP__AR_DIRECT : DDP__AR_RING;
        else
            algo = bytes <= c->rd_max ? DDP__AR_RD : DDP__AR_RING;
        const ddp__window *w = ddp__tp_window(c->tp);
        if (algo == DDP__AR_RING && shared_fits(c, bytes))
            algo = DDP__AR_SHARED;
        /* Messages, not bytes, decide mid sizes on a network (no shared
         * window: over shm messages the ring stays): Rabenseifner
         * sends the ring's bytes in 2 log2(n) messages instead of 2 (n-1)
         * (docs/algorithms.md's cost model; a fold-in makes it lose when n
         * is not a power of two). */
        else if (algo == DDP__AR_RING && !w && c->size >= 4 && !(c->size & (c->size - 1)) &&
                 bytes <= c->rab_max)
            algo = DDP__AR_RABENSEIFNER;
        /* For other n the fold makes Rabenseifner lose, and the tree's
         * 2 log2(n) steps beat the ring's 2 (n-1) until its bytes count
         * more (the same cost model). */
        else if (algo == DDP__AR_RING && !w && (c->size & (c->size - 1)) &&
                 bytes <= tree_max_bytes(c->size))
            algo = DDP__AR_TREE;
    }
    switch (algo) {
    case DDP__AR_DIRECT:
        return ddp__allreduce_direct(c, buf, count, dt, op);
    case DDP__AR_RD:
        return ddp__allreduce_rd(c, buf, count, dt, op);
    case DDP__AR_RABENSEIFNER:
        return ddp__allreduce_rabenseifner(c, buf, count, dt, op);
    case DDP__AR_TREE:
        return ddp__allreduce_tree(c, buf, count, dt, op);
    case DDP__AR_SHARED:
        return ddp__allreduce_shared(c, buf, count, dt, op);
    default:
        return ddp__allreduce_ring(c, buf, count, dt, op);
    }
}

/* Reduce to a root: over the shared window where the all-reduce would use
 * it (DDP_ALLREDUCE_ALGO=shared forces it, and fails as the all-reduce does
 * where there is no window; any other named algorithm keeps the
 * messages), so the ranks share the fold instead of the root
 * folding everything (ZeRO-2's per-owner reduces are bucket-sized).  Both
 * read every rank's input from send and write the root's result into recv
 * (the same buffer in place). */
static int reduce(ddp__coll_ctx *c, const void *send, void *recv, size_t count, ddp_dtype dt,
                  ddp_reduce_op op, int root)
{
    if (c->size == 1) {
        if (recv != send)
            memcpy(recv, send, count * ddp_dtype_size(dt));
        return 0;
    }
    int algo = c->allreduce_algo;
    if (algo == DDP__AR_SHARED ||
        (algo == DDP__AR_AUTO && shared_fits(c, count * ddp_dtype_size(dt))))
        return ddp__reduce_shared(c, send, recv, count, dt, op, root);
    return ddp__reduce_direct(c, send, recv, count, dt, op, root);
}

static int reduce_scatter(ddp__coll_ctx *c, const ddp__coll_args *a, size_t es)
{
    if (c->size == 1) {
        if (a->recv != a->send)
            memcpy(a->recv, a->send, a->count * es);
        return 0;
    }
    ddp__blocks bl;
    DDP_TRY(ddp__blocks_equal(&bl, a->count, c->size));
    int rc = ddp__ring_reduce_scatter(c, a->send, NULL, a->recv, &bl, a->dtype, a->op, 0, NULL);
    ddp__blocks_free(&bl);
    if (rc == 0 && a->op == DDP_AVG)
        ddp__reduce_divide(a->recv, a->count, a->dtype, c->size);
    return rc;
}

static int all_gather(ddp__coll_ctx *c, const ddp__coll_args *a, size_t es)
{
    uint8_t *own = (uint8_t *)a->recv + (size_t)c->rank * a->count * es;
    if (own != a->send)
        memmove(own, a->send, a->count * es);
    if (c->size == 1)
        return 0;
    ddp__blocks bl;
    DDP_TRY(ddp__blocks_equal(&bl, a->count, c->size));
    int rc = ddp__ring_all_gather(c, a->recv, &bl, es, 0, NULL, NULL);
    ddp__blocks_free(&bl);
    return rc;
}

static int p2p(ddp__coll_ctx *c, const ddp__coll_args *a, size_t bytes)
{
    ddp__req r;
    uint64_t tag = DDP__TAG_P2P | (uint64_t)(unsigned)a->tag;
    if (a->kind == DDP__SEND)
        DDP_TRY(ddp__tp_isend(c->tp, &r, a->peer, tag, a->send, bytes));
    else
        DDP_TRY(ddp__tp_irecv(c->tp, &r, a->peer, tag, a->recv, bytes));
    /* Only this peer matters: others may come and go. */
    return ddp__tp_wait1(c->tp, &r, c->deadline, 0);
}

int ddp__coll_run(ddp__coll_ctx *c, const ddp__coll_args *a)
{
    size_t es = ddp_dtype_size(a->dtype), bytes = a->count * es;
    int rc = 0;
    if (a->kind != DDP__BARRIER && a->count == 0)
        return 0;
    switch (a->kind) {
    case DDP__ALL_REDUCE:
        rc = all_reduce(c, a->recv, a->count, a->dtype, a->op);
        break;
    case DDP__BROADCAST:
        rc = c->size == 1 ? 0 : ddp__broadcast_tree(c, a->recv, bytes, a->root);
        break;
    case DDP__REDUCE:
        rc = reduce(c, a->send, a->recv, a->count, a->dtype, a->op, a->root);
        break;
    case DDP__ALL_GATHER:
        rc = all_gather(c, a, es);
        break;
    case DDP__GATHER:
        rc = ddp__gather_direct(c, a->send, a->recv, bytes, a->root);
        break;
    case DDP__SCATTER:
        rc = ddp__scatter_direct(c, a->send, a->recv, bytes, a->root);
        break;
    case DDP__REDUCE_SCATTER:
        rc = reduce_scatter(c, a, es);
        break;
    case DDP__ALL_TO_ALL:
        rc = ddp__alltoall_pairwise(c, a->send, a->recv, bytes);
        break;
    case DDP__BARRIER:
        rc = c->size == 1 ? 0 : ddp__barrier_dissemination(c);
        break;
    case DDP__SEND:
    case DDP__RECV:
        rc = p2p(c, a, bytes);
        break;
    default:
        rc = DDP_ERROR(DDP_ERR_INVALID_ARG, "unknown operation %d", a->kind);
    }
    return rc;
}
