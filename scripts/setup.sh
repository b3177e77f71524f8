#!/usr/bin/env bash
# Installs every Debian 12 package that estream's build, tests, benchmarks and tools need.
# Idempotent: safe to re-run; packages already present are left alone.
# Works natively on amd64 and arm64 Debian (the package names are the same). On an amd64 host it
# also installs the AArch64 cross toolchain, the :arm64 libraries (multiarch; adds the arm64
# architecture to dpkg) and qemu-user-static, for scripts/build_arm64.sh and the ARM64 stage of
# scripts/test.sh; `scripts/setup.sh --no-arm64` skips them.
set -euo pipefail

WANT_ARM64=1
for arg in "$@"; do
  case "$arg" in
    --no-arm64) WANT_ARM64=0 ;;
    --arm64) WANT_ARM64=1 ;;
    *) echo "setup: unknown option $arg (use --no-arm64 or --arm64)" >&2; exit 2 ;;
  esac
done
HOST_ARCH=$(dpkg --print-architecture)

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev          # libFuzzer target and sanitizer runtimes
  libomp-dev                        # OpenMP for clang builds (gcc ships libgomp)
  liburing-dev                      # io_uring loader
  libgtest-dev libgmock-dev         # unit tests
  libbenchmark-dev                  # kernel benchmarks
  libcli11-dev                      # command-line parsing
  nlohmann-json3-dev                # JSON output
  libfmt-dev                        # formatting
  libxxhash-dev                     # record checksums
  libpcre2-dev                      # Unicode-correct pre-tokenizer splits
  libcpp-httplib-dev                # HTTP front end
  python3                           # plotting/helper scripts
  python3-dev pybind11-dev          # the Python module (python/)
  python3-numpy python3-pytest      # its arrays and its tests
)

# The official OpenAI Node client for tests/server_openai_node_test.sh, into tests/node/node_modules
# (git-ignored; versions pinned by tests/node/package-lock.json). Optional: without node/npm the
# test is skipped.
node_client() {
  local dir
  dir="$(cd "$(dirname "$0")/.." && pwd)/tests/node"
  if command -v npm >/dev/null && [ ! -d "$dir/node_modules/openai" ]; then
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) ||
      echo "setup: npm ci in tests/node failed; the OpenAI client test will be skipped"
  fi
}
# Cross-building for AArch64 from amd64: the toolchain, the emulator for the tests, and the
# libraries the build links (header-only ones, CLI11 and nlohmann-json, serve both architectures).
CROSS_PACKAGES=(
  g++-aarch64-linux-gnu qemu-user-static
  liburing-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64 libbenchmark-dev:arm64
  libxxhash-dev:arm64 libpcre2-dev:arm64 libfmt-dev:arm64 libcpp-httplib-dev:arm64
  libgomp1:arm64                    # OpenMP runtime the test binaries load under qemu-aarch64 -L /
)
ADD_ARCH=0
if [ "$HOST_ARCH" = "amd64" ] && [ "$WANT_ARM64" = 1 ]; then
  PACKAGES+=("${CROSS_PACKAGES[@]}")
  dpkg --print-foreign-architectures | grep -qx arm64 || ADD_ARCH=1
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  node_client
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ "$ADD_ARCH" = 1 ]; then
  echo "setup: adding the arm64 architecture to dpkg (multiarch libraries for the cross build)"
  $SUDO dpkg --add-architecture arm64
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
node_client
echo "setup: done"
