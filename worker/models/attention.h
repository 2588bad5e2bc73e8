#pragma once

// Causal self-attention for the built-in models (Note [Fused attention] in attention.cc).

#include <torch/torch.h>

namespace varuna {

// softmax(q k^T / sqrt(head_dim) + causal mask) v through LibTorch's fused attention
// (at::scaled_dot_product_attention: flash, memory-efficient or cuDNN on a GPU, a fused CPU
// kernel here). q [b, h, t, hd]; k and v [b, kv, t, hd] with kv dividing h (grouped-query:
// key/value head g serves query heads g*h/kv .. (g+1)*h/kv - 1). `dropout_p` drops
// attention probabilities (pass 0 outside training). The first call on each device type logs
// the backend it runs.
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, double dropout_p);

// The same computed explicitly (the [b, h, t, t] probabilities in fp32, cast to q's dtype):
// the reference CausalAttention is tested against, and the path of a model whose heads are
// split over tensor-parallel ranks with dropout (whose draws must agree on every rank).
// `probabilities_hook`, when set, is applied to the probabilities before v (e.g. dropout).
torch::Tensor ExplicitCausalAttention(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
    const std::function<torch::Tensor(const torch::Tensor&)>& probabilities_hook = nullptr);

// The fused kernel `CausalAttention` picks for these inputs on their device: "flash",
// "efficient", "cudnn", "math", ...
std::string AttentionBackend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             double dropout_p);

}  // namespace varuna
