/* ddprun across nodes with its own rendezvous (--rdzv-backend c10d): two
 * or three launchers, each a "node" on this host, meet at one endpoint;
 * node ranks are assigned, one worker's failure restarts every node, a
 * node that dies lets the others go on at the smaller size (MIN), a node
 * that comes late is admitted at the next restart, a job
 * with no restarts left stops on every node naming the failure, the store
 * host's death stops the others with a message, and bad flags are refused.
 * Then the same across two network namespaces (each launcher on its own
 * "host", its address chosen by DDP_SOCKET_IFNAME): a job, and a link taken
 * down.  Real launchers, real workers (tests/helpers/ddprun_worker.c). */
#include "ddprun_util.h"
#include "free_port.h"
#include "netns_fixture.h"

static char dir[64];
static int port;
static char endpoint[64];

/* One launcher ("node") of job id running the worker in mode with args
 * w1, w2 (NULL: none; "DIR": the test's folder). */
static launch node(const char *id, const char *nnodes, const char *restarts, const char *conf,
                   const char *mode, const char *w1, const char *w2)
{
    char *argv[24];
    int a = 0;
    const char *fixed[] = {ddprun, "--rdzv-backend=c10d", "--rdzv-endpoint", endpoint,
                           "--rdzv-id", id, "--nnodes", nnodes, "--max-restarts", restarts,
                           "--rdzv-conf", conf, worker, mode};
    for (size_t k = 0; k < sizeof fixed / sizeof *fixed; k++)
        argv[a++] = (char *)fixed[k];
    const char *extra[] = {w1, w2};
    for (int k = 0; k < 2 && extra[k]; k++)
        argv[a++] = (char *)(strcmp(extra[k], "DIR") ? extra[k] : dir);
    argv[a] = NULL;
    return start(argv);
}

static int setup(void **state)
{
    (void)state;
    ddprun_paths();
    make_dir(dir);
    port = free_port();
    snprintf(endpoint, sizeof endpoint, "127.0.0.1:%d", port);
    setenv("DDP_SECRET", "elastic test secret", 1); /* no warning, and strangers kept out */
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove_dir(dir);
    return 0;
}

static void expect_ok(launch l, const char *what, char *err, size_t len)
{
    int st = finish(l, err, len, 60);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s: status %d: %s", what, st, err);
}

/* Two launchers form one world of 2: ranks 0 and 1, one all-reduce. */
static void test_two_nodes(void **state)
{
    (void)state;
    char ea[8192], eb[8192];
    launch a = node("two", "2:2", "0", "last_call_timeout=0.2", "allreduce", "DIR", "0");
    usleep(200000);
    launch b = node("two", "2:2", "0", "last_call_timeout=0.2", "allreduce", "DIR", "0");
    expect_ok(a, "node a", ea, sizeof ea);
    expect_ok(b, "node b", eb, sizeof eb);
    char buf[64];
    for (int r = 0; r < 2; r++) {
        assert_int_equal(read_file(dir, "sum", r, buf, sizeof buf), 0);
        assert_string_equal(buf, "3\n"); /* (0 + 1) + (1 + 1) */
    }
    assert_non_null(strstr(ea, "round 0: node 0 of 2, ranks 0..0 of 2"));
    assert_non_null(strstr(eb, "round 0: node 1 of 2, ranks 1..1 of 2"));
}

/* Rank 1 is killed in the first round: both nodes restart (round 1). */
static void test_coordinated_restart(void **state)
{
    (void)state;
    char ea[8192], eb[8192], buf[64];
    launch a = node("restart", "2:2", "2", "last_call_timeout=0.2", "flaky", "DIR", NULL);
    usleep(200000);
    launch b = node("restart", "2:2", "2", "last_call_timeout=0.2", "flaky", "DIR", NULL);
    expect_ok(a, "node a", ea, sizeof ea);
    expect_ok(b, "node b", eb, sizeof eb);
    for (int r = 0; r < 2; r++)
        assert_int_equal(read_file(dir, "done", r, buf, sizeof buf), 0);
    for (int k = 0; k < 2; k++) {
        const char *e = k ? eb : ea;
        assert_non_null(strstr(e, "rank 1"));
        assert_non_null(strstr(e, "was killed by signal 9"));
        assert_non_null(strstr(e, "every node restarts (1 of 2)"));
        assert_non_null(strstr(e, "round 1: node"));
    }
}

/* The second node's launcher dies (kill -9): the first notices its
 * heartbeat stop and goes on alone (MIN 1) from round 1. */
static void test_node_lost_min_remains(void **state)
{
    (void)state;
    char ea[8192], eb[8192], buf[64];
    const char *conf = "heartbeat_timeout=1.5,last_call_timeout=2";
    launch a = node("lost", "1:2", "1", conf, "elastic", "DIR", NULL);
    usleep(200000);
    launch b = node("lost", "1:2", "1", conf, "elastic", "DIR", NULL);
    wait_files(dir, "gen0", 2, NULL);
    double t0 = now();
    kill(b.pid, SIGKILL);
    finish(b, eb, sizeof eb, 10);
    expect_ok(a, "node a", ea, sizeof ea);
    assert_true(now() - t0 < 15);
    assert_non_null(strstr(ea, "node 1 stopped answering (no heartbeat for"));
    assert_non_null(strstr(ea, "round 1: node 0 of 1, ranks 0..0 of 1"));
    assert_int_equal(read_file(dir, "gen1", 0, buf, sizeof buf), 0);
    assert_string_equal(buf, "1 0\n"); /* WORLD_SIZE 1, GROUP_RANK 0 */
}

/* A third launcher comes while round 0 runs: it waits, and the restart
 * that a killed worker causes admits it (round 1 has 3 nodes). */
static void test_late_node_joins_next_round(void **state)
{
    (void)state;
    char e[3][8192], buf[64];
    const char *conf = "last_call_timeout=2,heartbeat_timeout=5";
    launch l[3];
    l[0] = node("late", "1:3", "1", conf, "elastic", "DIR", NULL);
    usleep(100000);
    l[1] = node("late", "1:3", "1", conf, "elastic", "DIR", NULL);
    pid_t pids[2];
    wait_files(dir, "gen0", 2, pids);
    l[2] = node("late", "1:3", "1", conf, "elastic", "DIR", NULL);
    usleep(500000); /* it has joined and waits for the next round */
    assert_int_equal(read_file(dir, "gen0", 2, buf, sizeof buf), -1);
    kill(pids[1], SIGKILL); /* rank 1's worker */
    for (int k = 0; k < 3; k++)
        expect_ok(l[k], "a node", e[k], sizeof e[k]);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(read_file(dir, "gen1", r, buf, sizeof buf), 0);
        assert_int_equal(atoi(buf), 3); /* WORLD_SIZE */
    }
    assert_non_null(strstr(e[2], "round 1: node"));
    assert_null(strstr(e[2], "round 0:"));
}

/* No restarts left: the failure stops every node, naming it. */
static void test_failure_stops_everyone(void **state)
{
    (void)state;
    char ea[8192], eb[8192];
    launch a = node("fail", "2:2", "0", "last_call_timeout=0.2", "fail", "1", "7");
    usleep(200000);
    launch b = node("fail", "2:2", "0", "last_call_timeout=0.2", "fail", "1", "7");
    int sa = finish(a, ea, sizeof ea, 30), sb = finish(b, eb, sizeof eb, 30);
    assert_true(WIFEXITED(sa) && WEXITSTATUS(sa) == 1);
    assert_true(WIFEXITED(sb) && WEXITSTATUS(sb) == 1);
    for (int k = 0; k < 2; k++)
        assert_non_null(strstr(k ? eb : ea, "the job stops: node 1: rank 1"));
}

/* The launcher that hosts the store dies: the other says so and stops. */
static void test_store_host_dies(void **state)
{
    (void)state;
    char ea[8192], eb[8192];
    const char *conf = "heartbeat_timeout=2,last_call_timeout=0.2";
    launch a = node("host", "2:2", "3", conf, "elastic", "DIR", NULL);
    usleep(200000);
    launch b = node("host", "2:2", "3", conf, "elastic", "DIR", NULL);
    wait_files(dir, "gen0", 2, NULL);
    kill(a.pid, SIGKILL);
    finish(a, ea, sizeof ea, 10);
    double t0 = now();
    int sb = finish(b, eb, sizeof eb, 30);
    assert_true(now() - t0 < 20);
    assert_true(WIFEXITED(sb) && WEXITSTATUS(sb) == 1);
    assert_non_null(strstr(eb, "lost the rendezvous store at 127.0.0.1:"));
}

/* A launcher inside namespace i of np, listening on its veth. */
static launch ns_node(const netns_pair *np, int i, const char *nnodes, const char *conf,
                      const char *mode, const char *w1)
{
    char ifname[64];
    snprintf(ifname, sizeof ifname, "DDP_SOCKET_IFNAME=%s", np->veth[i]);
    char *argv[] = {"/bin/ip", "netns", "exec", (char *)np->ns[i], "env", ifname, ddprun,
                    "--rdzv-backend=c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "ns",
                    "--nnodes", (char *)nnodes, "--max-restarts", "1", "--rdzv-conf",
                    (char *)conf, worker, (char *)mode, dir, (char *)w1, NULL};
    return start(argv);
}

static void test_netns_nodes(void **state)
{
    (void)state;
    netns_pair np = {0};
    const char *why = netns_pair_setup(&np, "e", 219);
    if (why) {
        netns_pair_teardown(&np);
        fprintf(stderr, "skipped: network namespaces unavailable here (%s)\n", why);
        skip();
    }
    snprintf(endpoint, sizeof endpoint, "%s:%d", np.addr[0], port);
    char ea[8192], eb[8192], buf[64];
    /* one job across the two "hosts": the workers' all-reduce crosses too */
    const char *conf = "last_call_timeout=0.3,heartbeat_timeout=2";
    launch a = ns_node(&np, 0, "2:2", conf, "allreduce", "0");
    usleep(200000);
    launch b = ns_node(&np, 1, "2:2", conf, "allreduce", "0");
    expect_ok(a, "node a", ea, sizeof ea);
    expect_ok(b, "node b", eb, sizeof eb);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(read_file(dir, "sum", r, buf, sizeof buf), 0);
        assert_string_equal(buf, "3\n");
    }
    /* the link goes down mid-job: the store's host goes on alone (MIN 1),
     * the cut-off node stops, saying it lost the store */
    snprintf(endpoint, sizeof endpoint, "%s:%d", np.addr[0], free_port());
    const char *conf2 = "last_call_timeout=2,heartbeat_timeout=2"; /* both in round 0 */
    a = ns_node(&np, 0, "1:2", conf2, "elastic", NULL);
    usleep(200000);
    b = ns_node(&np, 1, "1:2", conf2, "elastic", NULL);
    wait_files(dir, "gen0", 2, NULL);
    assert_int_equal(netns_sh("ip -n %s link set %s down", np.ns[1], np.veth[1]), 0);
    double t0 = now();
    int sb = finish(b, eb, sizeof eb, 40);
    expect_ok(a, "node a", ea, sizeof ea);
    assert_true(now() - t0 < 40);
    netns_pair_teardown(&np);
    assert_true(WIFEXITED(sb) && WEXITSTATUS(sb) == 1);
    assert_non_null(strstr(eb, "lost the rendezvous store"));
    assert_non_null(strstr(ea, "node 1 stopped answering"));
    assert_non_null(strstr(ea, "round 1: node 0 of 1"));
}

static void expect_usage(char *const argv[], const char *msg)
{
    char err[4096];
    int st = finish(start(argv), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    if (!strstr(err, msg))
        fail_msg("want '%s' in: %s", msg, err);
}

/* Rendezvous errors: too few nodes within join_timeout; nodes with
 * different --nproc-per-node. */
static void test_rendezvous_errors(void **state)
{
    (void)state;
    char ea[8192], eb[8192];
    launch a = node("alone", "2:2", "0", "join_timeout=1", "env", "DIR", NULL);
    int sa = finish(a, ea, sizeof ea, 30);
    assert_true(WIFEXITED(sa) && WEXITSTATUS(sa) == 1);
    assert_non_null(strstr(ea, "only 1 of the 2 nodes needed joined round 0 within 1 s"));
    char *argv[] = {ddprun, "--rdzv-backend=c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
                    "nproc", "--nnodes", "2:2", "--nproc-per-node", "2", "--rdzv-conf",
                    "join_timeout=20", worker, "env", dir, NULL};
    a = node("nproc", "2:2", "0", "join_timeout=20", "env", "DIR", NULL);
    usleep(200000);
    launch b = start(argv);
    sa = finish(a, ea, sizeof ea, 30);
    int sb = finish(b, eb, sizeof eb, 30);
    assert_true(WIFEXITED(sa) && WEXITSTATUS(sa) == 1);
    assert_true(WIFEXITED(sb) && WEXITSTATUS(sb) == 1);
    assert_non_null(strstr(ea, "every node needs the same --nproc-per-node"));
    /* the other node sees the mismatch too, or the store host gone first */
    assert_true(strstr(eb, "every node needs the same --nproc-per-node") ||
                strstr(eb, "lost the rendezvous store"));
}

static void test_bad_flags(void **state)
{
    (void)state;
    char *no_id[] = {ddprun, "--rdzv-backend", "c10d", "--nnodes", "1:2", "true", NULL};
    expect_usage(no_id, "--rdzv-backend c10d needs --rdzv-id");
    char *range[] = {ddprun, "--nnodes", "3:2", "true", NULL};
    expect_usage(range, "bad --nnodes '3:2': want MIN:MAX");
    char *static_range[] = {ddprun, "--nnodes", "1:2", "true", NULL};
    expect_usage(static_range, "--nnodes MIN:MAX needs --rdzv-backend c10d");
    char *conf[] = {ddprun, "--rdzv-backend", "c10d", "--rdzv-id", "x", "--rdzv-conf",
                    "join_timeout=abc", "true", NULL};
    expect_usage(conf, "bad --rdzv-conf item 'join_timeout=abc'");
    char *rank[] = {ddprun, "--rdzv-backend", "c10d", "--rdzv-id", "x", "--nnodes", "2",
                    "--node-rank", "1", "true", NULL};
    expect_usage(rank, "assigns node ranks; drop --node-rank");
    char *backend[] = {ddprun, "--rdzv-backend", "etcd", "true", NULL};
    expect_usage(backend, "bad --rdzv-backend 'etcd'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_two_nodes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coordinated_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_node_lost_min_remains, setup, teardown),
        cmocka_unit_test_setup_teardown(test_late_node_joins_next_round, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_stops_everyone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_host_dies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_flags, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rendezvous_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_netns_nodes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
