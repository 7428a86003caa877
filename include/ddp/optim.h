/* libddp optim layer: public API (see docs/ARCHITECTURE.md). */
#ifndef DDP_OPTIM_H
#define DDP_OPTIM_H

#include "ddp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
