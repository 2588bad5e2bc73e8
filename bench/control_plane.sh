#!/usr/bin/env bash
# Control-plane benchmark: one real varuna-manager, AGENTS simulated agents (bench/
# control_plane_load.cc, one gRPC connection each) heartbeating every PERIOD seconds for
# DURATION seconds. For each configuration in CONFIGS ("agents:workers_per_agent") it
# reports heartbeat latency percentiles as the agents see them, the manager's CPU (user +
# system from /proc/PID/stat over the counted window, as % of one core), its peak RSS, and
# how long `varunactl nodes -o json` takes with that many nodes. Each configuration gets a
# fresh manager and state dir. Prints a markdown table for docs/benchmarks.md.
# Builds nothing: run after scripts/build.sh. About 40 s per configuration.
# Usage: BUILD_DIR=/work/build bench/control_plane.sh
# With METRICS="off on" (the default) every configuration runs twice, alternating: without
# and with the metrics pipeline (--http_listen, heartbeat round trips into histograms, and a
# scraper reading /metrics every SCRAPE_S seconds (15, a common Prometheus scrape_interval; the default is 60
# s)); ROUNDS repeats the whole sweep.
# With STORE="sqlite etcd" each configuration also runs with the state in etcd (a 3-member
# etcd on loopback from scripts/etcd_test_cluster.sh; the manager elected on it first; docs/
# operations.md "Several managers"). CPU per 1,000 heartbeats/s is the manager's CPU over
# the heartbeat rate: the load tool shares the same cores, so a rate this machine cannot
# drive is extrapolated from it, not measured.
# Knobs: BUILD_DIR (default build), CONFIGS="100:0 1000:0 1000:8", PERIOD=1, DURATION=35,
#   WARMUP=5, METRICS="off on", STORE=sqlite, ROUNDS=1, SCRAPE_S=15, TIMEOUT_S=5 (each RPC's
#   deadline), CONNECTIONS=0 (gRPC connections the simulated agents share; 0 = one each,
#   which needs a descriptor limit above the agent count), KEEP_TMP=0.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-${VARUNA_BUILD_DIR:-build}}
[[ $BUILD_DIR == /* ]] || BUILD_DIR=$PWD/$BUILD_DIR
BIN=$BUILD_DIR/bin
CONFIGS=${CONFIGS:-"100:0 1000:0 1000:8"}
METRICS=${METRICS:-"off on"} ROUNDS=${ROUNDS:-1} SCRAPE_S=${SCRAPE_S:-15}
STORE=${STORE:-sqlite}
PERIOD=${PERIOD:-1} DURATION=${DURATION:-35} WARMUP=${WARMUP:-5}
for b in varuna-manager varunactl control_plane_load; do
  [[ -x $BIN/$b ]] || { echo "control_plane.sh: $BIN/$b not built (run scripts/build.sh)" >&2; exit 2; }
done
ulimit -n 65536 2>/dev/null || ulimit -n 4096
tmp=$(mktemp -d /tmp/varuna_cp_bench.XXXXXX)
mgr_pid= load_pid= scrape_pid=
etcd_env=(VARUNA_ETCD_DIR="$tmp/etcd" VARUNA_ETCD_PORT="${ETCD_PORT:-24590}")
endpoints=
if [[ $STORE == *etcd* ]]; then
  endpoints=$(env "${etcd_env[@]}" scripts/etcd_test_cluster.sh start 3 | tail -1)
fi
cleanup() {
  [[ -n $endpoints ]] && env "${etcd_env[@]}" scripts/etcd_test_cluster.sh stop > /dev/null 2>&1 || true
  [[ -n $scrape_pid ]] && kill -TERM "$scrape_pid" 2>/dev/null || true
  [[ -n $load_pid ]] && kill -TERM "$load_pid" 2>/dev/null || true
  [[ -n $mgr_pid ]] && kill -TERM "$mgr_pid" 2>/dev/null && wait "$mgr_pid" 2>/dev/null || true
  [[ ${KEEP_TMP:-0} == 1 ]] || rm -rf "$tmp"
}
trap cleanup EXIT
hz=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
rows=()
for ((round = 1; round <= ROUNDS; round++)); do
for cfg in $CONFIGS; do
for store in $STORE; do
for metrics in $METRICS; do
  agents=${cfg%%:*} workers=${cfg##*:}
  addr=127.0.0.1:$(free_port)
  state=$tmp/state_${agents}_${workers}_${metrics}_${store}_$round
  http=()
  [[ $metrics == on ]] && http=(--http_listen "127.0.0.1:$(free_port)")
  ha=()
  if [[ $store == etcd ]]; then  # its own key prefix per run
    echo "etcd_prefix: /bench/${agents}_${workers}_${metrics}_$round/" > "$tmp/ha_$round.yaml"
    ha=(--etcd_endpoints "$endpoints" --config "$tmp/ha_$round.yaml")
  fi
  "$BIN/varuna-manager" --listen "$addr" --state_dir "$state" "${http[@]}" "${ha[@]}" \
    2> "$tmp/manager_${agents}_$workers.log" &
  mgr_pid=$!
  for _ in $(seq 100); do
    "$BIN/varunactl" --manager "$addr" nodes -o json > /dev/null 2>&1 && break
    sleep 0.1
  done
  "$BIN/control_plane_load" --manager "$addr" --agents "$agents" --workers "$workers" \
    --period_s "$PERIOD" --duration_s "$DURATION" --warmup_s "$WARMUP" \
    --timeout_s "${TIMEOUT_S:-5}" --connections "${CONNECTIONS:-0}" > "$tmp/load.json" &
  load_pid=$!
  # Registration takes a moment; the load tool's window starts after it plus WARMUP.
  reg_deadline=$((SECONDS + ${REGISTER_S:-120}))
  until [[ $("$BIN/varunactl" --manager "$addr" nodes -o json 2>/dev/null |
             /usr/bin/python3 -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null) == "$agents" ]]; do
    kill -0 "$load_pid" 2>/dev/null ||
      { echo "control_plane.sh: load tool exited during registration: $(cat "$tmp/load.json")" >&2; exit 1; }
    ((SECONDS < reg_deadline)) ||
      { echo "control_plane.sh: $agents agents not registered within 120 s" >&2; exit 1; }
    sleep 0.2
  done
  if [[ $metrics == on ]]; then
    (while sleep "$SCRAPE_S"; do curl -sf "http://${http[1]}/metrics" > /dev/null || true; done) &
    scrape_pid=$!
  fi
  sleep "$WARMUP"
  c0=$(cpu_ticks "$mgr_pid") t0=$(date +%s.%N)
  window=$((DURATION - WARMUP - 2))
  ((window >= 1)) || window=1
  sleep "$window"
  c1=$(cpu_ticks "$mgr_pid") t1=$(date +%s.%N)
  metrics_bytes=0
  if [[ -n $scrape_pid ]]; then
    metrics_bytes=$(curl -sf "http://${http[1]}/metrics" | wc -c)
    kill -TERM "$scrape_pid" 2>/dev/null || true
    wait "$scrape_pid" 2>/dev/null || true
    scrape_pid=
  fi
  t_nodes=$(date +%s.%N)
  "$BIN/varunactl" --manager "$addr" nodes -o json > /dev/null
  nodes_s=$(/usr/bin/python3 -c "print($(date +%s.%N) - $t_nodes)")
  # Exit 1 with a report means some heartbeats failed: the table shows the error count.
  load_rc=0
  wait "$load_pid" || load_rc=$?
  load_pid=
  if ! /usr/bin/python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/load.json" 2>/dev/null ||
     ((load_rc > 1)); then
    echo "control_plane.sh: load tool failed (exit $load_rc): $(cat "$tmp/load.json")" >&2
    exit 1
  fi
  rss_kb=$(awk '/VmHWM/{print $2}' "/proc/$mgr_pid/status")
  kill -TERM "$mgr_pid"; wait "$mgr_pid" 2>/dev/null || true; mgr_pid=
  cpu=$(/usr/bin/python3 -c "print(f'{100 * ($c1 - $c0) / $hz / ($t1 - $t0):.1f}')")
  echo "config $cfg metrics=$metrics round $round: $(cat "$tmp/load.json") manager_cpu_pct=$cpu" \
    "rss_mb=$((rss_kb / 1024)) nodes_cmd_s=$nodes_s metrics_bytes=$metrics_bytes"
  rows+=("$(/usr/bin/python3 - "$tmp/load.json" "$cpu" "$rss_kb" "$nodes_s" "$metrics" "$round" \
            "$metrics_bytes" "$store" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
per_k = float(sys.argv[2]) / max(r['heartbeats_per_s'] / 1000, 1e-9)
print(f"| {sys.argv[6]} | {r['agents']} | {r['workers_per_agent']} | {sys.argv[8]} "
      f"| {sys.argv[5]} | {r['heartbeats_per_s']:.0f} | {r['errors']} "
      f"| {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.1f} | {sys.argv[2]}% "
      f"| {per_k:.1f}% | {int(sys.argv[3]) // 1024} | {float(sys.argv[4]):.2f} "
      f"| {int(sys.argv[7]) // 1024} |")
PY
)")
done
done
done
done
echo
echo "| round | agents | workers/agent | store | metrics | heartbeats/s | errors | p50 ms | p99 ms | max ms | manager CPU (1 core) | CPU per 1,000 hb/s | manager peak RSS MiB | \`varunactl nodes\` s | /metrics KiB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
