#!/usr/bin/env bash
# Fuzzes the parsers: builds the libFuzzer targets with clang (+ ASan + UBSan) in their own build
# directory and runs each for SECONDS (default 60) on its seed corpus, the two side by side (one
# core each):
#   gguf_fuzz   the GGUF reader (seeds fuzz/corpus/);
#   text_fuzz   the text users send: the server's request bodies, `estream score` lines and the
#               shard outputs its --merge joins, the `estream eval` task files and the tokenizer
#               (seeds fuzz/text_corpus/, dictionary fuzz/text.dict; the real vocabularies of
#               ../shared/testdata/tokenizer when present, else only the built-in one).
# Exits non-zero on any finding (crash, sanitizer report, leak, timeout, out-of-memory); the
# reproducer is left in $BUILD/fuzz-artifacts/TARGET/ (replay: $BUILD/fuzz/TARGET FILE, with the
# same ESTREAM_FUZZ_VOCAB_DIR for text_fuzz).
#   usage: scripts/ci_fuzz.sh [SECONDS]      env: FUZZ_BUILD_DIR (default build-fuzz), JOBS
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-60}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-2}

CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DESTREAM_FUZZ=ON \
  -DESTREAM_BUILD_TESTS=OFF -DESTREAM_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target gguf_fuzz text_fuzz

VOCABS=$(cd .. && pwd)/shared/testdata/tokenizer
if [ -d "$VOCABS" ]; then export ESTREAM_FUZZ_VOCAB_DIR=$VOCABS; fi

# run TARGET SEEDS [libFuzzer flags]: new inputs go to a scratch corpus; the committed seeds are
# only read. The log goes to $BUILD/fuzz-TARGET.log.
run() {
  local target=$1 seeds=$2
  shift 2
  mkdir -p "$BUILD/fuzz-corpus/$target" "$BUILD/fuzz-artifacts/$target"
  "$BUILD/fuzz/$target" -max_total_time="$SECONDS_TO_RUN" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$BUILD/fuzz-artifacts/$target/" "$@" "$BUILD/fuzz-corpus/$target" "$seeds" \
    >"$BUILD/fuzz-$target.log" 2>&1
}
echo "fuzzing for ${SECONDS_TO_RUN} s: gguf_fuzz ($(ls fuzz/corpus | wc -l) seeds) and text_fuzz" \
  "($(ls fuzz/text_corpus | wc -l) seeds, vocabularies: ${ESTREAM_FUZZ_VOCAB_DIR:-built-in only})"
run gguf_fuzz fuzz/corpus -max_len=16384 &
gguf_pid=$!
run text_fuzz fuzz/text_corpus -max_len=4096 -dict=fuzz/text.dict &
text_pid=$!
failed=0
for t in gguf_fuzz:$gguf_pid text_fuzz:$text_pid; do
  if wait "${t#*:}"; then
    runs=$(grep -o 'number_of_executed_units: [0-9]*' "$BUILD/fuzz-${t%:*}.log" | grep -o '[0-9]*$')
    echo "${t%:*}: no findings in ${SECONDS_TO_RUN} s ($runs inputs)"
  else
    failed=1
    echo "${t%:*}: FINDING (reproducer in $BUILD/fuzz-artifacts/${t%:*}/); the end of its log:"
    tail -n 60 "$BUILD/fuzz-${t%:*}.log"
  fi
done
exit $failed
