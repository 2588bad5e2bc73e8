#pragma once

// Data-parallel gradient reduction for one pipeline stage, in the manner of c10d's Reducer:
// the engine hands it the stage's parameters once, then only calls it. The groups, the flat
// buckets, the gradient-accumulator hooks and the all-reduces are its own.
//
// Per training step, on the engine's thread:
//   reducer->PrepareStep(); // before the first backward: zeroes the buckets, which are the
//                           //   gradients (Note [Gradients as bucket views])
//   reducer->Arm();         // right before the step's last backward: the hooks post buckets
//   ...last backward...     //   as their gradients become final (Note [Overlapped all-reduce])
//   reducer->ReduceTied();  // sums tied copies' gradients (Note [Tied weights])
//   reducer->Finish();      // posts the rest, waits, writes the sums into .grad()
// or reducer->Abort() when the backward failed. The hooks run on the autograd thread; the
// reducer's own lock orders them with the engine's calls.

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/dist/process_group.h"

namespace varuna {

struct GradientReducerOptions {
  int64_t bucket_bytes = 25 << 20;       // fp32 bytes per flat bucket
  int64_t first_bucket_bytes = 1 << 20;  // the first bucket in backward order (as DDP)
  // Post buckets from the backward's hooks once armed; false: all of them in Finish(). The
  // sums are bit-identical either way.
  bool overlap = true;
  torch::Device device = torch::kCPU;  // where the buckets live: the parameters' device
  std::chrono::milliseconds timeout{300000};
};

// One parameter of the stage, as the reducer sees it.
struct ReducedParameter {
  std::string name;  // model-wide: "<layer name>.<parameter>"
  torch::Tensor tensor;
  // The data-parallel group of its segment's holders (Note [Data-parallel reduction] in
  // gradient_reducer.cc); null when nothing is all-reduced (a single pipeline).
  ProcessGroupPtr group;
};

class GradientReducer {
 public:
  // Lays out the buckets of `params` (this stage's, in layer order) and, with
  // options.overlap, hooks their gradient accumulators. `tied` are the model's tied pairs
  // of parameter names (pairs with no copy here are ignored); `tied_group` joins the first
  // and last stage when a pair spans them. Errors are LibTorch's, as a status.
  static absl::StatusOr<std::unique_ptr<GradientReducer>> Create(
      std::vector<ReducedParameter> params,
      const std::vector<std::pair<std::string, std::string>>& tied, ProcessGroupPtr tied_group,
      GradientReducerOptions options);
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Before the step's first backward: one memset per bucket, and every parameter whose
  // gradient lives in a bucket (Note [Gradients as bucket views] in gradient_reducer.cc) given
  // its view again if something replaced it.
  void PrepareStep();
  // After the update: releases the stage's gradients (undefined: the next backward takes its
  // first gradient as it is) except those that are views of a bucket, which stay until the
  // next PrepareStep zeroes them.
  void ReleaseGradients();
  // From now until Finish() or Abort(), the hooks post each bucket once its gradients are
  // final. Call right before the step's last backward (earlier ones still accumulate).
  void Arm();
  // The gradients of `params` became final outside autograd (the step's last W pass of a split
  // schedule adds them directly, so no accumulator hook fires): counts them as the hooks do.
  void DeferredGradientsReady(const std::vector<torch::Tensor>& params);
  // Sums the gradients of each tied pair (Note [Tied weights]): locally, and over the tied
  // group for pairs split between the first and last stage. Every parameter has a gradient.
  absl::Status ReduceTied();
  // Disarms, posts every bucket the hooks did not, waits for all, and writes the sums back
  // into the parameters' gradients. Call after ReduceTied(). Collective over each group.
  absl::Status Finish();
  // Disarms and gives up on buckets in flight (the step failed before Finish()).
  void Abort();

  // Whether `param` is the second copy of a tied pair: the gradient norm and the parameter
  // count skip it.
  bool IsSecondCopy(const torch::Tensor& param) const;
  // Buckets over all groups, and how many of them the last Finish() found posted early.
  int num_buckets() const;
  int last_early_buckets() const { return last_early_buckets_; }

 private:
  // A data-parallel group: its parameters and their flat buckets, laid out once.
  struct Group {
    ProcessGroupPtr pg;
    std::vector<int> params;                  // indices into params_, layer order
    std::vector<std::vector<int>> bucket_of;  // params per flat bucket, in launch order
    std::vector<torch::Tensor> buckets;
    // Per bucket: its parameters' gradients are views of it (nothing copied in or out).
    std::vector<bool> viewed;
    // Per step: gradients still missing per bucket, the next bucket to post, works posted.
    std::vector<int> missing;
    size_t next = 0;
    std::vector<WorkPtr> works;
  };
  // A tied parameter on this stage.
  struct Tied {
    torch::Tensor param;
    bool second;                  // the pair's second copy
    torch::Tensor local_partner;  // the other copy, when it is on this stage too
  };

  GradientReducer(ProcessGroupPtr tied_group, GradientReducerOptions options)
      : tied_group_(std::move(tied_group)), options_(options) {}
  void LayOut(const std::vector<ReducedParameter>& params,
              const std::vector<std::pair<std::string, std::string>>& tied);
  void RegisterHooks();
  void OnGradReady(int param);
  bool GradIsView(int i) const;  // params_[i]'s gradient is its bucket's view
  void LaunchReadyBuckets();     // mu_ held
  void ResetStep(bool abort);    // mu_ held

  std::vector<torch::Tensor> params_;
  std::vector<Group> groups_;
  std::vector<std::pair<int, int>> bucket_of_param_;  // (group, bucket) per params_ index
  // Per params_ index: the view of its bucket that is its gradient (undefined: copied).
  std::vector<torch::Tensor> grad_view_;
  std::vector<Tied> tied_;
  ProcessGroupPtr tied_group_;
  GradientReducerOptions options_;
  // Kept alive for the hooks: whatever grad_accumulator returns (std::shared_ptr<Node> in
  // LibTorch 2.11, an intrusive_ptr in later releases).
  std::vector<decltype(torch::autograd::impl::grad_accumulator(std::declval<torch::Tensor>()))>
      grad_accs_;
  std::mutex mu_;  // the autograd thread posts buckets while the compute thread may flush
  bool armed_ = false;
  int last_early_buckets_ = 0;
};

}  // namespace varuna
