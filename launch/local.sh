#!/usr/bin/env bash
# Run a workload locally on N ranks with the venv's MPI: launch/local.sh N WORKLOAD [args...]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
n=${1:?usage: launch/local.sh N WORKLOAD.toml [--set k=v ...]}
shift
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-1800}
# after `make install-site-mpi` the site's mpiexec (on PATH) belongs to mpi4py's MPI
launcher="$here/.venv/bin/mpiexec"
[ -f "$here/.venv/.site-mpi" ] && launcher=mpiexec
exec "$launcher" -n "$n" "$here/.venv/bin/mpiemu" run "$@"
