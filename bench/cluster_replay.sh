#!/usr/bin/env bash
# The shared-cluster replay (docs/benchmarks.md (o)): both Pollux traces at 64 and 512 slots,
# and at 512 slots with the arrivals 8x as often (--load 8: the 64-slot load per slot), every
# policy on the same jobs, then the allocator's average JCT over the queue's and static's.
# The replay is deterministic: one run per policy is the result.
# Usage: bench/cluster_replay.sh [BUILD_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$here/../build}/bin/cluster_replay"
traces="$here/../../shared/data/workloads"
[ -d "$traces" ] || traces="${VARUNA_WORKLOADS:?set VARUNA_WORKLOADS to the folder of pollux-workload-*.csv}"
for w in 1 2; do
  for run in 64:1 512:1 512:8; do
    slots=${run%:*} load=${run#*:}
    declare -A avg=()
    for policy in queue static allocator; do
      line=$("$bin" --trace "$traces/pollux-workload-$w.csv" --slots "$slots" --policy "$policy" \
             --load "$load" 2>/dev/null | tail -1)
      echo "workload-$w $line"
      avg[$policy]=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["avg_jct_s"])' "$line")
    done
    python3 -c 'import sys; a,q,s=map(float,sys.argv[1:]); print(f"workload-'"$w"' slots='"$slots"' load='"$load"': allocator/queue {a/q:.2f}x, allocator/static {a/s:.2f}x")' \
      "${avg[allocator]}" "${avg[queue]}" "${avg[static]}"
  done
done
