#include "worker/models/attention.h"

#include <ATen/ops/_fused_sdp_choice.h>

#include <atomic>
#include <cmath>
#include <string>

#include "common/base/logging.h"

namespace varuna {

// Note [Fused attention]: every built-in model attends through
// at::scaled_dot_product_attention with is_causal and, for grouped-query attention,
// enable_gqa, instead of building the [b, h, t, t] scores, a mask and an fp32 softmax by hand
// (which also kept those probabilities for the backward: over 0.5 GB per layer at 1.3B) and
// expanding k and v to every query head (../shared/reference/gpu-perf.md). On a GPU it runs
// flash, memory-efficient or cuDNN attention; the backend is logged once per device type
// (AttentionBackend: at::_fused_sdp_choice). The result equals the explicit computation to
// rounding (tests/worker/models/attention_test.cc; the Hugging Face parity tests hold 1e-5). Its
// dropout draws from the device generator, which recompute replays. The explicit form stays
// for tensor-parallel heads with dropout, whose draws must agree across ranks
// (HeadSliceDropout in tensor_parallel.h).

std::string AttentionBackend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             double dropout_p) {
  const int64_t choice =
      at::_fused_sdp_choice(q, k, v, /*attn_mask=*/{}, dropout_p, /*is_causal=*/true,
                            /*scale=*/std::nullopt, /*enable_gqa=*/k.size(1) != q.size(1));
  switch (choice) {
    case 0:
      return "math";
    case 1:
      return "flash";
    case 2:
      return "efficient";
    case 3:
      return "cudnn";
    case 4:
      return "overrideable";
    default:
      return "none";
  }
}

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, double dropout_p) {
  static std::atomic<bool> logged_cpu{false}, logged_cuda{false};
  std::atomic<bool>& logged = q.is_cuda() ? logged_cuda : logged_cpu;
  if (!logged.exchange(true)) {
    LOG(INFO) << "attention: fused scaled_dot_product_attention, backend "
              << AttentionBackend(q, k, v, dropout_p) << " on " << q.device() << " ("
              << c10::toString(q.scalar_type()) << ", head_dim " << q.size(-1) << ")";
  }
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout_p,
                                          /*is_causal=*/true, /*scale=*/std::nullopt,
                                          /*enable_gqa=*/k.size(1) != q.size(1));
}

torch::Tensor ExplicitCausalAttention(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
    const std::function<torch::Tensor(const torch::Tensor&)>& probabilities_hook) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), hd = q.size(3), kv = k.size(1);
  torch::Tensor kk = k, vv = v;
  if (kv != h) {
    kk = k.unsqueeze(2).expand({b, kv, h / kv, t, hd}).reshape({b, h, t, hd});
    vv = v.unsqueeze(2).expand({b, kv, h / kv, t, hd}).reshape({b, h, t, hd});
  }
  auto att = torch::matmul(q, kk.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  auto mask = torch::ones({t, t}, torch::dtype(torch::kBool).device(q.device())).triu(1);
  att = torch::softmax(att.masked_fill(mask, -INFINITY), -1, torch::kFloat).to(q.scalar_type());
  if (probabilities_hook) att = probabilities_hook(att);
  return torch::matmul(att, vv);
}

}  // namespace varuna
