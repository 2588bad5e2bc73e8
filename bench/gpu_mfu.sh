#!/usr/bin/env bash
# Benchmark (i), GPU machine only: varuna-worker P=1 vs a plain PyTorch loop (bench/gpu_loop.py,
# eager and torch.compile) training the same GPT in bf16 on one GPU, alternating systems over
# ROUNDS rounds. Reports samples/s, tokens/s and MFU = 6 * N * tokens/s / PEAK_TFLOPS (dense
# bf16: 989 for an H100 SXM) per round and the medians, as a markdown table for
# docs/benchmarks.md. Models: GPT ~350M (24 x 1024) and ~1.3B (24 x 2048), seq 1024, byte vocab.
#
# On the device machine, from the repo root (docs/gpu.md):
#   scripts/gpu_build.sh && bench/gpu_mfu.sh
# Knobs: WORKER (build-gpu/bin/varuna-worker), ROUNDS=3, STEPS=30, SKIP=10, BATCH_350M=16,
#   BATCH_1B3=8, PEAK_TFLOPS=989, COMPILE=1, PYTHON=python3, MODELS="350m 1.3b".
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
WORKER=${WORKER:-$repo/build-gpu/bin/varuna-worker}
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-30} SKIP=${SKIP:-10} PEAK_TFLOPS=${PEAK_TFLOPS:-989}
BATCH_350M=${BATCH_350M:-16} BATCH_1B3=${BATCH_1B3:-8} COMPILE=${COMPILE:-1}
PYTHON=${PYTHON:-python3} MODELS=${MODELS:-"350m 1.3b"}
[[ -x $WORKER ]] || { echo "gpu_mfu: $WORKER missing (scripts/gpu_build.sh)" >&2; exit 1; }
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' ||
  { echo "gpu_mfu: no GPU visible to $PYTHON's torch" >&2; exit 1; }
[[ -d /tmp/varuna-deps ]] && export LD_LIBRARY_PATH=/tmp/varuna-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tmp=$(mktemp -d /tmp/gpu-mfu.XXXXXX)
head -c 64000000 /dev/urandom > "$tmp/corpus.txt"
out=$tmp/results.jsonl

shape() {  # name -> "layers d_model heads batch"
  case $1 in
    350m) echo "24 1024 16 $BATCH_350M" ;;
    1.3b) echo "24 2048 16 $BATCH_1B3" ;;
    *) echo "gpu_mfu: unknown model $1" >&2; exit 1 ;;
  esac
}

run_varuna() {  # model round
  read -r L D H B <<<"$(shape "$1")"
  cat > "$tmp/job.yaml" <<YAML
name: gpu-mfu
model: {kind: gpt, layers: $L, d_model: $D, heads: $H, seq_len: 1024, vocab: 256, dropout: 0.0}
data: {kind: text, path: "$tmp/corpus.txt"}
train: {global_batch: $B, steps: $STEPS, optimizer: adamw, lr: 1e-4, warmup: 0,
        schedule: constant, clip_grad_norm: 1.0, precision: bf16, device: cuda, seed: 7}
parallel: {stages: 1, micro_batch: $B, schedule: varuna, timeout_s: 600}
YAML
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$((20000 + RANDOM % 20000)) "$WORKER" --job "$tmp/job.yaml" \
    --stage_to_rank_map "0;" --metrics_out "$tmp/varuna.jsonl" > "$tmp/varuna.log" 2>&1 ||
    { tail -30 "$tmp/varuna.log" >&2; exit 1; }
  "$PYTHON" - "$tmp/varuna.jsonl" "$SKIP" "$1" "$2" "$B" <<'PY' >> "$out"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t = statistics.median(r["step_time_s"] for r in rows if r["step"] > int(sys.argv[2]))
b = int(sys.argv[5])
print(json.dumps({"system": "varuna-worker", "model": sys.argv[3], "round": int(sys.argv[4]),
                  "step_s": t, "samples_per_s": b / t, "tokens_per_s": b * 1024 / t}))
PY
}

run_loop() {  # model round [--compile]
  read -r L D H B <<<"$(shape "$1")"
  "$PYTHON" bench/gpu_loop.py --layers "$L" --d_model "$D" --heads "$H" --seq_len 1024 \
    --vocab 256 --batch "$B" --steps "$STEPS" --skip "$SKIP" --peak_tflops "$PEAK_TFLOPS" \
    ${3:-} > "$tmp/loop.json" 2> "$tmp/loop.log" || { tail -30 "$tmp/loop.log" >&2; exit 1; }
  "$PYTHON" -c 'import json, sys; d = json.load(open(sys.argv[1])); d.update(model=sys.argv[2],
round=int(sys.argv[3])); print(json.dumps(d))' "$tmp/loop.json" "$1" "$2" >> "$out"
}

for model in $MODELS; do
  for ((r = 1; r <= ROUNDS; r++)); do
    systems="varuna eager compile"
    (( r % 2 == 0 )) && systems="compile eager varuna"
    for s in $systems; do
      case $s in
        varuna) run_varuna "$model" "$r" ;;
        eager) run_loop "$model" "$r" ;;
        compile) [[ $COMPILE == 1 ]] && run_loop "$model" "$r" --compile ;;
      esac
      echo "gpu_mfu: $model round $r $s done"
    done
  done
done

"$PYTHON" - "$out" "$PEAK_TFLOPS" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
peak = float(sys.argv[2]) * 1e12
params = {r["model"]: r["params"] for r in rows if "params" in r}
gpu = next((r["gpu"] for r in rows if "gpu" in r), "?")
print(f"\nGPU {gpu}; MFU = 6 * N * tokens/s / {peak / 1e12:.0f} TFLOP/s (dense bf16)")
print("| model | N | system | round | samples/s | tokens/s | MFU |")
print("|---|---|---|---|---|---|---|")
med = collections.defaultdict(list)
for r in rows:
    n = params[r["model"]]
    mfu = 6 * n * r["tokens_per_s"] / peak
    med[(r["model"], r["system"])].append((r["samples_per_s"], r["tokens_per_s"], mfu))
    print(f"| {r['model']} | {n / 1e6:.0f}M | {r['system']} | {r['round']} | "
          f"{r['samples_per_s']:.2f} | {r['tokens_per_s']:.0f} | {100 * mfu:.1f}% |")
print("\n| model | system | samples/s (median) | MFU | vs eager loop |")
print("|---|---|---|---|---|")
for (model, system), v in sorted(med.items()):
    s = statistics.median(x[0] for x in v)
    e = statistics.median(x[0] for x in med[(model, "pytorch-eager")])
    print(f"| {model} | {system} | {s:.2f} | {100 * statistics.median(x[2] for x in v):.1f}% | "
          f"{s / e:.3f}x |")
PY
