#!/usr/bin/env bash
# Runs every libFuzzer target for a set time and prints a results row per target
# (docs/fuzzing.md has the table and how to read it).
#
#   bench/fuzz.sh [CPU_SECONDS] [TARGET...]  default 600 CPU-s each, all targets, 2 at a time
#
# Builds the targets with clang (-fsanitize=fuzzer,address,undefined) into build-fuzz/ (the
# code without LibTorch only), starts each from its seed corpus in tests/fuzz/corpus/<target>
# with a scratch copy of it, and stops it (SIGINT, so libFuzzer prints its final stats) once
# the fuzzer process has used CPU_SECONDS of CPU (utime + stime from /proc/PID/stat: time the
# machine gave to others does not count). Records executions, coverage and any crash, leak or
# timeout (an input that takes over 10 s). Crashing inputs are kept in
# build-fuzz/findings/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
CPU_BUDGET=${1:-600}
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(job_spec_fuzz submission_fuzz stage_map_fuzz checkpoint_fuzz rpc_fuzz worker_protocol_fuzz
                            progress_fuzz http_request_fuzz safetensors_fuzz)
PARALLEL=${VARUNA_FUZZ_PARALLEL:-2}

if ! command -v clang++ >/dev/null || ! dpkg-query -W libclang-rt-14-dev >/dev/null 2>&1; then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get install -y -q --no-install-recommends clang libclang-rt-14-dev
fi
scripts/install_deps.sh >/dev/null
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DVARUNA_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  >/dev/null
cmake --build build-fuzz -j"${VARUNA_JOBS:-2}" >/dev/null

run_one() {
  local t=$1 out=build-fuzz/runs/$1
  rm -rf "$out" && mkdir -p "$out/corpus" "build-fuzz/findings/$t"
  cp tests/fuzz/corpus/"$t"/* "$out/corpus/"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    build-fuzz/fuzz/"$t" "$out/corpus" -max_total_time=$((CPU_BUDGET * 20)) -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/findings/$t/" >"$out/log" 2>&1 &
  local pid=$! ticks cpu=0 hz
  hz=$(getconf CLK_TCK)
  while kill -0 "$pid" 2>/dev/null; do
    ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    ((ticks > 0)) && cpu=$((ticks / hz))
    if ((cpu >= CPU_BUDGET)); then
      kill -INT "$pid"
      break
    fi
    sleep 2
  done
  local rc=0
  wait "$pid" || rc=$?
  local execs cov found
  execs=$(grep -m1 "stat::number_of_executed_units" "$out/log" | awk '{print $2}')
  cov=$(grep -o "cov: [0-9]*" "$out/log" | tail -1 | awk '{print $2}')
  found=$(find "build-fuzz/findings/$t" -type f | wc -l)
  echo "$t rc=$rc cpu=$cpu execs=${execs:-?} cov=${cov:-?} findings=$found" >"$out/summary"
}

mkdir -p build-fuzz/runs
for ((i = 0; i < ${#TARGETS[@]}; i += PARALLEL)); do
  pids=()
  for t in "${TARGETS[@]:i:PARALLEL}"; do
    run_one "$t" &
    pids+=($!)
  done
  wait "${pids[@]}" || true
done

date_now=$(date -u +%Y-%m-%d)
printf '| %-16s | %-10s | %-6s | %-12s | %-8s | %-8s |\n' target date "CPU s" executions coverage findings
for t in "${TARGETS[@]}"; do
  s=build-fuzz/runs/$t/summary
  field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" "$s"; }
  printf '| %-16s | %-10s | %-6s | %-12s | %-8s | %-8s |\n' "$t" "$date_now" "$(field cpu)" \
    "$(field execs)" "$(field cov)" "$(field findings)"
done
