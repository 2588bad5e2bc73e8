// model.kind gpt2: Hugging Face's GPT2LMHeadModel, module for module and name for name
// (common/spec/model_spec.h). Unlike model.kind gpt (ours, kept as it was), it matches
// transformers exactly:
//   - Conv1D: the projection weights are stored [in, out] as Hugging Face stores them
//     (y = x W + b), so they load and save byte for byte with no transpose.
//   - gelu_new (the tanh approximation), LayerNorm with layer_norm_epsilon, attention scaled
//     by 1/sqrt(head_dim) with the softmax in fp32, dropout where GPT-2 has it (embeddings,
//     attention probabilities, each residual branch).
//   - The LM head is tied to transformer.wte; Hugging Face's files leave lm_head out.

#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/models/attention.h"
#include "worker/models/builtin.h"

namespace varuna {
namespace {

namespace F = torch::nn::functional;

torch::Tensor Normal(std::vector<int64_t> shape) { return torch::randn(shape) * 0.02; }

struct Conv1D : torch::nn::Module {
  Conv1D(int in, int out) {
    weight = register_parameter("weight", Normal({in, out}));
    bias = register_parameter("bias", torch::zeros({out}));
  }
  torch::Tensor operator()(const torch::Tensor& x) const {
    return ApplyLinear(x, weight, bias, WeightLayout::kInOut);
  }
  torch::Tensor weight, bias;
};

struct Norm : torch::nn::Module {
  Norm(int d, double eps) : eps(eps) {
    weight = register_parameter("weight", torch::ones({d}));
    bias = register_parameter("bias", torch::zeros({d}));
  }
  torch::Tensor operator()(const torch::Tensor& x) const {
    return torch::layer_norm(x, {weight.size(0)}, weight, bias, eps);
  }
  double eps;
  torch::Tensor weight, bias;
};

struct Attention : torch::nn::Module {
  explicit Attention(int d) {
    c_attn = register_module("c_attn", std::make_shared<Conv1D>(d, 3 * d));
    c_proj = register_module("c_proj", std::make_shared<Conv1D>(d, d));
  }
  std::shared_ptr<Conv1D> c_attn, c_proj;
};

struct Mlp : torch::nn::Module {
  Mlp(int d, int ffn) {
    c_fc = register_module("c_fc", std::make_shared<Conv1D>(d, ffn));
    c_proj = register_module("c_proj", std::make_shared<Conv1D>(ffn, d));
  }
  std::shared_ptr<Conv1D> c_fc, c_proj;
};

class TokenEmbedding : public Layer {
 public:
  TokenEmbedding(int vocab, int d) { weight_ = register_parameter("weight", Normal({vocab, d})); }
  torch::Tensor Forward(const torch::Tensor&, const TensorMap& in) override {
    return F::embedding(in.at("input_ids"), weight_);
  }

 private:
  torch::Tensor weight_;
};

class PositionEmbedding : public Layer {
 public:
  PositionEmbedding(int positions, int d, double dropout) : dropout_(dropout) {
    weight_ = register_parameter("weight", Normal({positions, d}));
  }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap&) override {
    auto h = x + weight_.narrow(0, 0, x.size(1)).unsqueeze(0);
    return F::dropout(h, F::DropoutFuncOptions().p(dropout_).training(is_training()));
  }

 private:
  double dropout_;
  torch::Tensor weight_;
};

class Block : public Layer {
 public:
  explicit Block(const ModelSpec& s) : heads_(s.heads), dropout_(s.dropout) {
    ln_1_ = register_module("ln_1", std::make_shared<Norm>(s.d_model, s.norm_eps));
    attn_ = register_module("attn", std::make_shared<Attention>(s.d_model));
    ln_2_ = register_module("ln_2", std::make_shared<Norm>(s.d_model, s.norm_eps));
    mlp_ = register_module("mlp", std::make_shared<Mlp>(s.d_model, s.ffn));
  }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap&) override {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads_;
    auto drop = F::DropoutFuncOptions().p(dropout_).training(is_training());
    auto qkv = (*attn_->c_attn)((*ln_1_)(x)).view({b, t, 3, heads_, hd}).permute({2, 0, 3, 1, 4});
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    // Note [Fused attention] in attention.cc (GPT-2's attn_pdrop on the probabilities).
    auto y =
        CausalAttention(q, k, v, is_training() ? dropout_ : 0.0).transpose(1, 2).reshape({b, t, d});
    auto h = x + F::dropout((*attn_->c_proj)(y), drop);
    auto m = (*mlp_->c_proj)(torch::gelu((*mlp_->c_fc)((*ln_2_)(h)), "tanh"));
    return h + F::dropout(m, drop);
  }

 private:
  int64_t heads_;
  double dropout_;
  std::shared_ptr<Norm> ln_1_, ln_2_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<Mlp> mlp_;
};

class FinalNorm : public Layer {
 public:
  FinalNorm(int d, double eps) : eps_(eps) {
    weight_ = register_parameter("weight", torch::ones({d}));
    bias_ = register_parameter("bias", torch::zeros({d}));
  }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap&) override {
    return torch::layer_norm(x, {weight_.size(0)}, weight_, bias_, eps_);
  }

 private:
  double eps_;
  torch::Tensor weight_, bias_;
};

}  // namespace

Model Gpt2Model(const ModelSpec& s) {
  Model m;
  const double d = s.d_model, t = s.seq_len;
  m.Add("transformer.wte", t * d,
        [s] { return std::make_shared<TokenEmbedding>(s.vocab, s.d_model); });
  m.Add("transformer.wpe", t * d,
        [s] { return std::make_shared<PositionEmbedding>(s.max_positions, s.d_model, s.dropout); });
  for (int i = 0; i < s.layers; ++i) {
    m.Add(CutPoint{});
    // The planner's cost model (common/planner/profile.cc) counts the same FLOPs.
    m.Add(absl::StrCat("transformer.h.", i), 2 * t * (4 * d * d + 2 * d * s.ffn) + 4 * t * t * d,
          [s] { return std::make_shared<Block>(s); });
  }
  m.Add(CutPoint{});
  m.Add("transformer.ln_f", t * d,
        [s] { return std::make_shared<FinalNorm>(s.d_model, s.norm_eps); });
  m.Add("lm_head", 2 * t * d * s.vocab, [s] { return LmHead(s.vocab, s.d_model); });
  for (const auto& [a, b] : TiedParameters(s)) m.Tie(a, b);
  return m;
}

}  // namespace varuna
