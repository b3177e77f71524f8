#!/usr/bin/env bash
# Throughput and latency of `estream serve` for 1/4/16/64 concurrent clients sending 128-token
# scoring requests (docs/PERFORMANCE.md, "estream serve"). Starts the server on a free port,
# waits until it is ready, runs bench/serve_load, prints its CSV and the server's peak RSS, and
# stops the server with SIGTERM. Run it under `flock -x /tmp/estream-cpu.lock` for figures.
#   scripts/serve_bench.sh MODEL [serve options, e.g. --budget 3G -t 2] -- [serve_load options]
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1; shift
serve_args=() load_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do serve_args+=("$1"); shift; done
[ $# -gt 0 ] && shift
load_args=("$@")
log=$(mktemp)
build/tools/estream/estream serve -m "$model" --port 0 "${serve_args[@]}" 2>"$log" &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 3000); do
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log" | head -1)
  if [ -n "$port" ] && grep -q "ready" "$log"; then break; fi
  if ! kill -0 $pid 2>/dev/null; then cat "$log"; exit 1; fi
  sleep 0.1
done
grep "ready" "$log"
build/bench/serve_load --port "$port" "${load_args[@]}"
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^estream_(peak_rss_bytes|budget_bytes|batches_total|prompt_tokens_total|expert_bytes_read_total|expert_cache_[a-z_]*) '
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^estream_batch_jobs_(sum|count) '
kill -TERM $pid
wait $pid
