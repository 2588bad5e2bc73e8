#!/usr/bin/env bash
# Starts N ranks of a command on this machine with the torchrun environment, waits for all,
# and exits non-zero if any rank failed (killing the others). A stand-in for torchrun until
# the manager and agents exist.
# Usage: run_local.sh N CMD [ARGS...]
set -uo pipefail
n=${1:?usage: run_local.sh N CMD [ARGS...]}
shift
port=${MASTER_PORT:-$((20000 + RANDOM % 20000))}
pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do
  if ! wait "$pid"; then
    rc=1
    kill "${pids[@]}" 2>/dev/null
  fi
done
exit $rc
