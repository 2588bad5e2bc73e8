#pragma once

// Linear layers whose weight gradient can be deferred (Note [Deferred weight gradients]).
//
// The built-in models compute every linear map through ApplyLinear(). Normally that is
// at::linear (or addmm). While a WeightGradCapture is active on the thread, each call also
// records the layer's input and, through a hook, the gradient of its output; a backward run
// with the recorded weights left out of its `inputs` then computes only the input gradients
// (ZB-H1's B pass), and WeightGradCapture::Apply() adds each weight's gradient later (the W
// pass) with one matmul, without walking the autograd graph again.

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/models/tensor_parallel.h"

namespace varuna {

// How a weight is laid out: [out, in] (torch's Linear, y = x Wᵀ + b) or [in, out] (GPT-2's
// Conv1D, y = x W + b).
enum class WeightLayout { kOutIn, kInOut };

class WeightGradCapture {
 public:
  // Called by ApplyLinear() during a forward with grad mode on; registers the hook on `y`.
  void Record(const torch::Tensor& weight, WeightLayout layout, const torch::Tensor& x,
              torch::Tensor& y);
  // Whether `param` is one of the recorded weights (the backward leaves these out).
  bool Defers(const torch::Tensor& param) const;
  // Adds every recorded weight's gradient (gy flattened to [n, out], x to [n, in]) and drops
  // the recordings. A weight whose output gradient never arrived (the backward did not reach
  // it) gets none. Returns the weights it added to, once each.
  std::vector<torch::Tensor> Apply();
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    torch::Tensor weight;
    WeightLayout layout;
    torch::Tensor input;
    std::shared_ptr<torch::Tensor> grad_out;  // set by the hook during the backward
  };
  std::vector<Entry> entries_;
};

// Makes `capture` the current thread's capture for its lifetime (null: none).
class ScopedWeightGradCapture {
 public:
  explicit ScopedWeightGradCapture(WeightGradCapture* capture);
  ~ScopedWeightGradCapture();
  ScopedWeightGradCapture(const ScopedWeightGradCapture&) = delete;
  ScopedWeightGradCapture& operator=(const ScopedWeightGradCapture&) = delete;

 private:
  WeightGradCapture* previous_;
};

// y = x Wᵀ + b (kOutIn) or x W + b (kInOut), over the last dimension of x; `bias` may be
// undefined. Recorded into the thread's capture when there is one.
torch::Tensor ApplyLinear(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias, WeightLayout layout = WeightLayout::kOutIn);

// How a linear is split over a tensor-parallel group (Note [Tensor parallelism]).
enum class TpSplit {
  kNone,    // replicated
  kColumn,  // output features split (weight and bias rows); `blocks` equal parts (qkv: 3)
  kRow,     // input features split (weight columns); partial outputs summed, then the bias
};

// torch::nn::Linear's parameters ("weight" [out, in], "bias" [out]), initialised as the built-in
// models always did (normal(0, 0.02), zero bias), computed through ApplyLinear(). Split, it
// initialises the full layer the same way and keeps this rank's slice, so every tp_size
// starts from the same model.
class LinearImpl : public torch::nn::Module, public ShardedModule {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias, TpSplit split = TpSplit::kNone,
             TensorParallel tp = {}, int blocks = 1);
  // A column-parallel linear expects its input already through CopyToTensorParallel (once
  // per block, shared by the block's column-parallel linears).
  torch::Tensor forward(const torch::Tensor& x);
  std::map<std::string, ShardSpec> shards() const override;

  torch::Tensor weight, bias;

 private:
  TpSplit split_;
  TensorParallel tp_;
  int blocks_;
  bool has_bias_;
};
TORCH_MODULE(Linear);

}  // namespace varuna
