/* libFuzzer harness: init-method URLs (src/store/url.c,
 * ddp_init_url_parse).  The input is the URL (cut at its first NUL, as a C
 * string would be); a parse either fails with DDP_ERR_INVALID_ARG or gives
 * a result whose fields keep their documented ranges. */
#include <stdlib.h>
#include <string.h>

#include "ddp.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size heap copy, so that ASan sees any read past its end. */
    char *url = malloc(size + 1);
    if (!url)
        return 0;
    memcpy(url, data, size);
    url[size] = '\0';
    ddp_init_url u;
    int rc = ddp_init_url_parse(url, &u);
    fuzz_note("url", rc, ddp_last_error());
    if (rc == 0) {
        if (u.kind != DDP_INIT_FILE && u.kind != DDP_INIT_TCP && u.kind != DDP_INIT_ENV)
            abort();
        if (u.kind == DDP_INIT_FILE && u.path[0] != '/')
            abort(); /* documented: an absolute path */
        if (u.kind == DDP_INIT_TCP && (u.port < 1 || u.port > 65535 || u.host[0] == '\0'))
            abort();
        if (memchr(u.path, 0, sizeof u.path) == NULL || memchr(u.host, 0, sizeof u.host) == NULL)
            abort();
        if (u.rank < -1 || u.world_size < -1 || u.world_size == 0)
            abort();
    } else if (rc != DDP_ERR_INVALID_ARG) {
        abort();
    }
    free(url);
    return 0;
}
