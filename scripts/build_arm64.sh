#!/usr/bin/env bash
# Cross-builds estream (Release: library, CLI, tests, benchmarks) for 64-bit ARM Linux in
# build-arm64/ with Debian's cross toolchain (scripts/setup.sh --arm64 installs it and the :arm64
# libraries). Extra arguments go to cmake's configure step. On an AArch64 machine use
# scripts/build.sh instead (a native build).
#   BUILD_DIR=dir   build there instead of build-arm64/;
#   TARGET=name     build only that target and what it needs: TARGET=estream_tests_arm builds just
#                   the test binaries labelled `arm` (what the ARM64 stage of scripts/test.sh runs).
# The Python module is not cross-built (-DESTREAM_PYTHON=OFF: it needs the target's Python headers
# and numpy); on an ARM64 machine scripts/build.sh builds it natively.
# The test binaries run under qemu-user: ctest --test-dir build-arm64 -L arm
# (or one binary: qemu-aarch64-static -L / build-arm64/tests/kernels_ops_test).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-arm64}
JOBS=${JOBS:-$(nproc)}
if ! command -v aarch64-linux-gnu-g++ >/dev/null; then
  echo "build_arm64: aarch64-linux-gnu-g++ not found; run scripts/setup.sh --arm64 first" >&2
  exit 1
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DESTREAM_PYTHON=OFF \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64-linux-gnu.cmake" "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" ${TARGET:+--target "$TARGET"}
