/* What powersgd_ddp.c needs of powersgd.c: the state frees its layout's
 * user pointer with free_fn when destroyed. */
#ifndef DDP_DDP_POWERSGD_IMPL_H
#define DDP_DDP_POWERSGD_IMPL_H

#include "ddp/powersgd.h"

void ddp__powersgd_own_user(ddp_powersgd_t *s, void (*free_fn)(void *));

#endif
