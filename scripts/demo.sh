#!/usr/bin/env bash
# The main job on a default model that this script makes itself:
#   builds estream, writes a small OLMoE-shaped synthetic model (Q4_0; it keeps the real
#   OLMoE-1B-7B layer shapes — d 2048, 64 experts top-8, d_ff 1024 — at 4 of its 16 layers),
#   then runs a prefill of a built-in prompt and prints the answer (next-token distribution),
#   the time and the peak memory.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
MODEL=${MODEL:-models/demo-olmoe-q4_0.gguf}
BUILD_DIR=$BUILD_DIR scripts/build.sh
mkdir -p "$(dirname "$MODEL")"
if [ ! -f "$MODEL" ]; then
  "$BUILD_DIR"/tools/estream/estream synth --preset olmoe-1b-7b --layers 4 --type q4_0 --seed 1 -o "$MODEL"
fi
"$BUILD_DIR"/tools/estream/estream inspect "$MODEL" | sed -n "1,20p"
if "$BUILD_DIR"/tools/estream/estream prefill --help >/dev/null 2>&1; then
  "$BUILD_DIR"/tools/estream/estream prefill -m "$MODEL" \
    -p "The quick brown fox jumps over the lazy dog. Mixture-of-experts models route each token to a few experts, so" \
    --top-k 5
fi
