/* Monotonic time, back-off sleeps (time.h) and the library version. */
#include "base/time.h"

#include <math.h>
#include <time.h>

double ddp_time_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- back-off ----------------------------------------------------------- */

void ddp__backoff_init(ddp__backoff *b, double timeout_s, double max_s)
{
    b->sleep_s = 50e-6;
    b->max_s = max_s;
    b->deadline = ddp_time_now() + timeout_s;
}

int ddp__backoff_sleep(ddp__backoff *b)
{
    double left = b->deadline - ddp_time_now();
    if (left <= 0)
        return DDP_ERR_TIMEOUT;
    double t = b->sleep_s < left ? b->sleep_s : left;
    struct timespec ts = {(time_t)t, (long)((t - floor(t)) * 1e9)};
    nanosleep(&ts, NULL); /* EINTR: an early wake-up only means one more poll */
    b->sleep_s *= 2;
    if (b->sleep_s > b->max_s)
        b->sleep_s = b->max_s;
    return 0;
}

const char *ddp_version(void) { return "0.1.0"; }
