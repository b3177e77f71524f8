#!/usr/bin/env bash
# Installs Debian 12's Slurm (slurm-wlm 22.05: slurmctld, slurmd, the client commands) and munge,
# for the single-node Slurm test (tests/slurm/run_slurm_test.sh, a stage of scripts/test.sh).
# Separate from scripts/setup.sh: the build and the other tests never need them, and the test
# stage skips itself where they are absent. Idempotent. The packages' own services are not
# used (the test starts its own daemons in a temporary directory), so a container without
# systemd is fine: a failure of the postinst service start is harmless.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup_slurm: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup_slurm: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# policy-rc.d exit 101: the packages' init scripts do not start daemons while installing (no
# systemd here, and the test runs its own).
restore=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  restore=1
fi
status=0
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" || status=$?
if [ -n "$restore" ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
[ "$status" = 0 ] || { echo "setup_slurm: apt-get install failed ($status)" >&2; exit "$status"; }
echo "setup_slurm: done"
