#!/usr/bin/env bash
# The main job on its built-in default: installs what is missing, builds, prepares the
# fortunes corpus (a tokenizer and a Megatron indexed dataset, with scripts/varuna-data), starts a local varuna-manager and two varuna-agents (2 slots each),
# submits the small GPT job (2 pipeline stages x 2 data-parallel replicas) with
# `varunactl submit --follow`, and shuts everything down when it ends. Extra arguments go
# to `varunactl submit` (e.g. --steps 50, --set train.lr=1e-3). VARUNA_DEMO_JOB=FILE runs
# another job file (examples/jobs/llama_fortunes.yaml: a small Llama, checkpointed to
# build/demo/checkpoints for `varuna-ckpt export`).
# The loss falls from ~6.2 (uniform over the 512 tokens) to about 4.5 in the 200 steps.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh varuna-manager varuna-agent varunactl varuna-worker
BUILD_DIR=${VARUNA_BUILD_DIR:-build}
[[ $BUILD_DIR == /* ]] || BUILD_DIR=$PWD/$BUILD_DIR
BIN=$BUILD_DIR/bin
DEMO=$BUILD_DIR/demo
rm -rf "$DEMO/cluster"
mkdir -p "$DEMO/cluster"
# The corpus (docs/data.md): the English text of Debian's fortunes package, one document per
# fortune, tokenized by a byte-level BPE of 512 tokens that varuna-data trains on it (with
# Hugging Face's tokenizers) into a Megatron indexed dataset.
fortunes=/usr/share/games/fortunes
if [[ ! -d $fortunes ]]; then
  echo "demo: $fortunes missing; run scripts/install_deps.sh" >&2
  exit 1
fi
mapfile -t inputs < <(find -L "$fortunes" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
scripts/varuna-data tokenizer --input "${inputs[@]}" --delimiter % --vocab 512 \
  --out "$DEMO/tokenizer"
scripts/varuna-data prepare --tokenizer "$DEMO/tokenizer" --input "${inputs[@]}" --delimiter % \
  --out "$DEMO/fortunes" --workers 2
# VARUNA_DEMO_JOB picks another job file (examples/jobs/llama_fortunes.yaml).
sed -e "s|@CORPUS@|$DEMO/fortunes|" -e "s|@TOKENIZER@|$DEMO/tokenizer|" \
  -e "s|@CHECKPOINTS@|$DEMO/checkpoints|" \
  "${VARUNA_DEMO_JOB:-examples/jobs/gpt_fortunes.yaml}" > "$DEMO/job.yaml"

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export VARUNA_MANAGER=127.0.0.1:$port
http_port=${VARUNA_DASHBOARD_PORT:-$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
echo "dashboard: http://127.0.0.1:$http_port/  (Prometheus metrics: http://127.0.0.1:$http_port/metrics)"
# Run as root, the agents start workers as the unprivileged user 'varuna' (made by
# install_deps.sh); if that user cannot reach the worker binary or the corpus from here (a
# checkout under a private home), they run as root instead, said out loud.
worker_flags=()
if [[ $(id -u) -eq 0 ]] && ! runuser -u varuna -- test -x "$BIN/varuna-worker" -a -r "$DEMO/fortunes.bin" 2>/dev/null; then
  echo "demo: user 'varuna' cannot reach $BIN; workers run as root (--allow_root_workers)"
  worker_flags=(--allow_root_workers)
fi
pids=()
cleanup() {
  # Agents first (they stop their workers), then the manager.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

"$BIN/varuna-manager" --listen "$VARUNA_MANAGER" --state_dir "$DEMO/cluster/manager" \
  --http_listen "127.0.0.1:$http_port" 2> "$DEMO/cluster/manager.log" &
pids+=($!)
for n in 0 1; do
  "$BIN/varuna-agent" --manager "$VARUNA_MANAGER" --listen 127.0.0.1:0 --slots 2 \
    --name "agent$n" --work_dir "$DEMO/cluster/agent$n" "${worker_flags[@]}" \
    2> "$DEMO/cluster/agent$n.log" &
  pids+=($!)
done
for _ in $(seq 100); do
  alive=$("$BIN/varunactl" nodes 2>/dev/null | grep -c ALIVE || true)
  [[ $alive == 2 ]] && break
  sleep 0.2
done
"$BIN/varunactl" nodes
rc=0
"$BIN/varunactl" submit "$DEMO/job.yaml" --follow "$@" || rc=$?
"$BIN/varunactl" list
echo "logs: $DEMO/cluster (varunactl logs ID --rank R while the cluster runs)"
echo "dashboard was at http://127.0.0.1:$http_port/ (the cluster stops with this script;" \
  "VARUNA_DEMO_HOLD=1 keeps it up until Ctrl-C)"
if [[ ${VARUNA_DEMO_HOLD:-0} == 1 ]]; then
  echo "holding the cluster: the dashboard stays at http://127.0.0.1:$http_port/; Ctrl-C to stop"
  while sleep 3600; do :; done
fi
exit $rc
