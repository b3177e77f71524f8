#!/usr/bin/env bash
# The official OpenAI Node client (tests/node) against `estream serve` on the tiny shared model,
# then SIGTERM: the server must exit 0. Skipped (exit 77) when node or the npm package is missing
# (scripts/setup.sh installs it into tests/node/node_modules).
#   server_openai_node_test.sh ESTREAM_BINARY MODEL SOURCE_DIR
set -euo pipefail
estream=$1 model=$2 src=$3
if ! command -v node >/dev/null || [ ! -d "$src/tests/node/node_modules/openai" ]; then
  echo "skipped: node or tests/node/node_modules/openai missing (run scripts/setup.sh)"
  exit 77
fi
log=$(mktemp)
"$estream" serve -m "$model" --port 0 -t 1 --api-key test-key 2>"$log" &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 300); do
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log" | head -1)
  if [ -n "$port" ] && grep -q "ready" "$log"; then break; fi
  sleep 0.1
done
[ -n "$port" ] || { cat "$log"; echo "the server did not start"; exit 1; }
node "$src/tests/node/openai_client_test.mjs" "http://127.0.0.1:$port/v1" test-key
kill -TERM $pid
status=0
wait $pid || status=$?
cat "$log"
[ "$status" = 0 ] || { echo "estream serve exited $status after SIGTERM (want 0)"; exit 1; }
grep -q "stopped" "$log" || { echo "no graceful stop in the log"; exit 1; }
echo "ok"
