#!/usr/bin/env bash
# Stragglers: policy off vs auto vs the plan that knows the speeds (bench/stragglers.py);
# results go in docs/benchmarks.md (k). Needs root (cgroup cpu caps) and an idle machine.
# usage: bench/stragglers.sh [--rounds 5] [--factors 0.5,0.25,0.1] [--steps 300]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/bin/varuna-manager ]] || scripts/build.sh
exec /usr/bin/python3 bench/stragglers.py "$@"
