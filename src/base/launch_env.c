/* Rank and world size from the environment a launcher sets: ddprun/torchrun,
 * Open MPI, MPICH (PMI) or Slurm.  See ddp_launch_info_from_env in base.h. */
#include "base/env.h"
#include "base/error.h"

#include <stdlib.h>

typedef struct {
    const char *source, *rank, *size, *local_rank, *local_size;
    /* Every launcher but Slurm sets each pair whole: one half alone is a
     * broken environment (an export lost on the way), not "no launcher",
     * and a process that trained alone and exited 0 would hide it. */
    int pairs_whole;
} launcher;

static const launcher launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", 1},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", 1},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", 1},
    /* SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: a batch script's own shell has
     * SLURM_PROCID=0 and SLURM_NTASKS=N too, and a program started there
     * without srun is one process, not rank 0 of N waiting for the rest.
     * So SLURM_PROCID alone is normal, and SLURM_NTASKS_PER_NODE is set
     * only when asked for. */
    {"slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", 0},
};

static int is_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v;
}

/* One of a pair set without the other: an error naming the missing one. */
static int check_pair(const launcher *l, const char *a, const char *b)
{
    if (is_set(a) == is_set(b))
        return 0;
    const char *have = is_set(a) ? a : b, *missing = is_set(a) ? b : a;
    return DDP_ERROR(DDP_ERR_INVALID_ARG,
                     "partial launcher environment: %s=%.40s is set but %s is not (%s sets "
                     "both; set both, or neither to run as one process)",
                     have, getenv(have), missing, l->source);
}

/* A whole launcher's variables, or none of them; the local pair also
 * needs the global one. */
static int check_whole(const launcher *l)
{
    if (!l->pairs_whole)
        return 0;
    DDP_TRY(check_pair(l, l->rank, l->size));
    DDP_TRY(check_pair(l, l->local_rank, l->local_size));
    if (is_set(l->local_rank) && !is_set(l->rank))
        return DDP_ERROR(DDP_ERR_INVALID_ARG,
                         "partial launcher environment: %s=%.40s is set but %s and %s are not "
                         "(%s sets all four; set %s and %s, or none of them to run as one "
                         "process)",
                         l->local_rank, getenv(l->local_rank), l->rank, l->size, l->source,
                         l->rank, l->size);
    return 0;
}

/* A rank or size variable: 0 to 2^24; *out keeps dflt when unset. */
static int env_int(const char *name, int dflt, int *out)
{
    return ddp__env_launcher_int(name, 0, 1 << 24, dflt, out);
}

int ddp_launch_info_from_env(ddp_launch_info *out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "ddp_launch_info_from_env: out is NULL");
    for (size_t i = 0; i < sizeof launchers / sizeof *launchers; i++) {
        const launcher *l = &launchers[i];
        DDP_TRY(check_whole(l));
        if (!is_set(l->rank) || !is_set(l->size))
            continue;
        ddp_launch_info info = {.source = l->source};
        DDP_TRY(env_int(l->rank, -1, &info.rank));
        DDP_TRY(env_int(l->size, -1, &info.world_size));
        DDP_FAIL_IF(info.world_size < 1, DDP_ERR_INVALID_ARG, "%s=%d: world size must be >= 1",
                    l->size, info.world_size);
        DDP_FAIL_IF(info.rank >= info.world_size, DDP_ERR_INVALID_ARG,
                    "%s=%d is out of range for %s=%d", l->rank, info.rank, l->size,
                    info.world_size);
        DDP_TRY(env_int(l->local_rank, info.rank, &info.local_rank));
        DDP_TRY(env_int(l->local_size, info.world_size, &info.local_world_size));
        DDP_FAIL_IF(info.local_rank >= info.local_world_size, DDP_ERR_INVALID_ARG,
                    "%s=%d is out of range for %s=%d", l->local_rank, info.local_rank,
                    l->local_size, info.local_world_size);
        *out = info;
        return 0;
    }
    return DDP_ERROR(DDP_ERR_NOT_FOUND,
                     "no launcher environment: none of RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, "
                     "PMI_*, SLURM_PROCID/SLURM_STEP_NUM_TASKS (srun) is set");
}
