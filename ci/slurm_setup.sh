#!/usr/bin/env bash
# System packages for the SLURM tests (tests/jobs/test_slurm_cluster.py start a one-node cluster
# on localhost): Debian's slurm-wlm (slurmctld, slurmd, sbatch, squeue, ...) and munge.
# Idempotent: nothing to do (and no apt-get) when every command is already installed.
set -euo pipefail
COMMANDS=(munged slurmctld slurmd sbatch squeue sacct scancel scontrol sinfo)
missing=()
for cmd in "${COMMANDS[@]}"; do
  # The daemons live in sbin, which not every PATH has.
  PATH="$PATH:/usr/sbin:/usr/local/sbin" command -v "$cmd" > /dev/null || missing+=("$cmd")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "ci/slurm_setup.sh: ${missing[*]} missing; installing slurm-wlm and munge needs root" >&2
  exit 1
fi
echo "ci/slurm_setup.sh: installing slurm-wlm and munge (missing: ${missing[*]})"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq slurm-wlm munge > /dev/null
