#!/usr/bin/env bash
# Configures and builds estream (Release) in build/ . Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
# The Python module (python/): make `import estream` work for the Python it was built for
# (Debian's /usr/bin/python3 unless configured otherwise) in any new shell, from this build tree:
# a .pth file naming BUILD_DIR/python in that Python's user site-packages. ESTREAM_NO_PTH=1 skips
# it; `cmake --install` installs the package instead (README, "Python").
if [ -d "$BUILD_DIR/python/estream" ] && [ "${ESTREAM_NO_PTH:-0}" != 1 ]; then
  py=$(sed -n 's/^ESTREAM_PYTHON_EXECUTABLE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
  if [ -n "$py" ] && [ -x "$py" ]; then
    site=$("$py" -c 'import site; print(site.getusersitepackages())')
    mkdir -p "$site"
    (cd "$BUILD_DIR/python" && pwd) > "$site/estream.pth"
    echo "build: Python module estream: $py finds it through $site/estream.pth"
  fi
fi
