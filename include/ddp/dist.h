/* libddp dist layer: public API (see docs/ARCHITECTURE.md). */
#ifndef DDP_DIST_H
#define DDP_DIST_H

#include "ddp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
