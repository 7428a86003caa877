/* `make install PREFIX=DIR` puts the headers, both libraries, the pkg-config
 * file and the programs in place, and a program built the way README.md says
 * (its line `cc examples/mnist/<files> $(pkg-config --cflags --libs libddp) ...`,
 * read from README.md itself) starts and trains without LD_LIBRARY_PATH: the
 * installed libddp.pc carries an rpath.  Run from the source tree's root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_fixture.h"
#include "mnist_output.h"

static char prefix[64];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

/* README.md's line that builds a program against the installed library,
 * leading blanks removed. */
static void readme_build_line(char *line, size_t cap)
{
    FILE *f = fopen("README.md", "r");
    if (!f)
        fail_msg("README.md: not found (run the test from the source tree's root)");
    char buf[512];
    line[0] = '\0';
    while (fgets(buf, sizeof buf, f))
        if (strstr(buf, "$(pkg-config --cflags --libs libddp)")) {
            snprintf(line, cap, "%s", buf + strspn(buf, " "));
            line[strcspn(line, "\n")] = '\0';
            break;
        }
    fclose(f);
    if (!line[0])
        fail_msg("README.md has no line with $(pkg-config --cflags --libs libddp)");
}

static void test_install_and_build_a_user_program(void **state)
{
    (void)state;
    const char *build = getenv("DDP_TEST_BUILD");
    build = build && *build ? build : "build";
    int san = getenv("DDP_TEST_SANITIZER") != NULL;
    strcpy(prefix, "/tmp/ddp-install-XXXXXX");
    assert_non_null(mkdtemp(prefix));
    assert_int_equal(sh("make -s install BUILD=%s %s PREFIX=%s >%s/make.log 2>&1", build,
                        san ? "SAN=1" : "", prefix, prefix),
                     0);
    const char *files[] = {"include/ddp.h", "include/ddp/ddp.h", "include/ddp/pg.h",
                           "include/ddp/ext.h", "lib/libddp.a", "lib/libddp.so", "lib/pkgconfig/libddp.pc",
                           "include/ddp/progress.h", "include/ddp/timeline.h", "bin/ddprun",
                           "bin/ddp-mnist", "bin/ddp-bench-collectives", "bin/ddp-trace",
                           "bin/ddp-timeline", "bin/ddp-cnn", "include/ddp/nn_conv.h"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", prefix, files[i]);
        if (access(path, F_OK) != 0)
            fail_msg("make install did not put %s in place", path);
    }
    /* ddp-plot, when this build has it (cairo found), is installed too. */
    char built[1100];
    snprintf(built, sizeof built, "%s/bin/ddp-plot", build);
    if (access(built, X_OK) == 0) {
        char path[256];
        snprintf(path, sizeof path, "%s/bin/ddp-plot", prefix);
        if (access(path, X_OK) != 0)
            fail_msg("make install did not put %s in place", path);
    }
    /* The README's line, run as written but for its output (into PREFIX)
     * and its arguments: PKG_CONFIG_PATH exported, no LD_LIBRARY_PATH.  Under
     * the sanitizers, libddp.so needs their runtime in the program too. */
    char cc[512], out_name[] = " -o my-mnist", run_prefix[] = " && ./my-mnist";
    readme_build_line(cc, sizeof cc);
    char *o = strstr(cc, out_name), *r = strstr(cc, run_prefix);
    if (!o || !r || r < o || strncmp(cc, "cc ", 3) != 0)
        fail_msg("README.md's build line '%s' is not 'cc FILE ...%s%s ...'", cc, out_name,
                 run_prefix);
    *o = '\0';
    char envp[256];
    snprintf(envp, sizeof envp, "export PKG_CONFIG_PATH=%s/lib/pkgconfig && unset LD_LIBRARY_PATH",
             prefix);
    assert_int_equal(sh("%s && cc %s %s -o %s/my-mnist >%s/cc.log 2>&1", envp,
                        san ? "-fsanitize=address,undefined" : "", cc + 3, prefix, prefix),
                     0);
    /* ... and the program it built trains, on a small generated data set. */
    char data[128];
    snprintf(data, sizeof data, "%s/data", prefix);
    assert_int_equal(mkdir(data, 0755), 0);
    fx_write_split(data, "train", 1, 200, 28, 28, 10);
    fx_write_split(data, "t10k", 1, 50, 28, 28, 10);
    int st = sh("%s && %s/my-mnist --data %s --epochs 1 --batch-size 2 >%s/run.txt 2>&1", envp,
                prefix, data, prefix);
    char *ran = slurp(fx_path(prefix, "run.txt"));
    if (st != 0 || !strstr(ran, "Epoch [1/1], Step [100/100], Loss: ") || accuracy(ran) < 0)
        fail_msg("my-mnist built as README.md says did not train: %s", ran);
    free(ran);

    /* A program of one's own, built the same way, reaches the library. */
    char src[128];
    FILE *f;
    snprintf(src, sizeof src, "%s/user.c", prefix);
    f = fopen(src, "w");
    assert_non_null(f);
    fputs("#include <ddp.h>\n#include <stdio.h>\n"
          "int main(void) {\n"
          "    ddp_module_t *l; ddp_model_t *m;\n"
          "    if (ddp_linear_create(4, 2, 1, 0, &l) || ddp_model_from_module(l, &m)) {\n"
          "        puts(ddp_last_error()); return 1; }\n"
          "    printf(\"%zu parameters, libddp %s\\n\", ddp_model_num_params(m), ddp_version());\n"
          "    ddp_model_destroy(m); return 0; }\n",
          f);
    fclose(f);
    assert_int_equal(sh("%s && cd %s && cc %s user.c $(pkg-config --cflags --libs libddp) "
                        "-o user >cc.log 2>&1 && ./user >out.txt",
                        envp, prefix, san ? "-fsanitize=address,undefined" : ""),
                     0);
    char *out = slurp(fx_path(prefix, "out.txt"));
    assert_string_equal(out, "2 parameters, libddp 0.1.0\n");
    free(out);
    assert_int_equal(sh("rm -rf %s", prefix), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_install_and_build_a_user_program),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
