#!/usr/bin/env bash
# Makes a cluster CA and one certificate per NAME, for mutual TLS between varuna-manager and
# varuna-agent (docs/operations.md "Security").
#
#   scripts/make_certs.sh DIR NAME[=HOST,HOST...] ...
#
# DIR/ca.pem, DIR/ca.key: the CA (keep ca.key off the cluster). For each NAME: DIR/NAME.pem
# and DIR/NAME.key, with common name NAME and subject alternative names NAME and the HOSTs
# given (the names or addresses peers dial it at; e.g. NAME=127.0.0.1 on one machine).
# An agent's NAME must be its node name (the manager checks). The manager's NAME must be
# varuna-manager (what agents accept calls from, unless --tls_manager_name says otherwise).
# An existing CA in DIR is reused, so agents can be added later.
set -euo pipefail
if (($# < 2)); then
  echo "usage: $0 DIR NAME[=HOST,HOST...] ..." >&2
  exit 2
fi
dir=$1
shift
mkdir -p "$dir"
umask 077
if [[ ! -f "$dir/ca.pem" ]]; then
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj "/CN=varuna-cluster-ca" \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
fi
for spec in "$@"; do
  name=${spec%%=*}
  hosts=""
  [[ "$spec" == *=* ]] && hosts=${spec#*=}
  if [[ ! "$name" =~ ^[A-Za-z0-9._-]+$ ]]; then
    echo "make_certs: bad name '$name'" >&2
    exit 2
  fi
  san="DNS:$name"
  IFS=',' read -ra extra <<<"$hosts"
  for h in "${extra[@]}"; do
    [[ -z "$h" ]] && continue
    if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then san+=",IP:$h"; else san+=",DNS:$h"; fi
  done
  ext=$(mktemp)
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' \
    "$san" >"$ext"
  openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$name" \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 825 -sha256 -extfile "$ext" -out "$dir/$name.pem" 2>/dev/null
  rm -f "$ext" "$dir/$name.csr"
  echo "make_certs: $dir/$name.pem ($san)"
done
chmod 644 "$dir"/*.pem
