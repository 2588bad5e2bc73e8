#!/usr/bin/env bash
# Installs what the build, the tests and the demo need: Debian's packages (apt), then the
# project's Python environment with torch 2.11 and its CUDA pieces from PyPI
# (scripts/python_env.sh; outside the clone, reused by every clone on the machine).
# Idempotent and non-interactive; a no-op when everything is present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ccache pkg-config git
  python3 python3-venv libgloo-dev
  libabsl-dev libyaml-cpp-dev libgoogle-glog-dev libgflags-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev zlib1g-dev libsqlite3-dev
  fortunes fortunes-min
  iproute2 procps openssl libssl-dev systemd
  slurm-wlm munge etcd-server etcd-client
  clang-format
  prometheus-cpp-dev prometheus chromium
)

# The dashboard is built with npm (Node's own packages, or Debian's when there is none).
command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)

# The unprivileged user a root agent runs workers as by default (Note [Worker user] in
# agent/launch_request.h). Made only when we are root (an agent that is not root runs workers as
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
  echo "install_deps: all Debian packages present"
else
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# torch (LibTorch for the build), NVIDIA's CUDA 13.0 pieces, transformers, safetensors, ...
echo "install_deps: Python environment $("$(dirname "$0")/python_env.sh")"
