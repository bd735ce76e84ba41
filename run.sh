#!/bin/sh
# qcal's one entry point for set-up, the demo and the tests on Debian 12 (run as root, or
# with the packages below already installed).
#   ./run.sh demo [ARGS...]   install what is missing, build, run the end-to-end demo
#   ./run.sh test             install what is missing, build, run the whole test suite
#   ./run.sh build            install what is missing and build only
#   ./run.sh sanitize         ASan+UBSan build + whole suite, TSan stress, valgrind CLI (.ci/run)
#   ./run.sh fuzz             libFuzzer targets, 60 s each (QCAL_FUZZ_SECONDS; .ci/run)
set -eu
cd "$(dirname "$0")"

# Runs a build step quietly; on failure shows its whole output (meson and ninja report
# errors on stdout) and fails.
quiet() {
    local log
    log=$(mktemp)
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "$(basename "$0"): failed: $*" >&2
        return 1
    fi
    rm -f "$log"
}

# libopenblas0-openmp: without it Debian's python3-torch and numpy run on the generic
# reference BLAS (torch's fc layers at about 2 GFLOP/s), so the PyTorch side of the Python
# benches would be slower than PyTorch as users get it; the OpenMP build follows
# torch.set_num_threads. The C library and the CLI do not use BLAS.
PACKAGES="meson ninja-build pkg-config gcc libc6-dev libdnnl-dev libcmocka-dev zlib1g-dev dataset-fashion-mnist python3-numpy python3-flatbuffers libopenmpi-dev openmpi-bin chromium python3-dev python3-torch libopenblas0-openmp"

install_missing() {
    missing=""
    for p in $PACKAGES; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing="$missing $p"
        fi
    done
    if [ -n "$missing" ]; then
        echo "run.sh: installing$missing" >&2
        if [ "$(id -u)" != 0 ]; then
            echo "run.sh: missing packages:$missing (run as root, or install them)" >&2
            exit 1
        fi
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    fi
}

build() {
    install_missing
    if [ ! -f build/build.ninja ]; then
        quiet meson setup build --buildtype=release
    fi
    quiet meson compile -C build
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
    build) build ;;
    demo)
        build
        # Fashion-MNIST CNN: float model (trained once, then cached), calibration with every
        # observer, int8 on oneDNN, QAT; see docs/demo.md for the options.
        exec ./build/examples/qcal-demo "$@"
        ;;
    test)
        build
        exec meson test -C build --print-errorlogs "$@"
        ;;
    sanitize) exec .ci/run sanitize tsan valgrind ;;
    fuzz) exec .ci/run fuzz ;;
    *)
        echo "usage: ./run.sh demo|test|build|sanitize|fuzz" >&2
        exit 2
        ;;
esac
