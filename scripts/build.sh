#!/usr/bin/env bash
# Configures and builds into ${VARUNA_BUILD_DIR:-build} (ccache, -j2 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${VARUNA_BUILD_DIR:-build}
JOBS=${VARUNA_JOBS:-2}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${VARUNA_BUILD_TYPE:-RelWithDebInfo} >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS"
