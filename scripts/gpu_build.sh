#!/usr/bin/env bash
# Run ON THE GPU MACHINE: builds varuna-worker against the CUDA LibTorch of that machine's
# PyTorch (the same CMake as everywhere: VARUNA_PYTHON, cmake/VarunaTorch.cmake), with
# the Debian packages scripts/gpu_deps.sh fetched into .gpudeps/ unpacked under /tmp/varuna-deps.
# CMake detects the CUDA LibTorch (VARUNA_CUDA=AUTO) and c10d's NCCL; the result is
# build-gpu/bin/varuna-worker (and build-gpu/tests/gpu/fault_matrix_test when .gpudeps has
# GoogleTest). CONFIGURE_ONLY=1 stops after CMake's configure (what
# tests/gpu/device_check.sh --dry-run rehearses here, with PYTHON=scripts/python).
# Usage: scripts/gpu_build.sh [BUILD_DIR]
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
# Debian's gloo headers, which CMake uses only if the wheel ships none (CMakeLists.txt).
gloo=/tmp/varuna-gloo
for f in .gpudeps/gloo/*.deb; do
  if [[ -e $f ]]; then dpkg -x "$f" "$gloo"; fi
done
libdir=$deps/usr/lib/x86_64-linux-gnu
# glog's CMake config names its find modules by absolute path (/usr/share/glog/cmake).
sed -i "s|\"/usr/share/glog/cmake\"|\"$deps/usr/share/glog/cmake\"|" "$libdir/cmake/glog/glog-modules.cmake"
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$deps/usr/bin:$PATH
# The machine's CUDA compiler: on PATH, else the toolkit's usual home. None: CMake looks for the
# pip toolkit beside torch (cmake/VarunaTorch.cmake).
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cuda=()
command -v nvcc >/dev/null && cuda=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
"$PYTHON" -c 'import torch; print("gpu_build: torch", torch.__version__, "cuda", torch.version.cuda,
      "gpus", torch.cuda.device_count())'
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DVARUNA_CUDA=ON \
  -DVARUNA_WORKER_ONLY=ON -DVARUNA_PYTHON="$(command -v "$PYTHON")" -DCMAKE_PREFIX_PATH="$deps/usr" \
  -DVARUNA_GLOO_FALLBACK="$gloo/usr/include" \
  -DProtobuf_PROTOC_EXECUTABLE="$deps/usr/bin/protoc" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0 "${cuda[@]}"
if [[ ${CONFIGURE_ONLY:-0} == 1 ]]; then
  echo "gpu_build: configured $build (CONFIGURE_ONLY=1)"
  exit 0
fi
# Keep going past the first error: one GPU session should show every error there is.
keep=(-k); [[ ${#gen[@]} -gt 0 ]] && keep=(-k 0)
cmake --build "$build" -j "$(nproc)" --target varuna-worker -- "${keep[@]}"
echo "gpu_build: $build/bin/varuna-worker (LD_LIBRARY_PATH=$libdir)"
# The device's test binaries (tests/gpu/CMakeLists.txt), when GoogleTest came along; the
# worker above stands whatever happens here.
if [[ -f $build/tests/gpu/CTestTestfile.cmake ]]; then
  cmake --build "$build" -j "$(nproc)" --target fault_matrix_test -- "${keep[@]}" &&
    echo "gpu_build: $build/tests/gpu/fault_matrix_test"
fi
