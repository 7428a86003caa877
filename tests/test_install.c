/* `make install PREFIX=DIR` puts the headers, both libraries, the pkg-config
 * file and the programs in place, and a user program that includes <ddp.h>
 * builds with `cc $(pkg-config --cflags --libs libddp)` and runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
                           "bin/ddprun", "bin/ddp-mnist", "bin/ddp-bench-collectives"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", prefix, files[i]);
        if (access(path, F_OK) != 0)
            fail_msg("make install did not put %s in place", path);
    }
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
    assert_int_equal(sh("cd %s && PKG_CONFIG_PATH=%s/lib/pkgconfig cc %s user.c "
                        "$(PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags --libs libddp) "
                        "-o user >cc.log 2>&1 && LD_LIBRARY_PATH=%s/lib ./user >out.txt",
                        prefix, prefix, san ? "-fsanitize=address,undefined" : "", prefix,
                        prefix),
                     0);
    char out[256];
    snprintf(src, sizeof src, "%s/out.txt", prefix);
    f = fopen(src, "r");
    assert_non_null(f);
    assert_non_null(fgets(out, sizeof out, f));
    fclose(f);
    assert_string_equal(out, "2 parameters, libddp 0.1.0\n");
    assert_int_equal(sh("rm -rf %s", prefix), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_install_and_build_a_user_program),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
