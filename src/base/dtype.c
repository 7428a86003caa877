/* Element types: sizes and names (include/ddp/base.h); the float16 and
 * bfloat16 conversions are inline in dtype.h. */
#include "base/dtype.h"

#include <string.h>

#include "base/error.h"

static const char *const dtype_names[DDP_NUM_DTYPES] = {
    "float32", "float64", "int32", "int64", "uint8", "float16", "bfloat16"};
static const char *const dtype_alias[DDP_NUM_DTYPES] = {"f32", "f64", "i32", "i64",
                                                        "u8",  "f16", "bf16"};
static const size_t dtype_sizes[DDP_NUM_DTYPES] = {4, 8, 4, 8, 1, 2, 2};

size_t ddp_dtype_size(ddp_dtype dtype)
{
    return (unsigned)dtype < DDP_NUM_DTYPES ? dtype_sizes[dtype] : 0;
}

const char *ddp_dtype_name(ddp_dtype dtype)
{
    return (unsigned)dtype < DDP_NUM_DTYPES ? dtype_names[dtype] : "unknown";
}

int ddp_dtype_parse(const char *name, ddp_dtype *out)
{
    for (int i = 0; name && i < DDP_NUM_DTYPES; i++) {
        if (strcmp(name, dtype_names[i]) == 0 || strcmp(name, dtype_alias[i]) == 0) {
            *out = (ddp_dtype)i;
            return 0;
        }
    }
    return DDP_ERROR(DDP_ERR_INVALID_ARG,
                     "unknown dtype '%s' (float32, float64, int32, int64, uint8, float16, "
                     "bfloat16)",
                     name ? name : "(null)");
}
