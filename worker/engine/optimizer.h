#pragma once

// The optimizer a job spec asks for (train.optimizer: adamw or sgd; docs/job_spec.md).

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/spec/job_spec.h"

namespace varuna {

// The job's optimizer over `named_params`: AdamW or SGD, weight decay on matrices only.
std::shared_ptr<torch::optim::Optimizer> MakeOptimizer(
    const TrainSpec& train, const std::vector<std::pair<std::string, torch::Tensor>>& named_params);

}  // namespace varuna
