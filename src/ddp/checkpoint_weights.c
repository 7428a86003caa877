/* Loading only the parameters from a training checkpoint (torch's
 * model.load_state_dict(sd, strict)): the optimizer's entries are skipped,
 * and without strict so are names on one side only, which the report
 * lists.  Everything is checked before anything is copied. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ddp/ddp.h"
#include "nn/safetensors.h"

#define OPT_PREFIX "optimizer."

static int is_param(ddp_model_t *model, const char *name)
{
    for (size_t i = 0; i < ddp_model_num_params(model); i++)
        if (strcmp(ddp_model_param(model, i)->name, name) == 0)
            return 1;
    return 0;
}

/* Checks e against p: F32 and the same shape. */
static int check_fits(const char *path, const ddp__st_entry *e, const ddp_param *p)
{
    int same = strcmp(e->dtype, "F32") == 0 && e->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++)
        same = e->shape[d] == p->shape[d];
    DDP_FAIL_IF(!same, DDP_ERR_MISMATCH,
                "checkpoint %s: %s is %s, %d-D, %llu bytes in the file but F32, %d-D, %zu "
                "elements in the model", path, p->name, e->dtype, e->ndim,
                (unsigned long long)(e->end - e->begin), p->ndim, p->numel);
    return 0;
}

/* Lists the missing and unexpected names into *text (caller frees). */
static int differences(ddp_model_t *model, const ddp__st_file *f, char **text, int *n)
{
    size_t len = 0;
    FILE *s = open_memstream(text, &len);
    DDP_FAIL_IF(!s, DDP_ERR_NOMEM, "checkpoint: out of memory");
    *n = 0;
    for (size_t i = 0; i < ddp_model_num_params(model); i++) {
        const char *name = ddp_model_param(model, i)->name;
        if (!ddp__st_find(f, name))
            fprintf(s, "%smissing %s", (*n)++ ? "; " : "", name);
    }
    for (size_t i = 0; i < f->n; i++) {
        const char *name = f->entries[i].name;
        if (strncmp(name, OPT_PREFIX, strlen(OPT_PREFIX)) != 0 && !is_param(model, name))
            fprintf(s, "%sunexpected %s", (*n)++ ? "; " : "", name);
    }
    fclose(s);
    return *text ? 0 : DDP_ERROR(DDP_ERR_NOMEM, "checkpoint: out of memory");
}

int ddp_checkpoint_load_weights(const char *path, ddp_model_t *model, int strict, char **report)
{
    DDP_FAIL_IF(!path || !model, DDP_ERR_INVALID_ARG, "checkpoint: NULL argument");
    if (report)
        *report = NULL;
    ddp__st_file f;
    DDP_TRY(ddp__st_read(path, &f));
    char *text = NULL;
    int ndiff = 0, rc = 0;
    size_t np = ddp_model_num_params(model);
    for (size_t i = 0; i < np; i++) {
        const ddp_param *p = ddp_model_param(model, i);
        const ddp__st_entry *e = ddp__st_find(&f, p->name);
        if (e)
            DDP_TRY_OUT(check_fits(path, e, p));
    }
    DDP_TRY_OUT(differences(model, &f, &text, &ndiff));
    DDP_FAIL_OUT(strict && ndiff > 0, DDP_ERR_MISMATCH, "checkpoint %s: %s", path, text);
    for (size_t i = 0; i < np; i++) {
        ddp_param *p = ddp_model_param(model, i);
        const ddp__st_entry *e = ddp__st_find(&f, p->name);
        if (e)
            memcpy(p->data, f.data + e->begin, p->numel * sizeof(float));
    }
    ddp_model_bump_param_version(model);
    if (report) {
        *report = text;
        text = NULL;
    }
out:
    free(text);
    ddp__st_close(&f);
    return rc;
}
