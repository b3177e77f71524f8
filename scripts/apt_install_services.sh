#!/usr/bin/env bash
# apt_install_services.sh TAG PACKAGE... : installs the Debian packages not yet installed, without
# starting their services (a policy-rc.d that answers 101 while apt runs), for the test stages that
# run their own daemons (scripts/setup_slurm.sh, scripts/setup_haproxy.sh). A container without
# systemd is fine. Idempotent; exits with apt-get's status on failure. TAG prefixes the messages.
set -euo pipefail
tag=$1; shift

missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$tag: already installed: $*"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "$tag: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
restore=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  restore=1
fi
status=0
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" || status=$?
if [ -n "$restore" ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
[ "$status" = 0 ] || { echo "$tag: apt-get install failed ($status)" >&2; exit "$status"; }
echo "$tag: done"
