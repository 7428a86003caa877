/* The "mpi" backend: every operation of a process group is one MPI call on
 * a communicator of its own (a dup of MPI_COMM_WORLD, or a subgroup made
 * with MPI_Comm_create_group).  Rank and size come from MPI: the program is
 * started by mpirun or srun, and no store is involved.  docs/mpi.md says
 * how to run it and why it is built this way; in short:
 *
 * - Progress.  pg.c runs one operation at a time per group, on the caller's
 *   thread or on the group's communication thread.  By default each runs as
 *   the blocking MPI call (MPI_Allreduce, ...): the MPI library's own tuned
 *   algorithms at its own speed (Open MPI's non-blocking collectives, from
 *   libnbc, measured 1.2-3.5x slower at 64 KiB-1 MiB here).  With
 *   DDP_MPI_PROGRESS=poll each runs as the non-blocking call (MPI_Iallreduce,
 *   ...) tested against the operation's deadline, which gives timeouts.
 * - Threads.  MPI_THREAD_SERIALIZED is requested, as PyTorch's MPI backend
 *   does: Open MPI's MPI_THREAD_MULTIPLE locks its progress path and costs
 *   3-5 % at 16-64 KiB here.  A process-wide lock serialises our calls, so
 *   at most one communicator may make blocking calls (two, each blocked
 *   under its rank's lock while waiting for the other's, would deadlock):
 *   the first one of the process; subgroups, and groups created while
 *   another is alive, run in poll mode (the lock is held only inside
 *   MPI_Test).  The mode is fixed at creation and agreed by all ranks of
 *   the communicator (poll if any rank wants it): MPI does not match a
 *   blocking collective with a non-blocking one.
 *   DDP_MPI_THREAD=multiple asks for the full level (no lock, blocking
 *   calls in every group).
 * - Dtypes.  float32/64, int32/64, uint8 map to MPI types and built-in ops;
 *   float16/bfloat16 travel as MPI_UINT16_T and reduce with user-defined ops
 *   around coll/'s kernels (float32 arithmetic, round to nearest even), as
 *   do uint8's (Open MPI and MPICH bugs, below).  AVG
 *   is SUM, then a division by the group size, like coll/.
 *
 * MPI itself is process-wide state, so this file keeps the one global the
 * library has: the count of live communicators and whether we initialised
 * MPI (MPI_Finalize at the last destroy, only then). */
#ifdef DDP_HAVE_MPI

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "coll/coll.h"
#include "coll/reduce.h"
#include "pg/backend.h"

/* ------------------------------------------------------------------ */
/* Process-wide MPI state                                               */
/* ------------------------------------------------------------------ */

static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER; /* guards the fields below */
static int mpi_live;         /* communicators of ours alive */
static int mpi_we_init;      /* MPI_Init_thread was ours: finalize at the last destroy */
static int mpi_serialise;    /* the library gave less than MPI_THREAD_MULTIPLE */
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER; /* our MPI calls, if serialised */

static void call_lock(void)
{
    if (mpi_serialise)
        pthread_mutex_lock(&call_mu);
}
static void call_unlock(void)
{
    if (mpi_serialise)
        pthread_mutex_unlock(&call_mu);
}

/* An MPI error code as a message. */
static int mpi_fail(int code, int mpirc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING + 1] = "";
    int len = 0;
    if (MPI_Error_string(mpirc, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", mpirc);
    return DDP_ERROR(code, "%s: %s", what, s);
}

/* Under mpi_mu: initialises MPI if nobody has. */
static int mpi_ensure_init(void)
{
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    DDP_FAIL_IF(finalized, DDP_ERR_STATE,
                "MPI is already finalised (it cannot be initialised twice in a process; keep "
                "one mpi process group alive for the whole program)");
    int provided = MPI_THREAD_SINGLE, want = MPI_THREAD_SERIALIZED;
    int multiple = 0; /* serialized, multiple */
    DDP_TRY(ddp__env_word("DDP_MPI_THREAD", &multiple));
    if (multiple)
        want = MPI_THREAD_MULTIPLE;
    if (!inited) {
        int rc = MPI_Init_thread(NULL, NULL, want, &provided);
        if (rc != MPI_SUCCESS)
            return mpi_fail(DDP_ERR_SYSTEM, rc, "MPI_Init_thread");
        mpi_we_init = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    mpi_serialise = provided < MPI_THREAD_MULTIPLE;
    if (provided < MPI_THREAD_SERIALIZED)
        DDP_WARN("MPI thread level %d (< MPI_THREAD_SERIALIZED): the communication thread "
                 "calls MPI anyway, under a lock",
                 provided);
    return 0;
}

/* Under mpi_mu: finalises MPI if we initialised it and nothing of ours is
 * left. */
static void mpi_maybe_finalize(void)
{
    if (mpi_live == 0 && mpi_we_init) {
        MPI_Finalize();
        mpi_we_init = 0;
    }
}

static int world_rank_size(int *rank, int *size)
{
    int rc = MPI_Comm_rank(MPI_COMM_WORLD, rank);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(MPI_COMM_WORLD, size);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(DDP_ERR_SYSTEM, rc, "MPI_Comm_rank/size");
}

/* Checks rank and size given by the caller (< 0: not given) against MPI's. */
static int check_world(int rank, int size, int mrank, int msize)
{
    DDP_FAIL_IF(size >= 0 && size != msize, DDP_ERR_MISMATCH,
                "backend mpi: world size %d given, but MPI has %d processes (start the program "
                "with mpirun -np N or srun; pass -1 to take MPI's)",
                size, msize);
    DDP_FAIL_IF(rank >= 0 && rank != mrank, DDP_ERR_MISMATCH,
                "backend mpi: rank %d given, but MPI says this process is rank %d of %d (pass -1 "
                "to take MPI's)",
                rank, mrank, msize);
    return 0;
}

static int mpi_launcher_world(int rank, int size, int *out_rank, int *out_size)
{
    pthread_mutex_lock(&mpi_mu);
    int rc = mpi_ensure_init();
    if (rc == 0)
        rc = world_rank_size(out_rank, out_size);
    if (rc == 0) /* on a mismatch MPI stays up: the caller may try again */
        rc = check_world(rank, size, *out_rank, *out_size);
    pthread_mutex_unlock(&mpi_mu);
    return rc;
}

/* ------------------------------------------------------------------ */
/* float16 / bfloat16 reductions                                        */
/* ------------------------------------------------------------------ */

/* MPI computes inout = in (op) inout, in being the lower rank's partial
 * result: coll/'s kernels take the lower position first. */
#define USER_OP(name, DT, OP)                                                        \
    static void name(void *in, void *inout, int *len, MPI_Datatype *type)           \
    {                                                                                \
        (void)type;                                                                  \
        ddp__reduce_kernel(DT, OP)(inout, in, inout, (size_t)*len);                  \
    }
USER_OP(f16_sum, DDP_FLOAT16, DDP_SUM)
USER_OP(f16_prod, DDP_FLOAT16, DDP_PRODUCT)
USER_OP(f16_min, DDP_FLOAT16, DDP_MIN)
USER_OP(f16_max, DDP_FLOAT16, DDP_MAX)
USER_OP(bf16_sum, DDP_BFLOAT16, DDP_SUM)
USER_OP(bf16_prod, DDP_BFLOAT16, DDP_PRODUCT)
USER_OP(bf16_min, DDP_BFLOAT16, DDP_MIN)
USER_OP(bf16_max, DDP_BFLOAT16, DDP_MAX)
/* uint8: Open MPI 4.1.4's AVX op component saturates MPI_UINT8_T sums at
 * 255 from 32 elements on (--mca op ^avx avoids it), and MPICH 4.0.2 gets
 * MPI_UINT8_T MIN/MAX wrong (both measured here), where the API promises
 * wrap-around: libddp's own kernels for every arithmetic op on uint8. */
USER_OP(u8_sum, DDP_UINT8, DDP_SUM)
USER_OP(u8_prod, DDP_UINT8, DDP_PRODUCT)
USER_OP(u8_min, DDP_UINT8, DDP_MIN)
USER_OP(u8_max, DDP_UINT8, DDP_MAX)
#undef USER_OP

/* [float16, bfloat16, uint8][SUM, PRODUCT, MIN, MAX] */
static MPI_User_function *const user_fns[3][4] = {
    {f16_sum, f16_prod, f16_min, f16_max},
    {bf16_sum, bf16_prod, bf16_min, bf16_max},
    {u8_sum, u8_prod, u8_min, u8_max},
};

/* ------------------------------------------------------------------ */
/* The backend                                                          */
/* ------------------------------------------------------------------ */

typedef struct mpi_backend {
    MPI_Comm comm;
    int rank, size;
    int poll;          /* DDP_MPI_PROGRESS=poll: non-blocking calls tested to the deadline */
    double spin_s;     /* poll: test back to back this long, then sleep between tests */
    int tag_ub;        /* largest point-to-point tag */
    int abandoned;     /* a request timed out: the communicator cannot be freed */
    double timeout_s;  /* bounds the sends still in flight at destroy */
    MPI_Op user_ops[3][4]; /* user_fns' ops (MPI_OP_NULL where none) */
    /* Sends in flight from copies of the user's data (see send_buffered) */
    MPI_Request *sreq;
    void **sbuf;
    int nsend, capsend;
    void *scratch;     /* reduce's receive buffer on non-roots (see there) */
    size_t scratch_len;
} mpi_backend;

static MPI_Datatype mpi_type(ddp_dtype dt)
{
    switch (dt) {
    case DDP_FLOAT32: return MPI_FLOAT;
    case DDP_FLOAT64: return MPI_DOUBLE;
    case DDP_INT32: return MPI_INT32_T;
    case DDP_INT64: return MPI_INT64_T;
    case DDP_UINT8: return MPI_UINT8_T;
    default: return MPI_UINT16_T; /* float16, bfloat16: user-defined ops */
    }
}

static MPI_Op mpi_op(const mpi_backend *b, ddp_dtype dt, ddp_reduce_op op)
{
    int k = op == DDP_PRODUCT ? 1 : op == DDP_MIN ? 2 : op == DDP_MAX ? 3 : op <= DDP_AVG ? 0 : -1;
    int d = dt == DDP_FLOAT16 ? 0 : dt == DDP_BFLOAT16 ? 1 : dt == DDP_UINT8 ? 2 : -1;
    if (d >= 0 && k >= 0 && b->user_ops[d][k] != MPI_OP_NULL)
        return b->user_ops[d][k];
    switch (op) {
    case DDP_PRODUCT: return MPI_PROD;
    case DDP_MIN: return MPI_MIN;
    case DDP_MAX: return MPI_MAX;
    case DDP_BAND: return MPI_BAND;
    case DDP_BOR: return MPI_BOR;
    case DDP_BXOR: return MPI_BXOR;
    default: return MPI_SUM; /* SUM, AVG (then divided) */
    }
}

/* Tests *req until it completes or the deadline passes (poll mode). */
static int wait_req(mpi_backend *b, MPI_Request *req, MPI_Status *st, double deadline,
                    const char *what)
{
    double t0 = ddp_time_now();
    long nap_ns = 1000;
    for (;;) {
        int done = 0;
        call_lock();
        int rc = MPI_Test(req, &done, st);
        call_unlock();
        if (rc != MPI_SUCCESS)
            return mpi_fail(DDP_ERR_PEER, rc, what);
        if (done)
            return 0;
        double t = ddp_time_now();
        if (t > deadline) {
            b->abandoned = 1; /* MPI cannot cancel a collective: leave it be */
            return DDP_ERROR(DDP_ERR_TIMEOUT,
                             "%s did not complete within %.1f s (a rank is missing or stuck; "
                             "the MPI communicator is abandoned)",
                             what, t - t0);
        }
        if (t - t0 > b->spin_s) { /* a long wait: stop taking a core */
            struct timespec ts = {0, nap_ns};
            nanosleep(&ts, NULL);
            if (nap_ns < 100000)
                nap_ns *= 2;
        }
    }
}

/* Frees the copies of the sends that completed. */
static int reap_sends(mpi_backend *b)
{
    int k = 0, rc = MPI_SUCCESS;
    for (int i = 0; i < b->nsend; i++) {
        int done = 0;
        call_lock();
        int e = MPI_Test(&b->sreq[i], &done, MPI_STATUS_IGNORE);
        call_unlock();
        if (e != MPI_SUCCESS && rc == MPI_SUCCESS)
            rc = e;
        if (done || e != MPI_SUCCESS) {
            free(b->sbuf[i]);
            continue;
        }
        b->sreq[k] = b->sreq[i];
        b->sbuf[k++] = b->sbuf[i];
    }
    b->nsend = k;
    return rc == MPI_SUCCESS ? 0 : mpi_fail(DDP_ERR_PEER, rc, "MPI_Isend");
}

/* A send completes once its data is copied and MPI_Isend posted, like the
 * tcp backend's (whose peers take unexpected messages in): one group runs
 * one operation at a time, so send_async then recv between two ranks, in a
 * ring, must not wait for the matching receive.  MPI moves the copy while
 * later operations run; reap_sends frees it. */
static int send_buffered(mpi_backend *b, const ddp__coll_args *a, MPI_Datatype t)
{
    size_t bytes = a->count * ddp_dtype_size(a->dtype);
    DDP_TRY(reap_sends(b));
    if (b->nsend == b->capsend) {
        int cap = b->capsend ? 2 * b->capsend : 8;
        MPI_Request *r = realloc(b->sreq, sizeof *r * (size_t)cap);
        if (r)
            b->sreq = r;
        void **p = r ? realloc(b->sbuf, sizeof *p * (size_t)cap) : NULL;
        DDP_FAIL_IF(!p, DDP_ERR_NOMEM, "out of memory for a send of %zu bytes", bytes);
        b->sbuf = p;
        b->capsend = cap;
    }
    void *copy = malloc(bytes ? bytes : 1);
    DDP_FAIL_IF(!copy, DDP_ERR_NOMEM, "out of memory for a send of %zu bytes", bytes);
    if (bytes)
        memcpy(copy, a->send, bytes);
    call_lock();
    int e = MPI_Isend(copy, (int)a->count, t, a->peer, a->tag, b->comm, &b->sreq[b->nsend]);
    call_unlock();
    if (e != MPI_SUCCESS) {
        free(copy);
        return mpi_fail(DDP_ERR_PEER, e, "MPI_Isend");
    }
    b->sbuf[b->nsend++] = copy;
    return 0;
}

/* Runs a blocking MPI call, or its non-blocking twin waited for to the
 * deadline (poll mode).  Expands inside mpi_run(). */
#define MPI_CALL(blocking, nonblocking, ...)                                         \
    do {                                                                             \
        if (b->poll) {                                                               \
            call_lock();                                                             \
            rc = nonblocking(__VA_ARGS__, &req);                                     \
            call_unlock();                                                           \
            if (rc == MPI_SUCCESS)                                                   \
                return wait_req(b, &req, MPI_STATUS_IGNORE, deadline, #nonblocking); \
        } else {                                                                     \
            call_lock();                                                             \
            rc = blocking(__VA_ARGS__);                                              \
            call_unlock();                                                           \
        }                                                                            \
        name = #blocking;                                                            \
    } while (0)

/* The collective proper; AVG's division comes after. */
static int mpi_exec(mpi_backend *b, const ddp__coll_args *a, double deadline)
{
    const MPI_Comm comm = b->comm;
    const MPI_Datatype t = mpi_type(a->dtype);
    const MPI_Op op = mpi_op(b, a->dtype, a->op);
    const int n = (int)a->count;
    const size_t bytes = a->count * ddp_dtype_size(a->dtype);
    const char *name = "MPI";
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    switch (a->kind) {
    case DDP__ALL_REDUCE:
        MPI_CALL(MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, a->recv, n, t, op, comm);
        break;
    case DDP__BROADCAST:
        MPI_CALL(MPI_Bcast, MPI_Ibcast, a->recv, n, t, a->root, comm);
        break;
    case DDP__REDUCE: {
        /* No MPI_IN_PLACE at the root and no NULL receive buffer elsewhere:
         * MPICH 4.0.2's reduce crashed on both here (1023 floats, root 1).
         * The root sends a copy of its buffer; the others receive into
         * scratch that MPI may write. */
        int root = b->rank == a->root;
        if (bytes > b->scratch_len) {
            free(b->scratch);
            b->scratch_len = 0;
            b->scratch = malloc(bytes);
            DDP_FAIL_IF(!b->scratch, DDP_ERR_NOMEM, "out of memory for %zu bytes", bytes);
            b->scratch_len = bytes;
        }
        /* Out of place (send != recv) the root's input is its own already. */
        int copy = root && a->send == a->recv;
        if (copy && bytes)
            memcpy(b->scratch, a->recv, bytes);
        MPI_CALL(MPI_Reduce, MPI_Ireduce, copy ? b->scratch : a->send,
                 root ? a->recv : b->scratch, n, t, op, a->root, comm);
        break;
    }
    case DDP__ALL_GATHER: {
        /* torch's in-place form: send is this rank's block of recv */
        int inplace = a->send == (const uint8_t *)a->recv + (size_t)b->rank * bytes && bytes;
        MPI_CALL(MPI_Allgather, MPI_Iallgather, inplace ? MPI_IN_PLACE : a->send, n, t, a->recv,
                 n, t, comm);
        break;
    }
    case DDP__GATHER:
        MPI_CALL(MPI_Gather, MPI_Igather, a->send, n, t, a->recv, n, t, a->root, comm);
        break;
    case DDP__SCATTER:
        MPI_CALL(MPI_Scatter, MPI_Iscatter, a->send, n, t, a->recv, n, t, a->root, comm);
        break;
    case DDP__REDUCE_SCATTER:
        MPI_CALL(MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block, a->send, a->recv, n, t, op,
                 comm);
        break;
    case DDP__ALL_TO_ALL:
        MPI_CALL(MPI_Alltoall, MPI_Ialltoall, a->send, n, t, a->recv, n, t, comm);
        break;
    case DDP__BARRIER:
        MPI_CALL(MPI_Barrier, MPI_Ibarrier, comm);
        break;
    case DDP__SEND:
        return send_buffered(b, a, t);
    case DDP__RECV: {
        MPI_Status st;
        call_lock();
        rc = MPI_Irecv(a->recv, n, t, a->peer, a->tag, comm, &req);
        call_unlock();
        if (rc != MPI_SUCCESS)
            return mpi_fail(DDP_ERR_PEER, rc, "MPI_Irecv");
        if (b->poll) {
            DDP_TRY(wait_req(b, &req, &st, deadline, "MPI_Irecv"));
        } else {
            call_lock();
            rc = MPI_Wait(&req, &st);
            call_unlock();
            if (rc != MPI_SUCCESS)
                return mpi_fail(DDP_ERR_PEER, rc, "MPI_Recv");
        }
        int got = 0;
        MPI_Get_count(&st, t, &got);
        DDP_FAIL_IF(got != n, DDP_ERR_MISMATCH, "received %d elements from rank %d, expected %d",
                    got, a->peer, n);
        return 0;
    }
    default:
        return DDP_ERROR(DDP_ERR_INVALID_ARG, "unknown operation %d", a->kind);
    }
    if (rc != MPI_SUCCESS)
        return mpi_fail(DDP_ERR_PEER, rc, name);
    return 0;
}
#undef MPI_CALL

static int mpi_run(void *impl, const ddp__coll_args *a, uint64_t seq, double deadline)
{
    (void)seq; /* MPI orders a communicator's collectives itself */
    mpi_backend *b = impl;
    DDP_FAIL_IF(b->abandoned, DDP_ERR_STATE, "the MPI communicator was abandoned after a timeout");
    DDP_FAIL_IF(a->count > INT_MAX, DDP_ERR_UNSUPPORTED,
                "count %zu exceeds MPI's int counts (split the buffer)", a->count);
    DDP_FAIL_IF((a->kind == DDP__SEND || a->kind == DDP__RECV) && a->tag > b->tag_ub,
                DDP_ERR_INVALID_ARG, "tag %d exceeds this MPI's MPI_TAG_UB (%d)", a->tag,
                b->tag_ub);
    DDP_TRY(mpi_exec(b, a, deadline));
    if (a->op == DDP_AVG && a->count) {
        if (a->kind == DDP__ALL_REDUCE || a->kind == DDP__REDUCE_SCATTER ||
            (a->kind == DDP__REDUCE && b->rank == a->root))
            ddp__reduce_divide(a->recv, a->count, a->dtype, b->size);
    }
    return 0;
}

static void mpi_abort(void *impl, int code, const char *why)
{
    /* Nothing to drop: a failed blocking call is over, a timed-out request
     * is abandoned (MPI_Cancel does not apply to collectives).  Peers learn
     * of the failure when this process exits: mpirun/srun end the job. */
    (void)impl;
    (void)code;
    (void)why;
}

static void free_backend(mpi_backend *b)
{
    for (int i = 0; i < b->nsend; i++)
        free(b->sbuf[i]);
    free(b->sreq);
    free(b->sbuf);
    free(b->scratch);
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 4; k++)
            if (b->user_ops[d][k] != MPI_OP_NULL)
                MPI_Op_free(&b->user_ops[d][k]);
    if (b->comm != MPI_COMM_NULL && !b->abandoned)
        MPI_Comm_free(&b->comm);
    free(b);
}

static void mpi_destroy(void *impl)
{
    mpi_backend *b = impl;
    if (!b)
        return;
    /* Sends still in flight: their receivers get them, or, after the
     * timeout, the communicator is abandoned. */
    double deadline = ddp_time_now() + b->timeout_s;
    for (int i = 0; i < b->nsend && !b->abandoned; i++)
        if (wait_req(b, &b->sreq[i], MPI_STATUS_IGNORE, deadline, "MPI_Isend") < 0)
            DDP_WARN("mpi backend: %s", ddp_last_error());
    pthread_mutex_lock(&mpi_mu);
    int abandoned = b->abandoned;
    call_lock();
    free_backend(b);
    call_unlock();
    mpi_live--;
    if (!abandoned) /* finalising with a request in flight could hang */
        mpi_maybe_finalize();
    else
        mpi_we_init = 0;
    pthread_mutex_unlock(&mpi_mu);
}

static int wait_setup(MPI_Request *req, double deadline, const char *what);

/* Under mpi_mu: every rank of the new communicator takes poll mode if any
 * wants it.  The wishes are local (this process's live communicators, its
 * environment), and MPI never matches a blocking collective with a
 * non-blocking one: a mode that differed between ranks would hang. */
static int agree_on_mode(mpi_backend *b, double deadline)
{
    int mine = b->poll, any = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    int e = MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_LOR, b->comm, &req);
    if (e != MPI_SUCCESS)
        return mpi_fail(DDP_ERR_SYSTEM, e, "MPI_Iallreduce (progress mode)");
    int rc = wait_setup(&req, deadline, "MPI_Iallreduce (progress mode)");
    if (rc < 0) {
        b->abandoned = 1; /* the request is still in flight on b->comm */
        return rc;
    }
    b->poll = any;
    return 0;
}

/* Under mpi_mu, MPI initialised: a backend over comm (taken); sub: comm is
 * a subgroup's. */
static int backend_new(MPI_Comm comm, int sub, double timeout_s, void **impl)
{
    int rc = 0;
    mpi_backend *b = calloc(1, sizeof *b);
    if (!b) {
        MPI_Comm_free(&comm);
        return DDP_ERROR(DDP_ERR_NOMEM, "out of memory");
    }
    b->comm = comm;
    b->timeout_s = timeout_s;
    /* One blocking communicator at most under a serialised library (top). */
    b->poll = mpi_serialise && (sub || mpi_live > 0);
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 4; k++)
            b->user_ops[d][k] = MPI_OP_NULL;
    mpi_live++;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &b->rank);
    MPI_Comm_size(comm, &b->size);
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    b->tag_ub = flag && ub ? *ub : 32767;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 4; k++) {
            if (!user_fns[d][k])
                continue;
            int e = MPI_Op_create(user_fns[d][k], 1, &b->user_ops[d][k]);
            if (e != MPI_SUCCESS) {
                rc = mpi_fail(DDP_ERR_SYSTEM, e, "MPI_Op_create");
                goto out;
            }
        }
    int poll = 0; /* blocking, poll */
    DDP_TRY_OUT(ddp__env_word("DDP_MPI_PROGRESS", &poll));
    b->poll |= poll;
    double spin_us = 0;
    DDP_TRY_OUT(ddp__env_usec("DDP_MPI_SPIN_US", &spin_us));
    b->spin_s = spin_us * 1e-6;
    DDP_TRY_OUT(agree_on_mode(b, ddp_time_now() + timeout_s));
    *impl = b;
    b = NULL;
out:
    if (b) {
        free_backend(b);
        mpi_live--;
    }
    return rc;
}

/* Under mpi_mu: waits for a request (communicator creation) to the deadline. */
static int wait_setup(MPI_Request *req, double deadline, const char *what)
{
    mpi_backend tmp = {.spin_s = 0.001};
    int rc = wait_req(&tmp, req, MPI_STATUS_IGNORE, deadline, what);
    if (rc < 0 && tmp.abandoned)
        ddp__error_context(rc, "process group setup");
    return rc;
}

static int mpi_create(ddp_store_t *store, const char *prefix, int rank, int size,
                      double timeout_s, void **impl)
{
    (void)store; /* MPI has its own rendezvous: mpirun / srun */
    (void)prefix;
    int rc = 0, mrank = 0, msize = 0;
    pthread_mutex_lock(&mpi_mu);
    DDP_TRY_OUT(mpi_ensure_init());
    DDP_TRY_OUT(world_rank_size(&mrank, &msize));
    DDP_TRY_OUT(check_world(rank, size, mrank, msize));
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    int e = MPI_Comm_idup(MPI_COMM_WORLD, &comm, &req);
    if (e != MPI_SUCCESS) {
        rc = mpi_fail(DDP_ERR_SYSTEM, e, "MPI_Comm_idup");
        goto out;
    }
    DDP_TRY_OUT(wait_setup(&req, ddp_time_now() + timeout_s, "MPI_Comm_idup"));
    rc = backend_new(comm, 0, timeout_s, impl);
out: /* on failure MPI stays up (it cannot be initialised twice) */
    pthread_mutex_unlock(&mpi_mu);
    return rc;
}

/* MPI_Comm_create_group is collective over the members only (others return
 * early in ddp_pg_new_group); it has no non-blocking form, so the group
 * timeout does not bound it. */
static int mpi_create_sub(void *parent, const int *ranks, int n, int me, double timeout_s,
                          void **impl)
{
    (void)me;
    mpi_backend *pb = parent;
    int rc = 0;
    MPI_Group world = MPI_GROUP_NULL, sub = MPI_GROUP_NULL;
    MPI_Comm comm = MPI_COMM_NULL;
    pthread_mutex_lock(&mpi_mu);
    call_lock();
    int e = MPI_Comm_group(pb->comm, &world);
    if (e == MPI_SUCCESS)
        e = MPI_Group_incl(world, n, ranks, &sub);
    if (e == MPI_SUCCESS)
        e = MPI_Comm_create_group(pb->comm, sub, 0x3dd, &comm);
    call_unlock();
    if (e != MPI_SUCCESS) {
        rc = mpi_fail(DDP_ERR_SYSTEM, e, "MPI_Comm_create_group");
        goto out;
    }
    rc = backend_new(comm, 1, timeout_s, impl);
out:
    if (sub != MPI_GROUP_NULL)
        MPI_Group_free(&sub);
    if (world != MPI_GROUP_NULL)
        MPI_Group_free(&world);
    pthread_mutex_unlock(&mpi_mu);
    return rc;
}

const ddp__backend ddp__backend_mpi = {
    .name = "mpi",
    .create = mpi_create,
    .run = mpi_run,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
    .launcher_world = mpi_launcher_world,
    .create_sub = mpi_create_sub,
};

#endif /* DDP_HAVE_MPI */
