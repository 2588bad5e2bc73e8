#!/usr/bin/env bash
# The project's Python environment: a virtual environment with torch 2.11 (whose LibTorch every
# build compiles against), NVIDIA's CUDA 13.0 pieces, transformers, safetensors and tokenizers,
# all pinned by scripts/python-constraints.txt. It lives outside the clone, one per machine and
# pinned set: $VARUNA_PYENV_ROOT/pyenv-<hash>, where the root is /var/cache/varuna-cpp for root
# (readable by the unprivileged user a root agent runs workers as: they load LibTorch from it)
# and ${XDG_CACHE_HOME:-$HOME/.cache}/varuna-cpp for anyone else. <hash> covers both requirement
# files and the Python version, so every clone and CI run on the machine reuses it, and a
# change of pins makes a new one beside the old.
#
#   scripts/python_env.sh           make it if missing (idempotent), print its python
#   scripts/python_env.sh --path    print its python if it is complete; exit 1 otherwise
#   scripts/python_env.sh --freeze  rewrite scripts/python-constraints.txt from a fresh install
#                                   of scripts/python-requirements.txt
# scripts/python runs that python (the way tests, benches and tools reach it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
req=$here/python-requirements.txt
con=$here/python-constraints.txt

# The machine's python3: Debian's when there is one (install_deps.sh installs it and its venv
# module), else the first on PATH.
base=${VARUNA_BASE_PYTHON:-}
if [[ -z $base ]]; then
  if [[ -x /usr/bin/python3 ]]; then base=/usr/bin/python3; else base=$(command -v python3); fi
fi
pyver=$("$base" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
hash=$( (cat "$req" "$con"; echo "$pyver") | sha256sum | cut -c1-12)
if [[ -n ${VARUNA_PYENV_ROOT:-} ]]; then
  root=$VARUNA_PYENV_ROOT
elif [[ $(id -u) -eq 0 ]]; then
  root=/var/cache/varuna-cpp
else
  root=${XDG_CACHE_HOME:-$HOME/.cache}/varuna-cpp
fi
env=$root/pyenv-$hash
python=$env/bin/python

if [[ ${1:-} == --path ]]; then
  [[ -f $env/.complete ]] || exit 1
  echo "$python"
  exit 0
fi

# Makes the pip-installed CUDA toolkit usable by nvcc and CMake's FindCUDA: nvcc links from
# lib64/ and FindCUDA looks for unversioned libraries (libcudart.so), while the wheels ship
# lib/ with versioned names only (libcudart.so.13).
link_cuda() {
  local cu
  cu=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "cu13"))')
  [[ -d $cu/lib ]] || return 0
  [[ -e $cu/lib64 ]] || ln -s lib "$cu/lib64"
  local f base_name
  for f in "$cu"/lib/lib*.so.*; do
    base_name=${f%%.so.*}.so
    [[ -e $base_name ]] || ln -s "$(basename "$f")" "$base_name"
  done
}

install_into() {  # $1: a fresh venv directory; $2...: extra pip arguments
  local dir=$1
  shift
  "$base" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$req" "$@"
}

if [[ ${1:-} == --freeze ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  install_into "$tmp/env"
  { echo "# Every package of the environment, pinned (pip freeze of scripts/python-requirements.txt's install)."
    echo "# Regenerate after changing scripts/python-requirements.txt: scripts/python_env.sh --freeze"
    "$tmp/env/bin/python" -m pip freeze --disable-pip-version-check; } > "$con"
  echo "python_env: wrote $con"
  exit 0
fi

mkdir -p "$root"
chmod a+rx "$root" 2>/dev/null || true
# One installer at a time per machine (CI and a developer's shell may start together).
exec 9> "$root/.lock"
flock 9
if [[ ! -f $env/.complete ]]; then
  rm -rf "$env"
  echo "python_env: creating $env (torch, CUDA pieces, transformers: a few GB, once per machine)" >&2
  start=$(date +%s)
  install_into "$env" -c "$con"
  python=$env/bin/python
  link_cuda
  "$python" -c 'import torch, transformers, safetensors, tokenizers' >&2
  touch "$env/.complete"
  echo "python_env: ready in $(($(date +%s) - start)) s" >&2
fi
echo "$python"
