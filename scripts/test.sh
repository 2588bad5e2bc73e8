#!/usr/bin/env bash
# The test command: installs missing packages, builds, runs every ctest (unit, integration,
# e2e; two at a time), then prints the ten slowest tests and each label's total
# (scripts/ctest_report.py). Extra arguments go to ctest (e.g. -L unit, -L manager).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
BUILD_DIR=${VARUNA_BUILD_DIR:-build}
# A CUDA build of torch means the CUDA path (and NCCL) must have been compiled: never test a
# build that left it out without saying so.
if grep -qE '^-- varuna: LibTorch .*CUDA path OFF|NCCL OFF' "$BUILD_DIR/configure.log" &&
  [[ $(grep -E '^VARUNA_CUDA:' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2) != OFF ]] &&
  "$(grep -E '^VARUNA_PYTHON_RESOLVED:' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2)" \
    -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null; then
  echo "test.sh: torch is a CUDA build but the CUDA path or NCCL was left out:" >&2
  grep -E '^-- varuna:|Warning' "$BUILD_DIR/configure.log" >&2
  exit 1
fi
# The dashboard's browser test drives Debian's chromium with npm's playwright-core.
if command -v npm >/dev/null 2>&1 && [[ -f tests/browser/package-lock.json ]]; then
  mkdir -p "$BUILD_DIR/browser"
  cp tests/browser/package.json tests/browser/package-lock.json "$BUILD_DIR/browser/"
  (cd "$BUILD_DIR/browser" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
    echo "test.sh: npm ci of playwright-core failed; the dashboard test will report a skip" >&2
fi
scripts/check_format.sh
REPO=$PWD
cd "$BUILD_DIR"
# A fresh build has no ctest cost data: seed it with the measured times (tests/test_times.txt)
# so the longest tests start first and the short ones fill the other slot.
if [[ ! -s Testing/Temporary/CTestCostData.txt ]]; then
  mkdir -p Testing/Temporary
  { awk '!/^#/ && NF == 2 { print $1, 1, $2 }' "$REPO/tests/test_times.txt"; echo ---; } \
    > Testing/Temporary/CTestCostData.txt
fi
# Three processor slots (VARUNA_TEST_JOBS): the e2e tests, which keep both cores busy, declare
# PROCESSORS 2, so one of them runs at a time, beside one light test (unit, lint, fuzz:
# PROCESSORS 1). Tests that share a test cluster take a RESOURCE_LOCK; the straggler test runs
# alone (RUN_SERIAL).
start=$(date +%s)
rc=0
ctest --output-on-failure -j"${VARUNA_TEST_JOBS:-3}" --timeout 900 \
  --output-junit Testing/ctest-junit.xml "$@" || rc=$?
python3 "$REPO/scripts/ctest_report.py" . --wall "$(($(date +%s) - start))" || true
exit "$rc"
