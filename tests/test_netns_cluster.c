/* ddp-mnist across a cluster of 4 "hosts": network namespaces on a bridge,
 * every link shaped with tbf (bench/netns_common.sh makes them; the
 * benchmarks use the same), one ddprun node per host with the static
 * rendezvous (--nnodes 4 --node-rank I), a few steps of training; the
 * weights rank 0 saves equal those of the same job on one host (4 ranks
 * by hand, file:// rendezvous): the tcp transport across hosts computes
 * what shared memory computes on one, to rounding.  Skips with a message
 * where namespaces cannot be made (not root, no `ip`, no netns). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_fixture.h"
#include "free_port.h"
#include "ddp.h"
#include "mnist_output.h"
#include "mnist_model.h"
#include "scratch_dir.h"
#include "run_logged.h"

static char bin[1024], ddprun[1024];

#define FLAGS "--hidden 32 --epochs 1 --batch-size 32 --lr 0.05 --seed 11 --no-progress"

/* Runs the shell script text with the cluster's functions loaded; its
 * exit status, output in *log. */
static int cluster_sh(const char *script, char **log)
{
    result r = sh_in(240, "log-cluster", ". bench/netns_common.sh; %s", script);
    *log = r.out;
    return r.status;
}

static void test_four_hosts_match_one(void **state)
{
    (void)state;
    char *log;
    if (cluster_sh("why=$(cluster_check); echo \"$why\"; [ -z \"$why\" ]", &log) != 0) {
        fprintf(stderr, "skipped: network namespaces unavailable here (%.*s)\n",
                (int)strcspn(log, "\n"), log);
        free(log);
        skip();
    }
    free(log);
    fx_write_split(dir, "train", 0, 960, 28, 28, 10);
    fx_write_split(dir, "t10k", 0, 100, 28, 28, 10);
    /* 960 / 4 ranks / 32 = 7.5: 8 steps, the last one short */
    char script[6144];
    snprintf(script, sizeof script,
             "trap cluster_down EXIT INT TERM; cluster_up 4 1gbit || exit 1; a=$(cluster_addr 1); "
             "for i in 4 3 2 1; do ns_run $i %s --nnodes 4 --node-rank $((i - 1)) "
             "--master-addr $a --master-port %d %s --data %s --save %s/hosts.safetensors "
             FLAGS " >%s/node$i.log 2>&1 & p=\"$p $!\"; done; s=0; for x in $p; do "
             "wait $x || s=1; done; cat %s/node*.log; exit $s",
             ddprun, free_port(), bin, dir, dir, dir, dir);
    int st = cluster_sh(script, &log);
    if (st != 0)
        fail_msg("4 hosts: exit %d: %s", st, log);
    assert_non_null(strstr(log, "Test accuracy: "));
    free(log);
    /* the same job on one host */
    char one[6144];
    int n = snprintf(one, sizeof one, "for r in 3 2 1 0; do %s --data %s --init-method file://%s/rdzv "
                     "--rank $r --world-size 4 --save %s/one.safetensors " FLAGS " & p=\"$p $!\"; "
                     "done; s=0; for x in $p; do wait $x || s=1; done; exit $s",
                     bin, dir, dir, dir);
    assert_true(n > 0 && (size_t)n < sizeof one);
    result r = sh_in(120, "log-one", "%s", one);
    if (r.status != 0)
        fail_msg("one host: exit %d: %s", r.status, r.out);
    log = r.out;
    free(log);
    const int hidden[1] = {32}; /* FLAGS' --hidden */
    ddp_model_t *ma = mnist_mlp_load(dir, hidden, 1, "hosts.safetensors"),
                *mb = mnist_mlp_load(dir, hidden, 1, "one.safetensors");
    double d = mnist_rel_diff(ma, mb);
    print_message("4 hosts against one host: max relative difference %.3g\n", d);
    if (!(d <= 1e-6)) /* INFINITY: the hosts saved all-zero weights */
        fail_msg("4 hosts differ from one host by %.3g (relative)", d);
    ddp_model_destroy(ma);
    ddp_model_destroy(mb);
}

int main(void)
{
    const char *build = getenv("DDP_TEST_BUILD");
    build = build && *build ? build : "build";
    snprintf(bin, sizeof bin, "%s/bin/ddp-mnist", build);
    snprintf(ddprun, sizeof ddprun, "%s/bin/ddprun", build);
    const struct CMUnitTest tests[] = {
        IN_SCRATCH(test_four_hosts_match_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
