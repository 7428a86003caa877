/* Private logging helpers: level-gated, silent by default. */
#ifndef DDP_BASE_LOG_H
#define DDP_BASE_LOG_H

#include "ddp/base.h"

void ddp__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DDP_LOG(level, ...)                              \
    do {                                                 \
        if ((level) <= ddp_log_level())              \
            ddp__log((level), __VA_ARGS__);              \
    } while (0)
#define DDP_WARN(...) DDP_LOG(DDP_LOG_WARN, __VA_ARGS__)
#define DDP_INFO(...) DDP_LOG(DDP_LOG_INFO, __VA_ARGS__)
#define DDP_DEBUG(...) DDP_LOG(DDP_LOG_DEBUG, __VA_ARGS__)

#endif
