#!/bin/sh
# install.pkgconfig: the examples build out of the tree against an installed libqcal.
# Installs the build into a temporary DESTDIR, copies examples/ (the QAT example, the demo
# and their shared examples/cnn) elsewhere, compiles each with nothing but
# `pkg-config --cflags --libs qcal` (plus zlib for the IDX reader) and runs it (--help) on the installed library.
# Also checks the layering rule: tools/ and examples/ include no internal header.
# usage: install_pkgconfig.sh MESON BUILD_DIR SOURCE_DIR CC
set -eu
MESON=$1 BUILD=$2 SRC=$3 CC=$4

bad=$(grep -rnE '#include "(core|observers|quant|fakequant|calib|numeric|io|int8|mpi)/|#include "qcal_config.h"' \
      "$SRC/tools" "$SRC/examples" || true)
if [ -n "$bad" ]; then
    echo "tools/ or examples/ include internal headers:"; echo "$bad"; exit 1
fi

TMP=$(mktemp -d /tmp/qcal-install-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
"$MESON" install -C "$BUILD" --destdir "$TMP/root" --no-rebuild --quiet
pc=$(find "$TMP/root" -name qcal.pc | head -n 1)
[ -n "$pc" ] || { echo "no qcal.pc installed"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
# qcal from the DESTDIR (the sysroot maps its -I/-L into it), zlib from the system.
flags="$(PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$TMP/root" pkg-config --cflags --libs qcal)"
echo "pkg-config --cflags --libs qcal: $flags"
case "$flags" in *"$SRC"*|*"$BUILD"*) echo "flags point into the source or build tree"; exit 1;; esac
flags="$flags $(pkg-config --cflags --libs zlib)"

mkdir "$TMP/ex"
cp -r "$SRC/examples/qat_fmnist.c" "$SRC/examples/demo.c" "$SRC/examples/cnn" "$TMP/ex/"
cd "$TMP/ex"
for ex in qat_fmnist demo; do
    # shellcheck disable=SC2086
    "$CC" -std=c11 -O1 -Wall -Wextra -Werror -Icnn -o "$ex" "$ex.c" cnn/*.c $flags -lm
    LD_LIBRARY_PATH="$libdir" ./"$ex" --help >help.txt
    head -n 1 help.txt
    lib=$(LD_LIBRARY_PATH="$libdir" ldd ./"$ex" | grep libqcal)
    case "$lib" in *"$TMP/root"*) ;; *) echo "$ex did not load the installed libqcal: $lib"; exit 1;; esac
done
echo "ok: qat_fmnist and demo built and ran against the installed libqcal"

# With MPI: qat_fmnist's data-parallel build through `pkg-config --cflags --libs qcal-mpi`
# (qcal-mpi.pc requires qcal and Open MPI's ompi-c). The installed .pc files are copied with
# their prefix pointing into the DESTDIR (a sysroot would also prefix Open MPI's paths).
mpipc=$(find "$TMP/root" -name qcal-mpi.pc | head -n 1)
if [ -n "$mpipc" ] && pkg-config --exists ompi-c; then
    mkdir "$TMP/pc"
    prefix=$(sed -n 's/^prefix=//p' "$mpipc")
    for f in "$pc" "$mpipc"; do
        sed "s|^prefix=.*|prefix=$TMP/root$prefix|" "$f" >"$TMP/pc/$(basename "$f")"
    done
    mflags="$(PKG_CONFIG_PATH="$TMP/pc" pkg-config --cflags --libs qcal-mpi)"
    echo "pkg-config --cflags --libs qcal-mpi: $mflags"
    case "$mflags" in *"$SRC"*|*"$BUILD"*) echo "flags point into the source or build tree"; exit 1;; esac
    cp "$SRC/examples/qat_dp_mpi.c" "$SRC/examples/qat_dp_mpi.h" .
    # shellcheck disable=SC2086
    "$CC" -std=c11 -O1 -Wall -Wextra -Werror -DQAT_WITH_MPI=1 -Icnn -o qat_fmnist_mpi \
        qat_fmnist.c qat_dp_mpi.c cnn/*.c $mflags $(pkg-config --cflags --libs zlib) -lm
    LD_LIBRARY_PATH="$libdir" ./qat_fmnist_mpi --help >help.txt
    lib=$(LD_LIBRARY_PATH="$libdir" ldd ./qat_fmnist_mpi | grep libqcal_mpi)
    case "$lib" in *"$TMP/root"*) ;; *) echo "qat_fmnist_mpi did not load the installed libqcal_mpi: $lib"; exit 1;; esac
    echo "ok: qat_fmnist (data-parallel) built with pkg-config qcal-mpi and ran against the installed libqcal_mpi"
fi
