#pragma once

// The model registry: a model kind's name (model.kind in the job spec) to its builder. The
// kinds live in worker/models/ (builtin.h); Model itself (model.h) knows none of them.

#include "absl/status/statusor.h"
#include "common/spec/model_spec.h"
#include "worker/models/model.h"
#include "worker/models/tensor_parallel.h"

namespace varuna {

// Builds a built-in model (gpt, mlp; llama and gpt2 in worker/models/) or loads TorchScript
// segments from spec.path (segment_0.pt, segment_1.pt, ...: each a scripted module with forward(x:
// Tensor, input_ids: Tensor, labels: Tensor) -> Tensor).
// With `tp` enabled, each block holds this rank's slice (Note [Tensor parallelism]); the kind
// and sizes must allow it (CheckTensorParallel).
absl::StatusOr<Model> BuildModel(const ModelSpec& spec, const TensorParallel& tp = {});

}  // namespace varuna
