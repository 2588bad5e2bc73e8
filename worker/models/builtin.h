#pragma once

// The built-in model kinds that follow Hugging Face (common/spec/model_spec.h): each returns
// the Model whose layer and parameter names are Hugging Face's, cut between blocks.

#include <memory>

#include "absl/status/statusor.h"
#include "common/spec/model_spec.h"
#include "worker/models/linear.h"
#include "worker/models/model.h"

namespace varuna {

Model GptModel(const ModelSpec& spec, const TensorParallel& tp);  // worker/models/gpt.cc
Model MlpModel(const ModelSpec& spec, const TensorParallel& tp);  // worker/models/gpt.cc
// worker/models/torchscript.cc: segment_0.pt, segment_1.pt, ... under spec.path.
absl::StatusOr<Model> ScriptModel(const ModelSpec& spec);
Model LlamaModel(const ModelSpec& spec, const TensorParallel& tp);  // worker/models/llama.cc
Model Gpt2Model(const ModelSpec& spec);                             // worker/models/gpt2.cc
Model BertModel(const ModelSpec& spec);                             // worker/models/bert.cc

// "lm_head": logits = x W^T (W [vocab, d], no bias), then the mean cross-entropy against
// the labels. Shared by llama and gpt2 (where W is tied to the token embedding).
std::shared_ptr<Layer> LmHead(int vocab, int d);

}  // namespace varuna
