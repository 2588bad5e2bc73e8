#pragma once

// Megatron-style tensor parallelism inside one stage (Note [Tensor parallelism] in
// tensor_parallel.cc: the layout of processes and groups, checkpoints, limits).
//
// A stage's tp_size ranks each hold a slice of every block: the attention's heads and the MLP's
// hidden units. A column-parallel linear splits its output features (each rank computes its
// heads' q, k, v, or its share of the MLP's hidden layer); a row-parallel linear splits its
// input features and sums the partial outputs over the group. Around them:
//   f = CopyToTensorParallel:     identity forward, all-reduce of the gradient backward
//                                  (the replicated input of the column-parallel linears),
//   g = ReduceFromTensorParallel: all-reduce forward, identity backward
//                                  (the row-parallel linear's partial outputs).
// Everything outside a block's f..g region (embeddings, norms, the head, the residual stream)
// is replicated and computed identically on every rank of the group, so its gradients are
// equal everywhere and need no reduction.
//
// Parameters keep their full names; a sharded one holds a slice of the full tensor, described
// by a ShardSpec, so a checkpoint can store full tensors (shape-free) and any tp_size can
// load them.

#include <torch/torch.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/dist/process_group.h"

namespace varuna {

// This rank's place in its stage's tensor-parallel group. size 1: no tensor parallelism.
struct TensorParallel {
  int size = 1;
  int rank = 0;
  ProcessGroupPtr group;  // the stage's tp ranks (null when size is 1)
  std::chrono::milliseconds timeout{300000};
  torch::Device device{torch::kCPU};   // the rank's compute device
  std::shared_ptr<AbortSignal> abort;  // the generation's (Note [Aborting waits])
  bool enabled() const { return size > 1; }
};

// How a sharded parameter is cut: along `dim`, the full tensor is `blocks` equal parts (qkv:
// 3, q | k | v), and each part is cut into `size` equal slices; rank r holds slice r of each
// part, concatenated.
struct ShardSpec {
  int dim = 0;
  int blocks = 1;
};

// Rank `rank`'s slice of `full` (a copy, contiguous).
torch::Tensor TakeShard(const torch::Tensor& full, const ShardSpec& spec, int size, int rank);
// The full tensor from every rank's slice, in rank order.
torch::Tensor JoinShards(const std::vector<torch::Tensor>& shards, const ShardSpec& spec);

// f and g above (identity when tp is not enabled or grad mode is off, for f).
torch::Tensor CopyToTensorParallel(const torch::Tensor& x, const TensorParallel& tp);
torch::Tensor ReduceFromTensorParallel(const torch::Tensor& x, const TensorParallel& tp);

// Dropout of attention probabilities `att` [b, heads / tp.size, t, t] that holds this rank's
// heads: the mask is drawn for all `heads` (as the unsplit model's dropout draws it) and this
// rank's heads kept, so every rank of the group consumes the same random numbers and the
// replicated dropouts after it stay identical, and tp_size does not change the masks.
torch::Tensor HeadSliceDropout(const torch::Tensor& att, int heads, double p,
                               const TensorParallel& tp);

// Every rank's copy of `t` (same shape everywhere), in rank order; collective over the group.
absl::StatusOr<std::vector<torch::Tensor>> AllGather(const torch::Tensor& t,
                                                     const TensorParallel& tp);

// The TensorParallel of `groups` (size 1 without a tp group).
TensorParallel TensorParallelOf(const ProcessGroups& groups, torch::Device device);

// A module that holds sharded parameters says which, by their names within the module.
class ShardedModule {
 public:
  virtual ~ShardedModule() = default;
  virtual std::map<std::string, ShardSpec> shards() const = 0;
};

// The sharded parameters of `module` and its submodules, by their names within `module`.
std::map<std::string, ShardSpec> ShardsOf(const torch::nn::Module& module);

}  // namespace varuna
