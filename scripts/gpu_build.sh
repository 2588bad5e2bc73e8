#!/usr/bin/env bash
# Run ON THE GPU MACHINE: builds varuna-worker (and the examples) against the CUDA LibTorch of
# that machine's PyTorch (python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'), with
# the Debian packages scripts/gpu_deps.sh fetched into .gpudeps/ unpacked under /tmp/varuna-deps.
# CMake detects the CUDA LibTorch (VARUNA_CUDA=AUTO) and c10d's NCCL; the result is
# build-gpu/bin/varuna-worker. Usage: scripts/gpu_build.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
deps=/tmp/varuna-deps
PYTHON=${PYTHON:-python3}
if [[ ! -d .gpudeps ]] || ! ls .gpudeps/*.deb >/dev/null 2>&1; then
  echo "gpu_build: .gpudeps/ is empty; run scripts/gpu_deps.sh where apt works first" >&2
  exit 1
fi
mkdir -p "$deps"
for f in .gpudeps/*.deb; do dpkg -x "$f" "$deps"; done
libdir=$deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$deps/usr/bin:$PATH
torch_prefix=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$PYTHON" -c 'import torch; print("gpu_build: torch", torch.__version__, "cuda", torch.version.cuda,
      "gpus", torch.cuda.device_count())'
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DVARUNA_CUDA=ON \
  -DVARUNA_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr" \
  -DProtobuf_PROTOC_EXECUTABLE="$deps/usr/bin/protoc" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0
cmake --build "$build" -j "$(nproc)" --target varuna-worker
echo "gpu_build: $build/bin/varuna-worker (LD_LIBRARY_PATH=$libdir)"
