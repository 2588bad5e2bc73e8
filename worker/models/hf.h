#pragma once

// Hugging Face weights in and out (docs/models.md): model.init_from starts a llama or gpt2
// job from a directory of safetensors, and `varuna-ckpt export --format hf` writes a
// checkpoint back as one. Tensor names are the model's parameter names
// ("<layer>.<param>", common/spec/model_spec.h), so nothing is renamed but GPT-2's optional
// "transformer." prefix, which files saved from GPT2Model lack.

#include <torch/torch.h>

#include <cstdint>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "common/checkpoint/hf_weights.h"
#include "common/spec/model_spec.h"

namespace varuna {

// Copies layer `layer`'s parameters from `weights`: shapes must match (an error names the
// tensor, both shapes and the directory); F32 is read as is, BF16/F16 are upcast into the
// fp32 parameter (their names are added to *upcast). A parameter the file lacks is an error,
// unless it is the second of a tied pair (TieAtStart fills it from the first).
absl::Status LoadHfLayer(const HfWeights& weights, const ModelSpec& spec, const std::string& dir,
                         const std::string& layer, torch::nn::Module& module,
                         std::set<std::string>* upcast);

struct HfExportOptions {
  std::string dtype = "F32";                 // F32 | BF16 | F16
  uint64_t max_shard_bytes = 5'000'000'000;  // Hugging Face's default shard size
  std::string tokenizer_dir;                 // "" = the one the checkpoint records
};
struct HfExportStats {
  int64_t step = 0;
  int tensors = 0;
  int shards = 0;
  uint64_t bytes = 0;                // tensor data written
  uint64_t largest_layer_bytes = 0;  // the largest layer's parameters, in the output dtype
  int tokenizer_files = 0;
  // The tokenizer directory when it came from the checkpoint (the job's word), not the caller.
  std::string tokenizer_from_checkpoint;
};

// Writes checkpoint `ckpt_path` (a complete varuna_ckpt_<step>) as a Hugging Face directory
// at `out`: config.json, model.safetensors or shards + model.safetensors.index.json, and the
// tokenizer's files. Streams: one layer file is mapped at a time and only its parameters are
// touched (not the optimizer state beside them), so memory stays about one layer.
absl::StatusOr<HfExportStats> ExportHf(const std::string& ckpt_path, const std::string& out,
                                       const HfExportOptions& options);

}  // namespace varuna
