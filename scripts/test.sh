#!/usr/bin/env bash
# The test command: installs missing packages, builds, runs every ctest (unit, integration,
# e2e). Extra arguments go to ctest (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
BUILD_DIR=${VARUNA_BUILD_DIR:-build}
scripts/check_format.sh
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 900 "$@"
