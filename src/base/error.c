/* Error codes and the thread-local last-error message (STYLE.md rules 2-3). */
#include "base/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DDP_ERRMSG_MAX 1024

static _Thread_local char last_error[DDP_ERRMSG_MAX];

const char *ddp_strerror(int code)
{
    switch (code) {
#define DDP__ERR_DESC(name, value, desc) \
    case (value):                        \
        return desc;
        DDP_ERR_MAP(DDP__ERR_DESC)
#undef DDP__ERR_DESC
    }
    return "unknown error";
}

const char *ddp_err_name(int code)
{
    switch (code) {
#define DDP__ERR_NAME(name, value, desc) \
    case (value):                        \
        return "DDP_ERR_" #name;
        DDP_ERR_MAP(DDP__ERR_NAME)
#undef DDP__ERR_NAME
    }
    return "DDP_ERR_UNKNOWN";
}

const char *ddp_last_error(void) { return last_error; }

void ddp_clear_error(void) { last_error[0] = '\0'; }

void ddp__error_restore(const char *msg)
{
    if (msg != last_error)
        snprintf(last_error, sizeof last_error, "%s", msg);
}

/* The file below its layer's folder ("tcp/loop.c" for
 * src/transport/tcp/loop.c, "pg.c" for src/pg/pg.c), else its base name:
 * messages stay short and build-path independent, and a transport's files
 * still say which transport they are. */
static const char *base_name(const char *path)
{
    const char *src = NULL;
    for (const char *p = path; (p = strstr(p, "src/")) != NULL; p += 4)
        if (p == path || p[-1] == '/')
            src = p + 4;
    const char *layer_end = src ? strchr(src, '/') : NULL;
    if (layer_end)
        return layer_end + 1;
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

__attribute__((format(printf, 3, 0)))
static void set_message(const char *file, int line, const char *fmt, va_list ap)
{
    /* Format into a scratch buffer first: fmt's arguments may point into
     * last_error itself (a message wrapping the previous one). */
    char tmp[DDP_ERRMSG_MAX];
    int n = snprintf(tmp, sizeof tmp, "%s:%d: ", base_name(file), line);
    if (n < 0)
        n = 0;
    if ((size_t)n < sizeof tmp)
        vsnprintf(tmp + n, sizeof tmp - (size_t)n, fmt, ap);
    memcpy(last_error, tmp, sizeof tmp);
}

int ddp__set_error(int code, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_message(file, line, fmt, ap);
    va_end(ap);
    return code;
}

int ddp__set_error_errno(int code, int err, const char *file, int line,
                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_message(file, line, fmt, ap);
    va_end(ap);
    size_t len = strlen(last_error);
    if (len < sizeof last_error)
        snprintf(last_error + len, sizeof last_error - len, ": %s", strerror(err));
    return code;
}

int ddp__error_context(int code, const char *fmt, ...)
{
    char tmp[2 * DDP_ERRMSG_MAX + 2];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, DDP_ERRMSG_MAX, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if (n > DDP_ERRMSG_MAX - 1)
        n = DDP_ERRMSG_MAX - 1;
    tmp[n++] = ':';
    tmp[n++] = ' ';
    memcpy(tmp + n, last_error, DDP_ERRMSG_MAX);
    tmp[DDP_ERRMSG_MAX - 1] = '\0'; /* truncate to the message size */
    memcpy(last_error, tmp, DDP_ERRMSG_MAX);
    return code;
}
