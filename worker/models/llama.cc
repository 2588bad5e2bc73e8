// model.kind llama: Hugging Face's LlamaForCausalLM, module for module and name for name
// (common/spec/model_spec.h), so its weights load and save without renaming or permuting.
//
// Note [Llama numerics]: the choices that make a loss equal to transformers' on the same
// weights (tests/e2e/lib/hf_models.py is the reference):
//   - RMSNorm in fp32: x * rsqrt(mean(x^2) + eps), cast back to x's dtype, then * weight.
//   - Rotary positions in the rotate-half layout (dims j and j + head_dim/2 form a pair),
//     inv_freq = theta^(-2j/head_dim) in fp32; Meta's interleaved checkpoints differ and are
//     not read here (a Hugging Face directory is already converted).
//   - Grouped-query attention: key/value head g serves query heads g*r .. g*r + r - 1.
//   - Softmax in fp32; no biases anywhere; SwiGLU: down(silu(gate(x)) * up(x)).

#include <torch/version.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/models/attention.h"
#include "worker/models/builtin.h"

namespace varuna {
namespace {

namespace F = torch::nn::functional;

torch::Tensor Normal(std::vector<int64_t> shape) { return torch::randn(shape) * 0.02; }

Linear Proj(int in, int out, TpSplit split, const TensorParallel& tp) {
  return Linear(in, out, /*bias=*/false, split, tp);
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  // An fp32 stream (the residual under autocast) takes LibTorch's fused kernel: the same
  // formula in one pass instead of seven kernels with fp32 temporaries.
  if (x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat) {
    return at::rms_norm(x, {x.size(-1)}, w, eps);
  }
  auto h = x.to(torch::kFloat);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return w * h.to(x.scalar_type());
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// Rotary positions: cos and sin of positions x inv_freq, each frequency used for dims j and
// j + head_dim/2, computed once per length, device and dtype and kept there (not a buffer:
// checkpoints need not hold them), instead of on the host and copied over in every forward.
struct Rotary {
  torch::Tensor inv_freq;  // [head_dim / 2], fp32, on the host
  int64_t length = -1;
  c10::optional<torch::Device> device;
  torch::ScalarType dtype = torch::kFloat;
  std::pair<torch::Tensor, torch::Tensor> table;

  const std::pair<torch::Tensor, torch::Tensor>& For(int64_t t, torch::Device dev,
                                                     torch::ScalarType type) {
    if (t != length || !device || *device != dev || type != dtype) {
      auto freqs = torch::outer(torch::arange(t, torch::kFloat), inv_freq).to(dev);
      auto emb = torch::cat({freqs, freqs}, -1);
      table = {emb.cos().to(type), emb.sin().to(type)};
      length = t;
      device = dev;
      dtype = type;
    }
    return table;
  }
};

class Embedding : public Layer {
 public:
  Embedding(int vocab, int d) { weight_ = register_parameter("weight", Normal({vocab, d})); }
  torch::Tensor Forward(const torch::Tensor&, const TensorMap& in) override {
    return F::embedding(in.at("input_ids"), weight_);
  }

 private:
  torch::Tensor weight_;
};

// A norm's weight as its own module, so it is named "<norm>.weight".
struct NormWeight : torch::nn::Module {
  explicit NormWeight(int d) { weight = register_parameter("weight", torch::ones({d})); }
  torch::Tensor weight;
};

// With tensor parallelism (Note [Tensor parallelism]) `heads` and `kv_heads` are this rank's:
// q, k, v column-parallel, o row-parallel.
struct Attention : torch::nn::Module {
  Attention(const ModelSpec& s, const TensorParallel& tp)
      : heads(s.heads / tp.size), kv_heads(s.kv_heads / tp.size), hd(s.d_model / s.heads) {
    const int64_t all = s.heads * hd, all_kv = s.kv_heads * hd;
    q_proj = register_module("q_proj", Proj(s.d_model, all, TpSplit::kColumn, tp));
    k_proj = register_module("k_proj", Proj(s.d_model, all_kv, TpSplit::kColumn, tp));
    v_proj = register_module("v_proj", Proj(s.d_model, all_kv, TpSplit::kColumn, tp));
    o_proj = register_module("o_proj", Proj(all, s.d_model, TpSplit::kRow, tp));
  }
  int64_t heads, kv_heads, hd;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};

struct Mlp : torch::nn::Module {
  Mlp(int d, int ffn, const TensorParallel& tp) {
    gate_proj = register_module("gate_proj", Proj(d, ffn, TpSplit::kColumn, tp));
    up_proj = register_module("up_proj", Proj(d, ffn, TpSplit::kColumn, tp));
    down_proj = register_module("down_proj", Proj(ffn, d, TpSplit::kRow, tp));
  }
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};

class DecoderLayer : public Layer {
 public:
  DecoderLayer(const ModelSpec& s, const TensorParallel& tp)
      : eps_(s.norm_eps), dropout_(s.dropout), all_heads_(s.heads), tp_(tp) {
    input_norm_ = register_module("input_layernorm", std::make_shared<NormWeight>(s.d_model));
    attn_ = register_module("self_attn", std::make_shared<Attention>(s, tp));
    post_norm_ =
        register_module("post_attention_layernorm", std::make_shared<NormWeight>(s.d_model));
    mlp_ = register_module("mlp", std::make_shared<Mlp>(s.d_model, s.ffn, tp));
    const int64_t hd = s.d_model / s.heads;
    rotary_.inv_freq = 1.0 / torch::pow(s.rope_theta, torch::arange(0, hd, 2, torch::kFloat) / hd);
  }

  torch::Tensor Forward(const torch::Tensor& x, const TensorMap&) override {
    const int64_t b = x.size(0), t = x.size(1);
    const int64_t h = attn_->heads, kv = attn_->kv_heads, hd = attn_->hd;
    auto a = CopyToTensorParallel(RmsNorm(x, input_norm_->weight, eps_), tp_);
    auto q = attn_->q_proj(a).view({b, t, h, hd}).transpose(1, 2);
    auto k = attn_->k_proj(a).view({b, t, kv, hd}).transpose(1, 2);
    auto v = attn_->v_proj(a).view({b, t, kv, hd}).transpose(1, 2);
    const auto& [cos, sin] = rotary_.For(t, q.device(), q.scalar_type());
    q = q * cos + RotateHalf(q) * sin;
    k = k * cos + RotateHalf(k) * sin;
    // Note [Fused attention] in attention.cc: grouped-query attention without expanding k and
    // v; split heads with dropout take the explicit path (the same draws on every tp rank).
    torch::Tensor y;
    if (tp_.enabled() && is_training() && dropout_ > 0) {
      y = ExplicitCausalAttention(q, k, v, [&](const torch::Tensor& att) {
        return HeadSliceDropout(att, all_heads_, dropout_, tp_);
      });
    } else {
      y = CausalAttention(q, k, v, is_training() ? dropout_ : 0.0);
    }
    y = y.transpose(1, 2).reshape({b, t, h * hd});
    auto r = x + attn_->o_proj(y);
    auto m = CopyToTensorParallel(RmsNorm(r, post_norm_->weight, eps_), tp_);
    return r + mlp_->down_proj(torch::silu(mlp_->gate_proj(m)) * mlp_->up_proj(m));
  }

 private:
  double eps_, dropout_;
  int all_heads_;
  TensorParallel tp_;
  std::shared_ptr<NormWeight> input_norm_, post_norm_;
  Rotary rotary_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<Mlp> mlp_;
};

class FinalNorm : public Layer {
 public:
  FinalNorm(int d, double eps) : eps_(eps) {
    weight_ = register_parameter("weight", torch::ones({d}));
  }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap&) override {
    return RmsNorm(x, weight_, eps_);
  }

 private:
  double eps_;
  torch::Tensor weight_;
};

}  // namespace

Model LlamaModel(const ModelSpec& s, const TensorParallel& tp) {
  Model m;
  const double d = s.d_model, t = s.seq_len;
  const double kv = static_cast<double>(s.kv_heads) * (s.d_model / s.heads);
  m.Add("model.embed_tokens", t * d,
        [s] { return std::make_shared<Embedding>(s.vocab, s.d_model); });
  for (int i = 0; i < s.layers; ++i) {
    m.Add(CutPoint{});
    // The planner's cost model (common/planner/profile.cc) counts the same FLOPs.
    m.Add(absl::StrCat("model.layers.", i),
          2 * t * (2 * d * d + 2 * d * kv + 3 * d * s.ffn) + 4 * t * t * d,
          [s, tp] { return std::make_shared<DecoderLayer>(s, tp); });
  }
  m.Add(CutPoint{});
  m.Add("model.norm", t * d, [s] { return std::make_shared<FinalNorm>(s.d_model, s.norm_eps); });
  m.Add("lm_head", 2 * t * d * s.vocab, [s] { return LmHead(s.vocab, s.d_model); });
  for (const auto& [a, b] : TiedParameters(s)) m.Tie(a, b);
  return m;
}

}  // namespace varuna
