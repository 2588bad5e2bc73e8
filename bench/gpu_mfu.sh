#!/usr/bin/env bash
# Benchmark (i), GPU machine only: varuna-worker P=1 vs a plain PyTorch loop (bench/gpu_loop.py,
# eager and torch.compile) training the same GPT in bf16 on one GPU, alternating systems over
# ROUNDS rounds. Reports samples/s, tokens/s and MFU per round and the medians, as a markdown
# table for docs/benchmarks.md. MFU two ways, over PEAK_TFLOPS (dense bf16: 989 for an H100
# SXM): 6 * N * tokens/s, and (6 * N + 12 * L * T * d) * tokens/s, attention's FLOPs counted as
# torchtitan counts them (N with the tied embedding counted once; torchtitan leaves the
# embedding out of N, less than 0.3% of N at 1.3B). Models: GPT ~350M (24 x 1024) and ~1.3B
# (24 x 2048), seq 1024, byte vocab; "tiny" (2 x 64, seq 64) for a dry run on the CPU.
#
# On the device machine, from the repo root (docs/gpu.md):
#   scripts/gpu_build.sh && bench/gpu_mfu.sh
# Knobs: WORKER (build-gpu/bin/varuna-worker), ROUNDS=3, STEPS=30, SKIP=10, BATCH_350M=16,
#   BATCH_1B3=8, BATCH_TINY=4, PEAK_TFLOPS=989, COMPILE=1, PYTHON=python3, MODELS="350m 1.3b",
#   DEVICE=cuda (cpu: the same runs on the CPU, no GPU needed, MFU n/a; what
#   tests/gpu/device_check.sh --dry-run does), CORPUS_BYTES=64000000, RESULTS_JSONL (each run's
#   row appended there as it finishes, so a run cut off keeps what it measured),
#   SYSTEMS="varuna eager compile" (which to run), TIMELINE_OUT (varuna-worker's --timeline_out
#   FILE, with --trace_steps TRACE_STEPS, default 3: docs/gpu.md "Where a step's time goes").
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
DEVICE=${DEVICE:-cuda}
WORKER=${WORKER:-$repo/build-gpu/bin/varuna-worker}
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-30} SKIP=${SKIP:-10} PEAK_TFLOPS=${PEAK_TFLOPS:-989}
BATCH_350M=${BATCH_350M:-16} BATCH_1B3=${BATCH_1B3:-8} BATCH_TINY=${BATCH_TINY:-4}
COMPILE=${COMPILE:-1} PYTHON=${PYTHON:-python3} MODELS=${MODELS:-"350m 1.3b"}
CORPUS_BYTES=${CORPUS_BYTES:-64000000}
SYSTEMS=${SYSTEMS:-"varuna eager compile"} TIMELINE_OUT=${TIMELINE_OUT:-} TRACE_STEPS=${TRACE_STEPS:-3}
timeline=()
[[ -n $TIMELINE_OUT ]] && timeline=(--timeline_out "$TIMELINE_OUT" --trace_steps "$TRACE_STEPS")
[[ -x $WORKER ]] || { echo "gpu_mfu: $WORKER missing (scripts/gpu_build.sh)" >&2; exit 1; }
case $DEVICE in
  cuda)
    "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' ||
      { echo "gpu_mfu: no GPU visible to $PYTHON's torch" >&2; exit 1; } ;;
  cpu) PEAK_TFLOPS=0 ;;  # MFU means nothing on the CPU: n/a
  *) echo "gpu_mfu: DEVICE must be cuda or cpu, not '$DEVICE'" >&2; exit 1 ;;
esac
[[ -d /tmp/varuna-deps ]] && export LD_LIBRARY_PATH=/tmp/varuna-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tmp=$(mktemp -d /tmp/gpu-mfu.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
head -c "$CORPUS_BYTES" /dev/urandom > "$tmp/corpus.txt"
out=${RESULTS_JSONL:-$tmp/results.jsonl}

shape() {  # name -> "layers d_model heads batch seq_len"
  case $1 in
    350m) echo "24 1024 16 $BATCH_350M 1024" ;;
    1.3b) echo "24 2048 16 $BATCH_1B3 1024" ;;
    tiny) echo "2 64 4 $BATCH_TINY 64" ;;
    *) echo "gpu_mfu: unknown model $1" >&2; exit 1 ;;
  esac
}

run_varuna() {  # model round
  read -r L D H B T <<<"$(shape "$1")"
  cat > "$tmp/job.yaml" <<YAML
name: gpu-mfu
model: {kind: gpt, layers: $L, d_model: $D, heads: $H, seq_len: $T, vocab: 256, dropout: 0.0}
data: {kind: text, path: "$tmp/corpus.txt"}
train: {global_batch: $B, steps: $STEPS, optimizer: adamw, lr: 1e-4, warmup: 0,
        schedule: constant, clip_grad_norm: 1.0, precision: bf16, device: $DEVICE, seed: 7}
parallel: {stages: 1, micro_batch: $B, schedule: varuna, timeout_s: 600}
YAML
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$((20000 + RANDOM % 20000)) "$WORKER" --job "$tmp/job.yaml" \
    --stage_to_rank_map "0;" --metrics_out "$tmp/varuna.jsonl" "${timeline[@]}" \
    > "$tmp/varuna.log" 2>&1 ||
    { tail -30 "$tmp/varuna.log" >&2; exit 1; }
  "$PYTHON" - "$tmp/varuna.jsonl" "$SKIP" "$1" "$2" "$B" "$T" "$L" "$D" <<'PY' >> "$out"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t = statistics.median(r["step_time_s"] for r in rows if r["step"] > int(sys.argv[2]))
b, seq, layers, d = (int(x) for x in sys.argv[5:9])
# bench/ddp_gpt.py's GPT (the worker's): wte + wpe, 12 d^2 + 13 d per block, ln_f; the head tied.
params = 256 * d + seq * d + layers * (12 * d * d + 13 * d) + 2 * d
print(json.dumps({"system": "varuna-worker", "model": sys.argv[3], "round": int(sys.argv[4]),
                  "step_s": t, "samples_per_s": b / t, "tokens_per_s": b * seq / t,
                  "params": params, "layers": layers, "d_model": d, "seq_len": seq,
                  "last_loss": rows[-1]["loss"]}))
PY
}

run_loop() {  # model round [--compile]
  read -r L D H B T <<<"$(shape "$1")"
  "$PYTHON" bench/gpu_loop.py --layers "$L" --d_model "$D" --heads "$H" --seq_len "$T" \
    --vocab 256 --batch "$B" --steps "$STEPS" --skip "$SKIP" --peak_tflops "$PEAK_TFLOPS" \
    --device "$DEVICE" ${3:-} > "$tmp/loop.json" 2> "$tmp/loop.log" ||
    { tail -30 "$tmp/loop.log" >&2; exit 1; }
  "$PYTHON" -c 'import json, sys; d = json.load(open(sys.argv[1])); d.update(model=sys.argv[2],
round=int(sys.argv[3])); print(json.dumps(d))' "$tmp/loop.json" "$1" "$2" >> "$out"
}

for model in $MODELS; do
  for ((r = 1; r <= ROUNDS; r++)); do
    systems=$SYSTEMS
    (( r % 2 == 0 )) && systems=$(tr ' ' '\n' <<<"$SYSTEMS" | tac | xargs)
    for s in $systems; do
      case $s in
        varuna) run_varuna "$model" "$r" ;;
        eager) run_loop "$model" "$r" ;;
        compile) [[ $COMPILE == 1 ]] || continue; run_loop "$model" "$r" --compile ;;
      esac
      echo "gpu_mfu: $model round $r $s done"
    done
  done
done

"$PYTHON" - "$out" "$PEAK_TFLOPS" "$DEVICE" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
peak = float(sys.argv[2]) * 1e12
params = {r["model"]: r["params"] for r in rows if "params" in r and r["system"] != "varuna-worker"}
gpu = next((r["gpu"] for r in rows if "gpu" in r), "?")


def mfus(r):  # (6N, 6N + attention) or None each when the peak is unknown
    n = params.get(r["model"], r.get("params"))
    attn = 12 * r["layers"] * r["seq_len"] * r["d_model"]
    if peak <= 0:
        return n, None, None
    return n, 6 * n * r["tokens_per_s"] / peak, (6 * n + attn) * r["tokens_per_s"] / peak


def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


if peak > 0:
    print(f"\nGPU {gpu}; MFU = 6 * N * tokens/s / {peak / 1e12:.0f} TFLOP/s (dense bf16); "
          "with attention: (6 * N + 12 * L * T * d) * tokens/s / the same")
else:
    print(f"\n{gpu} (DEVICE={sys.argv[3]}): no peak, MFU n/a")
print("| model | N | system | round | samples/s | tokens/s | MFU (6N) | MFU (6N + attn) |")
print("|---|---|---|---|---|---|---|---|")
med = collections.defaultdict(list)
for r in rows:
    n, m6, ma = mfus(r)
    med[(r["model"], r["system"])].append((r["samples_per_s"], m6, ma))
    print(f"| {r['model']} | {n / 1e6:.0f}M | {r['system']} | {r['round']} | "
          f"{r['samples_per_s']:.2f} | {r['tokens_per_s']:.0f} | {pct(m6)} | {pct(ma)} |")
print("\n| model | system | samples/s (median) | MFU (6N) | MFU (6N + attn) | vs eager loop |")
print("|---|---|---|---|---|---|")
for (model, system), v in sorted(med.items()):
    s = statistics.median(x[0] for x in v)
    eager = med.get((model, "pytorch-eager"))
    ratio = f"{s / statistics.median(x[0] for x in eager):.3f}x" if eager else "n/a"
    m6 = None if v[0][1] is None else statistics.median(x[1] for x in v)
    ma = None if v[0][2] is None else statistics.median(x[2] for x in v)
    print(f"| {model} | {system} | {s:.2f} | {pct(m6)} | {pct(ma)} | {ratio} |")
PY
