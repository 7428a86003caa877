/* Symmetric memory of a shared-memory group; see symmetric.h. */
#include "transport/symmetric.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"

typedef struct region {
    unsigned id;         /* the allocation's number, the same on every rank */
    size_t len;          /* bytes of each rank's region, whole pages */
    int sealed;
    uint8_t **base;      /* (size) every rank's region here; NULL until mapped */
    struct region *next;
} region;

struct ddp__sym_set {
    char name[64];
    int rank, size;
    unsigned made;       /* allocations so far: the next one's id is made + 1 */
    region *head;
};

int ddp__sym_set_create(const char *name, int rank, int size, ddp__sym_set **out)
{
    *out = NULL;
    ddp__sym_set *set = calloc(1, sizeof *set);
    DDP_FAIL_IF(!set, DDP_ERR_NOMEM, "out of memory");
    snprintf(set->name, sizeof set->name, "%s", name);
    set->rank = rank;
    set->size = size;
    *out = set;
    return 0;
}

/* The file name of rank q's region of allocation id. */
static void region_name(const ddp__sym_set *set, unsigned id, int q, char *buf, size_t len)
{
    snprintf(buf, len, "%s.m%u.%d", set->name, id, q);
}

static region *find_mine(ddp__sym_set *set, const void *mine, region ***link)
{
    region **l = &set->head;
    for (region *g = set->head; g; l = &g->next, g = g->next)
        if (g->base[set->rank] == mine) {
            if (link)
                *link = l;
            return g;
        }
    return NULL;
}

/* Maps len bytes of the open region fd (named name) into *out. */
static int map_fd(int fd, size_t len, const char *name, uint8_t **out)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    DDP_FAIL_IF(p == MAP_FAILED, DDP_ERR_SYSTEM, "symmetric memory: mmap of %zu bytes of %s: %s",
                len, name, strerror(errno));
    *out = p;
    return 0;
}

/* Opens and maps rank q's region of g (which exists: q made it). */
static int map_peer(const ddp__sym_set *set, region *g, int q)
{
    char name[96];
    region_name(set, g->id, q, name, sizeof name);
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    DDP_FAIL_IF(fd < 0, DDP_ERR_SYSTEM, "symmetric memory: shm_open(%s): %s", name,
                strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) < 0 || (size_t)st.st_size != g->len) {
        rc = DDP_ERROR(DDP_ERR_MISMATCH,
                       "symmetric memory: rank %d's region %s has %lld bytes where %zu were "
                       "expected (do the ranks allocate the same sizes in the same order?)",
                       q, name, (long long)st.st_size, g->len);
    } else {
        rc = map_fd(fd, g->len, name, &g->base[q]);
    }
    close(fd);
    return rc;
}

int ddp__sym_make(ddp__sym_set *set, size_t len, void **mine)
{
    *mine = NULL;
    unsigned id = ++set->made; /* first: whatever fails, ids stay equal on every rank */
    int on = 1;
    DDP_TRY(ddp__env_bool("DDP_SYMMETRIC_MEMORY", &on));
    DDP_FAIL_IF(!on, DDP_ERR_UNSUPPORTED,
                "symmetric memory is off here (DDP_SYMMETRIC_MEMORY=0)");
    DDP_FAIL_IF(len == 0 || len > ((size_t)1 << 40), DDP_ERR_INVALID_ARG,
                "symmetric memory: %zu bytes: expected 1 byte to 1 TiB", len);
    region *g = calloc(1, sizeof *g);
    uint8_t **base = calloc((size_t)set->size, sizeof *base);
    if (!g || !base) {
        free(g);
        free(base);
        return DDP_ERROR(DDP_ERR_NOMEM, "out of memory");
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    g->id = id;
    g->len = (len + page - 1) / page * page;
    g->base = base;
    char name[96];
    region_name(set, g->id, set->rank, name, sizeof name);
    int rc = 0, e, fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = DDP_ERROR(DDP_ERR_SYSTEM, "symmetric memory: shm_open(%s): %s", name, strerror(errno));
    } else if (ftruncate(fd, (off_t)g->len) < 0) {
        rc = DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "symmetric memory: ftruncate(%s, %zu)", name,
                             g->len);
    } else if ((e = posix_fallocate(fd, 0, (off_t)g->len)) != 0) {
        /* tmpfs reserves nothing at ftruncate: without this a full /dev/shm
         * (64 MiB in a default Docker container) would be found by SIGBUS
         * at the first write instead of by this error. */
        rc = DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, e, "symmetric memory: fallocate(%s, %zu)", name,
                             g->len);
    } else {
        rc = map_fd(fd, g->len, name, &base[set->rank]);
    }
    if (fd >= 0)
        close(fd);
    if (rc < 0) {
        if (fd >= 0)
            shm_unlink(name);
        free(base);
        free(g);
        return rc;
    }
    g->next = set->head;
    set->head = g;
    *mine = base[set->rank];
    return 0;
}

int ddp__sym_map(ddp__sym_set *set, void *mine)
{
    region *g = find_mine(set, mine, NULL);
    DDP_FAIL_IF(!g, DDP_ERR_INVALID_ARG, "symmetric memory: %p is no allocation of this group",
                mine);
    for (int q = 0; q < set->size; q++)
        if (!g->base[q])
            DDP_TRY(map_peer(set, g, q));
    return 0;
}

/* Removes every rank's name of allocation g: a rank that died between
 * making its region and sealing it leaves no file behind (ENOENT for the
 * names already gone is harmless). */
static void unlink_all(const ddp__sym_set *set, const region *g)
{
    char name[96];
    for (int q = 0; q < set->size; q++) {
        region_name(set, g->id, q, name, sizeof name);
        shm_unlink(name);
    }
}

void ddp__sym_seal(ddp__sym_set *set, void *mine)
{
    region *g = find_mine(set, mine, NULL);
    if (!g || g->sealed)
        return;
    unlink_all(set, g); /* every rank has mapped every region: names are done */
    g->sealed = 1;
}

int ddp__sym_drop(ddp__sym_set *set, void *mine)
{
    region **link;
    region *g = find_mine(set, mine, &link);
    if (!g)
        return 0;
    if (!g->sealed)
        unlink_all(set, g);
    *link = g->next;
    for (int q = 0; q < set->size; q++)
        if (g->base[q])
            munmap(g->base[q], g->len);
    free(g->base);
    free(g);
    return 1;
}

void ddp__sym_set_destroy(ddp__sym_set *set)
{
    if (!set)
        return;
    while (set->head)
        ddp__sym_drop(set, set->head->base[set->rank]);
    free(set);
}

uint8_t *const *ddp__sym_find(const ddp__sym_set *set, const void *p, size_t len, size_t *off,
                              unsigned *id)
{
    const uint8_t *b = p;
    for (const region *g = set ? set->head : NULL; g; g = g->next) {
        const uint8_t *mine = g->base[set->rank];
        if (g->sealed && b >= mine && b < mine + g->len && len <= g->len - (size_t)(b - mine)) {
            *off = (size_t)(b - mine);
            *id = g->id;
            return g->base;
        }
    }
    return NULL;
}
