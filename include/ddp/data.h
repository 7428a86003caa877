/* libddp data layer: public API (see docs/ARCHITECTURE.md). */
#ifndef DDP_DATA_H
#define DDP_DATA_H

#include "ddp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
