/* Opening a user-named file, refusing what is not a regular file; see
 * file.h. */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "base/error.h"

static const char *kind_of(mode_t m)
{
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    return "of an unknown kind";
}

int ddp__open_regular(const char *path, int flags, const char *what, int *fd, struct stat *st)
{
    *fd = -1;
    int f = open(path, flags | O_CLOEXEC | O_NONBLOCK, 0600);
    if (f < 0)
        return DDP_ERROR_ERRNO(errno == ENOENT ? DDP_ERR_NOT_FOUND : DDP_ERR_IO, errno,
                               "%s", what);
    struct stat s;
    int rc = 0;
    if (fstat(f, &s) < 0)
        rc = DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: stat", what);
    else if (!S_ISREG(s.st_mode))
        rc = DDP_ERROR(DDP_ERR_IO, "%s: %s, not a regular file", what, kind_of(s.st_mode));
    else if (fcntl(f, F_SETFL, fcntl(f, F_GETFL) & ~O_NONBLOCK) < 0)
        rc = DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: fcntl", what);
    if (rc < 0) {
        close(f);
        return rc;
    }
    *fd = f;
    if (st)
        *st = s;
    return 0;
}
