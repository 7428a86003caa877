/* The workers' output, line by line: to the console (unless redirected or
 * filtered out; prefixed "[rank N]: " with --prefix, "[N]:" when teed, as
 * torchrun's tee marks lines), to the worker's log files (whole, never
 * prefixed), and into what the failure report quotes: the last lines of
 * both streams and the last stderr line that looks like an error.
 *
 * "Looks like an error": a line naming error, fail, fatal, abort, assert,
 * exception, panic, traceback or segmentation (any case).  A program often
 * writes cleanup or teardown lines after its real error ("destroying the
 * process group"); those are not the cause.  Without such a line the last
 * stderr line stands in.  A program that writes its error to
 * DDP_ERROR_FILE is quoted from there first. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "ddprun.h"

static int looks_like_error(const char *line)
{
    static const char *const words[] = {"error", "fail", "fatal", "abort", "assert",
                                        "exception", "panic", "traceback", "segmentation"};
    for (size_t k = 0; k < sizeof words / sizeof *words; k++)
        if (strcasestr(line, words[k]))
            return 1;
    return 0;
}

static void remember(ddprun_worker *w, const ddprun_stream *s, const char *line, size_t n)
{
    snprintf(w->tail[w->tail_next], TAIL_LINE_LEN, "%.*s", (int)n, line);
    w->tail_next = (w->tail_next + 1) % TAIL_LINES;
    w->tail_count += w->tail_count < TAIL_LINES;
    if (!s->is_err || n == 0)
        return;
    memcpy(w->last_line, line, n);
    w->last_line[n] = '\0';
    if (looks_like_error(w->last_line))
        memcpy(w->last_err, w->last_line, n + 1);
}

/* One line (without its newline) to its destinations. */
static void emit_line(ddprun_worker *w, ddprun_stream *s, const char *line, size_t n, int prefix)
{
    if (s->log) {
        fwrite(line, 1, n, s->log);
        fputc('\n', s->log);
    }
    if (s->console) {
        if (s->tee)
            fprintf(s->console, "[%d]:", w->rank);
        else if (prefix)
            fprintf(s->console, "[rank %d]: ", w->rank);
        fwrite(line, 1, n, s->console);
        fputc('\n', s->console);
    }
    remember(w, s, line, n);
}

/* Writes out the complete lines in s; a full buffer or a flush (at EOF)
 * also writes the unfinished rest. */
static void emit_lines(ddprun_worker *w, ddprun_stream *s, int flush, int prefix)
{
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] == '\n') {
            emit_line(w, s, s->buf + start, i - start, prefix);
            start = i + 1;
        }
    }
    /* An unfinished line goes out at EOF, or when it alone fills the buffer. */
    if (start < s->len && (flush || (start == 0 && s->len == sizeof s->buf - 1))) {
        emit_line(w, s, s->buf + start, s->len - start, prefix);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    if (s->console)
        fflush(s->console);
    if (s->log)
        fflush(s->log);
}

/* Reads what is available; closes the stream at EOF. */
static void pump(ddprun_worker *w, ddprun_stream *s, int prefix)
{
    ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - 1 - s->len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        emit_lines(w, s, 1, prefix);
        close(s->fd);
        s->fd = -1;
        return;
    }
    s->len += (size_t)n;
    emit_lines(w, s, 0, prefix);
}

void ddprun_output_pump_all(const ddprun_options *o, ddprun_worker *ws, int timeout_ms)
{
    struct pollfd pfd[2 * MAX_WORKERS];
    ddprun_stream *who[2 * MAX_WORKERS];
    ddprun_worker *owner[2 * MAX_WORKERS];
    int n = 0;
    for (int l = 0; l < o->nproc; l++) {
        ddprun_stream *ss[2] = {&ws[l].out, &ws[l].err};
        for (int k = 0; k < 2; k++) {
            if (ss[k]->fd < 0)
                continue;
            pfd[n] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
            who[n] = ss[k];
            owner[n++] = &ws[l];
        }
    }
    if (n == 0) {
        if (timeout_ms > 0)
            poll(NULL, 0, timeout_ms);
        return;
    }
    if (poll(pfd, (nfds_t)n, timeout_ms) <= 0)
        return;
    for (int k = 0; k < n; k++)
        if (pfd[k].revents)
            pump(owner[k], who[k], o->prefix);
}

void ddprun_output_flush(const ddprun_options *o, ddprun_worker *w)
{
    ddprun_stream *ss[2] = {&w->out, &w->err};
    for (int k = 0; k < 2; k++)
        if (ss[k]->fd >= 0) {
            emit_lines(w, ss[k], 1, o->prefix);
            close(ss[k]->fd);
            ss[k]->fd = -1;
        }
}

void ddprun_output_close(ddprun_worker *w)
{
    ddprun_stream *ss[2] = {&w->out, &w->err};
    for (int k = 0; k < 2; k++)
        if (ss[k]->log) {
            fclose(ss[k]->log);
            ss[k]->log = NULL;
        }
}

/* The first line of the worker's error file, if it wrote one. */
static int read_error_file(const ddprun_worker *w, char *buf, size_t len)
{
    int fd = open(w->error_file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    return buf[0] ? 0 : -1;
}

void ddprun_output_report(const ddprun_worker *w)
{
    char what[128], from_file[1024];
    ddprun_describe(w, what, sizeof what);
    const char *why = w->last_err[0] ? w->last_err : w->last_line[0] ? w->last_line : "(none)";
    if (w->error_file[0] && read_error_file(w, from_file, sizeof from_file) == 0)
        why = from_file;
    fprintf(stderr, "ddprun: rank %d (local rank %d, pid %d) %s; last error: %s\n", w->rank,
            w->local_rank, (int)w->pid, what, why);
    if (w->tail_count > 0) {
        fprintf(stderr, "ddprun: rank %d's last %d lines of output:\n", w->rank, w->tail_count);
        for (int k = 0; k < w->tail_count; k++) {
            int at = (w->tail_next - w->tail_count + k + TAIL_LINES) % TAIL_LINES;
            fprintf(stderr, "ddprun:   | %s\n", w->tail[at]);
        }
    }
    if (w->log_dir[0])
        fprintf(stderr, "ddprun: rank %d's whole output: %s/{stdout,stderr}.log\n", w->rank,
                w->log_dir);
}
