#!/usr/bin/env bash
# GPU machine only (docs/gpu.md): the e2e parity checks of the CUDA path.
#   1. varuna-worker P=1 on the CPU vs on the GPU, fp32, 20 steps: losses within 1e-4 relative.
#   2. A 2-stage pipeline of two processes sharing the one GPU (gloo between them, boundary
#      tensors through pinned host memory) vs the CPU run: within 1e-4 relative.
#   3. bf16 autocast on the GPU trains (finite losses, the last below the first).
#   4. Tensor parallelism on CUDA tensors: tp 2 as two processes sharing the GPU (gloo between
#      them: NCCL refuses two ranks on one device) vs the CPU run: within 1e-4 relative.
# Prints every step's losses and exits non-zero on any failure. Exit 77 (skip) without a GPU.
# Usage (after scripts/gpu_build.sh): tests/gpu/cuda_parity.sh [WORKER]
set -euo pipefail
cd "$(dirname "$0")/../.."
WORKER=${1:-build-gpu/bin/varuna-worker}
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
  { echo "cuda_parity: no GPU; skipped"; exit 77; }
[[ -d /tmp/varuna-deps ]] && export LD_LIBRARY_PATH=/tmp/varuna-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tmp=$(mktemp -d /tmp/cuda-parity.XXXXXX)
cat docs/*.md README.md > "$tmp/corpus.txt"

job() {  # name device precision [tp_size] [stages]
  cat > "$tmp/$1.yaml" <<YAML
name: $1
model: {kind: gpt, layers: 4, d_model: 128, heads: 4, seq_len: 64, vocab: 256, dropout: 0.0}
data: {kind: text, path: "$tmp/corpus.txt"}
train: {global_batch: 16, steps: 20, optimizer: adamw, lr: 1e-3, warmup: 0, schedule: constant,
        clip_grad_norm: 1.0, precision: $3, device: $2, seed: 3}
parallel: {stages: ${5:-1}, micro_batch: 4, schedule: varuna, timeout_s: 120, tp_size: ${4:-1}}
YAML
}
run() {  # name ranks map
  MASTER_PORT=$((20000 + RANDOM % 20000)) scripts/run_local.sh "$2" "$WORKER" \
    --job "$tmp/$1.yaml" --stage_to_rank_map "$3" --metrics_out "$tmp/$1.jsonl" \
    > "$tmp/$1.log" 2>&1 || { tail -30 "$tmp/$1.log"; exit 1; }
  grep -h "backend=" "$tmp/$1.log" | sed 's/^.*\] /  /' || true
}
job cpu cpu fp32 && run cpu 1 "0;"
job gpu cuda fp32 && run gpu 1 "0;"
job pipe cuda fp32 1 2 && run pipe 2 "0;1;"
job bf16 cuda bf16 && run bf16 1 "0;"
job tp cuda fp32 2 && run tp 2 "0;"
"$PYTHON" - "$tmp" <<'PY'
import json, math, sys
tmp = sys.argv[1]
def losses(n):
    return [json.loads(l)["loss"] for l in open(f"{tmp}/{n}.jsonl") if l.strip()]
ref, ok = losses("cpu"), True
print("step | cpu | gpu | 2-stage on one gpu | tp 2 on one gpu | bf16 gpu")
b = losses("bf16")
for i, (c, g, p, t) in enumerate(zip(ref, losses("gpu"), losses("pipe"), losses("tp"))):
    print(f"{i + 1} | {c:.7f} | {g:.7f} | {p:.7f} | {t:.7f} | {b[i]:.5f}")
for name in ("gpu", "pipe", "tp"):
    got = losses(name)
    rel = max(abs(a - c) / abs(c) for a, c in zip(got, ref))
    good = len(got) == len(ref) == 20 and rel <= 1e-4
    ok &= good
    print(f"{name}: max relative difference from the CPU run over {len(got)} steps: {rel:.2e} "
          f"({'ok' if good else 'FAIL'}, bound 1e-4)")
good = all(math.isfinite(x) for x in b) and len(b) == 20 and b[-1] < b[0]
ok &= good
print(f"bf16: {len(b)} finite losses, {b[0]:.4f} -> {b[-1]:.4f} ({'ok' if good else 'FAIL'})")
sys.exit(0 if ok else 1)
PY
