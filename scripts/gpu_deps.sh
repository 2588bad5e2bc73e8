#!/usr/bin/env bash
# Run HERE (a Debian 12 machine with apt): downloads the Debian packages varuna-worker builds
# against (gRPC, protobuf, Abseil, yaml-cpp, glog, SQLite and what they need) into .gpudeps/,
# for a GPU machine that can reach no package registry (docs/gpu.md). About 22 MB.
# scripts/gpu_build.sh unpacks them there and builds against that machine's CUDA LibTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpudeps/' .git/info/exclude 2>/dev/null || echo '/.gpudeps/' >> .git/info/exclude
mkdir -p .gpudeps
cd .gpudeps
apt-get download \
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc \
  libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler \
  libabsl-dev libabsl20220623 libyaml-cpp-dev libyaml-cpp0.7 \
  libgoogle-glog-dev libgoogle-glog0v6 libgflags-dev libgflags2.2 libunwind-dev libunwind8 \
  libsqlite3-dev libsqlite3-0 libre2-9 libre2-dev libc-ares2 libc-ares-dev \
  libssl-dev libssl3 zlib1g-dev libupb-dev libsystemd-dev libgtest-dev libgmock-dev 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
# Gloo's headers, for a PyTorch wheel that ships none (c10d's ProcessGroupGloo.hpp includes
# them): kept apart in gloo/, unpacked only to stand in for those (scripts/gpu_build.sh).
mkdir -p gloo
(cd gloo && apt-get download libgloo-dev 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
echo "gpu_deps: $(ls *.deb | wc -l) packages, $(du -sh . | cut -f1) in .gpudeps/"
