/* SyncBatchNorm: BatchNorm whose batch statistics are those of the whole
 * process group's batch (torch.nn.SyncBatchNorm.convert_sync_batchnorm).
 * Each converted BatchNorm all-reduces, in training mode, three numbers per
 * channel in forward (sum x, sum x^2, and the count) and two in backward
 * (sum dy, sum dy*xhat), in float64, through the group's all_reduce; the
 * weight and bias gradients stay this rank's (DDP averages them).
 * Evaluation uses the running statistics and communicates nothing. */
#ifndef DDP_SYNC_BATCHNORM_H
#define DDP_SYNC_BATCHNORM_H

#include "ddp/nn.h"
#include "ddp/pg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes every BatchNorm module of model synchronise over pg (borrowed: it
 * must outlive the model's training use), or, with pg NULL, use local
 * statistics again.  *nconverted (may be NULL) gets how many modules were
 * changed.  Every rank must convert alike: the hook is a collective. */
DDP_API int ddp_sync_batchnorm_convert(ddp_model_t *model, ddp_pg_t *pg, int *nconverted);

#ifdef __cplusplus
}
#endif
#endif
