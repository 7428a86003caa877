/* libddp: distributed data-parallel training in C.  Umbrella header. */
#ifndef DDP_H
#define DDP_H

#include "ddp/base.h"
#include "ddp/tensor.h"
#include "ddp/nn.h"
#include "ddp/optim.h"
#include "ddp/data.h"
#include "ddp/store.h"
#include "ddp/pg.h"
#include "ddp/ddp.h"
#include "ddp/reducer.h"
#include "ddp/zero.h"
#include "ddp/pipeline.h"
#include "ddp/sync_batchnorm.h"
#include "ddp/progress.h"
#include "ddp/timeline.h"

#endif
