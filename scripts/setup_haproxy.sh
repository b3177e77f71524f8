#!/usr/bin/env bash
# Installs Debian 12's HAProxy (2.6) for the HAProxy test (tests/haproxy/run_haproxy_test.sh, a stage
# of scripts/test.sh; deploy/haproxy.cfg is written for this version). Separate from
# scripts/setup.sh: the build and the other tests never need it, and the test stage skips itself
# where it is absent (.ci/run goes on if this script fails). Idempotent. The package's own service
# is not used (the test runs haproxy in the foreground with its own config), so a container without
# systemd is fine: its service is kept from starting while installing.
set -euo pipefail

if dpkg-query -W -f='${Status}' haproxy 2>/dev/null | grep -q "install ok installed"; then
  echo "setup_haproxy: haproxy already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup_haproxy: installing haproxy"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# policy-rc.d exit 101: the package's init script does not start the service while installing.
restore=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  restore=1
fi
status=0
$SUDO apt-get install -y -qq --no-install-recommends haproxy || status=$?
if [ -n "$restore" ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
[ "$status" = 0 ] || { echo "setup_haproxy: apt-get install failed ($status)" >&2; exit "$status"; }
echo "setup_haproxy: done ($(haproxy -v 2>/dev/null | head -n 1 || /usr/sbin/haproxy -v | head -n 1))"
