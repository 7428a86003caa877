/* Level-gated logging through a user callback; stderr when none is set.
 * The level comes from DDP_LOG_LEVEL once, unless set explicitly.  This is
 * process-wide state by nature (like every logging sink), kept atomic. */
#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "base/error.h"

#define LEVEL_UNSET (-2)

static _Atomic int log_level = LEVEL_UNSET;
static _Atomic(ddp_log_fn) log_fn;
static void *_Atomic log_user;

/* DDP_LOG_LEVEL's level.  A bad value cannot fail the call that logs, so it
 * turns warnings on and says so: never silently off. */
static int level_from_env(char *bad, size_t len)
{
    /* off, error, warn, info, debug, warning (src/base/env.c) */
    static const int levels[] = {DDP_LOG_OFF,  DDP_LOG_ERROR, DDP_LOG_WARN,
                                 DDP_LOG_INFO, DDP_LOG_DEBUG, DDP_LOG_WARN};
    char saved[1024]; /* error.c keeps 1024 bytes */
    snprintf(saved, sizeof saved, "%s", ddp_last_error()); /* logging keeps the caller's error */
    int w = 0, rc = ddp__env_word("DDP_LOG_LEVEL", &w);
    if (rc < 0)
        snprintf(bad, len, "%s", ddp_last_error());
    ddp__error_restore(saved);
    return rc < 0 ? DDP_LOG_WARN : levels[w];
}

int ddp_log_level(void)
{
    int level = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (level == LEVEL_UNSET) {
        char bad[512] = "";
        level = level_from_env(bad, sizeof bad);
        atomic_store(&log_level, level);
        if (bad[0])
            ddp__log(DDP_LOG_WARN, "%s (logging warnings)", bad);
    }
    return level;
}

void ddp_log_set_level(int level) { atomic_store(&log_level, level); }

void ddp_log_set_callback(ddp_log_fn fn, void *user)
{
    atomic_store(&log_user, user);
    atomic_store(&log_fn, fn);
}

void ddp__log(int level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ddp_log_fn fn = atomic_load(&log_fn);
    if (fn) {
        fn(level, msg, atomic_load(&log_user));
        return;
    }
    static const char *tags[] = {"E", "W", "I", "D"};
    fprintf(stderr, "[ddp %s] %s\n", tags[level < 0 ? 0 : level > 3 ? 3 : level], msg);
}
