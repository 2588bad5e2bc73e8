// model.kind bert: Hugging Face's BertForMaskedLM, module for module and name for name
// (common/spec/model_spec.h), trained as a masked language model (docs/models.md "BERT"):
//   - bert.embeddings: word + absolute position + token-type embeddings (token type 0 unless
//     the batch has token_type_ids), LayerNorm (layer_norm_eps), dropout.
//   - bert.encoder.layer.N: post-norm blocks: bidirectional self-attention (query, key, value
//     with biases, scaled by 1/sqrt(head_dim)), attention.output.dense + residual + LayerNorm,
//     intermediate.dense with the exact (erf) GELU, output.dense + residual + LayerNorm;
//     dropout where BERT has it (attention probabilities, each branch before its residual).
//   - cls.predictions: transform.dense, GELU, transform.LayerNorm, then the decoder, whose
//     weight is tied to bert.embeddings.word_embeddings, plus cls.predictions.bias; the loss
//     is the mean cross-entropy over the positions whose label is not -100 (the masked ones),
//     0 for a micro-batch without any (Note [Masked-token weighting] in
//     worker/engine/pipeline_executor.cc weighs micro-batches by their counts).

#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/models/builtin.h"
#include "worker/models/linear.h"

namespace varuna {
namespace {

namespace F = torch::nn::functional;

torch::Tensor Normal(std::vector<int64_t> shape) { return torch::randn(shape) * 0.02; }

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

// Modules nest so that the parameter names are Hugging Face's ("attention.output.dense.weight"):
// a Holder only holds others; a Weight is one tensor named "weight" (an embedding table).
struct Holder : torch::nn::Module {};
struct Weight : torch::nn::Module {
  explicit Weight(torch::Tensor w) { weight = register_parameter("weight", std::move(w)); }
  torch::Tensor weight;
};

class Embeddings : public Layer {
 public:
  explicit Embeddings(const ModelSpec& s) : dropout_(s.dropout) {
    word_ =
        register_module("word_embeddings", std::make_shared<Weight>(Normal({s.vocab, s.d_model})))
            ->weight;
    position_ = register_module("position_embeddings",
                                std::make_shared<Weight>(Normal({s.max_positions, s.d_model})))
                    ->weight;
    type_ = register_module("token_type_embeddings",
                            std::make_shared<Weight>(Normal({s.type_vocab, s.d_model})))
                ->weight;
    norm_ = register_module("LayerNorm", std::make_shared<Norm>(s.d_model, s.norm_eps));
  }
  torch::Tensor Forward(const torch::Tensor&, const TensorMap& in) override {
    const torch::Tensor& ids = in.at("input_ids");
    auto h = F::embedding(ids, word_) + position_.narrow(0, 0, ids.size(1)).unsqueeze(0);
    auto types = in.find("token_type_ids");
    h = types != in.end() ? h + F::embedding(types->second, type_) : h + type_[0];
    return F::dropout((*norm_)(h), F::DropoutFuncOptions().p(dropout_).training(is_training()));
  }

 private:
  double dropout_;
  torch::Tensor word_, position_, type_;
  std::shared_ptr<Norm> norm_;
};

class EncoderLayer : public Layer {
 public:
  explicit EncoderLayer(const ModelSpec& s) : heads_(s.heads), dropout_(s.dropout) {
    const int d = s.d_model;
    auto self = register_module("attention", std::make_shared<Holder>());
    auto sa = self->register_module("self", std::make_shared<Holder>());
    query_ = sa->register_module("query", Linear(d, d, true));
    key_ = sa->register_module("key", Linear(d, d, true));
    value_ = sa->register_module("value", Linear(d, d, true));
    auto out = self->register_module("output", std::make_shared<Holder>());
    attn_dense_ = out->register_module("dense", Linear(d, d, true));
    attn_norm_ = out->register_module("LayerNorm", std::make_shared<Norm>(d, s.norm_eps));
    auto inter = register_module("intermediate", std::make_shared<Holder>());
    inter_dense_ = inter->register_module("dense", Linear(d, s.ffn, true));
    auto output = register_module("output", std::make_shared<Holder>());
    out_dense_ = output->register_module("dense", Linear(s.ffn, d, true));
    out_norm_ = output->register_module("LayerNorm", std::make_shared<Norm>(d, s.norm_eps));
  }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap&) override {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads_;
    auto heads = [&](Linear& l) { return l->forward(x).view({b, t, heads_, hd}).transpose(1, 2); };
    const double p = is_training() ? dropout_ : 0.0;
    auto y = at::scaled_dot_product_attention(heads(query_), heads(key_), heads(value_), {}, p,
                                              /*is_causal=*/false)
                 .transpose(1, 2)
                 .reshape({b, t, d});
    auto drop = F::DropoutFuncOptions().p(dropout_).training(is_training());
    auto h = (*attn_norm_)(x + F::dropout(attn_dense_->forward(y), drop));
    auto m = out_dense_->forward(torch::gelu(inter_dense_->forward(h)));
    return (*out_norm_)(h + F::dropout(m, drop));
  }

 private:
  int64_t heads_;
  double dropout_;
  Linear query_{nullptr}, key_{nullptr}, value_{nullptr}, attn_dense_{nullptr},
      inter_dense_{nullptr}, out_dense_{nullptr};
  std::shared_ptr<Norm> attn_norm_, out_norm_;
};

class MaskedLmHead : public Layer {
 public:
  explicit MaskedLmHead(const ModelSpec& s) {
    auto transform = register_module("transform", std::make_shared<Holder>());
    dense_ = transform->register_module("dense", Linear(s.d_model, s.d_model, true));
    norm_ = transform->register_module("LayerNorm", std::make_shared<Norm>(s.d_model, s.norm_eps));
    decoder_ =
        register_module("decoder", std::make_shared<Weight>(Normal({s.vocab, s.d_model})))->weight;
    bias_ = register_parameter("bias", torch::zeros({s.vocab}));
  }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap& in) override {
    auto h = (*norm_)(torch::gelu(dense_->forward(x)));
    auto logits = ApplyLinear(h, decoder_, bias_);
    const torch::Tensor labels = in.at("labels").reshape({-1});
    // Sum over the masked positions / their count (at least 1: a micro-batch without one adds
    // 0), so no count is read back to the host.
    auto sum =
        F::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), labels,
                         F::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
    return sum / (labels != -100).sum().clamp_min(1).to(sum.scalar_type());
  }

 private:
  Linear dense_{nullptr};
  std::shared_ptr<Norm> norm_;
  torch::Tensor decoder_, bias_;
};

}  // namespace

Model BertModel(const ModelSpec& s) {
  Model m;
  const double d = s.d_model, t = s.seq_len;
  m.Add("bert.embeddings", t * d, [s] { return std::make_shared<Embeddings>(s); });
  for (int i = 0; i < s.layers; ++i) {
    m.Add(CutPoint{});
    // The planner's cost model (common/planner/profile.cc) counts the same FLOPs.
    m.Add(absl::StrCat("bert.encoder.layer.", i),
          2 * t * (4 * d * d + 2 * d * s.ffn) + 4 * t * t * d,
          [s] { return std::make_shared<EncoderLayer>(s); });
  }
  m.Add(CutPoint{});
  m.Add("cls.predictions", 2 * t * d * d + 2 * t * d * s.vocab,
        [s] { return std::make_shared<MaskedLmHead>(s); });
  for (const auto& [a, b] : TiedParameters(s)) m.Tie(a, b);
  return m;
}

}  // namespace varuna
