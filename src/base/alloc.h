/* Allocation helpers: 64-byte aligned buffers (one cache line, one AVX-512
 * vector) for tensors and communication scratch. */
#ifndef DDP_BASE_ALLOC_H
#define DDP_BASE_ALLOC_H

#include <stddef.h>

/* Aligned allocation, NULL on failure (the caller sets the error). Free with
 * ddp__free_aligned.  size 0 returns a valid unique pointer. */
void *ddp__alloc_aligned(size_t size);
void *ddp__calloc_aligned(size_t size);
void ddp__free_aligned(void *p);

#endif
