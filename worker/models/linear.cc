#include "worker/models/linear.h"

#include <utility>

namespace varuna {
namespace {

thread_local WeightGradCapture* current_capture = nullptr;

}  // namespace

// Note [Deferred weight gradients]: a second autograd call for the weights
// would walk the graph again, recomputing the input gradients (W would cost B + W). Instead the
// B pass is `backward(grad, inputs = stage input + every parameter but the recorded weights)`:
// the engine then skips each linear's weight-gradient matmul (its edge is not needed), and the
// hook on the linear's output keeps the output gradient it did compute. W is then exactly the
// skipped matmul, gyᵀ x, accumulated into .grad like autograd would. The recordings hold x (which
// autograd saved anyway) and gy (one activation-sized tensor per linear) from B until W, the
// memory ZB-H1 trades for its shorter bubble.
void WeightGradCapture::Record(const torch::Tensor& weight, WeightLayout layout,
                               const torch::Tensor& x, torch::Tensor& y) {
  auto grad_out = std::make_shared<torch::Tensor>();
  y.register_hook([grad_out](const torch::Tensor& g) {
    *grad_out = g;
    return torch::Tensor();
  });
  entries_.push_back({weight, layout, x.detach(), std::move(grad_out)});
}

bool WeightGradCapture::Defers(const torch::Tensor& param) const {
  for (const Entry& e : entries_) {
    if (e.weight.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return true;
  }
  return false;
}

std::vector<torch::Tensor> WeightGradCapture::Apply() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> touched;
  for (Entry& e : entries_) {
    if (!e.grad_out->defined()) continue;
    const torch::Tensor& w = e.weight;
    const int64_t in = e.input.size(-1);
    const torch::Tensor gy = e.grad_out->reshape({-1, e.grad_out->size(-1)});
    const torch::Tensor x = e.input.reshape({-1, in}).to(gy.scalar_type());
    torch::Tensor gw = e.layout == WeightLayout::kOutIn ? gy.t().mm(x) : x.t().mm(gy);
    gw = gw.to(w.scalar_type());
    if (w.grad().defined()) {
      w.mutable_grad().add_(gw);
    } else {
      w.mutable_grad() = gw;
    }
    bool seen = false;
    for (const torch::Tensor& t : touched) seen = seen || t.is_same(w);
    if (!seen) touched.push_back(w);
  }
  entries_.clear();
  return touched;
}

ScopedWeightGradCapture::ScopedWeightGradCapture(WeightGradCapture* capture)
    : previous_(current_capture) {
  current_capture = capture;
}

ScopedWeightGradCapture::~ScopedWeightGradCapture() { current_capture = previous_; }

torch::Tensor ApplyLinear(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias, WeightLayout layout) {
  torch::Tensor y;
  if (layout == WeightLayout::kOutIn) {
    // at::linear, not the frontend's F::linear: it flattens N-D input into one addmm, so the
    // bias is added in the GEMM's epilogue (cuBLASLt) rather than by a separate mixed-dtype
    // kernel under autocast (../shared/reference/gpu-perf.md, item C).
    y = torch::linear(x, weight, bias);
  } else {
    auto shape = x.sizes().vec();
    shape.back() = weight.size(1);
    const torch::Tensor flat = x.reshape({-1, x.size(-1)});
    y = (bias.defined() ? torch::addmm(bias, flat, weight) : flat.mm(weight)).view(shape);
  }
  if (current_capture != nullptr && torch::GradMode::is_enabled() && weight.requires_grad()) {
    current_capture->Record(weight, layout, x, y);
  }
  return y;
}

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias, TpSplit split, TensorParallel tp,
                       int blocks)
    : split_(tp.enabled() ? split : TpSplit::kNone),
      tp_(std::move(tp)),
      blocks_(blocks),
      has_bias_(with_bias) {
  // torch::nn::Linear's own initialisation runs first and is overwritten: the RNG stream, and
  // so every later layer's initial weights, stay what they were with torch::nn::Linear.
  torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(with_bias));
  torch::NoGradGuard g;
  torch::Tensor w = l->weight.normal_(0, 0.02);
  torch::Tensor b = with_bias ? l->bias.zero_() : torch::Tensor();
  for (const auto& [name, spec] : shards()) {
    torch::Tensor& t = name == "weight" ? w : b;
    t = TakeShard(t, spec, tp_.size, tp_.rank);
  }
  weight = register_parameter("weight", w);
  if (with_bias) bias = register_parameter("bias", b);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (split_ != TpSplit::kRow) return ApplyLinear(x, weight, bias);
  torch::Tensor y = ReduceFromTensorParallel(ApplyLinear(x, weight, torch::Tensor()), tp_);
  return bias.defined() ? y + bias : y;
}

std::map<std::string, ShardSpec> LinearImpl::shards() const {
  std::map<std::string, ShardSpec> out;
  if (split_ == TpSplit::kColumn) {
    out["weight"] = {0, blocks_};
    if (has_bias_) out["bias"] = {0, blocks_};
  } else if (split_ == TpSplit::kRow) {
    out["weight"] = {1, 1};
  }
  return out;
}

}  // namespace varuna
