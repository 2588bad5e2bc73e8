#!/usr/bin/env bash
# The long chaos run (tests/e2e/chaos_e2e.py): EVENTS random events over one training run.
# usage: scripts/chaos.sh [EVENTS=20] [SEED=1]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/bin/varuna-manager ]] || scripts/build.sh
cd build
VARUNA_CHAOS_EVENTS=${1:-20} VARUNA_CHAOS_SEED=${2:-1} VARUNA_BIN_DIR=$PWD/bin \
  exec /usr/bin/python3 ../tests/e2e/chaos_e2e.py -v
