/* Environment variables: one table of every DDP_* variable that the library,
 * tools/ and examples/ read, and one typed reader for each kind of value.
 *
 * Why one reader: the variables used to be parsed in seven places with four
 * behaviours (reject, ignore, atoi, strtoull's wrap-around), so that
 * DDP_CHUNK_BYTES=-1 ran and did nothing, and DDP_TCP_SOCKBUF=1e30 read as 1.
 * Here every value is checked the same way and a bad one is an error of the
 * call that reads it:
 *
 *   DDP_CHUNK_BYTES=-1: expected a size in bytes from 1 to 1 TiB
 *
 * Rules, the same for every variable:
 *   - unset or empty ("VAR=") is unset: the getter returns 0 and the table's
 *     default (an entry without a default leaves *out as the caller set it);
 *   - a value is the whole string: no leading or trailing blanks or junk;
 *   - bool:  0 or 1;
 *   - int:   decimal digits (a leading '-' only where the range allows it);
 *   - size:  bytes as decimal digits, or in exponent form when that is a whole
 *            number (1e6, 2E9, 1.5e3), as the shared-memory knobs have always
 *            accepted; no suffixes (no parser ever took "64k");
 *   - usec:  microseconds, a decimal number (20, 0.5, 2e3);
 *   - seconds: a decimal number of seconds (10, 0.5);
 *   - word:  one of the entry's words (letter case ignored);
 *   - string / path: any text up to the entry's maximum length;
 *   - numbers outside the entry's range, negative numbers for sizes, nan,
 *     inf, and overflow are errors (DDP_ERR_INVALID_ARG).
 * A name not in the table is refused (DDP_ERR_INVALID_ARG), and
 * tests/test_env.c checks that no source file reads a DDP_* variable by
 * getenv and that README.md's configuration table lists exactly these
 * names. */
#ifndef DDP_BASE_ENV_H
#define DDP_BASE_ENV_H

#include <stddef.h>

typedef enum ddp__env_type {
    DDP__ENV_BOOL,
    DDP__ENV_INT,
    DDP__ENV_SIZE,
    DDP__ENV_USEC,
    DDP__ENV_WORD,
    DDP__ENV_STRING,
    DDP__ENV_PATH,
    DDP__ENV_SECONDS,
} ddp__env_type;

#define DDP__ENV_MAX_WORDS 8

typedef struct ddp__env_var {
    const char *name;
    ddp__env_type type;
    /* INT, SIZE, USEC, SECONDS: the accepted range, both ends included (exact in a
     * double: every bound is below 2^53).  STRING, PATH: hi is the longest
     * accepted value in bytes (0: no limit). */
    double lo, hi;
    /* The default as a user would spell it ("262144", "auto"), parsed by the
     * same reader; NULL where the caller computes it (described in what). */
    const char *dflt;
    const char *words[DDP__ENV_MAX_WORDS]; /* WORD: the accepted words, NULL-ended */
    const char *what;                      /* one line, for people */
} ddp__env_var;

/* The table, in README.md's order (borrowed, static). */
const ddp__env_var *ddp__env_table(size_t *count);
/* The entry for name, or NULL when it is not in the table. */
const ddp__env_var *ddp__env_find(const char *name);

/* Typed getters: 0 with *out set from the environment (or the default),
 * or DDP_ERR_INVALID_ARG with a ddp_last_error() message naming the
 * variable, its value and what is accepted.  A name not in the table, or
 * read as the wrong type, is refused the same way. */
int ddp__env_bool(const char *name, int *out);
int ddp__env_int(const char *name, int *out);
int ddp__env_size(const char *name, size_t *out);
int ddp__env_usec(const char *name, double *out); /* microseconds */
int ddp__env_seconds(const char *name, double *out);
int ddp__env_word(const char *name, int *out);    /* index into the entry's words */
/* A launcher's variable (RANK, WORLD_SIZE, OMPI_COMM_WORLD_RANK, MASTER_PORT,
 * ...: not DDP_* knobs, so not in the table): an integer from lo to hi by the
 * same rules, "NAME=value: expected an integer from lo to hi" otherwise.
 * Unset or empty: 0 with *out = dflt. */
int ddp__env_launcher_int(const char *name, long lo, long hi, int dflt, int *out);
/* STRING and PATH: *out borrows the environment's string (valid until the
 * variable is changed), or the default, or NULL when unset. */
int ddp__env_string(const char *name, const char **out);

#endif
