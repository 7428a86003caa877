/* Private error helpers: set the thread's last-error message and propagate
 * codes in one line (zstd's FORWARD_IF_ERROR, STYLE.md rule 4). */
#ifndef DDP_BASE_ERROR_H
#define DDP_BASE_ERROR_H

#include "ddp/base.h"

/* Formats "file:line: message" into the thread's last error; returns code. */
int ddp__set_error(int code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Same, with ": strerror(err)" appended. */
int ddp__set_error_errno(int code, int err, const char *file, int line,
                         const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Prepends "context: " to the current last-error message (keeps its code). */
int ddp__error_context(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Puts back a message saved from ddp_last_error() (after cleanup calls that
 * may have overwritten it). */
void ddp__error_restore(const char *msg);

#define DDP_ERROR(code, ...) ddp__set_error((code), __FILE__, __LINE__, __VA_ARGS__)
#define DDP_ERROR_ERRNO(code, err, ...) \
    ddp__set_error_errno((code), (err), __FILE__, __LINE__, __VA_ARGS__)

/* Return the code of a failing call. */
#define DDP_TRY(expr)                   \
    do {                                \
        int ddp_try_rc_ = (expr);       \
        if (ddp_try_rc_ < 0)            \
            return ddp_try_rc_;         \
    } while (0)

/* Fail with a message when cond holds. */
#define DDP_FAIL_IF(cond, code, ...)             \
    do {                                         \
        if (cond)                                \
            return DDP_ERROR((code), __VA_ARGS__); \
    } while (0)

/* Variants for functions with a local `int rc` and an `out:` cleanup label. */
#define DDP_TRY_OUT(expr)          \
    do {                           \
        if ((rc = (expr)) < 0)     \
            goto out;              \
    } while (0)
#define DDP_FAIL_OUT(cond, code, ...)              \
    do {                                           \
        if (cond) {                                \
            rc = DDP_ERROR((code), __VA_ARGS__);   \
            goto out;                              \
        }                                          \
    } while (0)

#endif
