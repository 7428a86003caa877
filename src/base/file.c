/* Files that a user named: opening one (refusing what is not a regular
 * file), reading one whole, writing one atomically; see file.h. */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
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

int ddp__file_fsync_parent(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "open directory %s", dir);
    /* Some file systems cannot fsync a directory (EINVAL): nothing to do. */
    int rc = fsync(fd) < 0 && errno != EINVAL
                 ? DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "fsync directory %s", dir)
                 : 0;
    close(fd);
    return rc;
}

int ddp__file_write_atomic(const char *path, const void *buf, size_t len)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    DDP_FAIL_IF(!tmp, DDP_ERR_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    int rc = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    DDP_FAIL_OUT(fd < 0, DDP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    for (const char *p = buf; len > 0;) { /* partial writes and EINTR */
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        DDP_FAIL_OUT(w < 0, DDP_ERR_IO, "write %s: %s", tmp, strerror(errno));
        p += w;
        len -= (size_t)w;
    }
    DDP_FAIL_OUT(fsync(fd) < 0, DDP_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    int cfd = fd;
    fd = -1;
    DDP_FAIL_OUT(close(cfd) < 0, DDP_ERR_IO, "close %s: %s", tmp, strerror(errno));
    DDP_FAIL_OUT(rename(tmp, path) < 0, DDP_ERR_IO, "rename %s to %s: %s", tmp, path,
                 strerror(errno));
    rc = ddp__file_fsync_parent(path);
out:
    if (fd >= 0)
        close(fd);
    if (rc < 0)
        unlink(tmp);
    free(tmp);
    return rc;
}

int ddp__file_read(const char *path, size_t max, char **out, size_t *len)
{
    int fd;
    struct stat st;
    DDP_TRY(ddp__open_regular(path, O_RDONLY, path, &fd, &st));
    int rc = 0;
    char *buf = NULL;
    DDP_FAIL_OUT((uint64_t)st.st_size > max, DDP_ERR_FORMAT, "%s: %lld bytes, more than %zu",
                 path, (long long)st.st_size, max);
    buf = malloc((size_t)st.st_size + 1);
    DDP_FAIL_OUT(!buf, DDP_ERR_NOMEM, "%s: out of memory", path);
    size_t n = 0;
    while (n < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + n, (size_t)st.st_size - n);
        if (r < 0 && errno == EINTR)
            continue;
        DDP_FAIL_OUT(r < 0, DDP_ERR_IO, "read %s: %s", path, strerror(errno));
        DDP_FAIL_OUT(r == 0, DDP_ERR_FORMAT, "%s: file ends early", path);
        n += (size_t)r;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return rc;
}
