#!/usr/bin/env bash
# Throughput and latency of `estream serve` for 1/4/16/64 concurrent clients sending 128-token
# scoring requests (docs/PERFORMANCE.md, "estream serve"). Starts the server on a free port,
# waits until it is ready, runs bench/serve_load, prints its CSV and the server's peak RSS, and
# stops the server with SIGTERM. Run it under `flock -x /tmp/estream-cpu.lock` for figures.
#   scripts/serve_bench.sh MODEL [serve options, e.g. --budget 3G -t 2] -- [serve_load options]
# The same load against llama-server (the comparison of issue 20), on the routes both serve
# (serve_load --route next or embed; llama-server has no echo logprobs):
#   scripts/serve_bench.sh --llama-server BIN MODEL [llama-server options] -- [serve_load options]
# Either way the last line is the server's peak RSS (VmHWM of its process), `peak_rss_bytes N`.
set -euo pipefail
cd "$(dirname "$0")/.."
llama=""
if [ "${1:-}" = "--llama-server" ]; then llama=$2; shift 2; fi
model=$1; shift
serve_args=() load_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do serve_args+=("$1"); shift; done
[ $# -gt 0 ] && shift
load_args=("$@")
log=$(mktemp)
if [ -n "$llama" ]; then
  # llama-server needs a port given; take a free one from the kernel.
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$llama" -m "$model" --host 127.0.0.1 --port "$port" "${serve_args[@]}" >"$log" 2>&1 &
else
  build/tools/estream/estream serve -m "$model" --port 0 "${serve_args[@]}" 2>"$log" &
  port=""
fi
pid=$!
trap 'kill -9 $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 3000); do
  if [ -n "$llama" ]; then
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && break
  else
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log" | head -1)
    if [ -n "$port" ] && grep -q "ready" "$log"; then break; fi
  fi
  if ! kill -0 $pid 2>/dev/null; then cat "$log"; exit 1; fi
  sleep 0.1
done
if [ -n "$llama" ]; then echo "llama-server ready on port $port"; else grep "ready" "$log"; fi
build/bench/serve_load --port "$port" "${load_args[@]}"
if [ -z "$llama" ]; then
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^estream_(peak_rss_bytes|budget_bytes|batches_total|prompt_tokens_total|expert_bytes_read_total|expert_cache_[a-z_]*) '
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^estream_batch_jobs_(sum|count) '
fi
echo "peak_rss_bytes $(awk '/^VmHWM:/ {printf "%.0f", $2 * 1024}' /proc/$pid/status)"
kill -TERM $pid
if [ -n "$llama" ]; then wait $pid || true; else wait $pid; fi
