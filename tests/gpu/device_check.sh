#!/usr/bin/env bash
# The one script a lent GPU machine runs (docs/gpu.md "The device check"), within BUDGET_S
# seconds from its start (default 360). Phases write their logs into a work folder (DC_WORK,
# default /tmp/varuna-device-check, emptied first); after every phase OUT (default gpu-out)
# gets results.json and logs.tgz (that folder, packed), so a run cut off still returns what
# it measured, and OUT never holds more than those two files (a device machine returns at
# most 8):
#   env     the card (nvidia-smi), torch, CUDA, compilers
#   build   scripts/gpu_build.sh -> build-gpu/bin/varuna-worker
#   parity  tests/gpu/cuda_parity.sh (DEVICE=cuda, SHAPE=large): P=1, P=2, D=2, tp 2, llama,
#           gpt2 vs the CPU within 1e-4; bf16 and fp16 train; resume GPU <-> CPU
#   matrix  the commit's fault matrix (tests/worker/engine/fault_matrix_test.cc) with every
#           rank's state on the GPU, ranks as threads: each point x kill/freeze/split on both
#           morph paths (the rescue's side-stream copies, the rolled rescue, the in-place
#           hand-over on CUDA tensors), within 1e-4 of an unbroken run
#   timeline  varuna-worker on the bench's model for TIMELINE_STEPS steps (6) with --timeline_out
#           OUT/timeline.jsonl --trace_steps 2: each step split by device events and a profiler
#           summary by kernel category (docs/gpu.md "Where a step's time goes")
#   bench   bench/gpu_mfu.sh, the 1.3B GPT, ROUNDS=1 (COMPILE=0 unless COMPILE=1), in the time
#           left (timeout); skipped, saying so, when less than BENCH_MIN_S (60) is left
#   multi   tests/gpu/multi_check.py: D=2 over gloo on the one GPU at 350M, the commit's cost
#           (off, in place, relaunch) and a rescue after killing rank 1 (its time); last, in
#           what is left, skipped under MULTI_MIN_S (60); PHASES="multi" with BUILD=0 runs it
#           alone on a machine that built before
#   then a summary on stdout.
# --dry-run: every phase here on the CPU in a few minutes, so device minutes are never spent on
# a typo: env (the CPU, torch), build (scripts/gpu_build.sh's configure with CONFIGURE_ONLY=1
# into build-gpu-dry, which needs .gpudeps/ as the GPU run does, then scripts/build.sh
# varuna-worker fault_matrix_test -> build/bin/varuna-worker; BUILD=0 skips both and uses the
# worker there), the matrix on the CPU (bit for bit, as ctest's),
# parity with DEVICE=cpu SHAPE=small (the same runs
# and comparisons with the CPU as "the device"; fp16 reported skipped), bench with DEVICE=cpu on
# a tiny GPT, 1 round of 4 steps (MFU n/a). BUDGET_S defaults to 300 there.
# Exits non-zero when the build, any parity check or any matrix cell fails (or runs out of
# time).
# Knobs: OUT, DC_WORK, BUDGET_S, BUILD=0, PHASES, PYTHON (python3; dry: scripts/python), PARITY_STEPS, COMPILE,
#   MATRIX_MAX_S (120),
#   TIMELINE_STEPS (6; dry 4),
#   BENCH_MODELS (1.3b), BENCH_STEPS (20), BENCH_SKIP (8), BENCH_MIN_S, PEAK_TFLOPS (from the
#   card's name: H100 SXM/H200 989, H100 PCIe 756, A100 312, L4 121; else n/a).
# Usage: tests/gpu/device_check.sh [--dry-run]
set -uo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/../.."
here=tests/gpu
dry=0
case ${1:-} in
  --dry-run) dry=1 ;;
  --phase) ;;  # internal: one phase, run under timeout by the code below
  "") ;;
  *) echo "usage: tests/gpu/device_check.sh [--dry-run]" >&2; exit 2 ;;
esac
out=${OUT:-gpu-out}

# ---- one phase (the script runs itself as `--phase NAME` under `timeout`) ----
if [[ ${1:-} == --phase ]]; then
  name=$2
  [[ $DC_DRY == 1 ]] && dry=1
  case $name in
    env)
      echo "mode=$([[ $dry == 1 ]] && echo dry-run || echo gpu)"
      if [[ $dry == 1 ]]; then
        echo "device=cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(getconf _NPROCESSORS_ONLN) cores"
      else
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        echo "device=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
        echo "gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)"
      fi
      "$PYTHON" -c 'import torch, os
print("torch=" + torch.__version__)
print("cuda=" + str(torch.version.cuda) + ", available " + str(torch.cuda.is_available()))
print("gloo_headers=" + str(os.path.isdir(os.path.join(os.path.dirname(torch.__file__), "include/gloo"))))'
      echo "gxx=$(g++ --version | head -1)"
      echo "cmake=$(cmake --version | head -1)"
      if [[ $dry == 0 ]]; then
        echo "nvcc=$(command -v nvcc >/dev/null && nvcc --version | tail -1 || echo 'none on PATH')"
      fi
      ;;
    build)
      if [[ $dry == 1 ]]; then
        # The GPU run's configure with what it will carry, then this machine's worker.
        CONFIGURE_ONLY=1 PYTHON=$PWD/scripts/python scripts/gpu_build.sh build-gpu-dry &&
          scripts/build.sh varuna-worker fault_matrix_test
      else
        scripts/gpu_build.sh
      fi ;;
    parity)
      DEVICE=$DC_DEVICE SHAPE=$DC_SHAPE STEPS=${PARITY_STEPS:-} PYTHON=$PYTHON \
        PARITY_JSON=$out/parity.json PARITY_LOGS=$out/parity "$here/cuda_parity.sh" "$DC_WORKER" ;;
    timeline)
      echo "device_check: varuna-worker, model $BENCH_MODELS, $TIMELINE_STEPS steps," \
        "--timeline_out $out/timeline.jsonl --trace_steps 2"
      DEVICE=$DC_DEVICE WORKER=$DC_WORKER ROUNDS=1 STEPS=$TIMELINE_STEPS SKIP=1 SYSTEMS=varuna \
        MODELS=$BENCH_MODELS COMPILE=0 PEAK_TFLOPS=$PEAK_TFLOPS PYTHON=$PYTHON \
        CORPUS_BYTES=$CORPUS_BYTES RESULTS_JSONL=$out/timeline_run.jsonl \
        TIMELINE_OUT=$out/timeline.jsonl TRACE_STEPS=2 bench/gpu_mfu.sh ;;
    matrix)
      # Built by gpu_build.sh when .gpudeps carried GoogleTest (tests/gpu/CMakeLists.txt).
      if [[ -d /tmp/varuna-deps ]]; then
        export LD_LIBRARY_PATH=/tmp/varuna-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      fi
      VARUNA_TEST_DEVICE=$DC_DEVICE "$DC_MATRIX" --gtest_brief=1 \
        --gtest_output="json:$out/matrix.json" ;;
    multi)
      # The worker gpu_build.sh made links the packages it unpacked there (as in parity, bench).
      if [[ -d /tmp/varuna-deps ]]; then
        export LD_LIBRARY_PATH=/tmp/varuna-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      fi
      "$PYTHON" "$here/multi_check.py" --worker "$DC_WORKER" --out "$out" --device "$DC_DEVICE" \
        --model "$MULTI_MODEL" --steps "$MULTI_STEPS" ;;
    bench)
      echo "device_check: bench/gpu_mfu.sh, models $BENCH_MODELS, ROUNDS=1 (fewer rounds than" \
        "the five of the CPU benchmarks: one sample per system, no median), $BENCH_STEPS steps," \
        "the first $BENCH_SKIP skipped, COMPILE=$COMPILE, peak $PEAK_TFLOPS TFLOP/s (0 = n/a)"
      DEVICE=$DC_DEVICE WORKER=$DC_WORKER ROUNDS=1 STEPS=$BENCH_STEPS SKIP=$BENCH_SKIP \
        MODELS=$BENCH_MODELS COMPILE=$COMPILE PEAK_TFLOPS=$PEAK_TFLOPS PYTHON=$PYTHON \
        CORPUS_BYTES=$CORPUS_BYTES RESULTS_JSONL=$out/bench.jsonl bench/gpu_mfu.sh ;;
    *) echo "device_check: unknown phase $name" >&2; exit 2 ;;
  esac
  exit
fi

# ---- the run ----
if [[ $dry == 1 ]]; then
  export DC_DRY=1 DC_DEVICE=cpu DC_SHAPE=small DC_WORKER=build/bin/varuna-worker
  export DC_MATRIX=build/tests/worker/fault_matrix_test
  export PYTHON=${PYTHON:-scripts/python} BENCH_MODELS=${BENCH_MODELS:-tiny}
  export BENCH_STEPS=${BENCH_STEPS:-4} BENCH_SKIP=${BENCH_SKIP:-1} CORPUS_BYTES=1000000
  export TIMELINE_STEPS=${TIMELINE_STEPS:-4}
  export PEAK_TFLOPS=0
  # Two cores: one OpenMP thread per rank, as the agent launches workers (tests/e2e/lib).
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  budget=${BUDGET_S:-300} bench_min=${BENCH_MIN_S:-20} multi_min=${MULTI_MIN_S:-20}
  export MULTI_MODEL=${MULTI_MODEL:-tiny} MULTI_STEPS=${MULTI_STEPS:-6}
else
  export DC_DRY=0 DC_DEVICE=cuda DC_SHAPE=large DC_WORKER=build-gpu/bin/varuna-worker
  export DC_MATRIX=build-gpu/tests/gpu/fault_matrix_test
  export PYTHON=${PYTHON:-python3} BENCH_MODELS=${BENCH_MODELS:-1.3b}
  export BENCH_STEPS=${BENCH_STEPS:-20} BENCH_SKIP=${BENCH_SKIP:-8} CORPUS_BYTES=64000000
  export TIMELINE_STEPS=${TIMELINE_STEPS:-6}
  if [[ -z ${PEAK_TFLOPS:-} ]]; then
    card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    case $card in
      *"H100 PCIe"*) PEAK_TFLOPS=756 ;;
      *H100* | *H200*) PEAK_TFLOPS=989 ;;
      *A100*) PEAK_TFLOPS=312 ;;
      *L4*) PEAK_TFLOPS=121 ;;
      *) PEAK_TFLOPS=0 ;;
    esac
  fi
  export PEAK_TFLOPS
  budget=${BUDGET_S:-360} bench_min=${BENCH_MIN_S:-60} multi_min=${MULTI_MIN_S:-60}
  export MULTI_MODEL=${MULTI_MODEL:-350m} MULTI_STEPS=${MULTI_STEPS:-8}
fi
# Which phases after env and build run (PHASES, default all): "multi" alone with BUILD=0
# reruns the multi-rank checks on a machine that built before.
phases=" ${PHASES:-parity matrix timeline bench multi} "
for p in $phases; do
  case $p in parity | matrix | timeline | bench | multi) ;;
    *) echo "device_check: PHASES names '$p'; expected parity, matrix, timeline, bench, multi" >&2
       exit 2 ;;
  esac
done
wanted() { [[ $phases == *" $1 "* ]]; }
export COMPILE=${COMPILE:-0} PARITY_STEPS=${PARITY_STEPS:-}
mode=$([[ $dry == 1 ]] && echo dry-run || echo gpu)
# `ret` is what comes back (results.json, logs.tgz); the phases write into `out`, the work
# folder, which every phase's own OUT names.
ret=$out
mkdir -p "$ret"
ret=$(cd "$ret" && pwd)
out=${DC_WORK:-${TMPDIR:-/tmp}/varuna-device-check}
mkdir -p "$out" && out=$(cd "$out" && pwd)
if [[ $ret == "$out" || $ret == "$out"/* || $out == "$ret"/* ]]; then
  echo "device_check: DC_WORK ($out) and OUT ($ret) must be apart: OUT gets the work packed" >&2
  exit 2
fi
rm -rf "$out" && mkdir -p "$out"
export OUT=$out
# OUT's own files, and what the layout before 2026-11-29 left there (logs, parity/).
rm -rf "$ret"/{results.json,logs.tgz,.results.json.part,.logs.tgz.part} \
  "$ret"/{env,build,parity,matrix,timeline,bench,multi}.log \
  "$ret"/{parity,matrix,.phases,multi}.json \
  "$ret"/{bench,timeline,timeline_run}.jsonl "$ret/parity" "$ret/multi"
ship() {  # results.json and the packed logs into `ret`, each replaced whole
  [[ -f $out/results.json ]] && cp "$out/results.json" "$ret/.results.json.part" &&
    mv "$ret/.results.json.part" "$ret/results.json"
  tar czf "$ret/.logs.tgz.part" -C "$out" . 2>/dev/null && mv "$ret/.logs.tgz.part" "$ret/logs.tgz"
  return 0
}
report() {
  "$PYTHON" "$here/device_check_report.py" "$@"
  local rc=$?
  ship
  return $rc
}
report start "$out" "$mode" "$DC_DEVICE" "$budget" ||
  { echo "device_check: $PYTHON cannot run $here/device_check_report.py" >&2; exit 1; }
t0=$SECONDS
left() { echo $((budget - (SECONDS - t0))); }
say() { echo "device_check: [$((SECONDS - t0)) s] $*"; }

phase() {  # name [key=value ...]: runs the phase in what is left of the budget (at most
  # PHASE_CAP seconds when set); sets prc
  local name=$1 t=$SECONDS l
  shift
  l=$(left)
  if ((l <= 5)); then
    say "$name skipped: the budget ($budget s) is spent"
    report record "$out" "$name" 0 0 "skipped=the budget ($budget s) was spent" "$@"
    prc=124
    return
  fi
  if [[ -n ${PHASE_CAP:-} ]] && ((PHASE_CAP < l)); then l=$PHASE_CAP; fi
  say "$name ... (at most $l s)"
  timeout --kill-after=10 "$l" "$self" --phase "$name" > "$out/$name.log" 2>&1
  prc=$?
  if [[ $name == parity && ! -f $out/parity.json && -f $out/parity/meta ]]; then
    # Cut off: compare what the finished runs hold (the rest is reported as not run).
    echo "device_check: parity cut off (rc $prc); comparing the runs that finished" \
      >> "$out/parity.log"
    PYTHON=$PYTHON PARITY_JSON=$out/parity.json "$here/cuda_parity.sh" --compare \
      "$out/parity" >> "$out/parity.log" 2>&1
  fi
  report record "$out" "$name" "$prc" "$((SECONDS - t))" "$@"
  say "$name rc=$prc in $((SECONDS - t)) s$( ((prc == 124 || prc == 137)) && echo ' (ran out of time)')"
}

say "$mode, OUT=$ret (results.json, logs.tgz; the logs in $out), budget $budget s"
phase env
cat "$out/env.log"

rc=0
# What the GPU run's build needs that git does not carry (scripts/gpu_deps.sh makes it here;
# the device call names it in `carry`).
carried=ok
# A GPU run with BUILD=0 uses the worker and the unpacked packages of an earlier call.
if [[ ! ($dry == 0 && ${BUILD:-1} == 0) ]] && ! ls .gpudeps/*.deb >/dev/null 2>&1; then
  carried=".gpudeps/ is empty: the GPU machine cannot build without it; run scripts/gpu_deps.sh here and carry .gpudeps"
  say "$carried"
fi
if [[ ${BUILD:-1} == 0 ]]; then
  if [[ -x $DC_WORKER ]]; then
    say "build skipped (BUILD=0): using $DC_WORKER as it is"
    report record "$out" build 0 0 "skipped=BUILD=0: using $DC_WORKER as built before" \
      "worker=$DC_WORKER"
  else
    say "build skipped (BUILD=0) but $DC_WORKER is missing"
    report record "$out" build 1 0 "worker=$DC_WORKER"
    rc=1
  fi
else
  phase build "worker=$DC_WORKER"
  if ((prc != 0)) || [[ ! -x $DC_WORKER ]]; then
    say "build FAILED; the errors:"
    grep -E -A12 "CMake Error" "$out/build.log" | head -40
    grep -E "error:|FAILED:" "$out/build.log" | head -60
    tail -5 "$out/build.log"
    rc=1
  else
    grep -E "varuna: LibTorch|WARNING" "$out/build.log" | head
  fi
fi

if ((rc != 0)); then
  report record "$out" parity 0 0 "skipped=the build failed"
  report record "$out" matrix 0 0 "skipped=the build failed"
  report record "$out" timeline 0 0 "skipped=the build failed"
  report record "$out" bench 0 0 "skipped=the build failed"
  report record "$out" multi 0 0 "skipped=the build failed"
  report final "$out"
  exit 1
fi

if wanted parity; then
  phase parity
  ((prc == 0)) || rc=1
  grep -E "^[a-z0-9_]+: (ok|FAIL|skipped|not run)|^cuda_parity:|FAILED" "$out/parity.log" 2>/dev/null
else
  report record "$out" parity 0 0 "skipped=not in PHASES"
fi

if ! wanted matrix; then
  report record "$out" matrix 0 0 "skipped=not in PHASES"
elif [[ ! -x $DC_MATRIX ]]; then
  say "matrix skipped: $DC_MATRIX was not built (.gpudeps without GoogleTest?)"
  report record "$out" matrix 0 0 "skipped=$DC_MATRIX was not built (no GoogleTest in .gpudeps)"
else
  # Capped (MATRIX_MAX_S, 120): a cell that hangs must not take the phases after it.
  PHASE_CAP=${MATRIX_MAX_S:-120} phase matrix "device=$DC_DEVICE"
  ((prc == 0)) || rc=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/matrix.log" | head -20
fi

if wanted timeline; then
  phase timeline "steps=$TIMELINE_STEPS" "models=$BENCH_MODELS"
  ((prc == 0)) || tail -15 "$out/timeline.log"
else
  report record "$out" timeline 0 0 "skipped=not in PHASES"
fi

l=$(left)
note="ROUNDS=1: one round per system, fewer than the five rounds of the CPU benchmarks"
[[ $dry == 1 ]] && note="$note; dry run on the CPU, tiny model: MFU n/a"
if ! wanted bench; then
  report record "$out" bench 0 0 "skipped=not in PHASES"
elif ((l < bench_min)); then
  say "bench skipped: $l s left, under BENCH_MIN_S=$bench_min"
  report record "$out" bench 0 0 "skipped=only $l s of the budget left (BENCH_MIN_S=$bench_min)"
else
  phase bench "peak_tflops=$PEAK_TFLOPS" "models=$BENCH_MODELS" rounds=1 \
    "steps=$BENCH_STEPS" "note=$note"
  ((prc == 124 || prc == 137)) && say "bench cut off by the budget; the rows it finished are kept"
  sed -n '/^| model/,$p' "$out/bench.log"
  ((prc == 0)) || tail -15 "$out/bench.log"
fi

l=$(left)
if ! wanted multi; then
  report record "$out" multi 0 0 "skipped=not in PHASES"
elif ((l < multi_min)); then
  say "multi skipped: $l s left, under MULTI_MIN_S=$multi_min (rerun: PHASES=multi BUILD=0)"
  report record "$out" multi 0 0 \
    "skipped=only $l s of the budget left (MULTI_MIN_S=$multi_min; rerun with PHASES=multi BUILD=0)"
else
  phase multi "model=$MULTI_MODEL"
  grep -E "^multi_check:" "$out/multi.log"
  ((prc == 0)) || tail -15 "$out/multi.log"
fi

# What the run itself needs besides the phases, recorded before the end: what the GPU run
# carries, and an OUT that a device machine can return whole (at most 8 files).
extra=$(find "$ret" -type f ! -name results.json ! -name logs.tgz | wc -l)
if [[ $carried != ok ]]; then
  report record "$out" carry 1 0 "note=$carried"
elif ((extra > 0)); then
  report record "$out" carry 1 0 \
    "note=$ret holds $extra file(s) besides results.json and logs.tgz; a device machine returns at most 8"
else
  report record "$out" carry 0 0 "note=what the GPU run carries is there; OUT holds results.json and logs.tgz alone"
fi
report final "$out"
if [[ $carried != ok ]] || ((extra > 0)); then
  say "FAILED: $(if [[ $carried != ok ]]; then echo "$carried"; else echo "$ret holds other files"; fi)"
  rc=1
fi
exit $rc
