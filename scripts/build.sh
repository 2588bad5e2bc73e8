#!/usr/bin/env bash
# Configures and builds into ${VARUNA_BUILD_DIR:-build} (ccache, -j2 by default). Arguments are
# targets (default: everything), e.g. scripts/build.sh varuna-worker varuna-manager.
# LibTorch comes from the project's Python environment (scripts/python_env.sh, made by
# scripts/install_deps.sh; cmake/VarunaTorch.cmake finds it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${VARUNA_BUILD_DIR:-build}
JOBS=${VARUNA_JOBS:-2}
# ccache: paths under the clone are hashed relative to it and the directory is not hashed,
# so a clean clone in another folder (CI) hits what this machine compiled before. LibTorch's
# objects are large: give the cache room.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-20G}
command -v ccache >/dev/null && ccache --zero-stats >/dev/null
mkdir -p "$BUILD_DIR"
# A build directory configured against another Python environment (the pins changed, so
# scripts/python_env.sh made a new one) would keep the old LibTorch in its cache: start over.
cache=$BUILD_DIR/CMakeCache.txt
if [[ -f $cache && -z ${VARUNA_PYTHON:-} ]] && ! grep -qE '^VARUNA_PYTHON:FILEPATH=.+' "$cache" &&
  want=$(scripts/python_env.sh --path 2>/dev/null) &&
  [[ $(grep -E '^VARUNA_PYTHON_RESOLVED:' "$cache" | cut -d= -f2) != "$want" ]]; then
  echo "build: $BUILD_DIR was configured with another Python; configuring it afresh for $want"
  rm -rf "$cache" "$BUILD_DIR/CMakeFiles"
fi
# The configure's own lines (LibTorch's version, the CUDA path, NCCL) go to the log; all of it
# when it fails.
if ! cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${VARUNA_BUILD_TYPE:-RelWithDebInfo} \
  > "$BUILD_DIR/configure.log" 2>&1; then
  cat "$BUILD_DIR/configure.log" >&2
  exit 1
fi
grep -E '^-- varuna:' "$BUILD_DIR/configure.log" || true
targets=()
for t in "$@"; do targets+=(--target "$t"); done
start=$(date +%s)
cmake --build "$BUILD_DIR" -j"$JOBS" "${targets[@]}"
if command -v ccache >/dev/null; then
  # One line for the log: how much of this build came from the cache.
  ccache --print-stats 2>/dev/null | awk -F'\t' -v s=$(($(date +%s) - start)) '
    $1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { hit += $2 }
    $1 == "cache_miss" { miss = $2 }
    END { printf "build: %d s, ccache %d hits, %d misses\n", s, hit, miss }'
fi
