/* Helpers of the convolution and pooling tests (test_conv.c, test_pool.c):
 * a weighted-sum loss sum(y * r) on a tape, and comparing arrays with a
 * reference at a tolerance scaled by the reference's largest magnitude. */
#ifndef DDP_TEST_CONV_UTIL_H
#define DDP_TEST_CONV_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ddp.h"

/* loss = sum(y * r), r (y's numel floats) borrowed until the tape resets. */
static inline int cu_weighted_sum(ddp_tape_t *tape, ddp_var_t *y, const float *r,
                                  ddp_var_t **loss)
{
    const ddp_tensor *t = ddp_var_tensor(y);
    ddp_tensor rt;
    ddp_var_t *rv, *prod;
    int rc;
    if ((rc = ddp_tensor_wrap(&rt, (float *)r, t->ndim, t->shape)) < 0 ||
        (rc = ddp_tape_input(tape, &rt, 0, &rv)) < 0 || (rc = ddp_op_mul(tape, y, rv, &prod)) < 0)
        return rc;
    return ddp_op_sum(tape, prod, loss);
}

/* max |got - want| / max(1, max |want|) over n values. */
static inline double cu_rel_err(const float *got, const float *want, size_t n)
{
    double err = 0, scale = 1;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)got[i] - (double)want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    if (err != err)
        return INFINITY;
    return err / scale;
}

/* A leaf var over data (borrowed) of shape (ndim, shape). */
static inline ddp_var_t *cu_input(ddp_tape_t *tape, float *data, int ndim, const int64_t *shape,
                                  int requires_grad)
{
    ddp_tensor t;
    ddp_var_t *v = NULL;
    if (ddp_tensor_wrap(&t, data, ndim, shape) < 0 ||
        ddp_tape_input(tape, &t, requires_grad, &v) < 0)
        return NULL;
    return v;
}

#endif
