/* Process groups: the collectives' entry points (ddp_pg_all_reduce, ...,
 * and their _async forms), each filling one ddp__coll_args and handing it
 * to ddp__pg_submit (work.c), which checks and runs or queues it. */
#include "base/error.h"
#include "pg/internal.h"
#include "pg/pg_impl.h"

#define ARGS(...) ((ddp__coll_args){__VA_ARGS__})

int ddp_pg_all_reduce(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype, ddp_reduce_op op)
{
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__ALL_REDUCE, .send = buf, .recv = buf,
                                    .count = count, .dtype = dtype, .op = op), NULL);
}
int ddp_pg_all_reduce_async(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype,
                            ddp_reduce_op op, ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "all_reduce_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__ALL_REDUCE, .send = buf, .recv = buf,
                                    .count = count, .dtype = dtype, .op = op), work);
}

int ddp_pg_broadcast(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype, int root)
{
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__BROADCAST, .send = buf, .recv = buf,
                                    .count = count, .dtype = dtype, .root = root), NULL);
}
int ddp_pg_broadcast_async(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype, int root,
                           ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "broadcast_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__BROADCAST, .send = buf, .recv = buf,
                                    .count = count, .dtype = dtype, .root = root), work);
}

int ddp_pg_reduce(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype, ddp_reduce_op op,
                  int root)
{
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__REDUCE, .send = buf, .recv = buf, .count = count,
                                    .dtype = dtype, .op = op, .root = root), NULL);
}
int ddp_pg_reduce_async(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype, ddp_reduce_op op,
                        int root, ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "reduce_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__REDUCE, .send = buf, .recv = buf, .count = count,
                                    .dtype = dtype, .op = op, .root = root), work);
}

int ddp__pg_reduce_into_async(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                              ddp_dtype dtype, ddp_reduce_op op, int root, ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "reduce_into_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__REDUCE, .send = send, .recv = recv,
                                    .count = count, .dtype = dtype, .op = op, .root = root), work);
}

int ddp_pg_all_gather(ddp_pg_t *pg, const void *send, void *recv, size_t count, ddp_dtype dtype)
{
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__ALL_GATHER, .send = send, .recv = recv,
                                    .count = count, .dtype = dtype), NULL);
}
int ddp_pg_all_gather_async(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                            ddp_dtype dtype, ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "all_gather_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__ALL_GATHER, .send = send, .recv = recv,
                                    .count = count, .dtype = dtype), work);
}

int ddp_pg_gather(ddp_pg_t *pg, const void *send, void *recv, size_t count, ddp_dtype dtype,
                  int root)
{
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__GATHER, .send = send, .recv = recv, .count = count,
                                    .dtype = dtype, .root = root), NULL);
}
int ddp_pg_gather_async(ddp_pg_t *pg, const void *send, void *recv, size_t count, ddp_dtype dtype,
                        int root, ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "gather_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__GATHER, .send = send, .recv = recv, .count = count,
                                    .dtype = dtype, .root = root), work);
}

int ddp_pg_scatter(ddp_pg_t *pg, const void *send, void *recv, size_t count, ddp_dtype dtype,
                   int root)
{
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__SCATTER, .send = send, .recv = recv,
                                    .count = count, .dtype = dtype, .root = root), NULL);
}
int ddp_pg_scatter_async(ddp_pg_t *pg, const void *send, void *recv, size_t count, ddp_dtype dtype,
                         int root, ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "scatter_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__SCATTER, .send = send, .recv = recv,
                                    .count = count, .dtype = dtype, .root = root), work);
}

int ddp_pg_reduce_scatter(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                          ddp_dtype dtype, ddp_reduce_op op)
{
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__REDUCE_SCATTER, .send = send, .recv = recv,
                                    .count = count, .dtype = dtype, .op = op), NULL);
}
int ddp_pg_reduce_scatter_async(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                                ddp_dtype dtype, ddp_reduce_op op, ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "reduce_scatter_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__REDUCE_SCATTER, .send = send, .recv = recv,
                                    .count = count, .dtype = dtype, .op = op), work);
}

int ddp_pg_all_to_all(ddp_pg_t *pg, const void *send, void *recv, size_t count, ddp_dtype dtype)
{
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__ALL_TO_ALL, .send = send, .recv = recv,
                                    .count = count, .dtype = dtype), NULL);
}
int ddp_pg_all_to_all_async(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                            ddp_dtype dtype, ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "all_to_all_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__ALL_TO_ALL, .send = send, .recv = recv,
                                    .count = count, .dtype = dtype), work);
}

int ddp_pg_barrier(ddp_pg_t *pg) { return ddp__pg_submit(pg, &ARGS(.kind = DDP__BARRIER), NULL); }
int ddp_pg_barrier_async(ddp_pg_t *pg, ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "barrier_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__BARRIER), work);
}

int ddp_pg_send(ddp_pg_t *pg, const void *buf, size_t count, ddp_dtype dtype, int dst, int tag)
{
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__SEND, .send = buf, .count = count, .dtype = dtype,
                                    .peer = dst, .tag = tag), NULL);
}
int ddp_pg_send_async(ddp_pg_t *pg, const void *buf, size_t count, ddp_dtype dtype, int dst,
                      int tag, ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "send_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__SEND, .send = buf, .count = count, .dtype = dtype,
                                    .peer = dst, .tag = tag), work);
}

int ddp_pg_recv(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype, int src, int tag)
{
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__RECV, .recv = buf, .count = count, .dtype = dtype,
                                    .peer = src, .tag = tag), NULL);
}
int ddp_pg_recv_async(ddp_pg_t *pg, void *buf, size_t count, ddp_dtype dtype, int src, int tag,
                      ddp_work_t **work)
{
    DDP_FAIL_IF(!work, DDP_ERR_INVALID_ARG, "recv_async: NULL work");
    return ddp__pg_submit(pg, &ARGS(.kind = DDP__RECV, .recv = buf, .count = count, .dtype = dtype,
                                    .peer = src, .tag = tag), work);
}

