#!/usr/bin/env bash
# Installs the Debian packages the build, the tests and the demo need. Idempotent and
# non-interactive; a no-op when everything is present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ccache pkg-config git
  libtorch-dev libgloo-dev python3-torch
  libabsl-dev libyaml-cpp-dev libgoogle-glog-dev libgflags-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev zlib1g-dev libsqlite3-dev
  fortunes fortunes-min
  iproute2 procps openssl libssl-dev systemd
  slurm-wlm munge etcd-server etcd-client
  clang-format
  prometheus-cpp-dev prometheus python3-prometheus-client chromium
)

# The dashboard is built with npm (Node's own packages, or Debian's when there is none).
command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)

# The unprivileged user a root agent runs workers as by default (Note [Worker user] in
# agent/agent.cc). Made only when we are root (an agent that is not root runs workers as
# itself and needs no such user).
if [[ $(id -u) -eq 0 ]] && ! id varuna >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin varuna
  echo "install_deps: created the system user 'varuna' (workers of a root agent run as it)"
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
