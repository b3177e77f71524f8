#!/usr/bin/env bash
# HAProxy (Debian's haproxy 2.6) in front of two `estream serve` instances on 127.0.0.1 (issue 24):
# a bounded load test through HAProxy keeps answering while one server is stopped (SIGTERM) and
# restarted, then the other killed (SIGKILL) and restarted; a request fails only if it was in
# flight at a signal, and the client retries it; every answer equals a single server's; a server
# set to drain on HAProxy's admin socket gets no new request. The servers run deploy/estream@.service's ExecStart line
# and HAProxy runs deploy/haproxy.cfg (ports and process settings substituted). Details:
# tests/haproxy/haproxy_load_test.py.
#
#   tests/haproxy/run_haproxy_test.sh [ESTREAM_BINARY]     (default build/tools/estream/estream)
#
# Skips (exit 0, with a message) when haproxy is not installed (scripts/setup_haproxy.sh installs
# it). Every wait has a timeout and the whole test a limit (HAPROXY_TEST_TIMEOUT, default 150 s);
# the servers and HAProxy die with the test however it ends. KEEP_DIR=1 keeps the directory (logs,
# the generated haproxy.cfg). Also checks deploy/estream@.service with `systemd-analyze verify`
# where that exists. HAPROXY_TEST_REQUESTS (default 400) and HAPROXY_TEST_CLIENTS (8) size the load.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
E=$(realpath "${1:-$ROOT/build/tools/estream/estream}")

HAPROXY=$(command -v haproxy || true)
[ -z "$HAPROXY" ] && [ -x /usr/sbin/haproxy ] && HAPROXY=/usr/sbin/haproxy
if [ -z "$HAPROXY" ]; then
  echo "haproxy test: SKIPPED (haproxy not installed; scripts/setup_haproxy.sh installs it)"
  exit 0
fi
[ -x "$E" ] || { echo "haproxy test: FAILED: no estream binary at $E (build first)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "haproxy test: FAILED: python3 needed" >&2; exit 1; }
echo "haproxy test: $("$HAPROXY" -v | head -n 1)"

D=$(mktemp -d /tmp/estream-haproxy.XXXXXX)
cleanup() {
  if [ "${KEEP_DIR:-0}" = 1 ]; then echo "haproxy test: kept $D"; else rm -rf "$D"; fi
}
trap cleanup EXIT

# The unit file: systemd's own check, with ExecStart pointing at a binary that exists here.
if command -v systemd-analyze >/dev/null; then
  mkdir -p "$D/unit"
  sed "s|/usr/local/bin/estream|$E|" "$ROOT/deploy/estream@.service" >"$D/unit/estream@.service"
  # Any line naming the unit fails the test: verify exits 0 on settings it ignores ("Failed to
  # parse ..., ignoring").
  rc=0
  out=$(timeout 30 systemd-analyze verify "$D/unit/estream@18101.service" 2>&1) || rc=$?
  if grep -q "estream@" <<<"$out"; then
    echo "haproxy test: FAILED: systemd-analyze verify deploy/estream@.service: $out" >&2
    exit 1
  elif [ $rc = 0 ]; then
    echo "haproxy test: systemd-analyze verify deploy/estream@.service: ok"
  else  # a complaint about this machine's systemd, not about the unit
    echo "haproxy test: systemd-analyze verify could not check the unit here ($rc): $out"
  fi
fi

rc=0
timeout -k 10 "${HAPROXY_TEST_TIMEOUT:-150}" python3 "$ROOT/tests/haproxy/haproxy_load_test.py" --estream "$E" \
  --root "$ROOT" --dir "$D" --haproxy "$HAPROXY" --requests "${HAPROXY_TEST_REQUESTS:-400}" \
  --clients "${HAPROXY_TEST_CLIENTS:-8}" || rc=$?
if [ $rc != 0 ]; then
  [ $rc = 124 ] && echo "haproxy test: FAILED: over the time limit (HAPROXY_TEST_TIMEOUT)" >&2
  for f in "$D"/s1.log "$D"/s2.log "$D"/haproxy.log; do
    [ -f "$f" ] && { echo "---- tail of $f"; tail -n 15 "$f"; } >&2
  done
  exit 1
fi
