/* Helpers for the multi-process dist tests: a fresh file:// init method per
 * test, and a shared-memory page children write results to. */
#ifndef DDP_TESTS_DIST_UTIL_H
#define DDP_TESTS_DIST_UTIL_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct job {
    char dir[64];
    char path[128];
    char url[160];
} job;

__attribute__((unused)) static void job_init(job *j)
{
    snprintf(j->dir, sizeof j->dir, "/tmp/ddp_test_dist_XXXXXX");
    if (!mkdtemp(j->dir))
        abort();
    snprintf(j->path, sizeof j->path, "%s/store", j->dir);
    snprintf(j->url, sizeof j->url, "file://%s", j->path);
}

__attribute__((unused)) static void job_cleanup(job *j)
{
    unlink(j->path);
    rmdir(j->dir);
}

/* Anonymous shared memory that forked children can write. */
__attribute__((unused)) static void *shared_page(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        abort();
    memset(p, 0, bytes);
    return p;
}

__attribute__((unused)) static int contains(const char *hay, const char *needle)
{
    return hay && strstr(hay, needle) != NULL;
}

/* Entries of folder dir whose name starts with prefix, not counting "."
 * and ".." (-1 when dir cannot be read). */
__attribute__((unused)) static int dir_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
             strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* Number of /dev/shm entries whose name starts with prefix. */
__attribute__((unused)) static int shm_entries(const char *prefix)
{
    return dir_entries("/dev/shm", prefix);
}

#endif
