#include "worker/engine/fused_adamw.h"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_fused_adamw.h>

#include <map>
#include <tuple>

namespace varuna {

// Note [Fused AdamW]: the C++ frontend's AdamW updates each parameter with its own kernels
// (decay, two moment updates, bias corrections, sqrt, add, addcdiv: about eight launches and
// two temporaries each), which at 1.3B is about 15 ms of a 190 ms step on an H200
// (../shared/reference/gpu-perf.md, item A). `_fused_adamw_` does the same update in one pass:
// per list of same-device, same-dtype parameters it reads each parameter, gradient and
// moment once and writes them once. Its step counts are device tensors (so the update never
// waits on the host); they are incremented on the device before the kernel, as PyTorch's own
// fused AdamW does, and the host's count is kept in AdamWParamState for checkpoints. The update
// is the same formula as torch::optim::AdamW (decoupled decay p *= 1 - lr*wd; bias-corrected
// moments; eps added after the sqrt); in fp32 it equals the frontend's to about 1e-7 per step
// (tests/worker/engine/fused_adamw_test.cc). A gradient scale (the clip factor's inverse) can be
// folded in (set_next_grad_scale): the kernel divides the gradients by it as it reads them.
// An overflowed step never reaches step() (the engine skips it on every rank alike), so the
// kernel's found_inf is not used.

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  const std::optional<at::Tensor> scale =
      next_scale_.defined() ? std::optional<at::Tensor>(next_scale_) : std::nullopt;
  next_scale_ = torch::Tensor();
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    struct Lists {
      std::vector<at::Tensor> params, grads, avgs, sqs, max_sqs, steps;
    };
    // One kernel per device and dtype (the CUDA kernel's lists must agree in both).
    std::map<std::tuple<int, int, int>, Lists> by_kind;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW: sparse gradients are not supported");
      void* key = p.unsafeGetTensorImpl();
      auto& slot = state()[key];
      if (slot == nullptr) {
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->step(0);
        s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (o.amsgrad()) s->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      DeviceStep& d = device_steps_[key];
      if (d.host != s.step() || !d.t.defined() || d.t.device() != p.device()) {
        d.t = torch::full({}, static_cast<double>(s.step()),
                          torch::TensorOptions().dtype(torch::kFloat32).device(p.device()));
      }
      s.step(s.step() + 1);
      d.host = s.step();
      Lists& l = by_kind[{static_cast<int>(p.device().type()), p.device().index(),
                          static_cast<int>(p.scalar_type())}];
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.avgs.push_back(s.exp_avg());
      l.sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) l.max_sqs.push_back(s.max_exp_avg_sq());
      l.steps.push_back(d.t);
    }
    for (auto& [kind, l] : by_kind) {
      at::_foreach_add_(l.steps, 1);
      at::_fused_adamw_(l.params, l.grads, l.avgs, l.sqs, l.max_sqs, l.steps, o.lr(),
                        std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                        o.amsgrad(), /*maximize=*/false, scale, std::nullopt);
    }
  }
  return loss;
}

}  // namespace varuna
