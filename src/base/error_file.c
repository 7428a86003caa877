/* ddp_error_file_write: a failing program's one-line error, for its
 * launcher (ddprun sets DDP_ERROR_FILE per worker, tools/ddprun/jobdir.c). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"

int ddp_error_file_write(const char *line)
{
    DDP_FAIL_IF(!line, DDP_ERR_INVALID_ARG, "error_file_write: NULL line");
    const char *path = NULL;
    int rc = ddp__env_string("DDP_ERROR_FILE", &path);
    if (rc < 0 || !path || !*path)
        return rc < 0 ? rc : 0;
    /* One line: what follows a newline is not the error's first line. */
    size_t n = strcspn(line, "\n");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "DDP_ERROR_FILE %s: cannot open", path);
    const char *p = line;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            int e = errno;
            close(fd);
            return DDP_ERROR_ERRNO(DDP_ERR_IO, e, "DDP_ERROR_FILE %s: cannot write", path);
        }
        p += k;
        n -= (size_t)k;
    }
    int bad = write(fd, "\n", 1) != 1;
    int e = errno;
    if (close(fd) < 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, e, "DDP_ERROR_FILE %s: cannot write", path);
    return 0;
}
