/* Level-gated logging through a user callback; stderr when none is set.
 * The level comes from DDP_LOG_LEVEL once, unless set explicitly.  This is
 * process-wide state by nature (like every logging sink), kept atomic. */
#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define LEVEL_UNSET (-2)

static _Atomic int log_level = LEVEL_UNSET;
static _Atomic(ddp_log_fn) log_fn;
static void *_Atomic log_user;

static int level_from_env(void)
{
    const char *s = getenv("DDP_LOG_LEVEL");
    if (!s || !*s)
        return DDP_LOG_OFF;
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcasecmp(s, names[i]) == 0)
            return i;
    if (strcasecmp(s, "warning") == 0)
        return DDP_LOG_WARN;
    return DDP_LOG_OFF;
}

int ddp_log_get_level(void)
{
    int level = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (level == LEVEL_UNSET) {
        level = level_from_env();
        atomic_store(&log_level, level);
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
