#!/usr/bin/env bash
# The long chaos runs.
#   scripts/chaos.sh [EVENTS=20] [SEED=1]   EVENTS random events over one training run
#                                           (tests/e2e/chaos_e2e.py)
#   scripts/chaos.sh --matrix [LINK_CUTS=10] every fault point x action of one step, on the
#                                           relaunch and the in-place path (tests/e2e/
#                                           commit_e2e.py, Note [Faults]), then LINK_CUTS
#                                           runs of ctest morph_link_cut (netns)
#   scripts/chaos.sh --faults [RUNS=10] [FAULTS=10] [SEED=1] [FIRST=0]
#                                           RUNS jobs with FAULTS random faults each (from
#                                           run FIRST: the same faults as a full soak's);
#                                           VARUNA_COMMIT_SOAK_PATH=relaunch|in_place picks
#                                           the path (default: the manager's, in place)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/bin/varuna-manager ]] || scripts/build.sh
cd build
if [[ ${1:-} == --faults ]]; then
  VARUNA_COMMIT_SOAK=${2:-10}:${3:-10}:${4:-1}:${5:-0} VARUNA_BIN_DIR=$PWD/bin \
    exec /usr/bin/python3 ../tests/e2e/commit_e2e.py -v SoakTest
fi
if [[ ${1:-} == --matrix ]]; then
  VARUNA_COMMIT_MATRIX=1 VARUNA_BIN_DIR=$PWD/bin /usr/bin/python3 ../tests/e2e/commit_e2e.py -v
  exec ctest -R '^morph_link_cut$' --output-on-failure --repeat "until-fail:${2:-10}"
fi
VARUNA_CHAOS_EVENTS=${1:-20} VARUNA_CHAOS_SEED=${2:-1} VARUNA_BIN_DIR=$PWD/bin \
  exec /usr/bin/python3 ../tests/e2e/chaos_e2e.py -v
