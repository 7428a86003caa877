/* Private loader internals used by the loader's helpers (loader_dist.c). */
#ifndef DDP_DATA_LOADER_H
#define DDP_DATA_LOADER_H

#include "ddp/data.h"

/* The loader takes ownership of the sampler it was created with
 * (opts.sampler): ddp_loader_destroy frees it. */
void ddp__loader_adopt_sampler(ddp_loader_t *dl);

#endif
