#!/usr/bin/env bash
# Fuzzes the GGUF reader: builds fuzz/gguf_fuzz with clang (libFuzzer + ASan + UBSan) in its own
# build directory and runs it for SECONDS (default 60) on the seed corpus in fuzz/corpus/.
# Exits non-zero on any finding (crash, sanitizer report, leak, timeout, out-of-memory); the
# reproducer is left in $BUILD/fuzz-artifacts/ (replay: $BUILD/fuzz/gguf_fuzz FILE).
#   usage: scripts/ci_fuzz.sh [SECONDS]      env: FUZZ_BUILD_DIR (default build-fuzz), JOBS
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-60}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-2}

CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DESTREAM_FUZZ=ON \
  -DESTREAM_BUILD_TESTS=OFF -DESTREAM_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target gguf_fuzz

# New inputs go to a scratch corpus; the committed seeds are only read.
mkdir -p "$BUILD/fuzz-corpus" "$BUILD/fuzz-artifacts"
echo "fuzzing the GGUF reader for ${SECONDS_TO_RUN} s (seeds: fuzz/corpus, $(ls fuzz/corpus | wc -l) files)"
"$BUILD/fuzz/gguf_fuzz" \
  -max_total_time="$SECONDS_TO_RUN" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
  -print_final_stats=1 -artifact_prefix="$BUILD/fuzz-artifacts/" \
  "$BUILD/fuzz-corpus" fuzz/corpus
echo "GGUF fuzzing: no findings in ${SECONDS_TO_RUN} s"
