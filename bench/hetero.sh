#!/bin/bash
# Heterogeneous pipelines vs P x D (docs/benchmarks.md (h)): AutoConfig's best mix and best
# P x D shape on 5, 7 and 9 slots, measured side by side. Needs a build (scripts/build.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build}"
exec /usr/bin/python3 "$ROOT/bench/hetero.py" --build "$BUILD" "$@"
