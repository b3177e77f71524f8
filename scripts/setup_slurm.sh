#!/usr/bin/env bash
# Installs Debian 12's Slurm (slurm-wlm 22.05: slurmctld, slurmd, the client commands) and munge,
# for the single-node Slurm test (tests/slurm/run_slurm_test.sh, a stage of scripts/test.sh).
# Separate from scripts/setup.sh: the build and the other tests never need them, and the test
# stage skips itself where they are absent. Idempotent. The packages' own services are not
# used (the test starts its own daemons in a temporary directory), so a container without
# systemd is fine: a failure of the postinst service start is harmless.
set -euo pipefail

exec "$(dirname "$0")/apt_install_services.sh" setup_slurm slurmctld slurmd slurm-client munge
