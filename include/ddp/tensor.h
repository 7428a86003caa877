/* libddp tensor layer: public API (see docs/ARCHITECTURE.md). */
#ifndef DDP_TENSOR_H
#define DDP_TENSOR_H

#include "ddp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
