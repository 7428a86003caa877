/* The shared secret from DDP_SECRET or DDP_SECRET_FILE; see secret.h. */
#include "base/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/file.h"

/* Reads up to cap bytes of path into buf: a regular file only (a FIFO
 * would block, or read as empty). */
static int read_file(const char *path, uint8_t *buf, size_t cap, size_t *n)
{
    char what[4200];
    snprintf(what, sizeof what, "DDP_SECRET_FILE=%s", path);
    int fd;
    if (ddp__open_regular(path, O_RDONLY, what, &fd, NULL) < 0)
        return DDP_ERR_IO; /* the message says why */
    *n = 0;
    while (*n < cap) {
        ssize_t got = read(fd, buf + *n, cap - *n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int err = errno;
            close(fd);
            return DDP_ERROR_ERRNO(DDP_ERR_IO, err, "DDP_SECRET_FILE=%s: read", path);
        }
        if (got == 0)
            break;
        *n += (size_t)got;
    }
    close(fd);
    return 0;
}

int ddp__secret_load(uint8_t **secret, size_t *len)
{
    int rc = 0;
    /* One byte over the limit tells a file at the limit from a larger one. */
    uint8_t buf[DDP__SECRET_MAX + 1];
    size_t n = 0;
    *secret = NULL;
    *len = 0;
    const char *value = NULL, *path = NULL;
    DDP_TRY(ddp__env_string("DDP_SECRET", &value));
    DDP_TRY(ddp__env_string("DDP_SECRET_FILE", &path));
    int have_value = value && *value, have_path = path && *path;
    DDP_FAIL_IF(have_value && have_path, DDP_ERR_INVALID_ARG,
                "DDP_SECRET and DDP_SECRET_FILE=%s are both set: set only one", path);
    if (have_value) {
        n = strlen(value);
        /* The same limit as a file's; the message never quotes a secret. */
        DDP_FAIL_IF(n > DDP__SECRET_MAX, DDP_ERR_INVALID_ARG,
                    "DDP_SECRET: %zu bytes, more than %d, the limit for a secret", n,
                    DDP__SECRET_MAX);
        *secret = malloc(n);
        DDP_FAIL_IF(!*secret, DDP_ERR_NOMEM, "out of memory");
        memcpy(*secret, value, n);
        *len = n;
        return 0;
    }
    if (!have_path)
        return 0;
    DDP_TRY_OUT(read_file(path, buf, sizeof buf, &n));
    DDP_FAIL_OUT(n > DDP__SECRET_MAX, DDP_ERR_INVALID_ARG,
                 "DDP_SECRET_FILE=%s: the file is larger than %d bytes, the limit for a secret",
                 path, DDP__SECRET_MAX);
    if (n && buf[n - 1] == '\n') { /* one "\n" or "\r\n"; a lone "\r" is the secret's */
        n--;
        if (n && buf[n - 1] == '\r')
            n--;
    }
    DDP_FAIL_OUT(n == 0, DDP_ERR_INVALID_ARG,
                 "DDP_SECRET_FILE=%s: the secret is empty (an empty file, or only a line ending)",
                 path);
    *secret = malloc(n);
    DDP_FAIL_OUT(!*secret, DDP_ERR_NOMEM, "out of memory");
    memcpy(*secret, buf, n);
    *len = n;
out:
    explicit_bzero(buf, sizeof buf);
    return rc;
}
