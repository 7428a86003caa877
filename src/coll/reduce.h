/* Element-wise reduction kernels for every (dtype, op) pair, and the
 * operator helpers the collectives share (element types and the float16 /
 * bfloat16 conversions are base/'s: base/dtype.h).
 *
 * A kernel computes dst[i] = a[i] (op) b[i]; dst may be a or b (in place).
 * The operand order is part of the contract: the algorithms always pass the
 * partial result of the lower position in their reduction order as a, so
 * that results are bitwise reproducible (docs/algorithms.md).  float16 and
 * bfloat16 are widened to float32, combined, and rounded to nearest even. */
#ifndef DDP_COLL_REDUCE_H
#define DDP_COLL_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "ddp/pg.h"

typedef void (*ddp__reduce_fn)(void *dst, const void *a, const void *b, size_t n);

/* The kernel for dtype and op (AVG uses SUM); NULL when op does not apply
 * to dtype (bitwise ops on floating types).  Vectorised for the best
 * instruction set the CPU has, capped by DDP_REDUCE_ISA (read once per
 * process). */
ddp__reduce_fn ddp__reduce_kernel(ddp_dtype dtype, ddp_reduce_op op);

/* Kernel tables by instruction set: every one computes the same bits. */
enum { DDP__ISA_PORTABLE, DDP__ISA_AVX2, DDP__ISA_AVX512, DDP__ISA_COUNT };
/* The kernel of one table; NULL also when this CPU cannot run it. */
ddp__reduce_fn ddp__reduce_kernel_isa(ddp_dtype dtype, ddp_reduce_op op, int isa);
/* The best table this CPU runs. */
int ddp__reduce_isa_best(void);
/* DDP_REDUCE_ISA (unset, auto, avx512, avx2, portable) into *isa: the best
 * table, capped by the value.  Sets the error on anything else. */
int ddp__reduce_isa_from_env(int *isa);
const char *ddp__reduce_isa_name(int isa);
/* Checks dtype and op (and that op applies to dtype); sets the error. */
int ddp__check_dtype_op(ddp_dtype dtype, ddp_reduce_op op);
/* Divides n elements by divisor in place (AVG's last step). */
void ddp__reduce_divide(void *buf, size_t n, ddp_dtype dtype, int divisor);

#endif
