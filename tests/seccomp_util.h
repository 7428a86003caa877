/* A system call made to fail in this process and its children, as a
 * kernel or a sandbox would refuse it (a seccomp filter): for tests of the
 * paths that only such refusals take. */
#ifndef DDP_TESTS_SECCOMP_UTIL_H
#define DDP_TESTS_SECCOMP_UTIL_H

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h> /* the callers' __NR_ names */

/* From now on, system call nr fails with errno err; with arg >= 0, only
 * when its argument arg (its low 32 bits: little-endian x86-64) is value.
 * 0, or -1 when no filter can be set (a container may forbid them).  The
 * filter does not check seccomp_data.arch: a test's process makes native
 * calls only. */
__attribute__((unused)) static int deny_syscall(long nr, int arg, uint32_t value, int err)
{
    const uint32_t at =
        (uint32_t)offsetof(struct seccomp_data, args) + 8u * (uint32_t)(arg < 0 ? 0 : arg);
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, at),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, value, 0, arg < 0 ? 0 : 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (uint32_t)err),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof *f, .filter = f};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
                   prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)
               ? -1
               : 0;
}

#endif
