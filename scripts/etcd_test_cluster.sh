#!/usr/bin/env bash
# A real etcd cluster on loopback, for tests and demos of several managers (docs/operations.md
# "Several managers"): N members of Debian's etcd-server, each with its own data directory
# and ports.
#
#   scripts/etcd_test_cluster.sh start [N]     # N members (default 3); prints the endpoints
#   scripts/etcd_test_cluster.sh endpoints     # 127.0.0.1:23790,127.0.0.1:23792,...
#   scripts/etcd_test_cluster.sh kill K        # SIGKILL member K (1-based): a lost member
#   scripts/etcd_test_cluster.sh revive K      # start member K again on its data
#   scripts/etcd_test_cluster.sh stop          # every member, and the data
#
# Idempotent: start stops an earlier cluster in the same directory first. The directory is
# $VARUNA_ETCD_DIR (default /tmp/varuna-etcd) and the ports start at $VARUNA_ETCD_PORT
# (default 23790): member K listens for clients on PORT + 2(K-1) and for peers one above.
# $VARUNA_ETCD_EXTRA_HOST (an address of this machine, e.g. a bridge's for network namespaces)
# makes the members listen for clients there too, on the same ports. Each member keeps
# the last 10,000 revisions (--auto-compaction-mode revision), as deploy/config/etcd.env.
# $VARUNA_ETCD_TLS=DIR: client and peer ports use TLS with the cluster's certificates, and
# take only clients with one (DIR/ca.pem, and DIR/etcd.pem + etcd.key from
# scripts/make_certs.sh DIR etcd=127.0.0.1[,HOST]).
set -euo pipefail
D=${VARUNA_ETCD_DIR:-/tmp/varuna-etcd}
BASE=${VARUNA_ETCD_PORT:-23790}

say() { echo "etcd_test_cluster: $*" >&2; }
members() { cat "$D/members" 2>/dev/null || echo 0; }
client_port() { echo $((BASE + 2 * ($1 - 1))); }
peer_port() { echo $((BASE + 2 * ($1 - 1) + 1)); }

endpoints() {
  local n out=() k
  n=$(members)
  for ((k = 1; k <= n; k++)); do out+=("127.0.0.1:$(client_port "$k")"); done
  (IFS=,; echo "${out[*]}")
}

ours() {  # the pid in $1 if it is still an etcd of ours
  local pid
  pid=$(cat "$1" 2>/dev/null || true)
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == etcd ]] || return 1
  echo "$pid"
}

TLS=${VARUNA_ETCD_TLS:-}
scheme=http
tls_flags=()
if [[ -n $TLS ]]; then
  scheme=https
  tls_flags=(--client-cert-auth --trusted-ca-file "$TLS/ca.pem" --cert-file "$TLS/etcd.pem"
             --key-file "$TLS/etcd.key" --peer-client-cert-auth --peer-trusted-ca-file
             "$TLS/ca.pem" --peer-cert-file "$TLS/etcd.pem" --peer-key-file "$TLS/etcd.key")
fi

start_member() {
  local k=$1 n initial=() j
  n=$(members)
  for ((j = 1; j <= n; j++)); do initial+=("m$j=$scheme://127.0.0.1:$(peer_port "$j")"); done
  local state=new
  [[ -d $D/m$k/member ]] && state=existing
  local listen="$scheme://127.0.0.1:$(client_port "$k")"
  [[ -n ${VARUNA_ETCD_EXTRA_HOST:-} ]] && listen+=",$scheme://$VARUNA_ETCD_EXTRA_HOST:$(client_port "$k")"
  (IFS=,; etcd --name "m$k" --data-dir "$D/m$k" \
    --listen-client-urls "$listen" \
    --advertise-client-urls "$scheme://127.0.0.1:$(client_port "$k")" \
    --listen-peer-urls "$scheme://127.0.0.1:$(peer_port "$k")" \
    --initial-advertise-peer-urls "$scheme://127.0.0.1:$(peer_port "$k")" \
    "${tls_flags[@]}" \
    --initial-cluster "${initial[*]}" --initial-cluster-state "$state" \
    --initial-cluster-token varuna-etcd-test \
    --auto-compaction-mode revision --auto-compaction-retention 10000 \
    >> "$D/m$k.log" 2>&1 & echo $! > "$D/m$k.pid")
}

kill_member() {
  local pid
  pid=$(ours "$D/m$1.pid") && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$D/m$1.pid"
}

stop() {
  local n k
  n=$(members)
  for ((k = 1; k <= n; k++)); do kill_member "$k"; done
  rm -rf "$D"
  say "stopped"
}

healthy() {
  local tls=()
  [[ -n $TLS ]] && tls=(--cacert "$TLS/ca.pem" --cert "$TLS/etcd.pem" --key "$TLS/etcd.key")
  ETCDCTL_API=3 etcdctl --endpoints "$(endpoints)" "${tls[@]}" --dial-timeout 1s \
    --command-timeout 2s endpoint health > /dev/null 2>&1
}

case "${1:-}" in
  start)
    n=${2:-3}
    [[ $n =~ ^[1-9]$ ]] || { say "N must be 1-9"; exit 2; }
    command -v etcd > /dev/null || { say "etcd is not installed (apt install etcd-server)"; exit 3; }
    [[ -d $D ]] && stop
    mkdir -p "$D"
    echo "$n" > "$D/members"
    for ((k = 1; k <= n; k++)); do start_member "$k"; done
    for _ in $(seq 100); do healthy && break; sleep 0.2; done
    healthy || { say "the cluster did not become healthy; logs in $D"; exit 1; }
    say "$n members up; logs in $D"
    endpoints
    ;;
  endpoints) endpoints ;;
  kill) kill_member "${2:?member number}" ;;
  revive) start_member "${2:?member number}" ;;
  stop) stop ;;
  *)
    echo "usage: $0 start [N] | endpoints | kill K | revive K | stop" >&2
    exit 2
    ;;
esac
