/* Reading what ddp-mnist wrote, for its end-to-end tests
 * (test_data_mnist_e2e.c, test_mnist_ddp.c). */
#ifndef DDP_TESTS_MNIST_OUTPUT_H
#define DDP_TESTS_MNIST_OUTPUT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole file as a string (owned by the caller); "" when unreadable. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

/* The percentage of the "Test accuracy: NN.NN %" line, -1 without one. */
static double accuracy(const char *out)
{
    const char *p = strstr(out, "Test accuracy: ");
    return p ? strtod(p + strlen("Test accuracy: "), NULL) : -1.0;
}

#endif
