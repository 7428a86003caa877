# Sourced by the drivers: blas_env DDPRUN exports the OPENBLAS_CORETYPE that
# ddprun gives its workers (tools/ddprun/blas_env.c) unless one is set, so
# that every run of the command, started by ddprun or by hand, libddp's and
# the reference's alike, runs the same OpenBLAS kernels.  Without it a run
# started by hand gets OpenBLAS's own choice, which on an Intel model Debian
# 12's OpenBLAS does not know is its SSE3 kernels (README: OPENBLAS_CORETYPE)
# while ddprun's ranks run AVX-512 ones.  Prints what the runs use.
blas_env() {
    if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
        _core=$("$1" --standalone --nproc-per-node 1 /bin/sh -c 'printf %s "${OPENBLAS_CORETYPE:-}"' \
            2>/dev/null) || _core=
        [ -z "$_core" ] || export OPENBLAS_CORETYPE="$_core"
    fi
    echo "OpenBLAS kernels: ${OPENBLAS_CORETYPE:-OpenBLAS's own choice} (every run)"
}
