/* Opening a file that a user named: a regular file, or a clear refusal. */
#ifndef DDP_BASE_FILE_H
#define DDP_BASE_FILE_H

#include <stddef.h>
#include <sys/stat.h>

/* Opens path with flags (O_RDONLY, O_RDWR, | O_CREAT: mode 0600; O_CLOEXEC
 * is added) and refuses, before any read, what is not a regular file: a
 * FIFO, a directory, a device or a socket in place of a data file would
 * block a read forever or feed it garbage.  The open itself is
 * non-blocking, so that even opening a FIFO without a writer returns at
 * once; the descriptor is blocking again when returned.  Returns 0 with
 * *fd (and *st, when not NULL, the file's fstat), or DDP_ERR_NOT_FOUND /
 * DDP_ERR_IO with "WHAT: why" (strerror) or "WHAT: a FIFO, not a regular file",
 * where what (borrowed) names the file as the caller's messages do: the
 * path, "file store PATH", "DDP_SECRET_FILE=PATH". */
int ddp__open_regular(const char *path, int flags, const char *what, int *fd, struct stat *st);

/* Writes len bytes of buf to "<path>.tmp", fsyncs it, renames it over path
 * and fsyncs the folder: a reader sees the old file or the whole new one,
 * also after a crash.  DDP_ERR_IO names the step that failed. */
int ddp__file_write_atomic(const char *path, const void *buf, size_t len);
/* fsyncs the folder of path, so that a rename in it is durable (a file
 * system that cannot fsync a folder, EINVAL, is not an error). */
int ddp__file_fsync_parent(const char *path);

/* Reads a whole regular file (at most max bytes, else DDP_ERR_FORMAT) into
 * *out, NUL-terminated, *len bytes; caller frees. */
int ddp__file_read(const char *path, size_t max, char **out, size_t *len);

#endif
