/* One call from the launcher's environment to a process group: what
 * torch.distributed.init_process_group(backend) does under torchrun.  Rank
 * and world size come from ddp_launch_info_from_env (ddprun/torchrun,
 * mpirun, srun), the rendezvous from env:// (MASTER_ADDR, MASTER_PORT); the
 * mpi backend takes everything from MPI itself. */
#include <string.h>

#include "base/error.h"
#include "ddp/pg.h"

int ddp_init_process_group_env(const char *backend, double timeout_s, ddp_pg_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "init_process_group_env: out is NULL");
    ddp_launch_info li;
    int rc = ddp_launch_info_from_env(&li);
    if (rc == DDP_ERR_NOT_FOUND)
        return ddp__error_context(rc, "init_process_group_env: start the program with a "
                                      "launcher (ddprun --standalone --nproc-per-node N "
                                      "PROGRAM, torchrun, mpirun or srun)");
    DDP_TRY(rc);
    if (backend && strcmp(backend, "mpi") == 0) /* MPI knows rank and size itself */
        return ddp_init_process_group(backend, NULL, li.rank, li.world_size, timeout_s, out);
    return ddp_init_process_group(backend, "env://", li.rank, li.world_size, timeout_s, out);
}
