#pragma once

// Heterogeneous pipelines, the Python Varuna API's PipelineTemplate and
// HeterogeneousParallelPlugin in C++ (docs/heterogeneous.md):
//
//   auto modules = varuna::PipelineTemplate::GetModules(model);   // embed blocks.0 ... head
//   auto t1 = varuna::PipelineTemplate::Create("gpt", {{"embed", "blocks.0"},
//                                                      {"blocks.1", "head"}}, model);
//   auto t2 = varuna::PipelineTemplate::Create("gpt", {modules}, model);
//   auto plugin = varuna::HeterogeneousParallelPlugin::Create(/*tp_size=*/1,
//                                                             /*microbatch_size=*/2, "fp32");
//   plugin->SetPipelines({*t1, *t1, *t2}, {{*t1, 4}, {*t2, 2}}, world_size);
//   auto engine = varuna::Varuna::Create(model, plugin->topology(), rank, groups, ...);
//
// Templates are checked when made and pipelines when set, with the Python Varuna API's errors (see
// common/pipeline/pipeline_template.h). The plugin's topology lays the pipelines out over
// contiguous ranks in the given order; pipeline k reads num_microbatches[k] x microbatch_size
// samples.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/pipeline/topology.h"
#include "worker/engine/varuna.h"
#include "worker/models/model.h"

namespace varuna {

class PipelineTemplate {
 public:
  // Checks `modules_per_stage` against `model`'s ordered modules (GetModules); `model_name` is
  // the model kind (gpt, mlp, torchscript; others: "Auto policy for ... is not implemented").
  static absl::StatusOr<PipelineTemplate> Create(
      const std::string& model_name, std::vector<std::vector<std::string>> modules_per_stage,
      const Model& model);
  // The model's modules (its layer names) in order: what a template must list.
  static std::vector<std::string> GetModules(const Model& model);

  const std::string& model_name() const { return model_name_; }
  int num_stages() const { return static_cast<int>(modules_per_stage_.size()); }
  const std::vector<std::vector<std::string>>& modules_per_stage() const {
    return modules_per_stage_;
  }
  // Stage boundaries as segment indices.
  const std::vector<int>& boundaries() const { return boundaries_; }
  // Templates are equal when they cut the same model the same way (the seed hashes them).
  bool operator==(const PipelineTemplate& o) const {
    return model_name_ == o.model_name_ && modules_per_stage_ == o.modules_per_stage_;
  }

 private:
  std::string model_name_;
  std::vector<std::vector<std::string>> modules_per_stage_;
  std::vector<int> boundaries_;
};

class HeterogeneousParallelPlugin {
 public:
  // tp_size in [1, 64]. With tp_size > 1 the topology places positions of tp_size processes
  // (Note [Tensor parallelism] in tensor_parallel.cc): make the groups with CreateGroups(...,
  // tp_size) and the model with BuildModel(spec, TensorParallelOf(groups, device)).
  // microbatch_size >= 1; precision fp32 | bf16 | fp16.
  static absl::StatusOr<HeterogeneousParallelPlugin> Create(int tp_size, int microbatch_size,
                                                            const std::string& precision = "fp16");
  // `pipelines` in rank order; `num_microbatches` gives each distinct template its count (the
  // seed's dict; an entry repeated with another count is an error). Errors: a pipeline whose
  // template has no count ("All pipelines must have a corresponding number of
  // microbatches."), ranks != world_size ("Number of ranks in pipeline templates (N) does not
  // match world size (W)."), templates of different models, no pipelines.
  absl::Status SetPipelines(const std::vector<PipelineTemplate>& pipelines,
                            const std::vector<std::pair<PipelineTemplate, int>>& num_microbatches,
                            int world_size);

  int tp_size() const { return tp_size_; }
  int microbatch_size() const { return microbatch_size_; }
  Precision precision() const { return precision_; }
  // Valid after SetPipelines.
  const Topology& topology() const { return topology_; }
  int64_t global_batch() const { return topology_.global_batch(); }

 private:
  int tp_size_ = 1;
  int microbatch_size_ = 1;
  Precision precision_ = Precision::kFp16;
  Topology topology_;
};

}  // namespace varuna
