#!/usr/bin/env bash
# Installs every Debian 12 package that estream's build, tests, benchmarks and tools need.
# Idempotent: safe to re-run; packages already present are left alone.
set -euo pipefail

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
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
node_client
echo "setup: done"
