/* The collective matrix of test_coll.c (every collective x world sizes 1-8
 * x counts 0, 1, 7, 1023, 1M+3 x dtypes and ops, bitwise against the
 * references) over the shared-memory transport: the same file, compiled
 * again with DDP_TRANSPORT=shm and DDP_REDUCE_ISA=portable set before its
 * main runs, and with the shared-window all-reduce (coll/allreduce_shared.c)
 * as a fifth algorithm. */
#include <stdlib.h>

#define COLL_NALGOS 6 /* and the shared-window all-reduce */
int coll_matrix_main(void);
#define main coll_matrix_main
#include "test_coll.c"
#undef main

int main(void)
{
    setenv("DDP_TRANSPORT", "shm", 1);
    /* The portable reduction kernels here, the vectorised ones (the best
     * this CPU has) in test_coll: both paths run the whole matrix. */
    setenv("DDP_REDUCE_ISA", "portable", 1);
    return coll_matrix_main();
}
