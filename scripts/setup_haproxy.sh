#!/usr/bin/env bash
# Installs Debian 12's HAProxy (2.6) for the HAProxy test (tests/haproxy/run_haproxy_test.sh, a stage
# of scripts/test.sh; deploy/haproxy.cfg is written for this version). Separate from
# scripts/setup.sh: the build and the other tests never need it, and the test stage skips itself
# where it is absent (.ci/run goes on if this script fails). Idempotent. The package's own service
# is not used (the test runs haproxy in the foreground with its own config), so a container without
# systemd is fine: its service is kept from starting while installing.
set -euo pipefail

"$(dirname "$0")/apt_install_services.sh" setup_haproxy haproxy
echo "setup_haproxy: $(/usr/sbin/haproxy -v 2>/dev/null | head -n 1)"
