/* Shared bits of the libFuzzer harnesses (tests/fuzz/README.md). */
#ifndef DDP_TESTS_FUZZ_UTIL_H
#define DDP_TESTS_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Readers that take a path (IDX, safetensors) read the input through an
 * in-memory file: "/proc/self/fd/N" of a memfd holding data.  Returns the
 * fd (close it after the read) and fills path; aborts when the kernel
 * refuses, which is a broken harness, not a finding. */
static inline int fuzz_memfile(const uint8_t *data, size_t size, char *path, size_t cap)
{
    int fd = memfd_create("fuzz-input", MFD_CLOEXEC);
    if (fd < 0) {
        perror("memfd_create");
        abort();
    }
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(fd, data + off, size - off);
        if (n <= 0) {
            perror("write memfd");
            abort();
        }
        off += (size_t)n;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

/* With FUZZ_DEBUG=1 in the environment, a harness says what each input
 * came to (for triage and for checking that seeds reach their path). */
static inline void fuzz_note(const char *what, int rc, const char *msg)
{
    static int on = -1;
    if (on < 0)
        on = getenv("FUZZ_DEBUG") != NULL;
    if (on)
        fprintf(stderr, "%s: rc %d%s%s\n", what, rc, rc ? ": " : "", rc ? msg : "");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#endif
