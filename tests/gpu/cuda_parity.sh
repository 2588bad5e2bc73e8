#!/usr/bin/env bash
# The e2e parity checks of the device path (docs/gpu.md), each against a one-process run on the
# CPU, within 1e-4 relative at every step:
#   p1      varuna-worker P=1 on the device
#   pipe2   a 2-stage pipeline, two processes sharing the device (gloo; boundary tensors
#           through pinned host memory on a GPU)
#   dp2     D=2, two data-parallel processes sharing the device (gloo)
#   tp2     tensor parallelism, tp 2 as two processes sharing the device (gloo: NCCL refuses
#           two ranks on one GPU)
#   llama   model.kind llama (grouped-query attention) on the device vs llama on the CPU
#   gpt2    model.kind gpt2 on the device vs gpt2 on the CPU
#   resume_dev_cpu  STEPS/2 steps on the device with checkpoint.dir set, then resumed on the
#           CPU to STEPS (--resume_step latest), vs the uninterrupted CPU run
#   resume_cpu_dev  the reverse
# and two that must train (finite losses, the last below the first): bf16 (autocast) on the
# device, fp16 (dynamic loss scaling) on a GPU only (skipped with DEVICE=cpu).
#
# DEVICE=cuda (default; exit 77 "skipped" without a GPU, as ctest's gpu_cuda_parity expects) or
# DEVICE=cpu: every check runs the same runs and comparisons with the CPU as "the device" (what
# tests/gpu/device_check.sh --dry-run does). SHAPE=large (default: GPT 4 x 128, seq 64, batch 16,
# 20 steps) or small (2 x 64, seq 32, batch 8, 10 steps); STEPS overrides (even).
# PARITY_JSON=FILE: each check's status and max relative difference as JSON. PARITY_LOGS=DIR:
# keep each run's log, metrics and exit status there; `cuda_parity.sh --compare DIR` then
# compares what a run cut off (a timeout) had finished, the rest reported as not run.
# Prints every step's losses; exits non-zero on any failure.
# Usage (after scripts/gpu_build.sh): tests/gpu/cuda_parity.sh [WORKER]
#        tests/gpu/cuda_parity.sh --compare DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
compare() {  # DIR: every check from the runs DIR holds (meta: device shape steps)
  "$PYTHON" - "$1" "${PARITY_JSON:-}" <<'PY'
import json, math, os, sys
runs, out = sys.argv[1:3]
device, shape, steps = open(f"{runs}/meta").read().split()
steps = int(steps)
BOUND = 1e-4


def status(n):  # "ok", "failed (rc N)" or "not run"
    try:
        rc = int(open(f"{runs}/{n}.rc").read())
    except (OSError, ValueError):
        return "not run"
    return "ok" if rc == 0 else f"failed (rc {rc})"


def rows(n):
    if status(n) != "ok":
        return None
    return [json.loads(l) for l in open(f"{runs}/{n}.jsonl") if l.strip()]


def missing(name, what, *names):  # a check whose runs failed, or never ran (a cut-off run)
    bad = [n for n in names if status(n) != "ok"]
    cut = all(status(n) == "not run" for n in bad)
    checks[name] = {"status": "not run" if cut else "FAIL", "what": what,
                    "why": "; ".join(f"run {n}: {status(n)}" for n in bad) +
                    ("" if cut else " (its log says why)")}


def losses(n):
    r = rows(n)
    return None if r is None else [x["loss"] for x in r]


checks = {}


def compare(name, got, ref, what, runs_of):
    if got is None or ref is None:
        missing(name, what, *runs_of)
        return
    rel = max((abs(a - c) / abs(c) for a, c in zip(got, ref)), default=float("nan"))
    good = len(got) == len(ref) == steps and rel <= BOUND
    checks[name] = {"status": "ok" if good else "FAIL", "what": what, "max_rel": rel,
                    "steps": len(got), "bound": BOUND}
    if len(got) != steps or len(ref) != steps:
        checks[name]["why"] = f"{len(got)} and {len(ref)} steps, expected {steps}"


def trains(name, what):
    r = rows(name)
    if r is None:
        missing(name, what, name)
        return
    b = [x["loss"] for x in r]
    good = len(b) == steps and all(math.isfinite(x) for x in b) and b[-1] < b[0]
    checks[name] = {"status": "ok" if good else "FAIL", "what": what, "steps": len(b),
                    "first_loss": b[0] if b else None, "last_loss": b[-1] if b else None,
                    "overflow_steps": sum(1 for x in r if x.get("overflow"))}


ref = losses("ref")
dev = "the GPU" if device == "cuda" else "the CPU (dry run)"
compare("p1", losses("p1"), ref, f"P=1 on {dev}", ["ref", "p1"])
compare("pipe2", losses("pipe2"), ref, f"2-stage pipeline, two processes on {dev}",
        ["ref", "pipe2"])
compare("dp2", losses("dp2"), ref, f"D=2, two processes on {dev}", ["ref", "dp2"])
compare("tp2", losses("tp2"), ref, f"tp 2, two processes on {dev}", ["ref", "tp2"])
compare("llama", losses("llama"), losses("llama_ref"), f"llama (GQA) on {dev}",
        ["llama_ref", "llama"])
compare("gpt2", losses("gpt2"), losses("gpt2_ref"), f"gpt2 on {dev}", ["gpt2_ref", "gpt2"])
trains("bf16", f"bf16 autocast on {dev} trains")
if device == "cuda":
    trains("fp16", "fp16 (dynamic loss scaling) on the GPU trains")
else:
    checks["fp16"] = {"status": "skipped", "what": "fp16 trains",
                      "why": "CUDA only (no fp16 autocast on the CPU); DEVICE=cpu"}
for name, what in (("resume_dev_cpu", f"{steps // 2} steps on {dev}, resumed on the CPU"),
                   ("resume_cpu_dev", f"{steps // 2} steps on the CPU, resumed on {dev}")):
    what += f" to {steps}, vs the uninterrupted CPU run"
    a, b = losses(name + "_a"), losses(name + "_b")
    br = rows(name + "_b")
    if a is not None and br is not None and [x["step"] for x in br] != list(range(steps // 2 + 1, steps + 1)):
        checks[name] = {"status": "FAIL", "what": what, "why": "the second half did not resume "
                        f"at step {steps // 2 + 1}: steps {[x['step'] for x in br]}"}
        continue
    compare(name, None if a is None or b is None else a + b, ref, what,
            ["ref", name + "_a", name + "_b"])

cols = [("ref", "cpu"), ("p1", "P=1"), ("pipe2", "2-stage"), ("dp2", "D=2"), ("tp2", "tp 2"),
        ("bf16", "bf16")]
table = {c: losses(c) or [] for c, _ in cols}
print("step | " + " | ".join(h for _, h in cols))
for i in range(steps):
    print(f"{i + 1} | " + " | ".join(
        f"{table[c][i]:.7f}" if i < len(table[c]) else "-" for c, _ in cols))
ok = True
for name, c in checks.items():
    if c["status"] in ("FAIL", "not run"):
        ok = False
    if "max_rel" in c:
        detail = f"max relative difference {c['max_rel']:.2e} over {c['steps']} steps (bound 1e-4)"
    elif "first_loss" in c:
        detail = (f"{c['steps']} losses, {c['first_loss']:.4f} -> {c['last_loss']:.4f}, "
                  f"{c['overflow_steps']} overflow-skipped")
    else:
        detail = ""
    why = f" [{c['why']}]" if "why" in c else ""
    print(f"{name}: {c['status']}: {c['what']}{': ' + detail if detail else ''}{why}")
if out:
    with open(out, "w") as f:
        json.dump({"device": device, "shape": shape, "steps": steps, "ok": ok, "checks": checks},
                  f, indent=1)
print("cuda_parity:", "all checks passed" if ok else "FAILED",
      "(fp16 skipped: CUDA only)" if device != "cuda" else "")
sys.exit(0 if ok else 1)
PY
}
if [[ ${1:-} == --compare ]]; then
  compare "${2:?usage: cuda_parity.sh --compare DIR}"
  exit
fi
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-large}
case $DEVICE in
  cuda) WORKER=${1:-build-gpu/bin/varuna-worker} ;;
  cpu) WORKER=${1:-build/bin/varuna-worker} ;;
  *) echo "cuda_parity: DEVICE must be cuda or cpu, not '$DEVICE'" >&2; exit 2 ;;
esac
case $SHAPE in
  large) L=4 D=128 H=4 T=64 B=16 MB=4 STEPS=${STEPS:-20} ;;
  small) L=2 D=64 H=4 T=32 B=8 MB=2 STEPS=${STEPS:-10} ;;
  *) echo "cuda_parity: SHAPE must be large or small, not '$SHAPE'" >&2; exit 2 ;;
esac
((STEPS >= 4 && STEPS % 2 == 0)) || { echo "cuda_parity: STEPS must be even and >= 4" >&2; exit 2; }
HALF=$((STEPS / 2))
if [[ $DEVICE == cuda ]]; then
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    { echo "cuda_parity: no GPU; skipped"; exit 77; }
fi
[[ -x $WORKER ]] || { echo "cuda_parity: $WORKER missing" >&2; exit 1; }
[[ -d /tmp/varuna-deps ]] && export LD_LIBRARY_PATH=/tmp/varuna-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tmp=$(mktemp -d /tmp/cuda-parity.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
logs=${PARITY_LOGS:-$tmp/runs}
mkdir -p "$logs"
echo "$DEVICE $SHAPE $STEPS" > "$logs/meta"
cat docs/*.md README.md > "$tmp/corpus.txt"
echo "cuda_parity: DEVICE=$DEVICE SHAPE=$SHAPE ($L layers x $D, seq $T, batch $B, $STEPS steps)" \
  "worker $WORKER"

job() {  # name device precision [tp_size] [stages] [model kind] [steps] [checkpoint dir]
  local model
  case ${6:-gpt} in
    gpt) model="{kind: gpt, layers: $L, d_model: $D, heads: $H, seq_len: $T, vocab: 256, dropout: 0.0}" ;;
    llama) model="{kind: llama, num_hidden_layers: $L, hidden_size: $D, num_attention_heads: $H,
             num_key_value_heads: $((H / 2)), vocab_size: 256, seq_len: $T, dropout: 0.0}" ;;
    gpt2) model="{kind: gpt2, n_layer: $L, n_embd: $D, n_head: $H, vocab_size: 256, seq_len: $T,
            dropout: 0.0}" ;;
  esac
  cat > "$tmp/$1.yaml" <<YAML
name: $1
model: $model
data: {kind: text, path: "$tmp/corpus.txt"}
train: {global_batch: $B, steps: ${7:-$STEPS}, optimizer: adamw, lr: 1e-3, warmup: 0,
        schedule: constant, clip_grad_norm: 1.0, precision: $3, device: $2, seed: 3}
parallel: {stages: ${5:-1}, micro_batch: $MB, schedule: varuna, timeout_s: 60, tp_size: ${4:-1}}
YAML
  if [[ -n ${8:-} ]]; then
    echo "checkpoint: {dir: \"$8\", every_steps: $HALF}" >> "$tmp/$1.yaml"
  fi
}
run() {  # name ranks map [extra worker args]; a failed run is reported, and the checks go on
  local name=$1 ranks=$2 map=$3 t0=$SECONDS rc=0
  shift 3
  rm -f "$logs/$name.jsonl" "$logs/$name.rc"
  MASTER_PORT=$((20000 + RANDOM % 20000)) scripts/run_local.sh "$ranks" "$WORKER" \
    --job "$tmp/$name.yaml" --stage_to_rank_map "$map" --metrics_out "$logs/$name.jsonl" "$@" \
    > "$logs/$name.log" 2>&1 || rc=$?
  echo "$rc" > "$logs/$name.rc"
  if ((rc == 0)); then
    echo "  $name: $ranks rank(s), $((SECONDS - t0)) s$(grep -ho "backend=[a-z]*" "$logs/$name.log" |
      sort -u | sed 's/^/ /' | tr -d '\n')"
  else
    echo "  $name: FAILED after $((SECONDS - t0)) s; the end of its log${PARITY_LOGS:+ ($logs/$name.log)}:"
    tail -25 "$logs/$name.log" | sed 's/^/    /'
  fi
}

# The CPU references, then the device runs.
job ref cpu fp32 && run ref 1 "0;"
job p1 "$DEVICE" fp32 && run p1 1 "0;"
job pipe2 "$DEVICE" fp32 1 2 && run pipe2 2 "0;1;"
job dp2 "$DEVICE" fp32 && run dp2 2 "0,1;"
job tp2 "$DEVICE" fp32 2 && run tp2 2 "0;"
for kind in llama gpt2; do
  job "${kind}_ref" cpu fp32 1 1 "$kind" && run "${kind}_ref" 1 "0;"
  job "$kind" "$DEVICE" fp32 1 1 "$kind" && run "$kind" 1 "0;"
done
job bf16 "$DEVICE" bf16 && run bf16 1 "0;"
if [[ $DEVICE == cuda ]]; then
  job fp16 cuda fp16 && run fp16 1 "0;"
fi
# Resume across devices: the first half writes a checkpoint at step HALF and stops; the second
# resumes from it on the other device and runs to STEPS.
for order in dev_cpu cpu_dev; do
  name=resume_$order
  if [[ $order == dev_cpu ]]; then first=$DEVICE second=cpu; else first=cpu second=$DEVICE; fi
  ck=$tmp/ck_$name
  job "${name}_a" "$first" fp32 1 1 gpt "$HALF" "$ck" && run "${name}_a" 1 "0;"
  # Without the first half's checkpoint the second would start afresh: not run then.
  [[ $(cat "$logs/${name}_a.rc") == 0 ]] && job "${name}_b" "$second" fp32 1 1 gpt "$STEPS" "$ck" &&
    run "${name}_b" 1 "0;" --resume_step latest
  rm -rf "$ck"
done

compare "$logs"
