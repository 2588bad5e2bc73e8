// The native model kinds: "gpt" (pre-LN GPT blocks) and "mlp" (residual MLP blocks), the
// engine's own test models (common/spec/model_spec.h).

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/models/attention.h"
#include "worker/models/builtin.h"
#include "worker/models/linear.h"
#include "worker/models/model.h"

namespace varuna {

namespace {

namespace F = torch::nn::functional;

torch::Tensor NormalInit(std::vector<int64_t> shape) { return torch::randn(shape) * 0.02; }

// Token + position embedding.
class GptEmbedding : public Layer {
 public:
  GptEmbedding(int vocab, int seq_len, int d, double dropout) : dropout_(dropout) {
    wte_ = register_parameter("wte", NormalInit({vocab, d}));
    wpe_ = register_parameter("wpe", NormalInit({seq_len, d}));
  }
  torch::Tensor Forward(const torch::Tensor&, const TensorMap& in) override {
    const auto& ids = in.at("input_ids");
    auto pos = torch::arange(ids.size(1), ids.options());
    auto h = F::embedding(ids, wte_) + F::embedding(pos, wpe_).unsqueeze(0);
    return F::dropout(h, F::DropoutFuncOptions().p(dropout_).training(is_training()));
  }

 private:
  double dropout_;
  torch::Tensor wte_, wpe_;
};

Linear MakeLinear(int in, int out, TpSplit split = TpSplit::kNone, const TensorParallel& tp = {},
                  int blocks = 1) {
  return Linear(in, out, /*bias=*/true, split, tp, blocks);
}

// Pre-LN transformer block: x + attn(ln1(x)); x + mlp(ln2(x)). With tensor parallelism
// (Note [Tensor parallelism]) this rank holds heads / tp_size heads (qkv column-parallel in
// three blocks, proj row-parallel) and 4d / tp_size hidden units (fc column, out row).
class GptBlock : public Layer {
 public:
  GptBlock(int d, int heads, double dropout, const TensorParallel& tp)
      : heads_(heads), local_heads_(heads / tp.size), dropout_(dropout), tp_(tp) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv_ = register_module("qkv", MakeLinear(d, 3 * d, TpSplit::kColumn, tp, 3));
    proj_ = register_module("proj", MakeLinear(d, d, TpSplit::kRow, tp));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc_ = register_module("fc", MakeLinear(d, 4 * d, TpSplit::kColumn, tp));
    out_ = register_module("out", MakeLinear(4 * d, d, TpSplit::kRow, tp));
  }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap&) override {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads_;
    const int64_t lh = local_heads_;
    auto drop = F::DropoutFuncOptions().p(dropout_).training(is_training());
    auto a = CopyToTensorParallel(ln1_(x), tp_);
    auto qkv = qkv_(a).view({b, t, 3, lh, hd}).permute({2, 0, 3, 1, 4});
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    torch::Tensor y;
    const bool dropping = is_training() && dropout_ > 0;
    // Note [Fused attention] in attention.cc; split heads with dropout take the explicit path
    // (the same draws on every tp rank).
    if (!(tp_.enabled() && dropping)) {
      y = CausalAttention(q, k, v, is_training() ? dropout_ : 0.0);
    } else {
      y = ExplicitCausalAttention(q, k, v, [&](const torch::Tensor& att) {
        return HeadSliceDropout(att, heads_, dropout_, tp_);
      });
    }
    y = y.transpose(1, 2).reshape({b, t, lh * hd});
    auto h = x + F::dropout(proj_(y), drop);
    auto m = CopyToTensorParallel(ln2_(h), tp_);
    return h + F::dropout(out_(torch::gelu(fc_(m))), drop);
  }

 private:
  int heads_, local_heads_;
  double dropout_;
  TensorParallel tp_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  Linear qkv_{nullptr}, proj_{nullptr}, fc_{nullptr}, out_{nullptr};
};

// Final LayerNorm + LM head (its own parameter, tied to the embedding) + cross-entropy.
class GptHead : public Layer {
 public:
  GptHead(int vocab, int d) {
    ln_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    // Overwritten from the embedding at start-up (Model::Tie).
    lm_head_ = register_parameter("lm_head", torch::zeros({vocab, d}));
  }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap& in) override {
    auto logits = torch::matmul(ln_(x), lm_head_.t());
    return F::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                            in.at("labels").reshape({-1}));
  }

 private:
  torch::nn::LayerNorm ln_{nullptr};
  torch::Tensor lm_head_;
};

// MLP model: token embedding, residual MLP blocks, linear head.
class MlpEmbedding : public Layer {
 public:
  MlpEmbedding(int vocab, int d) { wte_ = register_parameter("wte", NormalInit({vocab, d})); }
  torch::Tensor Forward(const torch::Tensor&, const TensorMap& in) override {
    return F::embedding(in.at("input_ids"), wte_);
  }

 private:
  torch::Tensor wte_;
};

class MlpBlock : public Layer {
 public:
  MlpBlock(int d, const TensorParallel& tp) : tp_(tp) {
    ln_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc_ = register_module("fc", MakeLinear(d, 4 * d, TpSplit::kColumn, tp));
    out_ = register_module("out", MakeLinear(4 * d, d, TpSplit::kRow, tp));
  }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap&) override {
    return x + out_(torch::gelu(fc_(CopyToTensorParallel(ln_(x), tp_))));
  }

 private:
  TensorParallel tp_;
  torch::nn::LayerNorm ln_{nullptr};
  Linear fc_{nullptr}, out_{nullptr};
};

class MlpHead : public Layer {
 public:
  MlpHead(int vocab, int d) { head_ = register_module("head", MakeLinear(d, vocab)); }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap& in) override {
    auto logits = head_(x);
    return F::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                            in.at("labels").reshape({-1}));
  }

 private:
  Linear head_{nullptr};
};

}  // namespace

Model GptModel(const ModelSpec& s, const TensorParallel& tp) {
  Model m;
  const double d = s.d_model, t = s.seq_len;
  m.Add("embed", t * d,
        [s] { return std::make_shared<GptEmbedding>(s.vocab, s.seq_len, s.d_model, s.dropout); });
  for (int i = 0; i < s.layers; ++i) {
    m.Add(CutPoint{});
    // Forward FLOPs per sample: 24*T*d^2 for the matmuls + 4*T^2*d for attention.
    m.Add(absl::StrCat("blocks.", i), 24 * t * d * d + 4 * t * t * d,
          [s, tp] { return std::make_shared<GptBlock>(s.d_model, s.heads, s.dropout, tp); });
  }
  m.Add(CutPoint{});
  m.Add("head", 2 * t * d * s.vocab, [s] { return std::make_shared<GptHead>(s.vocab, s.d_model); });
  m.Tie("embed.wte", "head.lm_head");
  return m;
}

Model MlpModel(const ModelSpec& s, const TensorParallel& tp) {
  Model m;
  const double d = s.d_model, t = s.seq_len;
  m.Add("embed", t * d, [s] { return std::make_shared<MlpEmbedding>(s.vocab, s.d_model); });
  for (int i = 0; i < s.layers; ++i) {
    m.Add(CutPoint{});
    m.Add(absl::StrCat("blocks.", i), 16 * t * d * d,
          [s, tp] { return std::make_shared<MlpBlock>(s.d_model, tp); });
  }
  m.Add(CutPoint{});
  m.Add("head", 2 * t * d * s.vocab, [s] { return std::make_shared<MlpHead>(s.vocab, s.d_model); });
  return m;
}

}  // namespace varuna
