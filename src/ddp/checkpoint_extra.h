/* Private: what a training checkpoint keeps besides the model, the
 * optimizer's buffers and the position (checkpoint_extra.c): the groups'
 * lrs, an lr scheduler's state and random generators' states, as
 * __metadata__ strings.  checkpoint.c calls these. */
#ifndef DDP_DDP_CHECKPOINT_EXTRA_H
#define DDP_DDP_CHECKPOINT_EXTRA_H

#include "ddp/ddp.h"
#include "nn/safetensors.h"

/* checkpoint.c's reader of a non-negative integer in __metadata__. */
int ddp__checkpoint_meta_int(const char *path, const ddp__st_file *f, const char *key,
                             int64_t *out);
/* ddp__st_write with meta (nmeta pairs) and the extras of opt and x (both
 * may be NULL). */
int ddp__checkpoint_write(const char *path, const ddp__st_out *t, size_t n,
                          const char *const *meta, size_t nmeta, ddp_optim_t *opt,
                          const ddp_checkpoint_options *x);
/* Reads and checks every extra that opt and x ask for (an error changes
 * nothing), then sets them. */
int ddp__checkpoint_extra_load(const char *path, const ddp__st_file *f, ddp_optim_t *opt,
                               const ddp_checkpoint_options *x);

#endif
