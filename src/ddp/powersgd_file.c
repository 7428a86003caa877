/* PowerSGD's state as a file (include/ddp/powersgd.h): the bytes of
 * ddp_powersgd_state_save, written atomically and durably by base/file.c,
 * so that a program checkpointing a rank's state (ddp-mnist --powersgd)
 * needs no file handling of its own. */
#include <stdint.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/file.h"
#include "ddp/powersgd.h"

int ddp_powersgd_state_save_file(const ddp_powersgd_t *s, const char *path)
{
    DDP_FAIL_IF(!s || !path || !*path, DDP_ERR_INVALID_ARG, "powersgd: no state or no path");
    void *blob = NULL;
    size_t len = 0;
    DDP_TRY(ddp_powersgd_state_save(s, &blob, &len));
    int rc = ddp__file_write_atomic(path, blob, len);
    free(blob);
    return rc;
}

int ddp_powersgd_state_load_file(ddp_powersgd_t *s, const char *path)
{
    DDP_FAIL_IF(!s || !path || !*path, DDP_ERR_INVALID_ARG, "powersgd: no state or no path");
    char *blob = NULL;
    size_t len = 0;
    DDP_TRY(ddp__file_read(path, SIZE_MAX - 1, &blob, &len));
    int rc = ddp_powersgd_state_load(s, blob, len);
    free(blob);
    if (rc < 0) /* the blob's own message says what is wrong, not where */
        ddp__error_context(rc, "%s", path);
    return rc;
}
