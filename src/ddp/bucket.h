/* Gradient bucket layout for DDP (PyTorch's compute_bucket_assignment_by_size
 * and its Reducer's ready-order bookkeeping).
 *
 * Parameters are assigned to buckets in "fill order" (reverse registration
 * order at first, the order gradients became ready after the rebuild): a
 * bucket closes as soon as its size reaches its cap, the first bucket having
 * a smaller cap (1 MiB by default) so communication starts early.  The flat
 * gradient buffer holds the buckets one after the other, each parameter at a
 * fixed offset: a bucket is a contiguous slice that is all-reduced in place,
 * and each parameter's gradient is a view into it (gradient_as_bucket_view).
 */
#ifndef DDP_DDP_BUCKET_H
#define DDP_DDP_BUCKET_H

#include <stddef.h>

typedef struct ddp__bucket_layout {
    int nparams, nbuckets;
    int *bucket_of;        /* (nparams) parameter -> bucket */
    size_t *offset;        /* (nparams) parameter -> element offset in the flat buffer */
    size_t *bucket_start;  /* (nbuckets) element offset of each bucket */
    size_t *bucket_numel;  /* (nbuckets) elements in each bucket */
    int *bucket_nparams;   /* (nbuckets) parameters in each bucket */
    size_t total_numel;
} ddp__bucket_layout;

/* Builds a layout.  numel[i]: elements of parameter i; order: the nparams
 * parameter indices in fill order (a permutation, checked); caps in bytes
 * (first_cap for bucket 0, cap for the rest); elem_size in bytes.  The
 * caller frees with ddp__bucket_layout_free. */
int ddp__bucket_layout_build(const size_t *numel, int nparams, const int *order,
                             size_t first_cap, size_t cap, size_t elem_size,
                             ddp__bucket_layout *out);
void ddp__bucket_layout_free(ddp__bucket_layout *l);

/* Per-iteration readiness: buckets are launched strictly in bucket order (the
 * same on every rank), each as soon as it and all buckets before it are
 * complete. */
typedef struct ddp__bucket_tracker {
    const ddp__bucket_layout *layout;
    int *pending;       /* (nbuckets) parameters not yet ready */
    unsigned char *ready; /* (nparams) marked ready this iteration */
    int next_launch;    /* first bucket not yet launched */
} ddp__bucket_tracker;

int ddp__bucket_tracker_init(ddp__bucket_tracker *t, const ddp__bucket_layout *l);
void ddp__bucket_tracker_reset(ddp__bucket_tracker *t);
void ddp__bucket_tracker_free(ddp__bucket_tracker *t);
/* Marks parameter p ready.  Returns how many buckets became launchable
 * (*first is the first of them: launch first .. first+n-1 in order), 0 when
 * none did, or DDP_ERR_STATE when p was already ready this iteration. */
int ddp__bucket_tracker_mark(ddp__bucket_tracker *t, int p, int *first);

#endif
