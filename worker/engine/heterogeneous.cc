#include "worker/engine/heterogeneous.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/pipeline/pipeline_template.h"

namespace varuna {

std::vector<std::string> PipelineTemplate::GetModules(const Model& model) {
  std::vector<std::string> names;
  for (const auto& def : model.layers()) names.push_back(def.name);
  return names;
}

absl::StatusOr<PipelineTemplate> PipelineTemplate::Create(
    const std::string& model_name, std::vector<std::vector<std::string>> modules_per_stage,
    const Model& model) {
  std::vector<int> segment_of(model.layers().size());
  const auto segments = model.Segments();
  for (size_t s = 0; s < segments.size(); ++s) {
    for (int layer : segments[s]) segment_of[layer] = static_cast<int>(s);
  }
  PipelineTemplate t;
  ASSIGN_OR_RETURN(t.boundaries_, TemplateBoundaries(model_name, GetModules(model),
                                                     modules_per_stage, segment_of));
  t.model_name_ = model_name;
  t.modules_per_stage_ = std::move(modules_per_stage);
  return t;
}

absl::StatusOr<HeterogeneousParallelPlugin> HeterogeneousParallelPlugin::Create(
    int tp_size, int microbatch_size, const std::string& precision) {
  if (tp_size < 1 || tp_size > kMaxTensorParallel) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_size must be in [1, ", kMaxTensorParallel, "], got ", tp_size));
  }
  if (microbatch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("microbatch_size must be >= 1, got ", microbatch_size));
  }
  HeterogeneousParallelPlugin p;
  ASSIGN_OR_RETURN(p.precision_, ParsePrecision(precision));
  p.tp_size_ = tp_size;
  p.microbatch_size_ = microbatch_size;
  return p;
}

absl::Status HeterogeneousParallelPlugin::SetPipelines(
    const std::vector<PipelineTemplate>& pipelines,
    const std::vector<std::pair<PipelineTemplate, int>>& num_microbatches, int world_size) {
  if (pipelines.empty())
    return absl::InvalidArgumentError("At least one pipeline template must be given.");
  for (size_t i = 0; i < num_microbatches.size(); ++i) {
    if (num_microbatches[i].second < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "num_microbatches[", i, "] is ", num_microbatches[i].second, "; it must be >= 1"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (num_microbatches[j].first == num_microbatches[i].first &&
          num_microbatches[j].second != num_microbatches[i].second) {
        return absl::InvalidArgumentError(
            absl::StrCat("identical pipeline templates must have the same number of microbatches; "
                         "num_microbatches gives one template ",
                         num_microbatches[j].second, " and ", num_microbatches[i].second));
      }
    }
  }
  int ranks = 0;
  std::vector<PipelineLayout> layouts;
  for (size_t k = 0; k < pipelines.size(); ++k) {
    const PipelineTemplate& t = pipelines[k];
    if (t.model_name() != pipelines[0].model_name() ||
        t.boundaries().back() != pipelines[0].boundaries().back()) {
      return absl::InvalidArgumentError("All pipeline templates must be of the same model.");
    }
    int count = 0;
    for (const auto& [tmpl, n] : num_microbatches) {
      if (tmpl == t) count = n;
    }
    if (count == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("All pipelines must have a corresponding number of microbatches. (pipeline ",
                       k, ", a ", t.num_stages(), "-stage template, has none)"));
    }
    ranks += t.num_stages() * tp_size_;
    PipelineLayout p;
    p.boundaries = t.boundaries();
    p.samples = static_cast<int64_t>(count) * microbatch_size_;
    layouts.push_back(std::move(p));
  }
  if (ranks != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("Number of ranks in pipeline templates (", ranks,
                                                   ") does not match world size (", world_size,
                                                   ")."));
  }
  ASSIGN_OR_RETURN(topology_, Topology::Make(std::move(layouts)));
  return absl::OkStatus();
}

}  // namespace varuna
