#!/usr/bin/env bash
# Morph timing per phase (bench/morph.py); results go in docs/benchmarks.md "Morphing".
# usage: bench/morph.sh [--paths relaunch,in_place] [ROUNDS] [notice|sigkill|freeze|join ...]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/bin/varuna-manager ]] || scripts/build.sh
exec /usr/bin/python3 bench/morph.py "$@"
