/* libddp base: error codes, last-error messages, logging, time, element types.
 *
 * Every call that can fail returns an int: 0 on success or a negative DDP_E*
 * code.  The human-readable reason ("file.c:212: what failed, with whom") is
 * kept per thread and read with ddp_last_error().
 */
#ifndef DDP_BASE_H
#define DDP_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>  /* DDP_CHECK */
#include <stdlib.h> /* DDP_CHECK */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && defined(DDP_BUILDING_LIBRARY)
#define DDP_API __attribute__((visibility("default")))
#else
#define DDP_API
#endif

/* X-macro list of error codes: name, value, description. */
#define DDP_ERR_MAP(X)                                                   \
    X(OK, 0, "success")                                                  \
    X(INVALID_ARG, -1, "invalid argument")                               \
    X(NOMEM, -2, "out of memory")                                        \
    X(IO, -3, "input/output error")                                      \
    X(FORMAT, -4, "malformed data")                                      \
    X(TIMEOUT, -5, "timed out")                                          \
    X(CONNECTION, -6, "connection failed")                               \
    X(PROTOCOL, -7, "protocol violation")                                \
    X(AUTH, -8, "authentication failed")                                 \
    X(STATE, -9, "invalid state")                                        \
    X(NOT_FOUND, -10, "not found")                                       \
    X(UNSUPPORTED, -11, "unsupported")                                   \
    X(MISMATCH, -12, "mismatch between ranks or files")                  \
    X(PEER, -13, "peer failed")                                          \
    X(SYSTEM, -14, "system call failed")                                 \
    X(EXISTS, -15, "already exists")

enum ddp_err {
#define DDP__ERR_ENUM(name, value, desc) DDP_ERR_##name = (value),
    DDP_ERR_MAP(DDP__ERR_ENUM)
#undef DDP__ERR_ENUM
};

/* Short description of a code ("timed out"); never NULL. */
DDP_API const char *ddp_strerror(int code);
/* Name of a code ("DDP_ERR_TIMEOUT"); never NULL. */
DDP_API const char *ddp_err_name(int code);
/* The message left by the last failing call on this thread ("" if none).
 * Borrowed: valid until the next libddp call on this thread. */
DDP_API const char *ddp_last_error(void);
/* Forget the last error message of this thread. */
DDP_API void ddp_clear_error(void);
/* For a program about to stop on an error: writes line (one line, e.g.
 * "ddp-mnist: rank 1: ...") to the file DDP_ERROR_FILE names, which ddprun
 * sets per worker and quotes as the failing rank's last error (torchrun's
 * TORCHELASTIC_ERROR_FILE, in plain text).  0 without the variable; an
 * error code when the file cannot be written (the program stops anyway). */
DDP_API int ddp_error_file_write(const char *line);

/* For PROGRAMS (the library never exits): DDP_CHECK(call) runs a libddp
 * call and, when it fails, prints "FILE:LINE: call: message (DDP_ERR_NAME)"
 * on stderr, hands that line to ddp_error_file_write (ddprun quotes it) and
 * exits with status 1. */
#define DDP_CHECK(call)                                                                 \
    do {                                                                                \
        int ddp_check_rc_ = (call);                                                     \
        if (ddp_check_rc_ < 0) {                                                        \
            char ddp_check_line_[2048];                                                 \
            snprintf(ddp_check_line_, sizeof ddp_check_line_, "%s:%d: %s: %s (%s)",     \
                     __FILE__, __LINE__, #call, ddp_last_error(),                       \
                     ddp_err_name(ddp_check_rc_));                                      \
            fprintf(stderr, "%s\n", ddp_check_line_);                                   \
            ddp_error_file_write(ddp_check_line_);                                      \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* Logging: silent by default.  Level from DDP_LOG_LEVEL (error, warn, info,
 * debug) or ddp_log_set_level().  Without a callback, messages at or above
 * the level go to stderr. */
enum { /* log levels */
    DDP_LOG_ERROR = 0,
    DDP_LOG_WARN = 1,
    DDP_LOG_INFO = 2,
    DDP_LOG_DEBUG = 3,
    DDP_LOG_OFF = -1
};
typedef void (*ddp_log_fn)(int level, const char *msg, void *user);
DDP_API void ddp_log_set_callback(ddp_log_fn fn, void *user);
DDP_API void ddp_log_set_level(int level);
DDP_API int ddp_log_level(void);

/* Monotonic clock in seconds. */
DDP_API double ddp_time_now(void);

/* Where this process stands in a job, as its launcher told it through the
 * environment.  Sources, first match wins: ddprun/torchrun (RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), Open MPI's mpirun
 * (OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/_LOCAL_SIZE), MPICH/Hydra (PMI_RANK,
 * PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS) and Slurm's srun (SLURM_PROCID,
 * SLURM_STEP_NUM_TASKS, SLURM_LOCALID).  Missing local values default to rank and
 * world size (one node).  Half of a pair (RANK without WORLD_SIZE,
 * LOCAL_RANK without LOCAL_WORLD_SIZE, a local pair without the global one;
 * likewise for Open MPI and PMI, not Slurm) is DDP_ERR_INVALID_ARG naming
 * the missing variable, not "no launcher". */
typedef struct ddp_launch_info {
    int rank, world_size, local_rank, local_world_size;
    const char *source; /* "torchrun", "openmpi", "pmi", "slurm"; static string */
} ddp_launch_info;
/* 0 when a launcher was found, DDP_ERR_NOT_FOUND when none was,
 * DDP_ERR_INVALID_ARG when a variable is malformed or out of range (the
 * message names it and quotes its value) or half of a pair is set. */
DDP_API int ddp_launch_info_from_env(ddp_launch_info *out);

/* Element types of buffers (collectives, communication hooks).  float16 is
 * IEEE binary16, bfloat16 the top half of a float32; the collectives reduce
 * both in float32 and round to nearest even after every step. */
typedef enum ddp_dtype {
    DDP_FLOAT32 = 0,
    DDP_FLOAT64 = 1,
    DDP_INT32 = 2,
    DDP_INT64 = 3,
    DDP_UINT8 = 4,
    DDP_FLOAT16 = 5,
    DDP_BFLOAT16 = 6,
} ddp_dtype;
#define DDP_NUM_DTYPES 7

/* Size in bytes of one element (0 for an unknown type). */
DDP_API size_t ddp_dtype_size(ddp_dtype dtype);
/* "float32", ...; "unknown" for an unknown type.  Static string. */
DDP_API const char *ddp_dtype_name(ddp_dtype dtype);
/* Parse "float32" or "f32", "bfloat16" or "bf16", ...; DDP_ERR_INVALID_ARG
 * (naming the choices) if unknown. */
DDP_API int ddp_dtype_parse(const char *name, ddp_dtype *out);

/* A 0/1 DDP_* variable of libddp's table of environment variables (README's
 * "Configuration"; programs built on libddp, such as ddp-mnist, have their
 * own DDP_<PROGRAM>_* entries there): its default when unset or empty, else
 * 0 or 1; DDP_ERR_INVALID_ARG for any other value or a name not in the table,
 * with a message naming the variable and its value. */
DDP_API int ddp_env_bool(const char *name, int *out);

/* Library version string, "MAJOR.MINOR.PATCH". */
DDP_API const char *ddp_version(void);

#ifdef __cplusplus
}
#endif
#endif
