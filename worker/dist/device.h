#pragma once

// The compute device: which one a rank uses, and one RNG helper for the CPU and CUDA
// generators (recompute replays a forward's dropout masks exactly: Note [Recompute RNG] in
// pipeline_executor.cc).

#include <torch/torch.h>

#include <string>

#include "absl/status/statusor.h"

namespace varuna {

// The state of the generators a forward on `device` draws from: the default CPU generator,
// plus the device's default CUDA generator when `device` is a GPU.
struct RngState {
  torch::Tensor cpu;
  torch::Tensor cuda;  // undefined on the CPU
};

RngState GetRngState(const torch::Device& device);
void SetRngState(const torch::Device& device, const RngState& state);

// Seeds the default CPU generator and, on a GPU, that device's generator.
void SeedRng(const torch::Device& device, uint64_t seed);

// Whether this LibTorch was built with CUDA and sees a GPU.
bool CudaAvailable();
int CudaDeviceCount();

// The device for the job's `train.device` (auto | cpu | cuda | cuda:N) on the rank with
// `local_rank`: `cuda` is GPU local_rank mod the GPU count (several ranks may share one);
// `auto` is `cuda` when this build has CUDA and sees a GPU, else the CPU.
absl::StatusOr<torch::Device> ResolveDevice(const std::string& want, int local_rank);

// Makes `device` this process's current GPU (what c10::cuda::set_device does), so that
// everything allocated or launched without an explicit index, LibTorch's own included (a
// kCUDA tensor, a CUDA context, NCCL's communicators), is on the rank's GPU and not GPU 0.
// Nothing on the CPU.
absl::Status MakeCurrent(const torch::Device& device);

// Note [MFU]: the peak FLOP/s one rank's device can do at `precision` (fp32 | bf16 | fp16),
// the denominator of MFU. VARUNA_PEAK_TFLOPS overrides. GPUs: the dense tensor-core rate of
// known models (H100/H200 989 TFLOP/s bf16; A100 312), else 0 (MFU not reported). CPU: no
// datasheet number applies to a VM's share of a core, so it is measured: the best of a few
// 512x512 fp32 matrix products on this process's threads (about 50 ms at start-up).
double PeakFlops(const torch::Device& device, const std::string& precision);

}  // namespace varuna
