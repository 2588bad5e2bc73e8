#include "worker/models/tensor_parallel.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/dist/read_back.h"
#include "worker/dist/torch_status.h"

namespace varuna {
namespace {

// Sums `t` over the group in place, through a copy where the group needs another device (a
// host copy for gloo, a copy on the rank's own GPU of a host value for NCCL). A host value
// summed on the GPU comes back through ReadBack, so a peer that died mid-sum fails it after the
// timeout instead of blocking the copy (and the checkpoint's lock) for ever.
void AllReduceInPlace(torch::Tensor& t, const TensorParallel& tp) {
  torch::Tensor buf;
  if (tp.group->backend() == "nccl") {
    buf = t.device() == tp.device ? t.contiguous() : ToDevice(t.contiguous(), tp.device);
  } else if (!tp.group->device_transfers()) {
    buf = t.is_cpu() ? t.contiguous() : t.to(torch::kCPU);
  } else {
    buf = t.contiguous();
  }
  tp.group->AllReduceSum(buf, tp.timeout)->Wait(tp.timeout);
  if (buf.is_same(t)) return;
  t.copy_(t.is_cpu() && !buf.is_cpu() ? ReadBack(buf, tp.abort.get(), tp.timeout) : buf);
}

}  // namespace

torch::Tensor TakeShard(const torch::Tensor& full, const ShardSpec& spec, int size, int rank) {
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& block : full.chunk(spec.blocks, spec.dim)) {
    parts.push_back(block.chunk(size, spec.dim)[rank]);
  }
  return torch::cat(parts, spec.dim).contiguous();
}

torch::Tensor JoinShards(const std::vector<torch::Tensor>& shards, const ShardSpec& spec) {
  std::vector<std::vector<torch::Tensor>> by_rank;
  for (const torch::Tensor& s : shards) by_rank.push_back(s.chunk(spec.blocks, spec.dim));
  std::vector<torch::Tensor> parts;
  for (int b = 0; b < spec.blocks; ++b) {
    for (const auto& r : by_rank) parts.push_back(r[b]);
  }
  return torch::cat(parts, spec.dim);
}

// Note [Tensor parallelism]: Megatron-style, inside each stage.
//  - Layout. With parallel.tp_size = T, the stage map (or pipelines) places positions, and
//    each position is T processes with consecutive RANKs (one node): process p is tp rank
//    p mod T of position p div T (WorkerTopology). CreateGroups makes, for each tp rank, a
//    complete set of Varuna groups over the processes with that tp rank (a "tp slice": world,
//    data-parallel holder groups, tied pair; group ranks are positions), then a tp group per
//    position. Each process runs an ordinary engine over its slice, so the pipeline's
//    transfers, the data-parallel reduction per (layer, tp rank) and the tied weights need no
//    change; only the layers talk across slices, through the tp group.
//  - Layers. f and g (tensor_parallel.h) are built from plain autograd pieces, so they need no
//    custom Function: g, y = sum(x) + (x - x.detach()), has exactly the sum as its value (the
//    same bits on every tp rank) and the identity as its gradient; f is a view of x whose gradient
//    hook returns the group's sum. They communicate on the thread that runs the forward or
//    backward, in layer order, which is the same on every tp rank of a stage: the ranks run the
//    same task list, and with tp the executor does no run-time reordering (StageConfig::reorder).
//  - Replicated work. Embeddings, norms, the head and dropout outside the heads are computed
//    identically on every tp rank (the same seed per position; the attention dropout draws
//    every head's mask, HeadSliceDropout), so their gradients agree without a reduction.
//  - The step. A sharded parameter's squared gradient norm is summed over the tp group, a
//    replicated one counted once, and the stop request rides along, so every slice's separate
//    agreement decides alike (Varuna::step).
//  - Checkpoints hold full tensors: a writer's tp ranks gather each sharded parameter and its
//    optimizer state (Varuna::GatherShards) and tp rank 0 writes; a loader takes its slice of
//    each (LoadLayer). A checkpoint so resumes at any tp_size and any P x D.
//  - Not yet: rescue (it runs without collectives), morph in place and the manager's plans
//    (tp jobs run under varuna-worker or torchrun), profiling, model.init_from, gpt2 and
//    TorchScript models; each is refused with the reason.
torch::Tensor CopyToTensorParallel(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.enabled() || !torch::GradMode::is_enabled() || !x.requires_grad()) return x;
  torch::Tensor y = x.view_as(x);
  TensorParallel copy = tp;
  y.register_hook([copy](const torch::Tensor& g) {
    torch::Tensor sum = g.clone();
    AllReduceInPlace(sum, copy);
    return sum;
  });
  return y;
}

torch::Tensor ReduceFromTensorParallel(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.enabled()) return x;
  torch::Tensor sum;
  {
    torch::NoGradGuard no_grad;
    sum = x.detach().clone();
    AllReduceInPlace(sum, tp);
  }
  if (!x.requires_grad()) return sum;
  // Exactly the sum (x - x is 0), so every tp rank holds the same bits; gradient: identity.
  return sum + (x - x.detach());
}

torch::Tensor HeadSliceDropout(const torch::Tensor& att, int heads, double p,
                               const TensorParallel& tp) {
  std::vector<int64_t> shape = att.sizes().vec();
  const int64_t local = shape[1];
  shape[1] = heads;
  torch::Tensor noise = torch::empty(shape, att.options().requires_grad(false)).bernoulli_(1 - p);
  noise = noise.narrow(1, tp.rank * local, local).div_(1 - p);
  return att * noise;
}

absl::StatusOr<std::vector<torch::Tensor>> AllGather(const torch::Tensor& t,
                                                     const TensorParallel& tp) {
  if (!tp.enabled()) return std::vector<torch::Tensor>{t};
  // A gather as a sum: each rank writes its copy into its own row of a zeroed buffer.
  std::vector<torch::Tensor> out;
  RETURN_IF_ERROR(TorchCall("tensor-parallel gather", [&] {
    torch::NoGradGuard no_grad;
    std::vector<int64_t> shape = {tp.size};
    for (int64_t d : t.sizes()) shape.push_back(d);
    torch::Tensor buf = torch::zeros(shape, t.options());
    buf[tp.rank].copy_(t);
    AllReduceInPlace(buf, tp);
    for (int r = 0; r < tp.size; ++r) out.push_back(buf[r].clone());
  }));
  return out;
}

TensorParallel TensorParallelOf(const ProcessGroups& groups, torch::Device device) {
  TensorParallel tp;
  if (!groups.tp) return tp;
  tp.size = groups.tp->size();
  tp.rank = groups.tp->rank();
  tp.group = groups.tp;
  tp.timeout = groups.timeout;
  tp.device = device;
  tp.abort = groups.abort;
  return tp;
}

std::map<std::string, ShardSpec> ShardsOf(const torch::nn::Module& module) {
  std::map<std::string, ShardSpec> out;
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const auto* sharded = dynamic_cast<const ShardedModule*>(item.value().get());
    if (sharded == nullptr) continue;
    for (const auto& [name, spec] : sharded->shards()) {
      out[item.key().empty() ? name : absl::StrCat(item.key(), ".", name)] = spec;
    }
  }
  return out;
}

}  // namespace varuna
