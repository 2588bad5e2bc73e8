#include "worker/engine/optimizer.h"

#include <cstdlib>
#include <cstring>

#include "worker/engine/fused_adamw.h"

namespace varuna {

std::shared_ptr<torch::optim::Optimizer> MakeOptimizer(
    const TrainSpec& t, const std::vector<std::pair<std::string, torch::Tensor>>& named_params) {
  // Decay only matrices (weights, embeddings); never biases or LayerNorm gains.
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& [name, p] : named_params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (t.optimizer == "sgd") {
    auto o = torch::optim::SGDOptions(t.lr).momentum(t.momentum);
    groups.emplace_back(decay, std::make_unique<torch::optim::SGDOptions>(
                                   torch::optim::SGDOptions(o).weight_decay(t.weight_decay)));
    groups.emplace_back(no_decay, std::make_unique<torch::optim::SGDOptions>(o));
    return std::make_shared<torch::optim::SGD>(groups, o);
  }
  // Defaults hold the decay: newer 2.x swaps a group value equal to AdamW's own (0.01) for it.
  auto o = torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).weight_decay(t.weight_decay);
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(o));
  auto none = torch::optim::AdamWOptions(o).weight_decay(0.0);
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(none));
  // Note [Fused AdamW] in fused_adamw.cc; VARUNA_ADAMW=loop keeps the frontend's per-parameter
  // loop (the same checkpoints), for A/B measurements.
  const char* impl = std::getenv("VARUNA_ADAMW");
  if (impl != nullptr && std::strcmp(impl, "loop") == 0) {
    return std::make_shared<torch::optim::AdamW>(groups, o);
  }
  return std::make_shared<FusedAdamW>(groups, o);
}

}  // namespace varuna
