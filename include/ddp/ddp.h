/* libddp ddp layer: public API (see docs/ARCHITECTURE.md). */
#ifndef DDP_DDP_H
#define DDP_DDP_H

#include "ddp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
