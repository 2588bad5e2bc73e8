#include "worker/dist/device.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#ifdef VARUNA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <chrono>
#include <cstdlib>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/dist/torch_status.h"

namespace varuna {
namespace {

at::Generator CudaGenerator(const torch::Device& device) {
  // Through the context (the hooks interface underneath), so a build without the CUDA path
  // links: it is never called there. No index: the current device's.
  return at::globalContext().defaultGenerator(device);
}

torch::Tensor StateOf(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void Restore(at::Generator gen, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

RngState GetRngState(const torch::Device& device) {
  RngState s;
  s.cpu = StateOf(at::detail::getDefaultCPUGenerator());
  if (device.is_cuda()) s.cuda = StateOf(CudaGenerator(device));
  return s;
}

void SetRngState(const torch::Device& device, const RngState& state) {
  Restore(at::detail::getDefaultCPUGenerator(), state.cpu);
  if (device.is_cuda() && state.cuda.defined()) Restore(CudaGenerator(device), state.cuda);
}

void SeedRng(const torch::Device& device, uint64_t seed) {
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  if (device.is_cuda()) {
    auto gen = CudaGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
}

bool CudaAvailable() { return torch::cuda::is_available(); }
int CudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

absl::StatusOr<torch::Device> ResolveDevice(const std::string& want, int local_rank) {
  if (want == "cpu" || (want == "auto" && !CudaAvailable())) return torch::Device(torch::kCPU);
  int index = -1;
  if (want.rfind("cuda:", 0) == 0) {
    if (!absl::SimpleAtoi(want.substr(5), &index) || index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.device '", want, "': expected auto, cpu, cuda or cuda:N"));
    }
  } else if (want != "cuda" && want != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("train.device '", want, "': expected auto, cpu, cuda or cuda:N"));
  }
  const int gpus = CudaAvailable() ? CudaDeviceCount() : 0;
  if (gpus == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "train.device '", want, "' needs a GPU, but ",
#ifdef VARUNA_WITH_CUDA
        "none is visible (CUDA_VISIBLE_DEVICES, driver)"
#else
        "this varuna-worker was built against a CPU-only LibTorch (docs/gpu.md)"
#endif
        ));
  }
  if (index < 0) index = std::max(0, local_rank) % gpus;
  if (index >= gpus) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.device '", want, "': this machine has ", gpus, " GPU(s)"));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

absl::Status MakeCurrent(const torch::Device& device) {
  if (!device.is_cuda()) return absl::OkStatus();
  return TorchCall(absl::StrCat("making ", device.str(), " the current GPU"),
                   [&] { c10::impl::getDeviceGuardImpl(device.type())->setDevice(device); });
}

double PeakFlops(const torch::Device& device, const std::string& precision) {
  if (const char* env = std::getenv("VARUNA_PEAK_TFLOPS"); env != nullptr && *env) {
    double v = 0;
    if (absl::SimpleAtod(env, &v) && v > 0) return v * 1e12;
  }
  const bool half = precision == "bf16" || precision == "fp16";
  if (device.is_cuda()) {
#ifdef VARUNA_WITH_CUDA
    const std::string name = at::cuda::getDeviceProperties(device.index())->name;
#else
    const std::string name;
#endif
    struct Known {
      const char* substr;
      double half_tflops, fp32_tflops;  // dense; fp32 = TF32 tensor cores
    };
    for (const Known& k : {Known{"H200", 989, 494}, Known{"H100", 989, 494},
                           Known{"A100", 312, 156}, Known{"L4", 121, 60}}) {
      if (name.find(k.substr) != std::string::npos) {
        return (half ? k.half_tflops : k.fp32_tflops) * 1e12;
      }
    }
    return 0;
  }
  torch::NoGradGuard no_grad;
  const int64_t n = 512;
  auto a = torch::randn({n, n}), b = torch::randn({n, n});
  auto c = torch::mm(a, b);  // warm-up
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    c = torch::mm(a, b);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

}  // namespace varuna
