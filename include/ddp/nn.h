/* libddp nn layer: public API (see docs/ARCHITECTURE.md). */
#ifndef DDP_NN_H
#define DDP_NN_H

#include "ddp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
