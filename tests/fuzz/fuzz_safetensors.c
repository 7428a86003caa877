/* libFuzzer harness: the safetensors reader (src/nn/safetensors.c,
 * ddp__st_read) through an in-memory file (fuzz_memfile): the 8-byte
 * header length, the JSON header, every entry's dtype, shape and offsets.
 * A successful read must hand out entries that lie inside the data buffer,
 * sized for their dtype and shape, and findable by name. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"
#include "fuzz_util.h"
#include "nn/safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    ddp__st_file f;
    int rc = ddp__st_read(path, &f);
    close(fd);
    fuzz_note("safetensors", rc, ddp_last_error());
    if (rc == 0) {
        for (size_t i = 0; i < f.n; i++) {
            const ddp__st_entry *e = &f.entries[i];
            uint64_t numel = 1;
            for (int d = 0; d < e->ndim; d++)
                numel *= (uint64_t)e->shape[d];
            if (e->ndim < 0 || e->ndim > DDP_ST_MAX_DIM || e->begin > e->end ||
                e->end > f.data_len || e->end - e->begin != numel * e->elem_size ||
                ddp__st_find(&f, e->name) != e)
                abort();
            volatile uint8_t sink = 0;
            if (e->end > e->begin)
                sink ^= f.data[e->begin] ^ f.data[e->end - 1];
            (void)sink;
        }
        for (size_t i = 0; i < f.nmeta; i++)
            if (ddp__st_meta(&f, f.meta[2 * i]) == NULL)
                abort();
        ddp__st_close(&f);
    } else if (rc != DDP_ERR_FORMAT && rc != DDP_ERR_IO && rc != DDP_ERR_NOMEM) {
        abort();
    }
    return 0;
}
