#!/bin/bash
# A one-node Slurm on this machine (Debian's slurm-wlm and munge), for trying launch/slurm.sbatch
# as a cluster user would (docs/cluster.md). Run as root; idempotent; no systemd needed.
#   sudo launch/slurm-one-node.sh            # install, configure, start munged/slurmctld/slurmd
#   sudo launch/slurm-one-node.sh stop       # stop the daemons
# The node advertises CPUS (default 8) CPUs whatever the machine has, so an 8-task job fits on a
# 2-core workstation (oversubscribed: one BLAS thread per task keeps that workable).
set -euo pipefail
CPUS=${CPUS:-8}
if [[ "${1:-}" == stop ]]; then
  pkill -x slurmd || true; pkill -x slurmctld || true; pkill -x munged || true
  exit 0
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null
fi
HOST=$(hostname -s)
MEM=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=mpiemu-local
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=local Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
[[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c "/usr/sbin/munged"
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 30); do
  sinfo -h -o %T 2>/dev/null | grep -q -E '^(idle|mixed|allocated)' && break
  sleep 1
done
scontrol update nodename="$HOST" state=resume 2>/dev/null || true
sinfo
