#!/bin/bash
# AutoConfig benchmark (docs/benchmarks.md (g)): the planner at scale (planner_scale) and its
# accuracy on this machine (bench/autoconfig.py). Needs a build (scripts/build.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build}"
echo "== planner at scale (built-in cost model, GPT-3-like layers, 80 GiB per slot)"
"$BUILD/bin/planner_scale" --slots 4,64,512,4096 --rounds 3
echo "== the same, no memory limit (every slot count has shapes)"
"$BUILD/bin/planner_scale" --slots 4,64,512,4096 --rounds 3 --memory_gib 0
echo "== predicted vs measured"
exec /usr/bin/python3 "$ROOT/bench/autoconfig.py" --build "$BUILD" "$@"
