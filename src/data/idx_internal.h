/* Private helpers of the data layer shared between its files. */
#ifndef DDP_DATA_IDX_INTERNAL_H
#define DDP_DATA_IDX_INTERNAL_H

#include <stddef.h>

#include "ddp/data.h"

/* A large buffer: sizes from 2 MiB up are a 2 MiB-aligned anonymous mapping
 * with transparent huge pages requested (few page faults on first touch);
 * smaller ones come from malloc.  *alloc_bytes receives what to pass to
 * ddp__big_free.  NULL on failure (the caller sets the error). */
void *ddp__big_alloc(size_t size, size_t *alloc_bytes);
void ddp__big_free(void *p, size_t alloc_bytes);

/* The object behind ddp_dataset_t (dataset.c): a vtable and its instance. */
struct ddp_dataset {
    const ddp_dataset_ops *ops;
    void *self;
    size_t sample_numel;
};

#endif
