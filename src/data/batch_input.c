/* A loader's batch straight onto the tape as an input var: the one line
 * between ddp_loader_next and the model's forward (examples/minimal.c). */
#include "base/error.h"
#include "ddp/data.h"

int ddp_batch_input(const ddp_batch *b, ddp_tape_t *tape, ddp_var_t **x)
{
    DDP_FAIL_IF(!b || !tape || !x, DDP_ERR_INVALID_ARG, "batch_input: NULL argument");
    DDP_FAIL_IF(!b->x || b->size == 0, DDP_ERR_INVALID_ARG,
                "batch_input: the batch is empty (was ddp_loader_next's return checked?)");
    ddp_tensor t;
    DDP_TRY(ddp_tensor_wrap(&t, b->x, 2, (int64_t[]){(int64_t)b->size, (int64_t)b->sample_numel}));
    return ddp_tape_input(tape, &t, 0, x);
}
