/* Aligned allocation helpers; see alloc.h. */
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

#define DDP_ALIGN 64

void *ddp__alloc_aligned(size_t size)
{
    size_t rounded = (size + DDP_ALIGN - 1) / DDP_ALIGN * DDP_ALIGN;
    if (rounded < size)
        return NULL;
    return aligned_alloc(DDP_ALIGN, rounded ? rounded : DDP_ALIGN);
}

void *ddp__calloc_aligned(size_t size)
{
    void *p = ddp__alloc_aligned(size);
    if (p)
        memset(p, 0, size);
    return p;
}

void ddp__free_aligned(void *p) { free(p); }
