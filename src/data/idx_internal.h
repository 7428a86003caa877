/* Private helpers of the data layer shared between its files. */
#ifndef DDP_DATA_IDX_INTERNAL_H
#define DDP_DATA_IDX_INTERNAL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/data.h"

/* A large buffer: sizes from 2 MiB up are a 2 MiB-aligned anonymous mapping
 * with transparent huge pages requested (few page faults on first touch);
 * smaller ones come from malloc.  *alloc_bytes receives what to pass to
 * ddp__big_free.  NULL on failure (the caller sets the error). */
void *ddp__big_alloc(size_t size, size_t *alloc_bytes);
void ddp__big_free(void *p, size_t alloc_bytes);

/* The decompressed cache of gzip'ed IDX files (idx_cache.c). */
#define DDP__IDX_CACHE_NAME_MAX 256
#define DDP__IDX_CACHE_PATH_MAX (PATH_MAX + DDP__IDX_CACHE_NAME_MAX)
typedef struct ddp__idx_cache {
    char dir[PATH_MAX];                 /* the cache folder */
    char name[DDP__IDX_CACHE_NAME_MAX]; /* the source's entry in it */
    char path[DDP__IDX_CACHE_PATH_MAX]; /* dir/name */
    char source[PATH_MAX];              /* the source's real path */
    uint64_t max_bytes;                 /* DDP_DATA_CACHE_MAX_BYTES */
} ddp__idx_cache;

/* Where source path's decompressed copy lives: 1 (c filled in), 0 when
 * caching is off or impossible (no folder, not a plausible gzip file), or
 * DDP_ERR_INVALID_ARG for a bad DDP_DATA_CACHE_MAX_BYTES. */
int ddp__idx_cache_lookup(const char *path, ddp__idx_cache *c);
/* Marks c's entry as just used (the LRU order). */
void ddp__idx_cache_touch(const ddp__idx_cache *c);
/* Writes idx (read from c's source, checked) as c's entry, then bounds the
 * folder.  Advisory: errors are ignored.  Borrows idx. */
void ddp__idx_cache_store(const ddp__idx_cache *c, uint32_t magic, const ddp_idx *idx);

/* The object behind ddp_dataset_t (dataset.c): a vtable and its instance. */
struct ddp_dataset {
    const ddp_dataset_ops *ops;
    void *self;
    size_t sample_numel;
};

#endif
