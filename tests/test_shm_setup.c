/* The shared-memory transport's setup of a group: the pages of a fresh
 * group mapped at setup (segment.c's populate, with MADV_POPULATE_WRITE
 * and, where the kernel has none, by reading each page), and the CPU each
 * rank waits on, which decides whether a wait spins (ring.c).  Ranks are
 * forked processes.  The rest of the transport: test_shm.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp/pg.h"
#include "fork_children.h"
#include "pg/internal.h"
#include "pg_util.h"
#include "seccomp_util.h"
#include "transport/shm.h"
#include "transport/shm/internal.h"
#include "transport/transport.h"
#include "transport_util.h"

static job J;

/* A wait spins only while the peer it waits for can run beside it
 * (shm/ring.c, ddp__shm_shares_cpu): each rank publishes the CPU it waits
 * on, and a peer that last waited on this CPU means no spin.  Ranks pinned
 * to one CPU see each other there, ranks on two CPUs do not.  (Measured
 * with bench/collectives_shm.sh: two ranks that the scheduler put on one
 * core beside a busy process took 25-28 us per small all-reduce, the
 * 20 us spin each time; 4-8 us without it.) */
static int one_cpu_rank(int rank, void *arg)
{
    const int *cpus = arg; /* the CPU of rank 0, of rank 1 */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[rank], &one);
    CHILD_CHECK(sched_setaffinity(0, sizeof one, &one) == 0);
    setenv("DDP_TRANSPORT", "shm", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 30, &pg) == 0);
    CHILD_CHECK(strcmp(transport_of(pg), "shm") == 0);
    shm *s = (shm *)ddp__pg_transport(pg);
    CHILD_CHECK(ddp__shm_note_cpu(s) == (uint32_t)cpus[rank] + 1);
    CHILD_CHECK(ddp_pg_barrier(pg) == 0); /* both published */
    int want = cpus[0] == cpus[1];
    CHILD_CHECK(ddp__shm_shares_cpu(s, 1 - rank) == want);
    CHILD_CHECK(ddp__shm_shares_cpu(s, -1) == want);
    CHILD_CHECK(ddp_pg_barrier(pg) == 0); /* both looked */
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_peer_on_same_cpu_seen(void **state)
{
    (void)state;
    cpu_set_t mine; /* the CPUs this test may use: the first two */
    int cpu[2] = {-1, -1}, n = 0;
    assert_int_equal(sched_getaffinity(0, sizeof mine, &mine), 0);
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &mine))
            cpu[n++] = c;
    int same[2] = {cpu[0], cpu[0]}, apart[2] = {cpu[0], cpu[1]};
    job_init(&J);
    assert_int_equal(run_children(2, one_cpu_rank, same, 60.0), 0);
    job_cleanup(&J);
    if (n < 2)
        return; /* one CPU: nowhere else to put rank 1 */
    job_init(&J);
    assert_int_equal(run_children(2, one_cpu_rank, apart, 60.0), 0);
    job_cleanup(&J);
}

/* This process's shared-memory pages mapped now, in KiB (RssShmem). */
static long rss_shmem_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssShmem: %ld kB", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

/* A fresh group maps every page it will use at setup (segment.c,
 * populate): its rings to and from the peer (1 MiB each here) and both
 * ranks' windows (1 MiB each), 4 MiB, before any collective.  Paid in the
 * first few hundred collectives instead, these page faults made a fresh
 * group's 8 KiB all-reduce 8 us for its first ~300 calls (1.5-2 us after). */
static int populated_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_TRANSPORT", "shm", 1);
    setenv("DDP_SHM_RING_BYTES", "1048576", 1);
    setenv("DDP_SHM_WINDOW_BYTES", "1048576", 1);
    long before = rss_shmem_kib();
    CHILD_CHECK(before >= 0);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 30, &pg) == 0);
    CHILD_CHECK(strcmp(transport_of(pg), "shm") == 0);
    long after = rss_shmem_kib();
    if (after - before < 4096) {
        fprintf(stderr, "rank %d: RssShmem %ld -> %ld KiB: want 4096 more\n", rank, before,
                after);
        return 1;
    }
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_setup_maps_rings_and_windows(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, populated_rank, NULL, 60.0), 0);
    job_cleanup(&J);
}

#ifdef MADV_POPULATE_WRITE
/* Whether madvise(MADV_POPULATE_WRITE) fails with EINVAL here after
 * deny_syscall, as on kernels before 5.14 (a container may forbid
 * filters). */
static int populate_deniable(void)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        _exit(p == MAP_FAILED || deny_syscall(__NR_madvise, 2, MADV_POPULATE_WRITE, EINVAL) ||
              madvise(p, 4096, MADV_POPULATE_WRITE) == 0 || errno != EINVAL);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static int populated_by_reads_rank(int rank, void *arg)
{
    CHILD_CHECK(deny_syscall(__NR_madvise, 2, MADV_POPULATE_WRITE, EINVAL) == 0);
    return populated_rank(rank, arg);
}
#endif

/* The same where the kernel has no MADV_POPULATE_WRITE (before 5.14):
 * segment.c reads a byte of each page instead, and the pages are mapped
 * all the same. */
static void test_setup_maps_pages_without_populate(void **state)
{
    (void)state;
#ifndef MADV_POPULATE_WRITE /* headers before Linux 5.14: segment.c reads the pages anyway */
    fprintf(stderr, "skipped: these headers have no MADV_POPULATE_WRITE\n");
    skip();
#else
    if (!populate_deniable()) {
        fprintf(stderr, "skipped: no seccomp filter here to make MADV_POPULATE_WRITE fail\n");
        skip();
    }
    job_init(&J);
    assert_int_equal(run_children(2, populated_by_reads_rank, NULL, 60.0), 0);
    job_cleanup(&J);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_on_same_cpu_seen),
        cmocka_unit_test(test_setup_maps_rings_and_windows),
        cmocka_unit_test(test_setup_maps_pages_without_populate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
