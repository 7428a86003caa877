/* Monotonic time and the library version. */
#include "ddp/base.h"

#include <time.h>

double ddp_time_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *ddp_version(void) { return "0.1.0"; }
