/* --bind-to core: each worker on CPUs of its own, after mpirun's --bind-to
 * core (which binds whole physical cores; see below).  Why: on a small
 * host, two ranks beside a busy process are often put on one core by the
 * scheduler, and a shared-memory collective
 * that waits for its peer then waits for a time slice too, where Open
 * MPI's ranks, bound by mpirun, never meet that placement (docs/shm.md,
 * "Waiting", has the figures).
 *
 * The CPUs are ddprun's own allowed set (sched_getaffinity: what taskset,
 * a cgroup cpuset or a batch system gave it), in CPU order, never the
 * machine's.  Local rank l gets the CPUs [l*k, (l+1)*k) of that list, with
 * k = CPUs / workers: every rank the same number, so each worker's OpenBLAS
 * (which sizes its thread pool by its own CPUs, unless a variable such as
 * OMP_NUM_THREADS says) starts as many threads as its peers and none waits
 * for a slower one; the CPUs left over stay free for ddprun itself and
 * whatever else runs there.  A "core" here is a CPU as the kernel numbers
 * them (a hardware thread where SMT is on): with the usual numbering
 * (siblings n apart), 2 ranks on 2 cores x 2 threads get {0,1} and {2,3},
 * one thread of each core each, where mpirun would give each rank a whole
 * core.  Grouping by /sys/.../topology/core_id is not done.
 * Fewer CPUs than workers is refused, as mpirun refuses to oversubscribe
 * under binding: two workers pinned to one CPU is the slow case made
 * certain. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddprun.h"

/* "0-3,8,10-11": the CPUs (ascending) as /proc's lists write them,
 * truncated to len. */
static void cpu_list(const int *cpus, int n, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0, j; i < n && used < len; i = j + 1) {
        for (j = i; j + 1 < n && cpus[j + 1] == cpus[j] + 1; j++)
            ;
        int w = j > i ? snprintf(buf + used, len - used, "%s%d-%d", i ? "," : "", cpus[i], cpus[j])
                      : snprintf(buf + used, len - used, "%s%d", i ? "," : "", cpus[i]);
        used += w > 0 ? (size_t)w : len;
    }
}

/* ddprun's allowed CPUs, ascending, in *out (malloc'd): their count, or -1
 * (errno set).  The set grows until the kernel's fits: a machine may have
 * more CPUs than cpu_set_t's 1024. */
static int allowed_cpus(int **out)
{
    for (int bits = CPU_SETSIZE; bits <= (1 << 20); bits *= 2) {
        cpu_set_t *set = CPU_ALLOC(bits);
        size_t size = CPU_ALLOC_SIZE(bits);
        if (!set)
            return -1;
        CPU_ZERO_S(size, set);
        if (sched_getaffinity(0, size, set) < 0) {
            CPU_FREE(set);
            if (errno != EINVAL)
                return -1;
            continue;
        }
        int count = CPU_COUNT_S(size, set), k = 0;
        int *cpus = malloc(sizeof *cpus * (size_t)(count ? count : 1));
        for (int c = 0; cpus && c < (int)(size * 8); c++)
            if (CPU_ISSET_S(c, size, set))
                cpus[k++] = c;
        CPU_FREE(set);
        *out = cpus;
        return cpus ? count : -1;
    }
    errno = EINVAL;
    return -1;
}

/* Each local rank's set and the words of its refusal, made here in ddprun
 * before any fork: the forked worker then only asks the kernel and writes
 * (malloc and stdio in a child of a process with threads, as ddprun is
 * when it hosts the launchers' store, can block on a lock another thread
 * held at the fork). */
static int make_sets(ddprun_options *o, const int *cpus, int n)
{
    int k = n / o->nproc, bits = cpus[n - 1] + 1; /* ascending: the last is the highest */
    o->bind_set_size = CPU_ALLOC_SIZE(bits);
    o->bind_sets = calloc((size_t)o->nproc, sizeof *o->bind_sets);
    o->bind_refused = calloc((size_t)o->nproc, sizeof *o->bind_refused);
    if (!o->bind_sets || !o->bind_refused)
        return -1;
    for (int l = 0; l < o->nproc; l++) {
        const int *mine = cpus + (size_t)l * (size_t)k;
        cpu_set_t *set = CPU_ALLOC(bits);
        char list[256], *msg = malloc(320);
        if (!set || !msg) {
            CPU_FREE(set);
            free(msg);
            return -1;
        }
        CPU_ZERO_S(o->bind_set_size, set);
        for (int i = 0; i < k; i++)
            CPU_SET_S(mine[i], o->bind_set_size, set);
        cpu_list(mine, k, list, sizeof list);
        snprintf(msg, 320, "ddprun: cannot bind local rank %d to CPU%s %s: ", l,
                 k == 1 ? "" : "s", list);
        o->bind_sets[l] = set;
        o->bind_refused[l] = msg;
    }
    return 0;
}

int ddprun_bind_plan(ddprun_options *o)
{
    if (!o->bind_core)
        return 0;
    int *cpus = NULL;
    int n = allowed_cpus(&cpus);
    if (n < 0) {
        fprintf(stderr, "ddprun: --bind-to core: cannot read ddprun's CPU set: %s\n",
                strerror(errno));
        return 2;
    }
    if (n < o->nproc) {
        char list[256];
        cpu_list(cpus, n, list, sizeof list);
        fprintf(stderr,
                "ddprun: --bind-to core: %d workers per node, but ddprun may run on only %d "
                "CPU%s (%s): give --nproc-per-node %d or less, or --bind-to none\n",
                o->nproc, n, n == 1 ? "" : "s", list, n);
        free(cpus);
        return 2;
    }
    int rc = make_sets(o, cpus, n);
    free(cpus);
    if (rc < 0) {
        fprintf(stderr, "ddprun: --bind-to core: out of memory\n");
        return 2;
    }
    return 0;
}

int ddprun_bind_worker(const ddprun_options *o, int local_rank)
{
    if (!o->bind_sets)
        return 0;
    if (sched_setaffinity(0, o->bind_set_size, (cpu_set_t *)o->bind_sets[local_rank]) == 0)
        return 0;
    const char *why = strerrordesc_np(errno); /* a constant string: no locale, no lock */
    ddprun_say(STDERR_FILENO, o->bind_refused[local_rank]);
    ddprun_say(STDERR_FILENO, why ? why : "unknown error");
    ddprun_say(STDERR_FILENO, "\n");
    return -1;
}
