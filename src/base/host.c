/* Host identity; see host.h. */
#include "base/host.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"

int ddp__host_id(char *out, size_t len)
{
    const char *env = NULL;
    DDP_TRY(ddp__env_string("DDP_HOST_ID", &env));
    if (env) {
        DDP_FAIL_IF(strlen(env) >= len || strchr(env, ' ') || strchr(env, '\n'),
                    DDP_ERR_INVALID_ARG,
                    "DDP_HOST_ID=%s: expected at most %zu characters, no spaces", env, len - 1);
        snprintf(out, len, "%s", env);
        return 0;
    }
    char host[256] = "", boot[64] = "";
    if (gethostname(host, sizeof host - 1) < 0)
        snprintf(host, sizeof host, "unknown");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f))
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    for (char *c = host; *c; c++) /* the record is space-separated */
        if (*c == ' ' || *c == '\n')
            *c = '_';
    snprintf(out, len, "%.200s/%.40s", host, boot[0] ? boot : "no-boot-id");
    return 0;
}

/* Field 22 of /proc/PID/stat: when the process started, in clock ticks
 * since boot.  -1 when there is no such process, -2 when unreadable. */
static long long start_time(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? -1 : -2;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name (field 2) is in parentheses and may hold spaces. */
    char *p = strrchr(buf, ')');
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoll(p + 1, NULL, 10) : -2;
}

static void pid_namespace(char *out, size_t len)
{
    ssize_t n = readlink("/proc/self/ns/pid", out, len - 1);
    if (n <= 0)
        snprintf(out, len, "-");
    else
        out[n] = '\0';
}

int ddp__proc_id(char *out, size_t len)
{
    char host[256], ns[64];
    DDP_TRY(ddp__host_id(host, sizeof host));
    pid_namespace(ns, sizeof ns);
    int pid = (int)getpid();
    snprintf(out, len, "%s %s %d %lld", host, ns, pid, start_time(pid));
    return 0;
}

int ddp__proc_alive(const char *proc_id)
{
    char host[256], ns[64], my_host[256], my_ns[64];
    int pid;
    long long start;
    if (sscanf(proc_id, "%255s %63s %d %lld", host, ns, &pid, &start) != 4 || pid <= 0)
        return 1;
    if (ddp__host_id(my_host, sizeof my_host) < 0)
        return 1;
    /* Another host id may be another machine whose host name is the same
     * (containers), not this one rebooted: only this host can tell. */
    pid_namespace(my_ns, sizeof my_ns);
    if (strcmp(host, my_host) != 0 || strcmp(ns, my_ns) != 0)
        return 1;
    long long now = start_time(pid);
    if (now == -2)
        return 1;
    return now >= 0 && (start < 0 || now == start);
}
