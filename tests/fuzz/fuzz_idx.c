/* libFuzzer harness: the IDX reader (src/data/idx.c, ddp_idx_read), raw
 * and gzip'ed, through an in-memory file (fuzz_memfile).  Byte 0 picks the
 * expected magic, 0x000008NN with NN = 1 + (byte 0 & 3) (0x801 labels, 0x803
 * images); the rest is the file.  The decompressed-data cache is off (DDP_DATA_CACHE=0) so
 * that no input reaches the disk.  A successful read must describe its
 * data consistently. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("DDP_DATA_CACHE", "0", 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t magic = 0x00000800u | (1u + (data[0] & 3)); /* 1..4 dimensions */
    char path[64];
    int fd = fuzz_memfile(data + 1, size - 1, path, sizeof path);
    ddp_idx idx;
    int rc = ddp_idx_read(path, magic, &idx);
    close(fd);
    fuzz_note("idx", rc, ddp_last_error());
    if (rc == 0) {
        size_t items = 1;
        for (int d = 1; d < idx.ndim; d++)
            items *= idx.dims[d];
        if (idx.ndim < 1 || idx.ndim > DDP_IDX_MAX_DIM || idx.count != idx.dims[0] ||
            idx.item_bytes != items || (idx.count > 0 && !idx.data))
            abort();
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < idx.count * idx.item_bytes; i += 4096)
            sink ^= idx.data[i]; /* every page readable */
        if (idx.count * idx.item_bytes)
            sink ^= idx.data[idx.count * idx.item_bytes - 1];
        (void)sink;
        ddp_idx_destroy(&idx);
    } else if (rc != DDP_ERR_FORMAT && rc != DDP_ERR_IO && rc != DDP_ERR_NOMEM) {
        abort();
    }
    return 0;
}
