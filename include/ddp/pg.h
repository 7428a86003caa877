/* libddp process groups and collectives (torch.distributed with gloo, in C).
 *
 *     ddp_pg_t *pg;
 *     ddp_init_process_group("tcp", "file:///tmp/job", rank, world_size, 30.0, &pg);
 *     ddp_pg_all_reduce(pg, grads, n, DDP_FLOAT32, DDP_SUM);
 *     ddp_work_t *w;
 *     ddp_pg_all_reduce_async(pg, bucket, m, DDP_FLOAT32, DDP_AVG, &w);
 *     ... compute ...
 *     ddp_work_wait(w, -1);  ddp_work_destroy(w);
 *     ddp_destroy_process_group(pg);
 *
 * Every rank of a group must issue the same collectives in the same order
 * with the same sizes.  Asynchronous operations run on the group's
 * communication thread in issue order; a blocking call issued while none is
 * pending runs on the caller's thread.  Several threads may share a group:
 * their operations are serialised in issue order.  Results are bitwise
 * identical on every rank and from run to run (docs/algorithms.md gives
 * each algorithm's reduction order).  Any failure (a peer dying, a
 * timeout, a protocol error) leaves the group broken: later operations fail
 * at once with the original reason; destroy it.
 */
#ifndef DDP_PG_H
#define DDP_PG_H

#include "ddp/base.h"
#include "ddp/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_pg ddp_pg_t;
typedef struct ddp_work ddp_work_t;

/* Reduction operators.  AVG divides the sum by the group size (integer
 * division for integer types); BAND/BOR/BXOR apply to integer types only.
 * Integer SUM/PRODUCT wrap around (two's complement).
 * They live here, not in base.h beside ddp_dtype: an element type describes
 * any buffer (base/ converts float16/bfloat16 for DDP's communication hooks
 * as well as for the kernels), but an operator means something only to a
 * collective (AVG needs the group's size) and only coll/'s kernels apply it. */
typedef enum ddp_reduce_op {
    DDP_SUM = 0,
    DDP_AVG = 1,
    DDP_PRODUCT = 2,
    DDP_MIN = 3,
    DDP_MAX = 4,
    DDP_BAND = 5,
    DDP_BOR = 6,
    DDP_BXOR = 7,
} ddp_reduce_op;
#define DDP_NUM_REDUCE_OPS 8

/* "sum", ...; "unknown" for an unknown operator.  Static string. */
DDP_API const char *ddp_reduce_op_name(ddp_reduce_op op);
/* Parse "sum", "prod", ...; DDP_ERR_INVALID_ARG if unknown. */
DDP_API int ddp_reduce_op_parse(const char *name, ddp_reduce_op *out);

/* ------------------------------------------------------------------ */
/* Process groups                                                       */
/* ------------------------------------------------------------------ */

/* Joins a group of world_size processes as rank.  backend: "tcp" (NULL
 * means "tcp").  init_method: "file:///path", "tcp://host:port" (rank 0
 * serves the store) or "env://" (MASTER_ADDR, MASTER_PORT, and RANK /
 * WORLD_SIZE when rank / world_size are negative).  backend "mpi" (when
 * libddp was built with MPI; docs/mpi.md): rank and size come from MPI
 * (mpirun, srun), init_method is ignored (may be NULL), rank / world_size
 * are checked against MPI's when not negative (DDP_ERR_MISMATCH).
 * timeout_s bounds the rendezvous and every later operation (<= 0: 300 s;
 * mpi: see docs/mpi.md).  If some ranks do not arrive in time the error
 * names them ("ranks 2, 3 did not join within 5.0 s").  Caller destroys
 * *out. */
DDP_API int ddp_init_process_group(const char *backend, const char *init_method, int rank,
                                   int world_size, double timeout_s, ddp_pg_t **out);
/* Same over a store the caller created; borrows store, which must outlive
 * the group (and its subgroups). */
DDP_API int ddp_init_process_group_store(const char *backend, ddp_store_t *store, int rank,
                                         int world_size, double timeout_s, ddp_pg_t **out);
/* The group of a job started by a launcher, in one call (PyTorch's
 * init_process_group(backend) under torchrun): rank and world size from
 * ddp_launch_info_from_env (ddprun/torchrun, mpirun, srun variables), the
 * rendezvous from env:// (MASTER_ADDR, MASTER_PORT; the "mpi" backend needs
 * neither).  No launcher: DDP_ERR_NOT_FOUND saying how to start the program.
 * backend and timeout_s as in ddp_init_process_group.  Caller destroys. */
DDP_API int ddp_init_process_group_env(const char *backend, double timeout_s, ddp_pg_t **out);
/* Waits for the group's pending operations (at most its timeout), stops its
 * thread, says goodbye to the peers and frees everything.  NULL: no-op.
 * Subgroups must be destroyed first.  A DDP wrapper holds a reference on
 * its group (as PyTorch's DDP holds its ProcessGroup): while one still
 * exists, this call only gives up the caller's handle, and the wrapper's
 * ddp_data_parallel_destroy tears the group down; so the two may be
 * destroyed in either order.  The caller must not use pg after this call. */
DDP_API void ddp_destroy_process_group(ddp_pg_t *pg);

DDP_API int ddp_pg_rank(const ddp_pg_t *pg);
DDP_API int ddp_pg_size(const ddp_pg_t *pg);
DDP_API const char *ddp_pg_backend(const ddp_pg_t *pg);
DDP_API double ddp_pg_timeout(const ddp_pg_t *pg);

/* Creates a subgroup of the ranks listed (ascending or not, no repeats),
 * numbered 0..n-1 in the order given.  Every rank of pg must call it, in
 * the same order relative to other new_group calls; ranks not listed get
 * *out = NULL and return 0.  The subgroup has its own connections and
 * thread.  Caller destroys *out (before pg). */
DDP_API int ddp_pg_new_group(ddp_pg_t *pg, const int *ranks, int n, ddp_pg_t **out);

/* Symmetric memory: bytes (> 0) of zeroed, 64-byte aligned memory that
 * the group's collectives may read straight from the peers that share this
 * host, as PyTorch's SymmetricMemory or OpenSHMEM's symmetric heap: an
 * all-reduce on a buffer inside it skips the staging copy (DDP keeps its
 * gradient buckets there).  Collective: every rank calls it with the same
 * bytes, in the same order relative to the group's collectives; it runs
 * once the group's queued operations are done.  Where the group cannot
 * share memory (tcp between hosts, mpi, a group of one, /dev/shm too small
 * on some rank, DDP_SYMMETRIC_MEMORY=0 on some rank) it returns private
 * memory: callers need no other path.  A collective treats a buffer as
 * symmetric only when every rank passes the same allocation at the same
 * offset; ranks that mix fail with a message.  Errors: NULL arguments, 0
 * bytes, ranks asking for different sizes (DDP_ERR_MISMATCH, naming the
 * rank), a failed or already broken group, a peer that fails or the
 * group's timeout during the allocation (the group is then broken, as after
 * a failed collective), queued operations that still run after the group's
 * timeout (DDP_ERR_TIMEOUT; the group is not marked broken), or no memory
 * for the private fallback. */
DDP_API int ddp_pg_symmetric_alloc(ddp_pg_t *pg, size_t bytes, void **out);
/* Frees memory that ddp_pg_symmetric_alloc on this pg returned (NULL is a
 * no-op), before ddp_destroy_process_group.  Local (no peer takes part), but it waits
 * until the group's queued and running operations are done (at most the
 * group's timeout; past it the memory is left allocated, with a warning). */
DDP_API void ddp_pg_symmetric_free(ddp_pg_t *pg, void *p);

/* Backends built in ("tcp", "mpi" when built with MPI): NULL-terminated
 * list of names. */
DDP_API const char *const *ddp_pg_backend_names(void);
/* 0 when name is a backend built in, or "gloo" (PyTorch's name for the CPU
 * backend, which here is tcp); else DDP_ERR_UNSUPPORTED, with a message
 * listing the backends.  NULL or "" is the default (tcp).  Lets a program
 * reject a bad --backend flag before it starts anything. */
DDP_API int ddp_pg_backend_check(const char *name);

/* ------------------------------------------------------------------ */
/* Seeing what a job does                                               */
/* ------------------------------------------------------------------ */

/* Flight recorder.  Every group keeps its last DDP_TRACE_BUFFER operations
 * (default 0: off; 2000 is typical): sequence number, operation, dtype, count, root,
 * reduce operator, state (queued, started, done, failed) with timestamps,
 * and a label.  Each rank writes every group it holds as JSON to
 * DIR/trace-rank<R>.json (R: its rank in the world group) when a
 * collective fails and when the world group is destroyed, with
 * DDP_TRACE_DIR=DIR (without it, the failure's message says how to get a
 * dump), and on SIGUSR1 (DDP_TRACE_DIR, else ./ddp-trace; the handler is
 * installed as a group starts to be made, before it waits for the other
 * ranks, even with the recorder off (it then does nothing), only where
 * SIGUSR1 has its default action; a group still connecting is dumped with
 * "setting_up": true, and once the process's last group is gone SIGUSR1
 * does nothing).  The failure, SIGUSR1 and ddp_pg_dump_trace dumps hold
 * the world's live subgroups; the teardown dump has none, since subgroups
 * are destroyed before their world.  tools/ddp-trace DIR reads all ranks'
 * dumps and says where they diverged. */

/* Labels the group's operations issued from now on (say "backward/bucket
 * 3"), until the next call; NULL or "" clears it.  Copied (at most 59
 * bytes kept).  Thread-safe; the label is the group's, not the thread's. */
DDP_API int ddp_pg_set_label(ddp_pg_t *pg, const char *label);
/* Writes this process's dump now (pg's world group and its subgroups) to
 * dir/trace-rank<R>.json; dir NULL: DDP_TRACE_DIR, else ./ddp-trace.
 * DDP_ERR_STATE when the recorder is off; DDP_ERR_IO when the file cannot
 * be written. */
DDP_API int ddp_pg_dump_trace(ddp_pg_t *pg, const char *dir);

/* PyTorch's monitored_barrier: every rank enters; rank 0 waits for each
 * other rank at most timeout_s (<= 0: the group's timeout) and fails with
 * DDP_ERR_TIMEOUT naming the first rank missing ("monitored_barrier: rank
 * 2 did not reach the barrier within 1.0 s"), or every one missing with
 * wait_all_ranks; the other ranks return the same error (or, when rank 0
 * itself does not come, "rank 0 did not answer").  Through the group's
 * store, not its transport: a failure does not break the group, and it is
 * not ordered with the group's queued operations.  DDP_ERR_UNSUPPORTED on
 * a backend without a store (mpi). */
DDP_API int ddp_pg_monitored_barrier(ddp_pg_t *pg, double timeout_s, int wait_all_ranks);

/* Communication statistics: per operation and power-of-two size bucket,
 * calls, bytes, time and the algorithm and bus bandwidths as nccl-tests
 * define them, logged at level info through the log callback (stderr by
 * default) whatever DDP_LOG_LEVEL says.  DDP_COMM_STATS=1 logs them for
 * every group at its destruction.  Kept while the flight recorder is on
 * (DDP_TRACE_BUFFER > 0) or with DDP_COMM_STATS=1; with both
 * off, nothing is kept (no clock read per operation) and this says so. */
DDP_API int ddp_pg_log_comm_stats(ddp_pg_t *pg);

/* ------------------------------------------------------------------ */
/* Asynchronous work                                                    */
/* ------------------------------------------------------------------ */

/* Waits until the work completes, at most timeout_s (< 0: the group's
 * timeout).  Returns the operation's status (its error message goes to
 * ddp_last_error), or DDP_ERR_TIMEOUT if it is still running: it goes on,
 * and the buffers it uses must stay valid until it completes. */
DDP_API int ddp_work_wait(ddp_work_t *work, double timeout_s);
/* *done = 1 once the work completed (successfully or not). */
DDP_API int ddp_work_test(ddp_work_t *work, int *done);
/* Releases the handle; an operation still running completes on its own
 * (its buffers must stay valid until then).  NULL: no-op.  Work handles may
 * outlive their group (destroying a group first completes its work). */
DDP_API void ddp_work_destroy(ddp_work_t *work);

/* ------------------------------------------------------------------ */
/* Collectives                                                          */
/* Every call has a blocking form and an _async form that returns a work  */
/* handle (caller frees).  Buffers are borrowed until completion.         */
/* count is in elements.                                                  */
/* ------------------------------------------------------------------ */

/* In place: buf (count) becomes op over every rank's buf. */
DDP_API int ddp_pg_all_reduce(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype,
                              ddp_reduce_op op);
DDP_API int ddp_pg_all_reduce_async(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype,
                                    ddp_reduce_op op, ddp_work_t **work);
/* buf (count) of root is copied to every rank's buf. */
DDP_API int ddp_pg_broadcast(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype, int root);
DDP_API int ddp_pg_broadcast_async(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype,
                                   int root, ddp_work_t **work);
/* In place on root: root's buf becomes op over every rank's buf; other
 * ranks' buf is left unchanged. */
DDP_API int ddp_pg_reduce(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype, ddp_reduce_op op,
                          int root);
DDP_API int ddp_pg_reduce_async(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype,
                                ddp_reduce_op op, int root, ddp_work_t **work);
/* recv (size * count) receives every rank's send (count), in rank order. */
DDP_API int ddp_pg_all_gather(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                              ddp_dtype dtype);
DDP_API int ddp_pg_all_gather_async(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                                    ddp_dtype dtype, ddp_work_t **work);
/* Root's recv (size * count) receives every rank's send (count); recv is
 * ignored (may be NULL) elsewhere. */
DDP_API int ddp_pg_gather(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                          ddp_dtype dtype, int root);
DDP_API int ddp_pg_gather_async(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                                ddp_dtype dtype, int root, ddp_work_t **work);
/* Rank r's recv (count) receives block r of root's send (size * count);
 * send is ignored (may be NULL) elsewhere. */
DDP_API int ddp_pg_scatter(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                           ddp_dtype dtype, int root);
DDP_API int ddp_pg_scatter_async(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                                 ddp_dtype dtype, int root, ddp_work_t **work);
/* Rank r's recv (count) becomes op over block r of every rank's send
 * (size * count). */
DDP_API int ddp_pg_reduce_scatter(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                                  ddp_dtype dtype, ddp_reduce_op op);
DDP_API int ddp_pg_reduce_scatter_async(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                                        ddp_dtype dtype, ddp_reduce_op op, ddp_work_t **work);
/* Block j (count) of rank r's send goes to block r of rank j's recv
 * (both size * count). */
DDP_API int ddp_pg_all_to_all(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                              ddp_dtype dtype);
DDP_API int ddp_pg_all_to_all_async(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                                    ddp_dtype dtype, ddp_work_t **work);
/* Returns once every rank has entered the barrier. */
DDP_API int ddp_pg_barrier(ddp_pg_t *pg);
DDP_API int ddp_pg_barrier_async(ddp_pg_t *pg, ddp_work_t **work);
/* Point to point: a receive with (src, tag) takes the oldest message that
 * src sent to this rank with that tag; counts must agree.  tag >= 0. */
DDP_API int ddp_pg_send(ddp_pg_t *pg, const void *buf, size_t count, ddp_dtype dtype, int dst,
                        int tag);
DDP_API int ddp_pg_send_async(ddp_pg_t *pg, const void *buf, size_t count, ddp_dtype dtype,
                              int dst, int tag, ddp_work_t **work);
DDP_API int ddp_pg_recv(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype, int src, int tag);
DDP_API int ddp_pg_recv_async(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype, int src,
                              int tag, ddp_work_t **work);

#ifdef __cplusplus
}
#endif
#endif
