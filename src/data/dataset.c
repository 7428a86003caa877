/* The dataset interface: a vtable (length, get, optional get_batch and
 * destroy) and its instance, as torch.utils.data.Dataset's __len__ and
 * __getitem__.  Index checks live here, once, so implementations can trust
 * their arguments. */
#include <stdlib.h>

#include "base/error.h"
#include "data/idx_internal.h"

int ddp_dataset_create(const ddp_dataset_ops *ops, void *self, size_t sample_numel,
                       ddp_dataset_t **out)
{
    int rc = 0;
    ddp_dataset_t *ds = NULL;
    DDP_FAIL_OUT(!out, DDP_ERR_INVALID_ARG, "ddp_dataset_create: out is NULL");
    *out = NULL;
    DDP_FAIL_OUT(!ops || !ops->length || !ops->get, DDP_ERR_INVALID_ARG,
                 "ddp_dataset_create: ops must provide length and get");
    DDP_FAIL_OUT(sample_numel == 0, DDP_ERR_INVALID_ARG,
                 "ddp_dataset_create: sample_numel is 0");
    ds = calloc(1, sizeof *ds);
    DDP_FAIL_OUT(!ds, DDP_ERR_NOMEM, "ddp_dataset_create: out of memory");
    ds->ops = ops;
    ds->self = self;
    ds->sample_numel = sample_numel;
    *out = ds;
    return 0;
out:
    if (ops && ops->destroy) /* self was handed over: do not leak it */
        ops->destroy(self);
    return rc;
}

void ddp_dataset_destroy(ddp_dataset_t *ds)
{
    if (!ds)
        return;
    if (ds->ops->destroy)
        ds->ops->destroy(ds->self);
    free(ds);
}

/* A user implementation may fail without a message: give it one. */
static int user_failed(int rc, const char *what, size_t index)
{
    if (ddp_last_error()[0] == '\0')
        return DDP_ERROR(rc, "dataset %s(%zu) failed: %s", what, index, ddp_strerror(rc));
    return ddp__error_context(rc, "dataset %s(%zu)", what, index);
}

size_t ddp_dataset_length(const ddp_dataset_t *ds) { return ds ? ds->ops->length(ds->self) : 0; }

size_t ddp_dataset_sample_numel(const ddp_dataset_t *ds) { return ds ? ds->sample_numel : 0; }

int ddp_dataset_get(ddp_dataset_t *ds, size_t index, float *x, int64_t *label)
{
    DDP_FAIL_IF(!ds || !x || !label, DDP_ERR_INVALID_ARG, "ddp_dataset_get: NULL argument");
    size_t n = ds->ops->length(ds->self);
    DDP_FAIL_IF(index >= n, DDP_ERR_INVALID_ARG,
                "dataset index %zu out of range (length %zu)", index, n);
    ddp_clear_error();
    int rc = ds->ops->get(ds->self, index, x, label);
    return rc < 0 ? user_failed(rc, "get", index) : 0;
}

int ddp_dataset_get_batch(ddp_dataset_t *ds, const size_t *indices, size_t n, float *x,
                          int64_t *labels)
{
    DDP_FAIL_IF(!ds || (n && (!indices || !x || !labels)), DDP_ERR_INVALID_ARG,
                "ddp_dataset_get_batch: NULL argument");
    size_t len = ds->ops->length(ds->self);
    for (size_t i = 0; i < n; i++)
        DDP_FAIL_IF(indices[i] >= len, DDP_ERR_INVALID_ARG,
                    "dataset index %zu (batch position %zu) out of range (length %zu)",
                    indices[i], i, len);
    ddp_clear_error();
    if (ds->ops->get_batch) {
        int rc = ds->ops->get_batch(ds->self, indices, n, x, labels);
        return rc < 0 ? user_failed(rc, "get_batch", n ? indices[0] : 0) : 0;
    }
    for (size_t i = 0; i < n; i++) {
        int rc = ds->ops->get(ds->self, indices[i], x + i * ds->sample_numel, labels + i);
        if (rc < 0)
            return user_failed(rc, "get", indices[i]);
    }
    return 0;
}
