#!/usr/bin/env bash
# The test command: installs missing packages, builds, runs every ctest (unit, integration,
# e2e). Extra arguments go to ctest (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
BUILD_DIR=${VARUNA_BUILD_DIR:-build}
# The dashboard's browser test drives Debian's chromium with npm's playwright-core.
if command -v npm >/dev/null 2>&1 && [[ -f tests/browser/package-lock.json ]]; then
  mkdir -p "$BUILD_DIR/browser"
  cp tests/browser/package.json tests/browser/package-lock.json "$BUILD_DIR/browser/"
  (cd "$BUILD_DIR/browser" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
    echo "test.sh: npm ci of playwright-core failed; the dashboard test will report a skip" >&2
fi
scripts/check_format.sh
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 900 "$@"
