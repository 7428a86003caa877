/* ZeRO's flat partition, in one place (the reducer's scatter mode, ZeRO's
 * shard model and its checkpoints all cut the same way): shard s of total
 * floats over n ranks is [s*S, min((s+1)*S, total)), S = ceil(total / n);
 * the last shards may be short or empty. */
#ifndef DDP_DDP_FLAT_SHARD_H
#define DDP_DDP_FLAT_SHARD_H

#include <stddef.h>

static inline size_t ddp__flat_shard_size(size_t total, int n)
{
    return (total + (size_t)n - 1) / (size_t)n;
}

static inline void ddp__flat_shard(size_t total, int n, int s, size_t *begin, size_t *end)
{
    size_t S = ddp__flat_shard_size(total, n), b = S * (size_t)s, e = b + S;
    *begin = b < total ? b : total;
    *end = e < total ? e : total;
}

#endif
