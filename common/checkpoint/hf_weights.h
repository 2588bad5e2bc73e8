#pragma once

// The weights of a Hugging Face model directory: model.safetensors, or the shards that
// model.safetensors.index.json maps each tensor name to. Opening reads headers only; a rank
// reads the tensors of its own layers and nothing else. The index is outside data: a name it
// maps to a shard that lacks it, a shard outside the directory, or a tensor in two shards is
// an error naming the problem.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint/safetensors.h"

namespace varuna {

class HfWeights {
 public:
  static absl::StatusOr<HfWeights> Open(const std::string& dir);

  // The tensor `name` and the shard that holds it, or nullptr.
  const SafetensorsEntry* Find(const std::string& name, const SafetensorsReader** shard) const;
  // Every tensor name, sorted.
  std::vector<std::string> Names() const;

 private:
  std::vector<std::shared_ptr<SafetensorsReader>> shards_;
};

// Opens the file `name` of the model directory `dir` for reading (Note [Files of a model
// directory] in hf_weights.cc): a regular file that is, or links to, a file beneath `dir`, or
// beneath the repository of a Hugging Face cache snapshot (.../models--org--name/snapshots/REV,
// whose files link to ../../blobs). Errors name the file and the directory, never its content.
absl::StatusOr<int> OpenModelFile(const std::string& dir, const std::string& name,
                                  const std::string& what);

// Hugging Face's index file: {"metadata": {"total_size": N}, "weight_map": {name: file}}.
std::string HfIndexJson(uint64_t total_size,
                        const std::vector<std::pair<std::string, std::string>>& weight_map);

}  // namespace varuna
