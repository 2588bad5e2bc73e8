#pragma once

// AdamW in one fused kernel per parameter group (Note [Fused AdamW] in fused_adamw.cc).

#include <torch/torch.h>

#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace varuna {

// torch::optim::AdamW whose step() is LibTorch's `_fused_adamw_` (a multi-tensor kernel on
// CUDA, a vectorised loop on the CPU) instead of about eight element-wise kernels per
// parameter. It is-a AdamW with AdamWParamState, so checkpoints and their loading are the same
// for both, and either one resumes the other's.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override;

  // For the next step only: divide every gradient by `scale` (a one-element float tensor on
  // the parameters' device, e.g. the clip factor's inverse; never read on the host). The
  // kernel writes the scaled gradients back.
  void set_next_grad_scale(torch::Tensor scale) { next_scale_ = std::move(scale); }

 private:
  // The fused kernel's step counts: float tensors on each parameter's device, mirrored by the
  // host's AdamWParamState::step() (what checkpoints hold). Rebuilt when the two disagree (a
  // checkpoint was loaded).
  struct DeviceStep {
    int64_t host = -1;
    torch::Tensor t;
  };
  std::unordered_map<void*, DeviceStep> device_steps_;
  torch::Tensor next_scale_;
};

}  // namespace varuna
